//! `cargo xtask <chore>`: the project's chores as plain Rust, in the style of rust-analyzer.
//!
//! - `lint`: rustfmt check and clippy with warnings as errors, as CI expects them.
//! - `fixtures`: regenerate the PyTorch parity fixtures in `tests/fixtures/` (needs a `.venv`
//!   with torch, torchvision and safetensors).
//! - `bench data`: the data pipeline's images/s per core against torchvision's.

mod bench_data;

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
        ["bench", "data", ..] => bench_data::run(&root, &args[2..]),
        _ => bail!("usage: cargo xtask <lint | fixtures | bench data [--count N] [--passes N]>"),
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
            "{} is missing: create it with `python3 -m venv .venv && .venv/bin/pip install torch torchvision safetensors`",
            python.display()
        );
    }
    let script = root.join("tests/fixtures/make_resnet_fixtures.py");
    run(
        root,
        &python.to_string_lossy(),
        &[&script.to_string_lossy()],
    )
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
