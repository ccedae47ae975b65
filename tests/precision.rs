//! Mixed precision as a user runs it: the quickstart trains in bf16 and in f16 (with loss
//! scaling) on the CPU, and a backend that cannot compute in a type refuses it in one line
//! before anything is loaded.

mod common;

use std::path::Path;

use common::{errors, train_on_flex};

/// Trains the quickstart for two epochs of 32 at 2e-3 in `precision` on flex; returns the last
/// validation top-1.
fn quickstart_top1(precision: &str, runs: &Path) -> f64 {
    let precision = format!("precision={precision}");
    let sets = [
        precision.as_str(),
        "epochs=2",
        "batch_size=32",
        "optimizer.lr=2e-3",
    ];
    let output = train_on_flex("configs/quickstart.toml", &sets, runs);
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
    let sets = ["precision=bf16"];
    let args = common::train_args("configs/quickstart.toml", "ndarray", &sets, runs.path());
    let output = common::kiln(&common::strs(&args));
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
