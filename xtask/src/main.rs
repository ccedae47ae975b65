//! `cargo xtask <chore>`: the project's chores as plain Rust, in the style of rust-analyzer.
//!
//! - `lint`: rustfmt check and clippy with warnings as errors, as CI expects them.
//! - `fixtures`: regenerate the PyTorch parity fixtures in `tests/fixtures/` and PyTorch's
//!   training runs in `tests/fixtures/trajectory/` (needs a `.venv` with torch, torchvision, timm
//!   and safetensors).
//! - `compare [--kiln PATH] [kiln compare options]`: builds kiln with the backends asked for
//!   (or takes the binary at PATH) and checks that they agree (`kiln compare`; add
//!   `--trajectories tests/fixtures/trajectory` for PyTorch's training runs); CI runs it with
//!   flex, ndarray and wgpu on the binary its tests built.
//! - `bench [--no-data] [--passes] [kiln bench options]`: training and inference throughput against
//!   PyTorch in the same run, then `bench data`.
//! - `bench data`: the data pipeline's images/s per core against torchvision's.
//! - `bench quickstart [--rounds N]`: `kiln train` of the quickstart against the same training in
//!   PyTorch, rounds alternating the two.
//! - `bench train [--rounds N] [--batches 32,128] [--images N] [--epochs N]`: `kiln train` of
//!   ResNet-18 on CIFAR-sized images (random ones in CIFAR-10's format), loader included, against
//!   the same training in PyTorch with torchvision's dataset and transforms.
//! - `gpu-check --carry-dir DIR [--dry-run]`: a folder that checks kiln on an NVIDIA machine.
//! - `patches [--write]`: each crate under `patches/` is the published crate plus the diff in
//!   its `KILN.md` (`--write` records the diffs after a meant change); CI runs it.

mod bench_data;
mod bench_models;
mod bench_train;
mod gpu_check;
mod patches;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["lint"] => lint(&root),
        ["fixtures"] => fixtures(&root),
        ["compare", ..] => compare(&root, &args[1..]),
        ["bench", "data", ..] => bench_data::run(&root, &args[2..]),
        ["bench", "quickstart", ..] => bench_train::quickstart(&root, &args[2..]),
        ["bench", "train", ..] => bench_train::cifar(&root, &args[2..]),
        ["bench", ..] => bench_models::run(&root, &args[1..]),
        ["gpu-check", ..] => gpu_check::run(&root, &args[1..]),
        ["patches", ..] => patches::run(&root, &args[1..]),
        _ => bail!(
            "usage: cargo xtask <lint | fixtures | compare [--kiln PATH] [--backends flex,ndarray,wgpu ...] | bench [--no-data] [--passes] [--backends ...] | bench data [--count N] [--passes N] | bench quickstart [--rounds N] | bench train [--rounds N] [--batches 32,128] [--images N] [--epochs N] | gpu-check --carry-dir DIR [--dry-run] | patches [--write]>"
        ),
    }
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn lint(root: &Path) -> anyhow::Result<()> {
    run(root, "cargo", &["fmt", "--all", "--", "--check"])?;
    run(
        root,
        "cargo",
        &[
            "clippy",
            "--release",
            "--workspace",
            "--all-targets",
            "--features",
            "ndarray",
            "--",
            "-D",
            "warnings",
        ],
    )
}

/// The project's `.venv` Python if there is one, else `python3` from the PATH.
fn python(root: &Path) -> PathBuf {
    let venv = root.join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

fn fixtures(root: &Path) -> anyhow::Result<()> {
    let python = root.join(".venv/bin/python");
    if !python.exists() {
        bail!(
            "{} is missing: create it with `python3 -m venv .venv && .venv/bin/pip install torch torchvision timm safetensors matplotlib`",
            python.display()
        );
    }
    for script in [
        "tests/fixtures/make_resnet_fixtures.py",
        "tests/fixtures/make_family_fixtures.py",
        "tests/fixtures/make_hub_fixtures.py",
        "tests/fixtures/trajectory/make_trajectories.py",
    ] {
        let script = root.join(script);
        run(
            root,
            &python.to_string_lossy(),
            &[&script.to_string_lossy()],
        )?;
    }
    // PyTorch's quickstart replays the batches and learning rates of kiln's own loader and
    // schedule, which an example writes.
    let batches = root.join("target/quickstart-batches.safetensors");
    let batches = batches.to_string_lossy();
    run(
        root,
        "cargo",
        &[
            "run",
            "--release",
            "--example",
            "replay_batches",
            "--",
            "configs/quickstart.toml",
            &batches,
        ],
    )?;
    let script = root.join("tests/fixtures/quickstart/make_quickstart_curve.py");
    run(
        root,
        &python.to_string_lossy(),
        &[&script.to_string_lossy(), &batches],
    )
}

/// PyTorch's training runs, which `kiln compare --trajectories` follows on every backend (the
/// GPU check carries them).
pub const TRAJECTORIES: &str = "tests/fixtures/trajectory";

/// `cargo xtask compare`: `kiln compare` built with the backends it names.
fn compare(root: &Path, args: &[String]) -> anyhow::Result<()> {
    // `--kiln PATH`: a binary already built with the backends' features (CI passes the one
    // the tests built), rather than building one here.
    let given = args.iter().position(|a| a == "--kiln");
    let kiln = given.map(|i| args.get(i + 1).map(PathBuf::from));
    let args: Vec<String> = match given {
        Some(i) => [&args[..i], args.get(i + 2..).unwrap_or_default()].concat(),
        None => args.to_vec(),
    };
    let args = args.as_slice();
    let backends = args
        .iter()
        .position(|a| a == "--backends")
        .and_then(|i| args.get(i + 1))
        .map_or_else(
            || vec!["flex".to_string(), "ndarray".into(), "wgpu".into()],
            |list| list.split(',').map(str::to_string).collect(),
        );
    let kiln = match kiln {
        Some(Some(path)) if path.is_file() => path,
        Some(Some(path)) => bail!("--kiln {}: no such file; build it first", path.display()),
        Some(None) => bail!("--kiln needs the path of a kiln binary"),
        None => build_kiln(root, &features_for(&backends))?,
    };
    let mut command = Command::new(kiln);
    command.arg("compare").args(args);
    if !args.iter().any(|a| a == "--backends") {
        command.args(["--backends", &backends.join(",")]);
    }
    let status = command.status().context("cannot start kiln compare")?;
    if !status.success() {
        bail!("kiln compare failed ({status})");
    }
    Ok(())
}

/// The `kiln` features that the named backends need beyond the default (wgpu and flex).
fn features_for(backends: &[String]) -> Vec<&'static str> {
    let mut features = Vec::new();
    if backends.iter().any(|b| b == "ndarray") {
        features.push("ndarray");
    }
    if backends.iter().any(|b| b == "cuda") {
        features.push("cuda");
    }
    features
}

/// Whether this machine has an NVIDIA driver (and so possibly GPUs for the cuda backend).
fn has_nvidia_gpu() -> bool {
    Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Builds the `kiln` binary in release mode with `features` and returns its path.
fn build_kiln(root: &Path, features: &[&str]) -> anyhow::Result<PathBuf> {
    let mut args = vec!["build", "--release", "--package", "kiln", "--bin", "kiln"];
    let joined = features.join(",");
    if !features.is_empty() {
        args.extend(["--features", &joined]);
    }
    run(root, "cargo", &args)?;
    Ok(root.join("target/release/kiln"))
}

/// Whether `python` can import torch and torchvision.
fn torch_importable(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import torch, torchvision"])
        .output()
        .is_ok_and(|out| out.status.success())
}

fn run(root: &Path, program: &str, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new(program)
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("cannot start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
}
