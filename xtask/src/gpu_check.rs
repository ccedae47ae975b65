//! `cargo xtask gpu-check --carry-dir DIR [--dry-run [--quick]]`: everything a machine with NVIDIA GPUs
//! needs to check kiln, built here and put in one folder (under 60 MB): the kiln binary with
//! `cuda` (and wgpu and flex) compressed, `run.sh`, the PyTorch benchmark script, the configs and
//! PyTorch's training runs (`trajectory/`).
//! On the GPU machine: `bash DIR/run.sh` (or `--quick`, for a machine lent for 15 minutes).
//! `--dry-run` runs the folder's script here, on the CPU (with `--quick`, its quick mode).

use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use flate2::Compression;
use flate2::write::GzEncoder;

/// What the folder may weigh, so that it travels to the GPU machine.
const LIMIT_BYTES: u64 = 60 << 20;

pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let mut carry: Option<PathBuf> = None;
    let mut dry_run = false;
    let mut quick = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--carry-dir" => carry = args.next().map(PathBuf::from),
            "--dry-run" => dry_run = true,
            "--quick" => quick = true,
            other => bail!(
                "unknown option {other}; gpu-check takes --carry-dir DIR [--dry-run [--quick]]"
            ),
        }
    }
    let Some(carry) = carry else {
        bail!("usage: cargo xtask gpu-check --carry-dir DIR [--dry-run [--quick]]");
    };

    let kiln = crate::build_kiln(root, &["cuda"])?;
    std::fs::create_dir_all(carry.join("configs"))
        .with_context(|| format!("cannot create {}", carry.display()))?;
    compress(&kiln, &carry.join("kiln.gz"))?;
    compress(&cudnn_test(root)?, &carry.join("cudnn-test.gz"))?;
    for (from, to) in [
        ("xtask/gpu-check/run.sh", "run.sh"),
        ("xtask/gpu-check/README.md", "README.md"),
        ("xtask/scripts/bench_torch.py", "bench_torch.py"),
        ("configs/quickstart.toml", "configs/quickstart.toml"),
        ("xtask/gpu-check/soak.toml", "configs/soak.toml"),
    ] {
        std::fs::copy(root.join(from), carry.join(to))
            .with_context(|| format!("cannot copy {from} into {}", carry.display()))?;
    }
    // PyTorch's training runs, for `kiln compare --trajectories` (its data, not its script).
    let trajectory = root.join(crate::TRAJECTORIES);
    std::fs::create_dir_all(carry.join("trajectory"))?;
    for entry in std::fs::read_dir(&trajectory)
        .with_context(|| format!("cannot read {}", trajectory.display()))?
    {
        let path = entry?.path();
        if path
            .extension()
            .is_some_and(|e| e == "json" || e == "safetensors")
        {
            let to = carry
                .join("trajectory")
                .join(path.file_name().unwrap_or_default());
            std::fs::copy(&path, &to)
                .with_context(|| format!("cannot copy {} into {}", path.display(), to.display()))?;
        }
    }
    let size = folder_size(&carry)?;
    println!(
        "{}: {:.1} MB; on the GPU machine run `bash {}/run.sh` (results in {}/results-<time>/)",
        carry.display(),
        size as f64 / 1e6,
        carry.display(),
        carry.display()
    );
    if size > LIMIT_BYTES {
        bail!(
            "{} weighs {:.1} MB, over the {} MB that travels to the GPU machine",
            carry.display(),
            size as f64 / 1e6,
            LIMIT_BYTES >> 20
        );
    }
    if dry_run {
        let status = Command::new("bash")
            .arg(carry.join("run.sh"))
            .arg("--dry-run")
            .args(quick.then_some("--quick"))
            .status()
            .context("cannot start bash")?;
        if !status.success() {
            bail!("run.sh --dry-run failed ({status}); see the summary above");
        }
    }
    Ok(())
}

/// kiln-kernels' cuDNN test (`crates/kiln-kernels/tests/cudnn.rs`: each convolution pass through
/// cuDNN, and burn's own CUDA convolution, against burn's on the CPU), built as a program the GPU
/// machine runs first.
fn cudnn_test(root: &Path) -> anyhow::Result<PathBuf> {
    let output = Command::new("cargo")
        .args([
            "test",
            "--release",
            "--package",
            "kiln-kernels",
            "--features",
            "cuda",
        ])
        .args(["--test", "cudnn", "--no-run", "--message-format", "json"])
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot start cargo")?;
    if !output.status.success() {
        bail!(
            "building kiln-kernels' cuDNN test failed ({})",
            output.status
        );
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["target"]["name"] == "cudnn")
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .context("cargo built kiln-kernels' cuDNN test but named no executable")
}

/// gzip, which every Linux machine can undo; the binary shrinks to about a quarter.
fn compress(from: &Path, to: &Path) -> anyhow::Result<()> {
    let mut input = BufReader::new(
        std::fs::File::open(from).with_context(|| format!("cannot read {}", from.display()))?,
    );
    let output = BufWriter::new(
        std::fs::File::create(to).with_context(|| format!("cannot write {}", to.display()))?,
    );
    let mut encoder = GzEncoder::new(output, Compression::best());
    std::io::copy(&mut input, &mut encoder)?;
    encoder.finish()?;
    Ok(())
}

fn folder_size(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        // Results of earlier runs inside the folder do not travel.
        if meta.is_dir() && !entry.file_name().to_string_lossy().starts_with("results-") {
            total += folder_size(&entry.path())?;
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
}
