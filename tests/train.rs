//! `kiln train` and `kiln eval` as a user runs them: the quickstart reaches its accuracy, every
//! shipped config runs one iteration on tiny synthetic data, config mistakes get one line.

mod common;

use std::path::{Path, PathBuf};

use common::{errors, kiln};

/// The single run directory under `runs`.
fn run_dir(runs: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.pop().unwrap()
}

#[test]
fn the_quickstart_reaches_95_percent_on_the_shipped_digits() {
    let runs = tempfile::tempdir().unwrap();
    let runs_dir = format!("logging.runs_dir={}", runs.path().display());
    let output = kiln(&[
        "train",
        "--config",
        "configs/quickstart.toml",
        "--backend",
        "flex",
        "--set",
        &runs_dir,
    ]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let run = run_dir(runs.path());
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    let top1 = last["val_top1"].as_f64().unwrap();
    println!("quickstart validation top-1: {top1:.4}");
    assert!(top1 >= 0.95, "validation top-1 {top1}");
    for file in [
        "config.toml",
        "metrics.jsonl",
        "metrics.csv",
        "loss.svg",
        "accuracy.svg",
        "lr.svg",
        "model.safetensors",
        "summary.txt",
    ] {
        assert!(run.join(file).is_file(), "{file} is missing");
    }

    // `kiln eval` on the run gives the same validation accuracy from the exported model.
    let output = kiln(&["eval", "--run", &run.to_string_lossy(), "--backend", "flex"]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains(&format!("top-1 {:.2}%", top1 * 100.0)),
        "{text}"
    );
}

#[test]
fn every_shipped_config_runs_one_iteration_on_synthetic_data() {
    let configs: Vec<PathBuf> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
    assert!(configs.len() >= 4, "{configs:?}");
    for config in configs {
        let runs = tempfile::tempdir().unwrap();
        let runs_dir = format!("logging.runs_dir={}", runs.path().display());
        let output = kiln(&[
            "train",
            "--config",
            &config.to_string_lossy(),
            "--backend",
            "flex",
            "--devices",
            "0",
            "--set",
            "data.source={ kind = \"synthetic\", train_size = 2, val_size = 2, image_size = 32, num_classes = 3 }",
            "--set",
            "epochs=1",
            "--set",
            "batch_size=2",
            "--set",
            "model.width=4",
            "--set",
            "model.pretrained=",
            "--set",
            "data.workers=1",
            "--set",
            &runs_dir,
        ]);
        assert!(
            output.status.success(),
            "{}: {:?}",
            config.display(),
            errors(&output)
        );
        let history = std::fs::read_to_string(run_dir(runs.path()).join("metrics.jsonl")).unwrap();
        let epoch: serde_json::Value =
            serde_json::from_str(history.lines().next().unwrap()).unwrap();
        assert_eq!(epoch["iteration"], 1, "{}", config.display());
    }
}

#[test]
fn config_mistakes_end_with_one_line_naming_the_key() {
    let runs = tempfile::tempdir().unwrap();
    let runs_dir = format!("logging.runs_dir={}", runs.path().display());
    for (set, expected) in [
        ("optimizer.lrr=0.1", "lrr"),
        ("batch_size=0", "batch_size"),
        ("optimizer.lr=-0.5", "optimizer.lr"),
        (
            "data.source={ kind = \"image_folder\", train = \"/nonexistent/train\" }",
            "/nonexistent/train",
        ),
    ] {
        let output = kiln(&[
            "train",
            "--config",
            "configs/quickstart.toml",
            "--backend",
            "flex",
            "--set",
            set,
            "--set",
            &runs_dir,
        ]);
        assert_eq!(output.status.code(), Some(1), "{set}");
        let lines = errors(&output);
        assert_eq!(lines.len(), 1, "{set}: {lines:?}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(expected),
            "{lines:?}"
        );
    }
    // Nothing ran, so no run directory was left behind.
    assert_eq!(std::fs::read_dir(runs.path()).unwrap().count(), 0);
}
