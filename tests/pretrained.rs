//! Pretrained weights by name, as a user runs kiln: `kiln predict --pretrained hf-hub:...`
//! against a Hub on loopback (`kiln_test_hub`) with the model timm's `save_for_hf`
//! wrote (`tests/fixtures/make_hub_fixtures.py`), whose top 5 on a photograph must be timm's
//! own; the cache it leaves used offline; a fine-tuning run started from it whose export has
//! timm's names; `kiln summary` of the family; and each bad input in one line.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::errors;
use kiln_test_hub::TestHub;

const REPO: &str = "timm/resnet18d.tiny_in1k";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn hub_fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join("hub/resnet18d_w8").join(name)).unwrap()
}

fn photo() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/kiln-data/tests/fixtures/photo.png")
        .display()
        .to_string()
}

fn serve() -> TestHub {
    let hub = TestHub::start();
    hub.add(REPO, "config.json", hub_fixture("config.json"));
    hub.add(REPO, "model.safetensors", hub_fixture("model.safetensors"));
    hub
}

/// `kiln args` with the Hugging Face environment pointing at `hub` and `home`.
fn kiln_with_hub(args: &[&str], hub: &TestHub, home: &Path, offline: bool) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
    command
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_BACKTRACE")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env("HF_HOME", home)
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("KILN_CACHE_DIR", home.join("kiln"));
    if offline {
        command.env("HF_HUB_OFFLINE", "1");
    } else {
        command.env_remove("HF_HUB_OFFLINE");
    }
    command.output().expect("the kiln binary runs")
}

/// `kiln predict`'s lines for one image: (class, percent).
fn top(output: &Output) -> Vec<(String, f64)> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .skip(1)
        .map(|line| {
            let (percent, name) = line.trim().split_once("%  ").unwrap();
            (name.to_string(), percent.trim().parse().unwrap())
        })
        .collect()
}

/// The Hub's config sets the network (resnet18d of width 8, 10 classes) and the transform
/// (64-pixel crop of a bicubic resize to 71): the top 5 are timm's on the same photograph, in
/// its order and with its probabilities within 0.02 of a percent (8e-5 apart measured). Then
/// offline, from the cache it filled, without a request.
#[test]
fn predict_from_the_hub_gives_timms_top_5() {
    let hub = serve();
    let home = tempfile::tempdir().unwrap();
    let spec = format!("hf-hub:{REPO}");
    let args = [
        "predict",
        &photo(),
        "--pretrained",
        &spec,
        "--backend",
        "flex",
    ];
    let output = kiln_with_hub(&args, &hub, home.path(), false);
    assert!(output.status.success(), "{:?}", errors(&output));
    let expected: serde_json::Value =
        serde_json::from_slice(&hub_fixture("expected.json")).unwrap();
    let expected: Vec<(String, f64)> = expected["top5"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            let class = pair[0].as_u64().unwrap();
            (format!("class {class}"), pair[1].as_f64().unwrap() * 100.0)
        })
        .collect();
    let ours = top(&output);
    let names = |v: &[(String, f64)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&ours),
        names(&expected),
        "{ours:?} vs timm's {expected:?}"
    );
    // Printed to 0.01 of a percent; the resized pixels are Pillow's within one level.
    for ((_, p), (_, q)) in ours.iter().zip(&expected) {
        assert!((p - q).abs() <= 0.02, "{ours:?} vs timm's {expected:?}");
    }

    let requests = hub.requests().len();
    let offline = kiln_with_hub(&args, &hub, home.path(), true);
    assert!(offline.status.success(), "{:?}", errors(&offline));
    assert_eq!(top(&offline), ours);
    assert_eq!(
        hub.requests().len(),
        requests,
        "offline, nothing was requested"
    );
    let with_flag = [&args[..], &["--offline"]].concat();
    assert!(
        kiln_with_hub(&with_flag, &hub, home.path(), false)
            .status
            .success()
    );
}

/// An unknown repository, an architecture kiln does not build, a model name that contradicts
/// the weights, a torchvision tag that does not exist: one line each, naming it.
#[test]
fn bad_pretrained_names_are_one_line_each() {
    let hub = serve();
    let vit = br#"{"architecture": "vit_base_patch16_224", "num_classes": 1000}"#;
    hub.add(
        "timm/vit_base_patch16_224.augreg_in1k",
        "config.json",
        vit.to_vec(),
    );
    let home = tempfile::tempdir().unwrap();
    let image = photo();
    for (args, says) in [
        (
            vec!["--pretrained", "hf-hub:timm/not-a-model"],
            "no such model repository",
        ),
        (
            vec![
                "--pretrained",
                "hf-hub:timm/vit_base_patch16_224.augreg_in1k",
            ],
            "is a vit_base_patch16_224",
        ),
        (
            vec![
                "--pretrained",
                "hf-hub:timm/resnet18d.tiny_in1k",
                "--model",
                "resnet50",
            ],
            "holds weights for a resnet18d of width 8, but the model is a resnet50 of width 8",
        ),
        (
            vec![
                "--pretrained",
                "torchvision:IMAGENET1K_V3",
                "--model",
                "resnext50_32x4d",
            ],
            "has no weights `IMAGENET1K_V3`: choose IMAGENET1K_V1, IMAGENET1K_V2, DEFAULT",
        ),
        (
            vec!["--pretrained", "torchvision", "--model", "resnet50d"],
            "torchvision publishes no weights for resnet50d",
        ),
        (
            vec![
                "--pretrained",
                "torchvision",
                "--model",
                "resnext50_32x4d",
                "--offline",
            ],
            "place resnext50_32x4d-7cdf4587.pth in",
        ),
    ] {
        let mut all = vec!["predict", image.as_str(), "--backend", "flex"];
        all.extend(args.iter());
        let output = kiln_with_hub(&all, &hub, home.path(), false);
        assert!(!output.status.success(), "{args:?}");
        let lines = errors(&output);
        let text = lines.join("\n");
        assert!(text.contains(says), "{args:?}: {text}");
        assert!(!text.contains("panicked"), "{text}");
    }
}

/// Fine-tuning from the Hub in a config: `model.pretrained = "hf-hub:..."` with 3 classes
/// replaces the classifier and starts every other weight from the Hub's (frozen here, so they
/// stay so), and the run's `model.safetensors` has timm's names (`conv1.0`, `downsample.2`),
/// which timm's `load_state_dict` takes.
#[test]
fn fine_tuning_starts_from_the_hub_and_exports_timms_names() {
    let hub = serve();
    let home = tempfile::tempdir().unwrap();
    let runs = home.path().join("runs");
    let config = home.path().join("finetune.toml");
    std::fs::write(
        &config,
        format!(
            r#"
epochs = 1
batch_size = 4
[model]
name = "resnet18d"
width = 8
pretrained = "hf-hub:{REPO}"
freeze = ["conv1", "bn1", "layer1", "layer2", "layer3", "layer4"]
[data]
source = {{ kind = "synthetic", train_size = 8, val_size = 4, image_size = 32, num_classes = 3 }}
workers = 0
[optimizer]
name = "sgd"
lr = 0.01
[logging]
runs_dir = "{}"
"#,
            runs.display()
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let args = ["train", "--config", &config, "--backend", "flex"];
    let output = kiln_with_hub(&args, &hub, home.path(), false);
    assert!(output.status.success(), "{:?}", errors(&output));
    let run = std::fs::read_dir(&runs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let exported = std::fs::read(run.join("model.safetensors")).unwrap();
    let exported = safetensors::SafeTensors::deserialize(&exported).unwrap();
    let source = hub_fixture("model.safetensors");
    let source = safetensors::SafeTensors::deserialize(&source).unwrap();
    assert_eq!(exported.tensor("fc.weight").unwrap().shape(), [3, 64]);
    let mut names = exported.names();
    names.sort();
    let mut theirs = source.names();
    theirs.sort();
    assert_eq!(names, theirs, "timm's names, every one");
    for name in [
        "conv1.0.weight",
        "conv1.6.weight",
        "layer2.0.downsample.1.weight",
        "layer4.1.conv2.weight",
    ] {
        assert_eq!(
            exported.tensor(name).unwrap().data(),
            source.tensor(name).unwrap().data(),
            "{name} starts from the Hub's weights"
        );
    }

    // The config's network must be the one the weights are for.
    let wrong = [&args[..], &["--set", "model.name=\"resnet34d\""]].concat();
    let output = kiln_with_hub(&wrong, &hub, home.path(), false);
    assert!(!output.status.success());
    let text = errors(&output).join("\n");
    assert!(
        text.contains("holds weights for a resnet18d of width 8"),
        "{text}"
    );
}

/// `kiln summary` knows the family, with torchvision's and timm's counts.
#[test]
fn summary_knows_the_family() {
    for (model, parameters) in [
        ("resnext50_32x4d", "25,028,904"),
        ("wide_resnet50_2", "68,883,240"),
        ("resnet50d", "25,576,264"),
    ] {
        let output = common::kiln(&["summary", "--model", model]);
        assert!(output.status.success(), "{:?}", errors(&output));
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            text.starts_with(model) && text.contains(parameters),
            "{text}"
        );
    }
    let output = common::kiln(&["summary", "--model", "resnext50_32x4d", "--width", "3"]);
    assert!(!output.status.success());
    assert!(errors(&output).join("\n").contains("multiple of 2"));
}

/// `--pretrained torchvision` downloads from `$KILN_TORCHVISION_URL` (here a loopback server),
/// the file under torchvision's own name and path (`/models/resnet18-f37072fd.pth`); a file
/// whose bytes are not the ones its name's hash prefix says is refused in one line naming it,
/// and nothing is left in kiln's cache. (torchvision's real files cannot be served here: their
/// names carry their hashes; `pretrained.rs`' unit tests download a renamed fixture through
/// the same path to the end.)
#[test]
fn torchvision_weights_download_from_the_configured_server_and_are_checked() {
    use kiln_test_hub::Fault;
    let hub = TestHub::start();
    let served = std::fs::read(fixtures().join("resnet18_w4.pth")).unwrap();
    hub.add_static("/models/resnet18-f37072fd.pth", served, Fault::None);
    let home = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "predict",
            &photo(),
            "--model",
            "resnet18",
            "--pretrained",
            "torchvision",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_BACKTRACE")
        .env("KILN_CACHE_DIR", home.path().join("kiln"))
        .env("TORCH_HOME", home.path().join("torch"))
        .env("KILN_TORCHVISION_URL", format!("{}/models/", hub.endpoint))
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert_eq!(hub.requests(), ["/models/resnet18-f37072fd.pth"]);
    let errors = errors(&output);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("resnet18-f37072fd.pth"), "{errors:?}");
    let weights = home.path().join("kiln/weights");
    let left: Vec<_> = std::fs::read_dir(&weights)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
}
