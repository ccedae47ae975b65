//! `cargo xtask bench quickstart`: the quickstart as a user times it, `kiln train --config
//! configs/quickstart.toml` (the loader, validation and checkpoints included) against the same
//! training in PyTorch (`xtask/scripts/bench_torch_quickstart.py`), in rounds that alternate the
//! two: each one's epochs (training and validation, as kiln's epoch line counts them) and whole
//! process. Writes `target/bench/quickstart.md`, naming the CPU.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let rounds = match args {
        [] => 3,
        [flag, value] if flag == "--rounds" => value.parse().context("--rounds takes a number")?,
        _ => bail!("bench quickstart takes --rounds N"),
    };
    let kiln = crate::build_kiln(root, &[])?;
    let python = crate::python(root);
    let torch = crate::torch_importable(&python);
    if !torch {
        println!(
            "torch is not importable from {}: kiln's figures only",
            python.display()
        );
    }
    // kiln writes its run directories under the working directory.
    let runs = root.join("target/bench/quickstart-runs");
    std::fs::create_dir_all(&runs)?;
    let config = root.join("configs/quickstart.toml");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let mut command = Command::new(&kiln);
        command
            .args(["train", "--config"])
            .arg(&config)
            .current_dir(&runs);
        ours.push(timed(command).context("kiln train failed")?);
        if torch {
            let mut command = Command::new(&python);
            command.arg(root.join("xtask/scripts/bench_torch_quickstart.py"));
            theirs.push(timed(command).context("the PyTorch quickstart failed")?);
        }
        println!("round {round} of {rounds} done");
    }
    let _ = std::fs::remove_dir_all(&runs);

    let seconds = |runs: &[Timing], f: fn(&Timing) -> f64| {
        runs.iter()
            .map(|t| format!("{:.1}", f(t)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut table = format!(
        "The quickstart on {} ({} threads), {rounds} rounds:\n\n\
         | | epochs (s) | whole process (s) |\n|---|---:|---:|\n",
        cpu_model(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    for (name, runs) in [("kiln", &ours), ("PyTorch", &theirs)] {
        if !runs.is_empty() {
            table += &format!(
                "| {name} | {} | {} |\n",
                seconds(runs, |t| t.epochs),
                seconds(runs, |t| t.whole)
            );
        }
    }
    if !theirs.is_empty() {
        let median = |runs: &[Timing], f: fn(&Timing) -> f64| {
            let mut values: Vec<f64> = runs.iter().map(f).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        table += &format!(
            "\nkiln / PyTorch (medians, speed): {:.2}x on the epochs, {:.2}x for the whole process\n",
            median(&theirs, |t| t.epochs) / median(&ours, |t| t.epochs),
            median(&theirs, |t| t.whole) / median(&ours, |t| t.whole),
        );
    }
    print!("\n{table}");
    let out = root.join("target/bench/quickstart.md");
    std::fs::write(&out, table)?;
    println!("written to {}", out.display());
    Ok(())
}

struct Timing {
    /// The epoch lines' seconds, summed.
    epochs: f64,
    /// The process, start to exit.
    whole: f64,
}

fn timed(mut command: Command) -> anyhow::Result<Timing> {
    let start = Instant::now();
    let output = command.output().context("cannot start it")?;
    let whole = start.elapsed().as_secs_f64();
    if !output.status.success() {
        bail!(
            "{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let epochs: Vec<f64> = stdout.lines().filter_map(epoch_seconds).collect();
    if epochs.is_empty() {
        bail!("no epoch lines in its output:\n{stdout}");
    }
    Ok(Timing {
        epochs: epochs.iter().sum(),
        whole,
    })
}

/// The seconds in an epoch line, `epoch N: ..., 2.1 s, ...`, as both programs print them.
fn epoch_seconds(line: &str) -> Option<f64> {
    let (head, rest) = line.split_once(": ")?;
    head.strip_prefix("epoch ")?.parse::<usize>().ok()?;
    rest.split(", ")
        .find_map(|field| field.strip_suffix(" s")?.parse().ok())
}

/// The processor's name as Linux gives it.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "an unnamed CPU".into())
}

#[cfg(test)]
mod tests {
    use super::epoch_seconds;

    #[test]
    fn epoch_lines_of_both_programs_give_their_seconds() {
        let kiln = "epoch 3: train loss 0.0587 accuracy 98.33%, validation loss 0.0912 top-1 97.31% top-5 100.00%, 2.1 s, 728 img/s, peak memory 0.04 GiB";
        assert_eq!(epoch_seconds(kiln), Some(2.1));
        assert_eq!(
            epoch_seconds("epoch 1: validation top-1 93.94%, 0.94 s"),
            Some(0.94)
        );
        assert_eq!(
            epoch_seconds("[epoch 4, iteration 160] running loss 0.0246"),
            None
        );
        assert_eq!(
            epoch_seconds("checkpoint runs/x/checkpoints/epoch-0003"),
            None
        );
    }
}
