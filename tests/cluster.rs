//! Two machines, played by two `kiln train` processes on loopback joined through the
//! coordinator, train as one process does on the whole batch.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use burn::backend::Flex;
use common::{errors, kiln};
use kiln_train::TrainConfig;

/// Frozen batch norm: each image's loss depends on that image alone, so splitting the batch
/// between machines changes nothing but float rounding.
const CONFIG: &str = r#"
name = "cluster"
seed = 11
epochs = 2
batch_size = 6
[model]
name = "resnet18"
stem = "cifar"
width = 4
freeze_batch_norm = true
[data]
source = { kind = "synthetic", train_size = 24, val_size = 6, image_size = 8, num_classes = 3 }
workers = 0
train_transforms = [{ op = "random_crop", size = 8, padding = 1 }, { op = "random_horizontal_flip" }]
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
weight_decay = 5e-4
"#;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn model_file(runs: &Path) -> PathBuf {
    let run = std::fs::read_dir(runs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    run.join("model.safetensors")
}

/// Every value of the model in `path` (torchvision's names, in name order), flattened.
fn parameters(config: &TrainConfig, path: &Path) -> Vec<f32> {
    let device = Default::default();
    let model = kiln_train::step::build_model::<Flex>(&config.model, 3, &device).unwrap();
    let (model, _) = kiln_models::weights::load(model, path).unwrap();
    kiln_models::weights::torch_state_dict(&model)
        .into_values()
        .flat_map(|data| data.convert::<f32>().to_vec::<f32>().unwrap())
        .collect()
}

/// Waits for `child`, killing it after `limit` (a run that hangs fails the test, not CI).
fn finish(mut child: Child, limit: Duration) -> (bool, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let output = child.wait_with_output().unwrap();
            return (
                status.success(),
                String::from_utf8_lossy(&output.stderr).into_owned(),
            );
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            let output = child.wait_with_output().unwrap();
            return (
                false,
                format!("timed out: {}", String::from_utf8_lossy(&output.stderr)),
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn two_processes_through_the_coordinator_train_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("cluster.toml");
    std::fs::write(&config_path, CONFIG).unwrap();
    let config = TrainConfig::load(&config_path, &[]).unwrap();
    let config_arg = config_path.to_string_lossy().into_owned();
    let runs = |name: &str| dir.path().join(name);

    let single = kiln(&[
        "train",
        "--config",
        &config_arg,
        "--backend",
        "flex",
        "--set",
        &format!("logging.runs_dir='{}'", runs("single").display()),
    ]);
    assert!(single.status.success(), "{:?}", errors(&single));

    let coordinator = format!("127.0.0.1:{}", free_port());
    let nodes: Vec<Child> = (0..2)
        .map(|rank| {
            Command::new(env!("CARGO_BIN_EXE_kiln"))
                .args(["train", "--config", &config_arg, "--backend", "flex"])
                .args(["--nodes", "2", "--node-rank", &rank.to_string()])
                .args(["--coordinator", &coordinator])
                .args(["--node-address", &format!("127.0.0.1:{}", free_port())])
                .arg("--set")
                .arg(format!(
                    "logging.runs_dir='{}'",
                    runs(&format!("node{rank}")).display()
                ))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, node) in nodes.into_iter().enumerate() {
        let (ok, stderr) = finish(node, Duration::from_secs(300));
        assert!(ok, "node {rank} failed: {stderr}");
    }

    let expected = parameters(&config, &model_file(&runs("single")));
    for rank in 0..2 {
        let actual = parameters(&config, &model_file(&runs(&format!("node{rank}"))));
        let difference = expected
            .iter()
            .zip(&actual)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            difference < 2e-5,
            "node {rank}'s parameters differ from one process's by {difference}"
        );
    }
    // Both machines logged the whole step's loss, not their half's.
    let metrics = |name: &str| {
        let run = model_file(&runs(name)).parent().unwrap().to_path_buf();
        std::fs::read_to_string(run.join("metrics.csv")).unwrap()
    };
    let loss = |text: String| -> Vec<f64> {
        text.lines()
            .skip(1)
            .map(|l| l.split(',').nth(3).unwrap().parse().unwrap())
            .collect()
    };
    let (single, node) = (loss(metrics("single")), loss(metrics("node1")));
    assert_eq!(single.len(), 2);
    for (a, b) in single.iter().zip(&node) {
        assert!(
            (a - b).abs() < 1e-4,
            "train loss {a} on one process, {b} on node 1"
        );
    }
}

#[test]
fn a_coordinator_port_in_use_is_one_clear_line() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let coordinator = format!("127.0.0.1:{}", taken.local_addr().unwrap().port());
    let output = kiln(&[
        "train",
        "--config",
        "configs/quickstart.toml",
        "--nodes",
        "2",
        "--coordinator",
        &coordinator,
    ]);
    assert!(!output.status.success());
    // The memory plan's line comes first, then one error.
    let lines = errors(&output);
    let errors: Vec<_> = lines.iter().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{lines:?}");
    assert!(
        errors[0].contains("cannot start the coordinator on port"),
        "{lines:?}"
    );
}

#[test]
fn a_node_rank_out_of_range_is_one_clear_line() {
    let output = kiln(&[
        "train",
        "--config",
        "configs/quickstart.toml",
        "--nodes",
        "2",
        "--node-rank",
        "2",
        "--coordinator",
        "127.0.0.1:29500",
    ]);
    assert!(!output.status.success());
    let errors = errors(&output);
    assert!(
        errors
            .iter()
            .any(|l| l.contains("--node-rank 2 is out of range")),
        "{errors:?}"
    );
}
