//! Mixed precision as a user runs it: the quickstart trains in bf16 and in f16 (with loss
//! scaling) on the CPU, and a backend that cannot compute in a type refuses it in one line
//! before anything is loaded.

mod common;

use std::path::Path;

use common::{errors, kiln};

/// Trains the quickstart for two epochs of 32 at 2e-3 in `precision` on flex; returns the last
/// validation top-1.
fn quickstart_top1(precision: &str, runs: &Path) -> f64 {
    let runs_dir = format!("logging.runs_dir={}", runs.display());
    let precision = format!("precision={precision}");
    let output = kiln(&[
        "train",
        "--config",
        "configs/quickstart.toml",
        "--backend",
        "flex",
        "--set",
        &precision,
        "--set",
        "epochs=2",
        "--set",
        "batch_size=32",
        "--set",
        "optimizer.lr=2e-3",
        "--set",
        &runs_dir,
    ]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    let top1 = text
        .lines()
        .find_map(|l| l.strip_prefix("validation top-1: "))
        .and_then(|v| v.trim_end_matches('%').parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no validation line in {text}"));
    top1 / 100.0
}

#[test]
fn the_quickstart_learns_in_bf16_and_f16() {
    let runs = tempfile::tempdir().unwrap();
    // f32 reaches about 96% after two epochs.
    for precision in ["bf16", "f16"] {
        let top1 = quickstart_top1(precision, runs.path());
        println!("{precision}: validation top-1 {top1:.4} after two epochs");
        assert!(top1 >= 0.9, "{precision}: validation top-1 {top1}");
    }
}

#[test]
#[cfg(feature = "ndarray")]
fn a_backend_without_the_type_refuses_it_in_one_line() {
    let runs = tempfile::tempdir().unwrap();
    let runs_dir = format!("logging.runs_dir={}", runs.path().display());
    let output = kiln(&[
        "train",
        "--config",
        "configs/quickstart.toml",
        "--backend",
        "ndarray",
        "--set",
        "precision=bf16",
        "--set",
        &runs_dir,
    ]);
    assert!(!output.status.success());
    let lines = errors(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("precision = \"bf16\"") && lines[0].contains("\"f32\""),
        "{}",
        lines[0]
    );
    // Refused before the run recorded anything: no run directory is left behind.
    let left = std::fs::read_dir(runs.path()).map_or(0, |d| d.count());
    assert_eq!(left, 0);
}
