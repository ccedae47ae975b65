//! A Hugging Face data set as a user has it: written by the `datasets` library into the Hub's
//! cache (kiln-data's `tests/fixtures/make_hf_fixtures.py`), trained offline by `kiln train`,
//! its class names from the `ClassLabel` feature in `classes.txt`, and read by `kiln stats`; the
//! same data set downloaded from a Hub on loopback (`HF_ENDPOINT`) into an empty cache, trained,
//! and written as shards by `kiln shard`.

mod common;

use std::path::{Path, PathBuf};

use common::{epoch_figures, errors, train_args};
use kiln_test_hub::{COMMIT, Fault, TestHub};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/crates/kiln-data/tests/fixtures/huggingface"
);

/// `kiln` with `HF_HOME` at `home` and the network forbidden.
fn offline(home: &Path, args: &[String]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("HF_HOME", home)
        .env_remove("HF_HUB_CACHE")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("the kiln binary runs")
}

fn only_run(runs: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.pop().unwrap()
}

#[test]
fn a_data_set_in_the_hugging_face_cache_trains_offline_with_its_class_names() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let source = r#"data.source={kind="huggingface",repo="kiln/tiny"}"#;
    let args = train_args(
        "configs/quickstart.toml",
        "flex",
        &[source, "epochs=2", "batch_size=4"],
        &runs,
    );
    let output = offline(Path::new(FIXTURE), &args);
    assert!(output.status.success(), "{:?}", errors(&output));
    let run = only_run(&runs);
    let classes = std::fs::read_to_string(run.join("classes.txt")).unwrap();
    assert_eq!(
        classes.lines().collect::<Vec<_>>(),
        ["red", "green", "blue"]
    );
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "{metrics}");

    // `kiln stats` reads the same source.
    let stats = offline(
        Path::new(FIXTURE),
        &[
            "stats",
            "--config",
            "configs/quickstart.toml",
            "--set",
            source,
            "--json",
        ]
        .map(String::from),
    );
    assert!(stats.status.success(), "{:?}", errors(&stats));
    let stdout = String::from_utf8_lossy(&stats.stdout);
    assert!(
        stdout.contains("red") && stdout.contains("blue"),
        "{stdout}"
    );
}

#[test]
fn a_repository_missing_from_the_cache_offline_is_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let args = train_args(
        "configs/quickstart.toml",
        "flex",
        &[r#"data.source={kind="huggingface",repo="kiln/absent"}"#],
        &dir.path().join("runs"),
    );
    let output = offline(dir.path(), &args);
    assert!(!output.status.success());
    let errors = errors(&output);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("kiln/absent"), "{errors:?}");
}

/// The epochs' figures and every step's loss of a run.
fn trajectory(run: &Path) -> (Vec<Vec<String>>, String) {
    let steps = std::fs::read_to_string(run.join("iterations.csv")).unwrap_or_default();
    (epoch_figures(run), steps)
}

/// Killed (`kill -9`) in the middle of its third epoch and resumed, a run from the Hugging Face
/// cache ends with the uninterrupted run's metrics and losses, step for step.
#[test]
fn a_run_from_the_hugging_face_cache_killed_and_resumed_ends_as_an_uninterrupted_one() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let sets = [
        r#"data.source={kind="huggingface",repo="kiln/tiny"}"#,
        "epochs=6",
        "batch_size=4",
        "checkpoints.every_steps=2",
        "logging.print_every=1",
        "data.workers=1",
    ];
    let whole = dir.path().join("whole");
    let output = offline(
        Path::new(FIXTURE),
        &train_args("configs/quickstart.toml", "flex", &sets, &whole),
    );
    assert!(output.status.success(), "{:?}", errors(&output));
    let expected = trajectory(&only_run(&whole));
    assert_eq!(expected.0.len(), 6, "{:?}", expected.0);

    let killed = dir.path().join("killed");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(train_args(
            "configs/quickstart.toml",
            "flex",
            &sets,
            &killed,
        ))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("HF_HOME", FIXTURE)
        .env_remove("HF_HUB_CACHE")
        .env("HF_HUB_OFFLINE", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Three steps an epoch: the seventh printed step is the third epoch's first.
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let printed = stderr
        .lines()
        .map_while(Result::ok)
        .filter(|line| line.contains("iteration "))
        .take(7)
        .count();
    assert_eq!(printed, 7, "the run ended before its seventh step");
    child.kill().unwrap();
    assert!(child.wait().unwrap().code().is_none(), "not killed mid-run");
    let run = only_run(&killed);
    assert!(
        trajectory(&run).0.len() < 6,
        "killed after the run had ended"
    );

    let resumed = offline(
        Path::new(FIXTURE),
        &[
            "train",
            "--resume",
            &run.display().to_string(),
            "--backend",
            "flex",
        ]
        .map(String::from),
    );
    assert!(resumed.status.success(), "{:?}", errors(&resumed));
    assert!(
        errors(&resumed)
            .iter()
            .any(|l| l.starts_with("resuming from"))
    );
    assert_eq!(trajectory(&run), expected);
}

/// kiln/tiny's snapshot at main, as the fixture cache holds it.
const TINY: &str = "hub/datasets--kiln--tiny/snapshots/1111111111111111111111111111111111111111";
const TINY_FILES: [&str; 2] = [
    "plain_text/train-00000-of-00001.parquet",
    "plain_text/test-00000-of-00001.parquet",
];

/// `kiln` with an empty `HF_HOME` at `home` and the Hub at `endpoint`.
fn online(home: &Path, endpoint: &str, args: &[String]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("HF_HOME", home)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_DATASETS_OFFLINE")
        .env_remove("HF_TOKEN")
        .output()
        .expect("the kiln binary runs")
}

/// The data set on a Hub (on loopback): `kiln train` downloads its splits into an empty cache as
/// huggingface_hub lays them out and trains exactly as from the cache the `datasets` library
/// filled; a second run and `kiln shard` then find it there with the network forbidden.
#[test]
fn a_data_set_on_the_hub_downloads_into_the_cache_and_trains_as_from_the_cache() {
    let hub = TestHub::start();
    for file in TINY_FILES {
        let bytes = std::fs::read(Path::new(FIXTURE).join(TINY).join(file)).unwrap();
        hub.add_dataset("kiln/tiny", file, bytes, Fault::None);
    }
    hub.add_dataset(
        "kiln/tiny",
        "README.md",
        b"---\nlicense: mit\n---\n".to_vec(),
        Fault::None,
    );
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("hf");
    let source = r#"data.source={kind="huggingface",repo="kiln/tiny"}"#;
    let sets = [source, "epochs=2", "batch_size=4"];

    let downloaded = dir.path().join("downloaded");
    let args = train_args("configs/quickstart.toml", "flex", &sets, &downloaded);
    let output = online(&home, &hub.endpoint, &args);
    assert!(output.status.success(), "{:?}", errors(&output));
    let snapshot = home.join(format!("hub/datasets--kiln--tiny/snapshots/{COMMIT}"));
    for file in TINY_FILES {
        assert!(snapshot.join(file).is_file(), "{file} not in the cache");
    }
    assert!(
        !snapshot.join("README.md").exists(),
        "more than the splits came"
    );
    let run = only_run(&downloaded);
    let classes = std::fs::read_to_string(run.join("classes.txt")).unwrap();
    assert_eq!(
        classes.lines().collect::<Vec<_>>(),
        ["red", "green", "blue"]
    );
    let cached = dir.path().join("cached");
    let output = offline(
        Path::new(FIXTURE),
        &train_args("configs/quickstart.toml", "flex", &sets, &cached),
    );
    assert!(output.status.success(), "{:?}", errors(&output));
    assert_eq!(trajectory(&run), trajectory(&only_run(&cached)));

    // Now in the cache: trained and sharded with the network forbidden, the Hub not asked.
    let asked = hub.requests().len();
    let again = dir.path().join("again");
    let output = offline(
        &home,
        &train_args("configs/quickstart.toml", "flex", &sets, &again),
    );
    assert!(output.status.success(), "{:?}", errors(&output));
    let shards = dir.path().join("shards");
    let shard = [
        "shard",
        "--config",
        "configs/quickstart.toml",
        "--set",
        source,
        "--out",
        &shards.display().to_string(),
    ]
    .map(String::from);
    let output = offline(&home, &shard);
    assert!(output.status.success(), "{:?}", errors(&output));
    assert_eq!(hub.requests().len(), asked);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shards.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(
        manifest["classes"],
        serde_json::json!(["red", "green", "blue"])
    );
    let samples = |split: &str| manifest["splits"][split]["samples"].as_u64().unwrap();
    assert_eq!((samples("train"), samples("val")), (12, 6));
}
