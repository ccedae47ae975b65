//! `kiln plan` as a user runs it: its estimate against the peak that real training steps take
//! on the CPU (each measured in its own process, where the resident-set peak is the run's
//! alone), `batch_size = "auto"` training, and `max_memory` refusing a batch that cannot fit.

mod common;

use std::path::Path;

use common::{errors, kiln};

/// A config for `model` on synthetic `side` x `side` images, SGD with momentum.
fn config(dir: &Path, model: &str, stem: &str, side: u32, extra: &str) -> String {
    let path = dir.join(format!("{model}-{side}.toml"));
    let text = format!(
        r#"
epochs = 1
batch_size = 8
{extra}
[model]
name = "{model}"
stem = "{stem}"
[data]
source = {{ kind = "synthetic", train_size = 16, val_size = 8, image_size = {side}, num_classes = 10 }}
workers = 1
[optimizer]
name = "sgd"
lr = 0.01
momentum = 0.9
[logging]
runs_dir = "{}"
"#,
        dir.join("runs").display()
    );
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// `kiln plan --measure --json` on flex: (estimated, measured) peak bytes.
fn estimate_and_measure(config: &str, batch: usize) -> (f64, f64) {
    let batch = format!("batch_size={batch}");
    let output = kiln(&[
        "plan",
        "--config",
        config,
        "--backend",
        "flex",
        "--set",
        &batch,
        "--measure",
        "--json",
    ]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let estimate = report["estimate_bytes"].as_f64().unwrap();
    let measured = report["measured"]["peak_bytes"].as_f64().unwrap();
    (estimate, measured)
}

#[test]
fn estimates_are_within_a_quarter_of_the_measured_cpu_peak() {
    let dir = tempfile::tempdir().unwrap();
    let resnet18 = config(dir.path(), "resnet18", "cifar", 32, "");
    let resnet50 = config(dir.path(), "resnet50", "imagenet", 64, "");
    // Grouped convolutions, and ResNet-D's deep stem and pooled shortcuts.
    let resnext = config(dir.path(), "resnext50_32x4d", "imagenet", 64, "");
    let resnet50d = config(dir.path(), "resnet50d", "imagenet", 64, "");
    for (config, batches) in [
        (&resnet18, &[8, 32][..]),
        (&resnet50, &[4, 16]),
        (&resnext, &[8]),
        (&resnet50d, &[8]),
    ] {
        for &batch in batches {
            let (estimate, measured) = estimate_and_measure(config, batch);
            let error = estimate / measured - 1.0;
            println!(
                "{config} batch {batch}: estimate {:.0} MiB, measured {:.0} MiB ({:+.1}%)",
                estimate / 1048576.0,
                measured / 1048576.0,
                error * 100.0
            );
            assert!(
                error.abs() < 0.25,
                "{config} at batch {batch}: estimated {estimate} bytes, measured {measured}"
            );
        }
    }
}

#[test]
fn auto_batch_size_trains_and_records_the_number_it_chose() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        dir.path(),
        "resnet18",
        "cifar",
        16,
        "max_memory = \"300MiB\"",
    );
    let output = kiln(&[
        "train",
        "--config",
        &config,
        "--backend",
        "flex",
        "--set",
        "batch_size=auto",
        "--set",
        "model.width=8",
        "--set",
        "data.source.train_size=512",
    ]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let lines = errors(&output).join("\n");
    assert!(lines.contains("batch_size \"auto\": "), "{lines}");
    // 512 images leave room for 16 steps an epoch up to a batch of 32.
    assert!(lines.contains("batch_size \"auto\" chose"), "{lines}");
    let run = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let recorded = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let chosen: toml::Table = toml::from_str(&recorded).unwrap();
    let batch = chosen["batch_size"].as_integer().unwrap();
    assert!(
        batch > 8 && batch <= 32 && (batch as u64).is_power_of_two(),
        "{recorded}"
    );
}

#[test]
fn a_batch_over_max_memory_is_refused_before_training_with_one_that_fits() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        dir.path(),
        "resnet50",
        "imagenet",
        224,
        "max_memory = \"1GiB\"",
    );
    let output = kiln(&[
        "train",
        "--config",
        &config,
        "--backend",
        "flex",
        "--set",
        "batch_size=64",
    ]);
    assert!(!output.status.success());
    let lines = errors(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert!(
        line.contains("batch_size 64")
            && line.contains("max_memory")
            && line.contains("accumulate = "),
        "{line}"
    );
    assert!(
        !dir.path().join("runs").exists()
            || std::fs::read_dir(dir.path().join("runs"))
                .unwrap()
                .next()
                .is_none()
    );
}
