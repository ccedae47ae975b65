//! `cargo xtask bench`: kiln's training and inference figures (`kiln bench`) beside PyTorch's
//! from the same run (`xtask/scripts/bench_torch.py`, when torch is importable), then the data
//! pipeline's. Results go to `target/bench/`: `torch.json`, `kiln.json`, `bench.md`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

/// Options that `kiln bench` and the PyTorch script both take, with a value each.
const SHARED: [&str; 6] = [
    "--models",
    "--batches",
    "--modes",
    "--warmup",
    "--min-steps",
    "--min-seconds",
];

pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    // Switches without a value: `--no-data` is xtask's, `--passes` goes to kiln bench.
    let (switches, args): (Vec<&String>, Vec<&String>) = args
        .iter()
        .partition(|a| matches!(a.as_str(), "--no-data" | "--passes"));
    let has = |switch: &str| switches.iter().any(|a| a.as_str() == switch);
    let (skip_data, passes) = (has("--no-data"), has("--passes"));
    let args: Vec<String> = args.into_iter().cloned().collect();
    let pairs = flag_pairs(&args)?;
    let backends = pairs
        .iter()
        .find(|(flag, _)| flag == "--backends")
        .map(|(_, v)| v.split(',').map(str::to_string).collect::<Vec<_>>());
    let mut features = crate::features_for(backends.as_deref().unwrap_or_default());
    if backends.is_none() && crate::has_nvidia_gpu() {
        features.push("cuda");
    }
    let kiln = crate::build_kiln(root, &features)?;

    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    let torch_json = out.join("torch.json");
    let _ = std::fs::remove_file(&torch_json);
    let python = crate::python(root);
    if crate::torch_importable(&python) {
        let mut torch = Command::new(&python);
        torch
            .arg(root.join("xtask/scripts/bench_torch.py"))
            .arg("--json")
            .arg(&torch_json);
        if let Some(names) = &backends {
            // PyTorch on the classes of device that kiln measures: wgpu may be either.
            let cpu = names.iter().any(|b| b != "cuda");
            let gpu = names.iter().any(|b| b != "flex" && b != "ndarray");
            let devices: Vec<&str> = [(cpu, "cpu"), (gpu, "cuda")]
                .into_iter()
                .filter_map(|(wanted, device)| wanted.then_some(device))
                .collect();
            torch.args(["--device", &devices.join(",")]);
        }
        for (flag, value) in pairs.iter().filter(|(f, _)| SHARED.contains(&f.as_str())) {
            torch.args([flag, value]);
        }
        println!("PyTorch:");
        let status = torch
            .status()
            .context("cannot start the PyTorch benchmark")?;
        if !status.success() {
            bail!("xtask/scripts/bench_torch.py failed ({status})");
        }
    } else {
        println!(
            "torch is not importable from {}: kiln's figures only (create .venv with torch and torchvision for PyTorch's)",
            python.display()
        );
    }

    println!("kiln:");
    let mut bench = Command::new(&kiln);
    bench
        .arg("bench")
        .args(&args)
        .arg("--json")
        .arg(out.join("kiln.json"))
        .arg("--markdown")
        .arg(out.join("bench.md"));
    if torch_json.exists() {
        bench.arg("--reference").arg(&torch_json);
    }
    if passes {
        bench.arg("--passes");
    }
    let status = bench.status().context("cannot start kiln bench")?;
    if !status.success() {
        bail!("kiln bench failed ({status})");
    }
    println!("written to {}", out.display());

    if !skip_data {
        println!("\nData pipeline:");
        crate::bench_data::run(root, &[])?;
    }
    Ok(())
}

/// `--flag value` pairs, as `kiln bench` takes them.
fn flag_pairs(args: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    args.chunks(2)
        .map(|pair| match pair {
            [flag, value] if flag.starts_with("--") => Ok((flag.clone(), value.clone())),
            _ => bail!(
                "options go as `--flag value` pairs (for example --backends flex --batches 32); got {}",
                pair.join(" ")
            ),
        })
        .collect()
}
