//! `cargo xtask <chore>`: the project's chores as plain Rust, in the style of rust-analyzer.
//!
//! - `lint`: rustfmt check and clippy with warnings as errors, as CI expects them.
//! - `fixtures`: regenerate the PyTorch parity fixtures in `tests/fixtures/` (needs a `.venv`
//!   with torch, torchvision and safetensors).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let chore = std::env::args().nth(1).unwrap_or_default();
    let root = project_root();
    match chore.as_str() {
        "lint" => lint(&root),
        "fixtures" => fixtures(&root),
        _ => bail!("usage: cargo xtask <lint | fixtures>"),
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
