//! The Hugging Face Hub client against a Hub on loopback (`kiln_test_hub`: `resolve/main`
//! paths, a CDN redirect with `X-Linked-Etag`, a renamed repository's relative redirect, the
//! Hub's status codes) and against a cache laid out as `huggingface_hub` lays it out. The model
//! is timm's own `save_for_hf` of a small resnet18d (`tests/fixtures/make_hub_fixtures.py`).

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use kiln_models::hub::{HubError, Place, fetch_in};
use kiln_models::{ResNetConfig, weights};
use kiln_test_hub::{COMMIT, Fault, TestHub, sha256};

const REPO: &str = "timm/resnet18d.tiny_in1k";

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/hub/resnet18d_w8")
        .join(name);
    std::fs::read(path).unwrap()
}

/// A Hub serving the fixture as `repo`.
fn hub_with(repo: &str) -> TestHub {
    let hub = TestHub::start();
    hub.add(repo, "config.json", fixture("config.json"));
    hub.add(repo, "model.safetensors", fixture("model.safetensors"));
    hub
}

fn online(hub: &TestHub, cache: &Path) -> Place {
    Place {
        cache: cache.to_path_buf(),
        endpoint: hub.endpoint.clone(),
        offline: None,
    }
}

fn offline(cache: &Path) -> Place {
    Place {
        cache: cache.to_path_buf(),
        endpoint: "http://127.0.0.1:9".into(),
        offline: Some("HF_HUB_OFFLINE is set"),
    }
}

/// Every file under `dir`, relative, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() && !path.is_symlink() {
                stack.push(path);
            } else {
                found.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    found
}

/// Downloaded into `huggingface_hub`'s layout (blobs by ETag, a snapshot of links per commit,
/// `refs/main`), loaded into the network its config names, and found there again offline
/// without a request.
#[test]
fn a_hub_model_is_downloaded_into_huggingface_hubs_layout_and_reused_offline() {
    let hub = hub_with(REPO);
    let cache = tempfile::tempdir().unwrap();
    let model = fetch_in(REPO, &online(&hub, cache.path())).unwrap();
    assert_eq!(model.config.architecture, "resnet18d");
    assert_eq!(
        model.config.model,
        ResNetConfig::from_name("resnet18d")
            .unwrap()
            .with_width(8)
            .with_num_classes(10)
    );
    assert_eq!((model.config.eval.resize, model.config.eval.crop), (71, 64));

    let repo = cache.path().join("models--timm--resnet18d.tiny_in1k");
    let sha = sha256(&fixture("model.safetensors"));
    let found = files(&repo);
    assert!(found.contains(&format!("blobs/{sha}")), "{found:?}");
    assert!(found.contains(&format!("snapshots/{COMMIT}/model.safetensors")));
    assert!(found.contains(&format!("snapshots/{COMMIT}/config.json")));
    assert!(found.contains(&"refs/main".to_string()));
    assert_eq!(found.len(), 5, "nothing else, no .part or .lock: {found:?}");
    let link = repo.join(format!("snapshots/{COMMIT}/model.safetensors"));
    assert!(link.is_symlink());
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    assert_eq!(model.weights, link);

    let (loaded, report) = weights::load(
        model
            .config
            .model
            .init::<Flex>(&Default::default())
            .unwrap(),
        &model.weights,
    )
    .unwrap();
    assert_eq!(report, weights::LoadReport::default());
    assert_eq!(loaded.num_classes(), 10);

    let requests = hub.requests().len();
    let again = fetch_in(REPO, &offline(cache.path())).unwrap();
    assert_eq!(again.weights, model.weights);
    let online_again = fetch_in(REPO, &online(&hub, cache.path())).unwrap();
    assert_eq!(online_again.weights, model.weights);
    assert_eq!(hub.requests().len(), requests, "the cache answered");
}

/// A cache that timm filled (`huggingface_hub`'s layout, written here by hand as it writes it:
/// blobs named by ETag, relative links in the snapshot) is read offline.
#[test]
fn a_cache_laid_out_by_huggingface_hub_is_read_offline() {
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--timm--resnet18d.ra2_in1k");
    let commit = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join(format!("snapshots/{commit}"))).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    for (file, blob) in [
        ("model.safetensors", sha256(&fixture("model.safetensors"))),
        (
            "config.json",
            "4f1c2a9e0b7d3c5a6e8f9a0b1c2d3e4f5a6b7c8d".to_string(),
        ),
    ] {
        std::fs::write(repo.join("blobs").join(&blob), fixture(file)).unwrap();
        std::os::unix::fs::symlink(
            format!("../../blobs/{blob}"),
            repo.join(format!("snapshots/{commit}/{file}")),
        )
        .unwrap();
    }
    let model = fetch_in("timm/resnet18d.ra2_in1k", &offline(cache.path())).unwrap();
    assert_eq!(model.config.model.name(), "resnet18d");

    // Not there at all: one line naming the repository, the cache and the way out.
    let err = fetch_in("timm/resnet50.a1_in1k", &offline(cache.path()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("hf-hub:timm/resnet50.a1_in1k")
            && err.contains("HF_HUB_OFFLINE")
            && err.contains(&*cache.path().to_string_lossy()),
        "{err}"
    );
}

/// A renamed repository answers with a relative redirect to its new name, as the Hub does.
#[test]
fn a_renamed_repository_is_followed() {
    let hub = hub_with("timm/resnet18d.new_name");
    hub.rename("timm/resnet18d.old_name", "timm/resnet18d.new_name");
    let cache = tempfile::tempdir().unwrap();
    let model = fetch_in("timm/resnet18d.old_name", &online(&hub, cache.path())).unwrap();
    assert_eq!(model.config.model.width, 8);
}

/// Each bad input is one line naming the repository and what to do, and leaves the cache with
/// no weights in it.
#[test]
fn unknown_repos_missing_safetensors_and_foreign_architectures_are_one_line_each() {
    let hub = TestHub::start();
    hub.add("timm/no-weights", "config.json", fixture("config.json"));
    hub.add("timm/no-weights", "pytorch_model.bin", b"not read".to_vec());
    let vit = br#"{"architecture": "vit_base_patch16_224", "num_classes": 1000}"#;
    hub.add(
        "timm/vit_base_patch16_224.augreg_in21k",
        "config.json",
        vit.to_vec(),
    );
    hub.add(
        "timm/vit_base_patch16_224.augreg_in21k",
        "model.safetensors",
        vec![0; 64],
    );
    let cache = tempfile::tempdir().unwrap();
    let place = online(&hub, cache.path());

    let err = fetch_in("timm/no-such-model", &place).unwrap_err();
    assert!(
        matches!(err, HubError::UnknownRepo { status: 401, .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("hf-hub:timm/no-such-model") && text.contains("no such model repository"),
        "{text}"
    );

    let err = fetch_in("timm/no-weights", &place).unwrap_err().to_string();
    assert!(err.contains("has no model.safetensors"), "{err}");

    let err = fetch_in("timm/vit_base_patch16_224.augreg_in21k", &place)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is a vit_base_patch16_224") && err.contains("resnet50d"),
        "{err}"
    );
    assert!(
        !hub.requests()
            .iter()
            .any(|r| r.contains("vit") && r.contains("safetensors")),
        "the weights of an architecture kiln cannot build are not downloaded"
    );

    let err = fetch_in("timm/../etc", &place).unwrap_err().to_string();
    assert!(err.contains("not a Hub model name"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let left = files(cache.path());
    assert!(
        !left
            .iter()
            .any(|f| f.ends_with("model.safetensors") || f.ends_with(".part")),
        "{left:?}"
    );
}

/// A download cut short, or one whose bytes differ from the hash the Hub gave: an error naming
/// the file, and nothing of the weights in the cache (no blob, no `.part`, no snapshot link),
/// so the next run downloads again and succeeds.
#[test]
fn truncated_or_damaged_downloads_leave_nothing_in_the_cache() {
    for fault in [Fault::Truncated, Fault::Corrupted] {
        let hub = TestHub::start();
        hub.add(REPO, "config.json", fixture("config.json"));
        hub.add_with(
            REPO,
            "model.safetensors",
            fixture("model.safetensors"),
            fault,
        );
        let cache = tempfile::tempdir().unwrap();
        let err = fetch_in(REPO, &online(&hub, cache.path())).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("model.safetensors") && text.contains(REPO),
            "{fault:?}: {text}"
        );
        let left = files(cache.path());
        let sha = sha256(&fixture("model.safetensors"));
        let kept: Vec<&String> = left
            .iter()
            .filter(|f| {
                f.contains(&sha)
                    || f.ends_with("model.safetensors")
                    || f.ends_with(".part")
                    || f.ends_with(".lock")
            })
            .collect();
        assert!(kept.is_empty(), "{fault:?} left {kept:?} in {left:?}");

        hub.add(REPO, "model.safetensors", fixture("model.safetensors"));
        let model = fetch_in(REPO, &online(&hub, cache.path())).unwrap();
        assert!(model.weights.exists(), "{fault:?}: the next run succeeds");
    }
}

/// The environment as `huggingface_hub` reads it. The only test here that reads it.
#[test]
fn the_environment_names_the_cache_the_endpoint_and_offline() {
    use kiln_models::hub::{cache_dir, endpoint, offline};
    // SAFETY (edition 2024's unsafe env): no other test of this binary reads these variables.
    unsafe {
        std::env::remove_var("HF_HUB_CACHE");
        std::env::set_var("HF_HOME", "/data/hf");
        std::env::set_var("HF_ENDPOINT", "http://mirror.example/");
        std::env::set_var("HF_HUB_OFFLINE", "1");
    }
    assert_eq!(cache_dir(), PathBuf::from("/data/hf/hub"));
    assert_eq!(endpoint(), "http://mirror.example");
    assert!(offline());
    let place = Place::from_env(true);
    assert_eq!(place.offline, Some("HF_HUB_OFFLINE is set"));
    unsafe {
        std::env::set_var("HF_HUB_CACHE", "/elsewhere");
        std::env::set_var("HF_HUB_OFFLINE", "0");
    }
    assert_eq!(cache_dir(), PathBuf::from("/elsewhere"));
    assert!(!offline());
    assert_eq!(Place::from_env(false).offline, Some("--offline"));
    unsafe {
        for key in ["HF_HUB_CACHE", "HF_HOME", "HF_ENDPOINT", "HF_HUB_OFFLINE"] {
            std::env::remove_var(key);
        }
    }
    assert_eq!(endpoint(), "https://huggingface.co");
}

/// A Hub model's weights that do not fit the network its config names (here, a config that
/// says resnet34d over resnet18d's weights): the load lists the keys and shapes.
#[test]
fn weights_of_the_wrong_shapes_are_listed() {
    let hub = TestHub::start();
    let config = String::from_utf8(fixture("config.json"))
        .unwrap()
        .replace("\"resnet18d\"", "\"resnet34d\"");
    hub.add(REPO, "config.json", config.into_bytes());
    hub.add(REPO, "model.safetensors", fixture("model.safetensors"));
    let cache = tempfile::tempdir().unwrap();
    let model = fetch_in(REPO, &online(&hub, cache.path())).unwrap();
    let built = model
        .config
        .model
        .init::<Flex>(&Default::default())
        .unwrap();
    let err = weights::load(built, &model.weights)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing keys (80)") && err.contains("layer1.2.bn1.weight"),
        "{err}"
    );
}
