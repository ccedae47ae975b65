//! Two machines, played by two `kiln train` processes on loopback joined through the
//! coordinator, train as one process does on the whole batch.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use burn::backend::Flex;
use common::{errors, kiln};
use kiln_config::TrainConfig;

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

/// A port free now, below the range the system takes ports for outgoing connections from (as a
/// deployment's 29500 is), so that no connection of a test running beside takes it meanwhile;
/// for a coordinator, the heartbeat's port (3 above, with two machines) is free too.
fn free_port() -> u16 {
    loop {
        let port = fastrand::u16(20000..32000);
        let free = |p: u16| std::net::TcpListener::bind(("0.0.0.0", p)).is_ok();
        if free(port) && free(port + 3) {
            return port;
        }
    }
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

/// Starts machines 0 and 1 of a run on loopback: `kiln train` with `args(rank)`.
fn start_nodes(args: impl Fn(usize) -> Vec<String>) -> Vec<Child> {
    let coordinator = format!("127.0.0.1:{}", free_port());
    (0..2)
        .map(|rank| {
            let mut args = args(rank);
            args.extend(["--nodes", "2", "--node-rank", &rank.to_string()].map(String::from));
            args.extend(["--coordinator".into(), coordinator.clone()]);
            args.extend([
                "--node-address".into(),
                format!("127.0.0.1:{}", free_port()),
            ]);
            train_on_flex(args, Vec::new())
        })
        .collect()
}

/// `kiln train --backend flex` with `args`, in the environment and `env`, its errors piped.
fn train_on_flex(args: Vec<String>, env: Vec<(String, String)>) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("train")
        .args(args)
        .args(["--backend", "flex"])
        .env_remove("RUST_BACKTRACE")
        // The test runner's own launcher, if any, is not these processes'.
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SLURM_STEP_ID")
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `kiln train`'s arguments for a new run of `config` with its run directory in `runs`.
fn new_run(config: &str, runs: &Path) -> Vec<String> {
    let set = format!("logging.runs_dir='{}'", runs.display());
    ["--config", config, "--set", &set]
        .map(String::from)
        .to_vec()
}

/// The run directory in `runs` once it has its first epoch's checkpoint.
fn after_first_epoch(runs: &Path, limit: Duration) -> PathBuf {
    let start = Instant::now();
    loop {
        let run = std::fs::read_dir(runs)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .find(|run| run.join("checkpoints/epoch-0001").is_dir());
        if let Some(run) = run {
            return run;
        }
        assert!(
            start.elapsed() < limit,
            "no first checkpoint in {}",
            runs.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The names of a run's checkpoints.
fn checkpoints(run: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A longer run of the same model: long enough to be stopped in the middle.
fn long_run(dir: &Path) -> String {
    let path = dir.join("long.toml");
    // At lr 0.1 this model diverges in its second epoch (the loss reaches millions on one
    // process, NaN on two): a tenth of it trains.
    let config = CONFIG
        .replace("epochs = 2", "epochs = 5")
        .replace("train_size = 24", "train_size = 120")
        .replace("lr = 0.1", "lr = 0.01");
    std::fs::write(&path, config).unwrap();
    path.to_string_lossy().into_owned()
}

/// The run folders of machines `nodes` hold the same parameters as one process's run in
/// `single` (within float rounding), and the last machine logged the whole step's loss.
fn assert_train_as_one(config: &TrainConfig, single: &Path, nodes: &[PathBuf]) {
    let expected = parameters(config, &model_file(single));
    for (rank, node) in nodes.iter().enumerate() {
        let actual = parameters(config, &model_file(node));
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
    // The machines logged the whole step's loss, not their half's.
    let loss = |runs: &Path| -> Vec<f64> {
        let run = model_file(runs).parent().unwrap().to_path_buf();
        std::fs::read_to_string(run.join("metrics.csv"))
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| l.split(',').nth(3).unwrap().parse().unwrap())
            .collect()
    };
    let (single, node) = (loss(single), loss(nodes.last().unwrap()));
    assert_eq!(single.len(), 2);
    for (a, b) in single.iter().zip(&node) {
        assert!(
            (a - b).abs() < 1e-4,
            "train loss {a} on one process, {b} on the last node"
        );
    }
}

/// Starts two `kiln train` processes of `config` with no cluster flags, each with the
/// environment `env(rank)` a job launcher would give it, its run folder `runs(rank)`.
fn launch_two(
    config: &str,
    runs: impl Fn(usize) -> PathBuf,
    env: impl Fn(usize) -> Vec<(String, String)>,
) {
    let nodes: Vec<Child> = (0..2)
        .map(|rank| train_on_flex(new_run(config, &runs(rank)), env(rank)))
        .collect();
    for (rank, node) in nodes.into_iter().enumerate() {
        let (ok, stderr) = finish(node, Duration::from_secs(300));
        assert!(ok, "process {rank} failed: {stderr}");
        assert!(stderr.contains("started by"), "{stderr}");
    }
}

/// Writes `CONFIG` into `dir` and trains it in one process into `dir/single`: the config and
/// its path, for the runs on two machines to match.
fn trained_alone(dir: &Path) -> (TrainConfig, String) {
    let config_path = dir.join("cluster.toml");
    std::fs::write(&config_path, CONFIG).unwrap();
    let config = TrainConfig::load(&config_path, &[]).unwrap();
    let config_arg = config_path.to_string_lossy().into_owned();
    let single = kiln(&[
        "train",
        "--config",
        &config_arg,
        "--backend",
        "flex",
        "--set",
        &format!("logging.runs_dir='{}'", dir.join("single").display()),
    ]);
    assert!(single.status.success(), "{:?}", errors(&single));
    (config, config_arg)
}

/// A SLURM job id whose coordinator port (15000 + its last four digits) is free now.
fn free_job_id() -> u64 {
    loop {
        let job = fastrand::u64(100_000..10_000_000);
        let port = kiln_train::cluster::launch::slurm_port(job);
        let free = |p: u16| std::net::TcpListener::bind(("0.0.0.0", p)).is_ok();
        if free(port) && free(port + 3) {
            return job;
        }
    }
}

#[test]
fn srun_and_torchrun_environments_start_a_run_without_flags() {
    let dir = tempfile::tempdir().unwrap();
    let (config, config_arg) = trained_alone(dir.path());
    let runs = |name: String| dir.path().join(name);

    let job = free_job_id().to_string();
    let srun = |rank: usize| {
        [
            ("SLURM_JOB_ID", job.as_str()),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", ["0", "1"][rank]),
            ("SLURM_STEP_NUM_TASKS", "2"),
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_STEP_NODELIST", "127.0.0.[1-2]"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec()
    };
    launch_two(&config_arg, |rank| runs(format!("srun{rank}")), srun);

    let port = free_port().to_string();
    let torchrun = |rank: usize| {
        [
            ("RANK", ["0", "1"][rank]),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", port.as_str()),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec()
    };
    launch_two(
        &config_arg,
        |rank| runs(format!("torchrun{rank}")),
        torchrun,
    );

    for launcher in ["srun", "torchrun"] {
        let nodes = [0, 1].map(|rank| runs(format!("{launcher}{rank}")));
        assert_train_as_one(&config, &runs("single".into()), &nodes);
    }
}

#[test]
fn a_malformed_launcher_variable_is_one_clear_line() {
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "train",
            "--config",
            "configs/quickstart.toml",
            "--backend",
            "flex",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .envs([("WORLD_SIZE", "2"), ("RANK", "first")])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let errors = errors(&output);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("RANK=\"first\""), "{errors:?}");
}

#[test]
fn two_processes_through_the_coordinator_train_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let (config, config_arg) = trained_alone(dir.path());
    let runs = |name: &str| dir.path().join(name);

    let nodes = start_nodes(|rank| new_run(&config_arg, &runs(&format!("node{rank}"))));
    for (rank, node) in nodes.into_iter().enumerate() {
        let (ok, stderr) = finish(node, Duration::from_secs(300));
        assert!(ok, "node {rank} failed: {stderr}");
    }

    assert_train_as_one(&config, &runs("single"), &[runs("node0"), runs("node1")]);
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

#[test]
fn ctrl_c_on_one_machine_stops_every_machine_at_the_same_step() {
    let dir = tempfile::tempdir().unwrap();
    let config = long_run(dir.path());
    let runs = |rank: usize| dir.path().join(format!("node{rank}"));
    let mut nodes = start_nodes(|rank| new_run(&config, &runs(rank)));
    let run: Vec<PathBuf> = (0..2)
        .map(|rank| after_first_epoch(&runs(rank), Duration::from_secs(120)))
        .collect();
    let interrupt = Command::new("kill")
        .args(["-INT", &nodes[1].id().to_string()])
        .status()
        .unwrap();
    assert!(interrupt.success());
    for (rank, node) in nodes.drain(..).enumerate() {
        let (ok, stderr) = finish(node, Duration::from_secs(60));
        assert!(ok, "node {rank} did not stop cleanly: {stderr}");
        assert!(!stderr.contains("error"), "node {rank}: {stderr}");
    }
    // Both wrote a checkpoint at the step where machine 1 asked to stop.
    let (saved0, saved1) = (checkpoints(&run[0]), checkpoints(&run[1]));
    assert_eq!(saved0, saved1);
    let last = saved0.last().unwrap();
    assert!(
        last.contains("-batch-"),
        "no checkpoint at the stop: {saved0:?}"
    );

    // And both go on from it together to the end.
    let nodes = start_nodes(|rank| vec!["--resume".into(), run[rank].display().to_string()]);
    for (rank, node) in nodes.into_iter().enumerate() {
        let (ok, stderr) = finish(node, Duration::from_secs(300));
        assert!(ok, "node {rank} failed to resume: {stderr}");
    }
    let loaded = TrainConfig::load(Path::new(&config), &[]).unwrap();
    let model = |rank: usize| parameters(&loaded, &run[rank].join("model.safetensors"));
    assert_eq!(model(0), model(1));

    // With the figures of one uninterrupted process.
    let single = dir.path().join("single");
    let output = kiln(&[
        "train",
        "--config",
        &config,
        "--backend",
        "flex",
        "--set",
        &format!("logging.runs_dir='{}'", single.display()),
    ]);
    assert!(output.status.success(), "{:?}", errors(&output));
    let losses = |run: &Path| -> Vec<f64> {
        let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
        (csv.lines().skip(1))
            .map(|l| l.split(',').nth(3).unwrap().parse().unwrap())
            .collect()
    };
    let expected = losses(model_file(&single).parent().unwrap());
    assert_eq!(expected.len(), 5);
    for (a, b) in expected.iter().zip(&losses(&run[1])) {
        assert!(
            (a - b).abs() < 1e-4,
            "train loss {a} on one process, {b} after the stop"
        );
    }
}

#[test]
fn a_machine_killed_mid_run_stops_the_other_with_one_line() {
    for killed in [1, 0] {
        let dir = tempfile::tempdir().unwrap();
        let config = long_run(dir.path());
        let runs = |rank: usize| dir.path().join(format!("node{rank}"));
        let mut nodes = start_nodes(|rank| new_run(&config, &runs(rank)));
        for rank in 0..2 {
            after_first_epoch(&runs(rank), Duration::from_secs(120));
        }
        let mut victim = nodes.remove(killed);
        victim.kill().unwrap();
        victim.wait().unwrap();
        let survivor = 1 - killed;
        let (ok, stderr) = finish(nodes.remove(0), Duration::from_secs(60));
        assert!(!ok, "machine {survivor} went on without machine {killed}");
        assert!(!stderr.contains("timed out"), "machine {survivor} hung");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "machine {survivor}: {stderr}");
        assert!(
            errors[0].contains(&format!("machine {killed} ")) && errors[0].contains("--resume"),
            "machine {survivor}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "machine {survivor}: {stderr}");
    }
}
