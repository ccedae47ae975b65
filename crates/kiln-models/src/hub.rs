//! Weights from the Hugging Face Hub by name, as timm names them (`hf-hub:timm/resnet50.a1_in1k`):
//! the repository's `config.json` (timm's: the architecture, the class count, and in
//! `pretrained_cfg` the eval transform) and its `model.safetensors`.
//!
//! Through the `hf-hub` crate (as candle uses it), into the cache `huggingface_hub` fills and
//! reads (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`:
//! `models--timm--resnet50.a1_in1k/{blobs,snapshots,refs}`), so models a timm user already has
//! are found there first and used offline. `HF_ENDPOINT` names another server (a mirror),
//! `HF_HUB_OFFLINE=1` forbids the network, `HF_TOKEN` (or the token `huggingface-cli login`
//! saved) authenticates. A safetensors blob is checked against its SHA-256 (its ETag on the Hub)
//! before use; a download that fails or arrives damaged leaves nothing in the cache.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{ApiBuilder, ApiError};
use hf_hub::{Cache, Repo};
use serde::Deserialize;

use crate::eval_transform::{EvalInterpolation, EvalSpec, IMAGENET_MEAN, IMAGENET_STD};
use crate::{MODEL_NAMES, ResNetConfig, Stem};

/// The files kiln reads from a repository.
const CONFIG: &str = "config.json";
const WEIGHTS: &str = "model.safetensors";

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(
        "hf-hub:{repo} is not a Hub model name: write hf-hub:<owner>/<model>, as timm does (hf-hub:timm/resnet50.a1_in1k)"
    )]
    InvalidRepo { repo: String },
    #[error(
        "hf-hub:{repo}: {file} is not in the Hugging Face cache ({}) and downloads are off ({why}); download it where there is network (`huggingface-cli download {repo}`, or timm.create_model(\"hf-hub:{repo}\", pretrained=True)) and copy that cache here, or set HF_HOME to it",
        cache.display()
    )]
    NotCached {
        repo: String,
        file: &'static str,
        cache: PathBuf,
        why: &'static str,
    },
    #[error(
        "hf-hub:{repo}: {endpoint} has no such model repository (HTTP {status}); check the name (timm's models are listed at https://huggingface.co/timm), or log in with `huggingface-cli login` (HF_TOKEN) if it is private or gated"
    )]
    UnknownRepo {
        repo: String,
        endpoint: String,
        status: u16,
    },
    #[error(
        "hf-hub:{repo} has no model.safetensors (HTTP {status}); kiln reads a Hub model's weights from safetensors only: pick a repository that has them (timm's do)"
    )]
    NoSafetensors { repo: String, status: u16 },
    #[error(
        "could not download {file} of hf-hub:{repo} from {endpoint} ({reason}); nothing was kept in the cache. Without network access set HF_HUB_OFFLINE=1 to use the cache only"
    )]
    Network {
        repo: String,
        file: &'static str,
        endpoint: String,
        reason: String,
    },
    #[error(
        "{file} of hf-hub:{repo} arrived with SHA-256 {actual}, the Hub says {expected}; it was removed from the cache (a proxy or a truncated transfer?): run again"
    )]
    Damaged {
        repo: String,
        file: &'static str,
        expected: String,
        actual: String,
    },
    #[error("hf-hub:{repo}: its config.json ({}) {reason}", path.display())]
    Config {
        repo: String,
        path: PathBuf,
        reason: String,
    },
    #[error(
        "hf-hub:{repo} is a {architecture} (its config.json's architecture), which kiln does not build; kiln builds {}",
        MODEL_NAMES.join(", ")
    )]
    Architecture { repo: String, architecture: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a Hub model repository holds for kiln: its weights and what its `config.json` says.
#[derive(Debug, Clone)]
pub struct HubModel {
    pub weights: PathBuf,
    pub config: HubConfig,
}

/// timm's `config.json`, as kiln reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct HubConfig {
    /// timm's architecture name (`resnet50d`).
    pub architecture: String,
    /// The network kiln builds for it: the architecture at the class count (and, for timm's
    /// reduced test models, the width) the file gives.
    pub model: ResNetConfig,
    /// `pretrained_cfg`'s eval transform, as timm's `create_transform(**resolve_data_config(..))`.
    pub eval: EvalSpec,
}

/// `config.json` as timm writes it (`timm.models._hub.save_config_for_hf`); keys kiln does not
/// use are ignored.
#[derive(Debug, Deserialize)]
struct ConfigFile {
    architecture: String,
    num_classes: Option<usize>,
    #[serde(default)]
    model_args: serde_json::Map<String, serde_json::Value>,
    pretrained_cfg: Option<PretrainedCfg>,
}

/// timm's `pretrained_cfg`: what `resolve_data_config` reads for the eval transform.
#[derive(Debug, Deserialize)]
struct PretrainedCfg {
    input_size: Option<[usize; 3]>,
    interpolation: Option<String>,
    crop_pct: Option<f64>,
    crop_mode: Option<String>,
    mean: Option<[f64; 3]>,
    std: Option<[f64; 3]>,
    num_classes: Option<usize>,
}

/// The Hugging Face cache as `huggingface_hub` finds it: `$HF_HUB_CACHE`, else `$HF_HOME/hub`,
/// else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
pub fn cache_dir() -> PathBuf {
    let env = |key| {
        std::env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("HF_HUB_CACHE")
        .or_else(|| env("HF_HOME").map(|p| p.join("hub")))
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("huggingface/hub")))
        .or_else(|| env("HOME").map(|p| p.join(".cache/huggingface/hub")))
        .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"))
}

/// The Hub's address: `$HF_ENDPOINT`, else `https://huggingface.co`.
pub fn endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .map(|e| e.trim_end_matches('/').to_string())
        .unwrap_or_else(|| "https://huggingface.co".into())
}

/// `HF_HUB_OFFLINE` as `huggingface_hub` reads it (1, ON, YES or TRUE).
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| ["1", "ON", "YES", "TRUE"].contains(&v.trim().to_uppercase().as_str()))
}

/// `repo`'s weights and config, from the Hugging Face cache or (where `download` allows and
/// `HF_HUB_OFFLINE` does not forbid it) from the Hub.
pub fn fetch(repo: &str, download: bool) -> Result<HubModel, HubError> {
    fetch_in(repo, &Place::from_env(download))
}

/// Where a repository's files are looked for and fetched from.
#[derive(Debug, Clone)]
pub struct Place {
    /// The Hugging Face cache ([`cache_dir`]).
    pub cache: PathBuf,
    /// The Hub's address ([`endpoint`]).
    pub endpoint: String,
    /// Why the network may not be used, if it may not.
    pub offline: Option<&'static str>,
}

impl Place {
    /// As the environment says (`HF_HUB_CACHE`, `HF_HOME`, `HF_ENDPOINT`, `HF_HUB_OFFLINE`), with
    /// downloads off where `download` is false.
    pub fn from_env(download: bool) -> Self {
        let offline = if offline() {
            Some("HF_HUB_OFFLINE is set")
        } else if !download {
            Some("--offline")
        } else {
            None
        };
        Place {
            cache: cache_dir(),
            endpoint: endpoint(),
            offline,
        }
    }
}

/// [`fetch`] from `place`.
pub fn fetch_in(repo: &str, place: &Place) -> Result<HubModel, HubError> {
    Client {
        repo: repo.to_string(),
        cache: place.cache.clone(),
        endpoint: place.endpoint.clone(),
        why_offline: place.offline,
    }
    .fetch()
}

/// One repository's files, as one request for them sees the environment.
struct Client {
    repo: String,
    cache: PathBuf,
    endpoint: String,
    /// Why the network may not be used, if it may not.
    why_offline: Option<&'static str>,
}

impl Client {
    fn fetch(&self) -> Result<HubModel, HubError> {
        check_repo_name(&self.repo)?;
        // The config first: an architecture kiln does not build is said before a weight download.
        let config_path = self.file(CONFIG)?;
        let config = read_config(&self.repo, &config_path)?;
        let weights = self.file(WEIGHTS)?;
        Ok(HubModel { weights, config })
    }

    /// `file` from the cache, else downloaded into it and checked.
    fn file(&self, file: &'static str) -> Result<PathBuf, HubError> {
        let repo = Repo::model(self.repo.clone());
        if let Some(path) = Cache::new(self.cache.clone()).repo(repo.clone()).get(file) {
            return self.checked(file, path);
        }
        if let Some(why) = self.why_offline {
            return Err(HubError::NotCached {
                repo: self.repo.clone(),
                file,
                cache: self.cache.clone(),
                why,
            });
        }
        let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
        let api = ApiBuilder::from_cache(Cache::new(self.cache.clone()))
            .with_endpoint(self.endpoint.clone())
            .with_progress(std::io::stderr().is_terminal())
            .with_token(token.or_else(|| Cache::new(self.cache.clone()).token()))
            .build()
            .map_err(|e| self.network(file, e))?;
        let downloaded = api.repo(repo).download(file);
        self.remove_partial_downloads();
        match downloaded {
            Ok(path) => self.checked(file, path),
            Err(error) => Err(self.download_error(file, error)),
        }
    }

    /// `path` (a snapshot's link into `blobs/`) where its blob holds what its name says: the
    /// Hub names a large file's blob by its SHA-256. A damaged blob is removed with its link.
    fn checked(&self, file: &'static str, path: PathBuf) -> Result<PathBuf, HubError> {
        let blob = std::fs::canonicalize(&path).map_err(|source| HubError::Io {
            path: path.clone(),
            source,
        })?;
        let expected = blob
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(str::to_lowercase);
        let Some(expected) = expected else {
            // A small file's blob is named by git's hash of it: JSON that parses is whole.
            return Ok(path);
        };
        let actual = kiln_download::sha256_file(&blob).map_err(|e| HubError::Io {
            path: blob.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        if actual == expected {
            return Ok(path);
        }
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&blob);
        Err(HubError::Damaged {
            repo: self.repo.clone(),
            file,
            expected,
            actual,
        })
    }

    /// hf-hub keeps an interrupted download as `blobs/<etag>.part` to resume it, and its lock
    /// as `blobs/<etag>.lock`; kiln does not resume, and leaves neither in the cache.
    fn remove_partial_downloads(&self) {
        let folder = Repo::model(self.repo.clone()).folder_name();
        let blobs = self.cache.join(folder).join("blobs");
        let Ok(entries) = std::fs::read_dir(&blobs) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "part" || e == "lock") {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    fn network(&self, file: &'static str, reason: impl std::fmt::Display) -> HubError {
        HubError::Network {
            repo: self.repo.clone(),
            file,
            endpoint: self.endpoint.clone(),
            reason: reason.to_string(),
        }
    }

    /// One line for what went wrong: no such repository, no safetensors, or the network.
    fn download_error(&self, file: &'static str, error: ApiError) -> HubError {
        if let ApiError::RequestError(request) = &error
            && let ureq::Error::Status(status, _) = **request
            && (status == 401 || status == 404)
        {
            return if file == WEIGHTS {
                HubError::NoSafetensors {
                    repo: self.repo.clone(),
                    status,
                }
            } else {
                HubError::UnknownRepo {
                    repo: self.repo.clone(),
                    endpoint: self.endpoint.clone(),
                    status,
                }
            };
        }
        self.network(file, error)
    }
}

/// `owner/name` (or a bare `name`) of the letters, digits, `-`, `_` and `.` the Hub allows.
fn check_repo_name(repo: &str) -> Result<(), HubError> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() <= 2 && parts.iter().all(|p| part_ok(p)) {
        Ok(())
    } else {
        Err(HubError::InvalidRepo {
            repo: repo.to_string(),
        })
    }
}

/// The network and eval transform `path` (a timm `config.json`) describes.
pub fn read_config(repo: &str, path: &Path) -> Result<HubConfig, HubError> {
    let error = |reason: String| HubError::Config {
        repo: repo.to_string(),
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(format!("cannot be read: {e}")))?;
    let file: ConfigFile =
        serde_json::from_str(&text).map_err(|e| error(format!("is not timm's config ({e})")))?;
    let mut model =
        ResNetConfig::from_name(&file.architecture).map_err(|_| HubError::Architecture {
            repo: repo.to_string(),
            architecture: file.architecture.clone(),
        })?;
    let cfg = file.pretrained_cfg.as_ref();
    let classes = file
        .num_classes
        .or_else(|| cfg.and_then(|c| c.num_classes))
        .unwrap_or(1000);
    model = model.with_num_classes(classes);
    model = apply_model_args(model, &file.model_args).map_err(error)?;
    let eval = eval_spec(cfg).map_err(error)?;
    Ok(HubConfig {
        architecture: file.architecture,
        model,
        eval,
    })
}

/// timm's `model_args` (the factory's arguments beyond the architecture's own): the stage
/// widths of a reduced model (`channels`, with the deep stem's `stem_width` half the first), and
/// the defaults timm records. Anything else is a network kiln does not build.
fn apply_model_args(
    mut model: ResNetConfig,
    args: &serde_json::Map<String, serde_json::Value>,
) -> Result<ResNetConfig, String> {
    use serde_json::Value;
    let mut stem_width = None;
    for (key, value) in args {
        match (key.as_str(), value) {
            ("num_classes", Value::Number(n)) if n.as_u64() == Some(model.num_classes as u64) => {}
            ("in_chans", Value::Number(n)) if n.as_u64() == Some(3) => {}
            ("global_pool", Value::String(s)) if s == "avg" => {}
            ("channels", Value::Array(channels)) => {
                let widths: Vec<u64> = channels.iter().filter_map(Value::as_u64).collect();
                let first = widths.first().copied().unwrap_or(0) as usize;
                if widths.len() != 4
                    || first == 0
                    || widths != [1, 2, 4, 8].map(|k| k * first as u64)
                {
                    return Err(format!(
                        "model_args.channels {value} are not a width and its double, fourfold and eightfold, as kiln's stages are"
                    ));
                }
                model = model.with_width(first);
            }
            ("stem_width", Value::Number(n)) => stem_width = n.as_u64().map(|n| n as usize),
            _ => {
                return Err(format!(
                    "has model_args {key} = {value}, which kiln's {} does not take",
                    model.name()
                ));
            }
        }
    }
    // timm's stem: `stem_width` wide, or the deep stem's (stem_width, stem_width, 2 stem_width);
    // kiln's stem ends at the first stage's width.
    let expected = match model.stem {
        Stem::Deep => model.width / 2,
        _ => 64,
    };
    if stem_width.is_some_and(|w| w != expected) || (model.stem != Stem::Deep && model.width != 64)
    {
        return Err(format!(
            "describes a stem of width {} before stages from {}, which kiln's {} does not build",
            stem_width.unwrap_or(expected),
            model.width,
            model.name()
        ));
    }
    Ok(model)
}

/// timm's eval transform from `pretrained_cfg` (`resolve_data_config`, then
/// `transforms_imagenet_eval`): resize the shorter side to `floor(size / crop_pct)` with the
/// given interpolation, center-crop `size`, normalize.
fn eval_spec(cfg: Option<&PretrainedCfg>) -> Result<EvalSpec, String> {
    let [_, height, width] = cfg.and_then(|c| c.input_size).unwrap_or([3, 224, 224]);
    if height != width {
        return Err(format!(
            "asks for {height}x{width} inputs; kiln's eval transform crops squares"
        ));
    }
    let crop_pct = cfg.and_then(|c| c.crop_pct).unwrap_or(0.875);
    if !(crop_pct > 0.0 && crop_pct <= 1.0) {
        return Err(format!("has crop_pct {crop_pct}, outside (0, 1]"));
    }
    let interpolation = match cfg
        .and_then(|c| c.interpolation.as_deref())
        .unwrap_or("bilinear")
    {
        "bilinear" => EvalInterpolation::Bilinear,
        "bicubic" => EvalInterpolation::Bicubic,
        other => {
            return Err(format!(
                "asks for {other} resizing; kiln resizes bilinear or bicubic"
            ));
        }
    };
    match cfg.and_then(|c| c.crop_mode.as_deref()).unwrap_or("center") {
        "center" => {}
        other => return Err(format!("asks for crop_mode {other}; kiln crops the center")),
    }
    let floats =
        |v: Option<[f64; 3]>, default: [f32; 3]| v.map_or(default, |v| v.map(|x| x as f32));
    Ok(EvalSpec {
        // timm: scale_size = math.floor(img_size / crop_pct)
        resize: (height as f64 / crop_pct).floor() as u32,
        crop: height as u32,
        interpolation,
        mean: floats(cfg.and_then(|c| c.mean), IMAGENET_MEAN),
        std: floats(cfg.and_then(|c| c.std), IMAGENET_STD),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_names_are_checked() {
        for good in ["timm/resnet50.a1_in1k", "timm/resnet50d.ra2_in1k", "gpt2"] {
            assert!(check_repo_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "timm/",
            "/resnet50",
            "timm/../x",
            "a/b/c",
            "timm/res net",
            "timm/.x",
        ] {
            assert!(check_repo_name(bad).is_err(), "{bad}");
        }
    }

    fn config(text: &str) -> Result<HubConfig, HubError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, text).unwrap();
        read_config("timm/x", &path)
    }

    /// timm's `resnet50d.ra2_in1k` config (224, crop_pct 0.875, bicubic): Resize(256) as timm's
    /// floor(224 / 0.875), CenterCrop(224).
    #[test]
    fn pretrained_cfg_sets_the_network_and_transform() {
        let found = config(
            r#"{"architecture": "resnet50d", "num_classes": 1000, "num_features": 2048,
                "pretrained_cfg": {"input_size": [3, 224, 224], "interpolation": "bicubic",
                "crop_pct": 0.875, "crop_mode": "center", "mean": [0.485, 0.456, 0.406],
                "std": [0.229, 0.224, 0.225], "num_classes": 1000}}"#,
        )
        .unwrap();
        assert_eq!(found.model, ResNetConfig::from_name("resnet50d").unwrap());
        assert_eq!(
            found.eval,
            EvalSpec {
                resize: 256,
                crop: 224,
                interpolation: EvalInterpolation::Bicubic,
                mean: [0.485, 0.456, 0.406],
                std: [0.229, 0.224, 0.225],
            }
        );
        // resnet50.a1_in1k: crop_pct 0.95 gives floor(235.79) = 235.
        let a1 = config(
            r#"{"architecture": "resnet50", "num_classes": 1000,
                "pretrained_cfg": {"input_size": [3, 224, 224], "interpolation": "bicubic", "crop_pct": 0.95}}"#,
        )
        .unwrap();
        assert_eq!((a1.eval.resize, a1.eval.crop), (235, 224));
        // A reduced timm model: its stage widths in model_args.
        let tiny = config(
            r#"{"architecture": "resnet18d", "num_classes": 10, "model_args": {"channels": [8, 16, 32, 64],
                "stem_width": 4, "num_classes": 10, "in_chans": 3, "global_pool": "avg"}}"#,
        )
        .unwrap();
        assert_eq!((tiny.model.width, tiny.model.num_classes), (8, 10));
        assert_eq!(tiny.eval.interpolation, EvalInterpolation::Bilinear);
    }

    #[test]
    fn configs_kiln_cannot_follow_are_one_line_each() {
        let message = |text: &str| config(text).unwrap_err().to_string();
        let vit = message(r#"{"architecture": "vit_base_patch16_224", "num_classes": 1000}"#);
        assert!(
            vit.contains("vit_base_patch16_224")
                && vit.contains("does not build")
                && vit.contains("resnet50d"),
            "{vit}"
        );
        let args = message(r#"{"architecture": "resnet50", "model_args": {"drop_rate": 0.2}}"#);
        assert!(args.contains("drop_rate"), "{args}");
        let mode =
            message(r#"{"architecture": "resnet50", "pretrained_cfg": {"crop_mode": "squash"}}"#);
        assert!(mode.contains("squash"), "{mode}");
        let nearest = message(
            r#"{"architecture": "resnet50", "pretrained_cfg": {"interpolation": "nearest"}}"#,
        );
        assert!(nearest.contains("nearest"), "{nearest}");
        let garbage = message("{not json");
        assert!(
            garbage.contains("config.json") && garbage.contains("timm/x"),
            "{garbage}"
        );
    }
}
