//! Running the `kiln` binary as a user does, for the end-to-end tests.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `kiln` with `args` from the project root.
pub fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the kiln binary runs")
}

/// The lines on standard error.
pub fn errors(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(String::from)
        .collect()
}

/// `kiln train --config <config> --backend <backend>`, each of `sets` as a `--set`, and the run
/// directories under `runs` (`--set logging.runs_dir=...`, last): the command line of the
/// training tests.
#[allow(dead_code)] // Not every test crate trains.
pub fn train_args(config: &str, backend: &str, sets: &[&str], runs: &Path) -> Vec<String> {
    let runs_dir = format!("logging.runs_dir={}", runs.display());
    let mut args: Vec<String> = ["train", "--config", config, "--backend", backend]
        .map(String::from)
        .into();
    for set in sets.iter().copied().chain([runs_dir.as_str()]) {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args
}

/// Runs [`train_args`] on flex.
#[allow(dead_code)] // Not every test crate trains.
pub fn train_on_flex(config: &str, sets: &[&str], runs: &Path) -> Output {
    kiln(&strs(&train_args(config, "flex", sets, runs)))
}

/// `args` as the `&str`s that [`kiln`] takes.
#[allow(dead_code)] // Not every test crate trains.
pub fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The figures of each epoch of `run` that must not depend on interruptions or on where the data
/// came from (wall-clock times may).
#[allow(dead_code)] // Not every test crate trains.
pub fn epoch_figures(run: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default();
    text.lines()
        .map(|line| {
            let epoch: serde_json::Value = serde_json::from_str(line).unwrap();
            [
                "epoch",
                "iteration",
                "lr",
                "train_loss",
                "val_loss",
                "val_top1",
            ]
            .iter()
            .map(|key| epoch[key].to_string())
            .collect()
        })
        .collect()
}
