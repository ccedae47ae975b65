//! Pretrained weights by name: torchvision's ImageNet weights for every network of its
//! `resnet.py` (`torchvision`, `torchvision:IMAGENET1K_V2`), timm's from the Hugging Face Hub
//! (`hf-hub:timm/resnet50.a1_in1k`, see [`crate::hub`]), or a file. Each comes with the eval
//! transform it was published with.
//!
//! A torchvision file is looked for in kiln's cache (`$KILN_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`, under `weights/`), then in PyTorch's own hub
//! cache, so weights a user already has from torchvision are reused. torchvision names each file
//! with the first hex digits of its SHA-256, and every copy is checked against them before use.
//! Downloads come from `$KILN_TORCHVISION_URL` where it is set (a mirror), else
//! download.pytorch.org.

use std::path::{Path, PathBuf};

use kiln_download::{DownloadError, fetch, is_verified};

use crate::ResNetConfig;
use crate::eval_transform::EvalSpec;
use crate::hub::{self, HubError};

const BASE_URL: &str = "https://download.pytorch.org/models";

/// One of torchvision's published weights for a network.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TorchvisionWeights {
    /// torchvision's name of the network (`resnext50_32x4d`).
    pub model: &'static str,
    /// The `WeightsEnum` member (`IMAGENET1K_V1`).
    pub tag: &'static str,
    /// The file under `https://download.pytorch.org/models/`, its SHA-256 prefix in its name.
    pub file: &'static str,
    /// `ImageClassification`'s `resize_size` (the crop is 224 for all of them).
    pub resize: u32,
    /// ImageNet-1k validation top-1 and top-5, as torchvision publishes them.
    pub top1: f64,
    pub top5: f64,
    /// torchvision's `DEFAULT` for the network.
    pub default: bool,
}

impl TorchvisionWeights {
    /// The SHA-256 prefix torchvision puts in the file's name (`resnet18-f37072fd.pth`).
    pub fn hash(&self) -> &'static str {
        self.file
            .trim_end_matches(".pth")
            .rsplit('-')
            .next()
            .unwrap_or_default()
    }

    /// The eval transform published with the weights.
    pub fn eval(&self) -> EvalSpec {
        EvalSpec::torchvision(self.resize)
    }
}

const fn tv(
    model: &'static str,
    tag: &'static str,
    file: &'static str,
    resize: u32,
    top1: f64,
    top5: f64,
    default: bool,
) -> TorchvisionWeights {
    TorchvisionWeights {
        model,
        tag,
        file,
        resize,
        top1,
        top5,
        default,
    }
}

/// torchvision's ImageNet weights for the networks of its `resnet.py`, as `torchvision/models/
/// resnet.py` (0.29) lists them: URL, transform and accuracy.
pub const TORCHVISION_WEIGHTS: [TorchvisionWeights; 17] = [
    tv(
        "resnet18",
        "IMAGENET1K_V1",
        "resnet18-f37072fd.pth",
        256,
        69.758,
        89.078,
        true,
    ),
    tv(
        "resnet34",
        "IMAGENET1K_V1",
        "resnet34-b627a593.pth",
        256,
        73.314,
        91.420,
        true,
    ),
    tv(
        "resnet50",
        "IMAGENET1K_V1",
        "resnet50-0676ba61.pth",
        256,
        76.130,
        92.862,
        false,
    ),
    tv(
        "resnet50",
        "IMAGENET1K_V2",
        "resnet50-11ad3fa6.pth",
        232,
        80.858,
        95.434,
        true,
    ),
    tv(
        "resnet101",
        "IMAGENET1K_V1",
        "resnet101-63fe2227.pth",
        256,
        77.374,
        93.546,
        false,
    ),
    tv(
        "resnet101",
        "IMAGENET1K_V2",
        "resnet101-cd907fc2.pth",
        232,
        81.886,
        95.780,
        true,
    ),
    tv(
        "resnet152",
        "IMAGENET1K_V1",
        "resnet152-394f9c45.pth",
        256,
        78.312,
        94.046,
        false,
    ),
    tv(
        "resnet152",
        "IMAGENET1K_V2",
        "resnet152-f82ba261.pth",
        232,
        82.284,
        96.002,
        true,
    ),
    tv(
        "resnext50_32x4d",
        "IMAGENET1K_V1",
        "resnext50_32x4d-7cdf4587.pth",
        256,
        77.618,
        93.698,
        false,
    ),
    tv(
        "resnext50_32x4d",
        "IMAGENET1K_V2",
        "resnext50_32x4d-1a0047aa.pth",
        232,
        81.198,
        95.340,
        true,
    ),
    tv(
        "resnext101_32x8d",
        "IMAGENET1K_V1",
        "resnext101_32x8d-8ba56ff5.pth",
        256,
        79.312,
        94.526,
        false,
    ),
    tv(
        "resnext101_32x8d",
        "IMAGENET1K_V2",
        "resnext101_32x8d-110c445d.pth",
        232,
        82.834,
        96.228,
        true,
    ),
    tv(
        "resnext101_64x4d",
        "IMAGENET1K_V1",
        "resnext101_64x4d-173b62eb.pth",
        232,
        83.246,
        96.454,
        true,
    ),
    tv(
        "wide_resnet50_2",
        "IMAGENET1K_V1",
        "wide_resnet50_2-95faca4d.pth",
        256,
        78.468,
        94.086,
        false,
    ),
    tv(
        "wide_resnet50_2",
        "IMAGENET1K_V2",
        "wide_resnet50_2-9ba9bcbe.pth",
        232,
        81.602,
        95.758,
        true,
    ),
    tv(
        "wide_resnet101_2",
        "IMAGENET1K_V1",
        "wide_resnet101_2-32ee1156.pth",
        256,
        78.848,
        94.284,
        false,
    ),
    tv(
        "wide_resnet101_2",
        "IMAGENET1K_V2",
        "wide_resnet101_2-d733dc28.pth",
        232,
        82.510,
        96.020,
        true,
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum PretrainedError {
    #[error("torchvision has no pretrained ResNet-{0}")]
    UnknownDepth(usize),
    #[error("torchvision publishes no weights for {model}: it does for {}", torchvision_models().join(", "))]
    NoTorchvisionWeights { model: String },
    #[error("torchvision's {model} has no weights `{tag}`: choose {}", choices.join(", "))]
    UnknownTag {
        model: String,
        tag: String,
        choices: Vec<&'static str>,
    },
    #[error("no {model} weights in the cache and downloads are off; place {file} in {}", dir.display())]
    NotCached {
        model: String,
        file: &'static str,
        dir: PathBuf,
    },
    #[error(
        "{origin} holds weights for a {found}, but the model is a {asked}: set the model's name to \"{found_name}\" (model.name, or --model)"
    )]
    WrongModel {
        origin: String,
        found: String,
        found_name: String,
        asked: String,
    },
    #[error(transparent)]
    Download(#[from] DownloadError),
    #[error(transparent)]
    Hub(#[from] HubError),
}

/// The networks torchvision publishes ImageNet weights for.
fn torchvision_models() -> Vec<&'static str> {
    let mut models: Vec<&str> = TORCHVISION_WEIGHTS.iter().map(|w| w.model).collect();
    models.dedup();
    models
}

/// torchvision's weights for `model` (torchvision's name): `tag` one of its `WeightsEnum`'s
/// members or `DEFAULT` (torchvision's default, V2 where there is one); none is
/// `IMAGENET1K_V1`, kiln's `--pretrained torchvision`.
pub fn torchvision_weights_for(
    model: &str,
    tag: Option<&str>,
) -> Result<&'static TorchvisionWeights, PretrainedError> {
    let published: Vec<&'static TorchvisionWeights> = TORCHVISION_WEIGHTS
        .iter()
        .filter(|w| w.model == model)
        .collect();
    if published.is_empty() {
        return Err(PretrainedError::NoTorchvisionWeights {
            model: model.to_string(),
        });
    }
    let found = match tag {
        None => published.iter().find(|w| w.tag == "IMAGENET1K_V1"),
        Some("DEFAULT") => published.iter().find(|w| w.default),
        Some(tag) => published.iter().find(|w| w.tag == tag),
    };
    found.copied().ok_or_else(|| PretrainedError::UnknownTag {
        model: model.to_string(),
        tag: tag.unwrap_or_default().to_string(),
        choices: published.iter().map(|w| w.tag).chain(["DEFAULT"]).collect(),
    })
}

/// Where kiln keeps downloaded weights.
pub fn cache_dir() -> PathBuf {
    kiln_download::cache_root().join("weights")
}

/// PyTorch's hub cache, where torchvision puts the same files.
fn torch_hub_dir() -> Option<PathBuf> {
    let env = |key| {
        std::env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("TORCH_HOME")
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("torch")))
        .or_else(|| env("HOME").map(|p| p.join(".cache/torch")))
        .map(|p| p.join("hub/checkpoints"))
}

/// The file name and the SHA-256 prefix it carries of ResNet-`depth`'s `IMAGENET1K_V1`, e.g.
/// `("resnet18-f37072fd.pth", "f37072fd")`.
pub fn torchvision_file(depth: usize) -> Result<(&'static str, &'static str), PretrainedError> {
    let weights = torchvision_weights_for(&format!("resnet{depth}"), None)
        .map_err(|_| PretrainedError::UnknownDepth(depth))?;
    Ok((weights.file, weights.hash()))
}

/// A verified local copy of torchvision's ImageNet weights (`IMAGENET1K_V1`) for ResNet-`depth`,
/// downloading it into `cache` when `download` allows and no verified copy exists.
pub fn torchvision_weights(
    depth: usize,
    cache: &Path,
    download: bool,
) -> Result<PathBuf, PretrainedError> {
    let weights = torchvision_weights_for(&format!("resnet{depth}"), None)
        .map_err(|_| PretrainedError::UnknownDepth(depth))?;
    torchvision_copy(weights, cache, download)
}

/// A verified local copy of `weights`, from `cache`, PyTorch's hub cache, or downloaded into
/// `cache` when `download` allows.
pub fn torchvision_copy(
    weights: &TorchvisionWeights,
    cache: &Path,
    download: bool,
) -> Result<PathBuf, PretrainedError> {
    let places: Vec<PathBuf> = std::iter::once(cache.to_path_buf())
        .chain(torch_hub_dir())
        .collect();
    find_or_fetch(weights, &places, download, &torchvision_url())
}

/// Where torchvision's files are downloaded from: `$KILN_TORCHVISION_URL` (a mirror, or a test's
/// loopback server), else download.pytorch.org, as `HF_ENDPOINT` names the Hub.
fn torchvision_url() -> String {
    std::env::var("KILN_TORCHVISION_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .map(|url| url.trim_end_matches('/').to_string())
        .unwrap_or_else(|| BASE_URL.to_string())
}

/// The first verified copy in `places`, else a download from `base_url` into the first of them.
fn find_or_fetch(
    weights: &TorchvisionWeights,
    places: &[PathBuf],
    download: bool,
    base_url: &str,
) -> Result<PathBuf, PretrainedError> {
    let (file, hash) = (weights.file, weights.hash());
    let cache = places
        .first()
        .map(PathBuf::as_path)
        .unwrap_or(Path::new("."));
    for dir in places {
        let path = dir.join(file);
        if is_verified(&path, hash) {
            return Ok(path);
        }
    }
    if !download {
        return Err(PretrainedError::NotCached {
            model: format!("{} {}", weights.model, weights.tag),
            file,
            dir: cache.to_path_buf(),
        });
    }
    let dest = cache.join(file);
    fetch(&format!("{base_url}/{file}"), &dest, hash)?;
    Ok(dest)
}

/// Where pretrained weights come from, as `--pretrained` and `model.pretrained` spell them.
#[derive(Debug, Clone, PartialEq)]
pub enum Pretrained {
    /// torchvision's ImageNet weights for the network: `torchvision` (`IMAGENET1K_V1`),
    /// `torchvision:IMAGENET1K_V2`, `torchvision:DEFAULT`.
    Torchvision { tag: Option<String> },
    /// A model repository on the Hugging Face Hub, as timm names it: `hf-hub:timm/resnet50d.ra2_in1k`.
    Hub { repo: String },
    /// A torchvision or timm state dict, or a kiln export.
    File(PathBuf),
}

/// A pretrained source made local: the file, and what the source says about it.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub path: PathBuf,
    /// The network the weights are for, where the source says so (the Hub's `config.json`):
    /// its architecture and class count.
    pub model: Option<ResNetConfig>,
    /// The eval transform the weights were published with, where known.
    pub eval: Option<EvalSpec>,
    /// Where they came from, for messages (`torchvision resnet50 IMAGENET1K_V2`).
    pub source: String,
}

impl Fetched {
    /// Whether the weights are for `model` as far as their source says (the Hub's config names
    /// the architecture and, for reduced models, the width); one line naming both where not.
    pub fn check_model(&self, model: &ResNetConfig) -> Result<(), PretrainedError> {
        let Some(theirs) = &self.model else {
            return Ok(());
        };
        if theirs.name() == model.name() && theirs.width == model.width {
            return Ok(());
        }
        let describe = |m: &ResNetConfig| match m.width {
            64 => m.name(),
            width => format!("{} of width {width}", m.name()),
        };
        Err(PretrainedError::WrongModel {
            origin: self.source.clone(),
            found: describe(theirs),
            found_name: theirs.name(),
            asked: describe(model),
        })
    }
}

impl Pretrained {
    /// `torchvision`, `torchvision:<TAG>`, `hf-hub:<owner>/<name>`, or a path.
    pub fn parse(spec: &str) -> Self {
        if spec == "torchvision" {
            Pretrained::Torchvision { tag: None }
        } else if let Some(tag) = spec.strip_prefix("torchvision:") {
            Pretrained::Torchvision {
                tag: Some(tag.to_string()),
            }
        } else if let Some(repo) = spec.strip_prefix("hf-hub:") {
            Pretrained::Hub {
                repo: repo.to_string(),
            }
        } else {
            Pretrained::File(PathBuf::from(spec))
        }
    }

    /// The weights for the network named `model` (torchvision's are chosen by it; the Hub's
    /// say which network they are for), verified, from a cache or downloaded where `download`
    /// allows.
    pub fn fetch(&self, model: &str, download: bool) -> Result<Fetched, PretrainedError> {
        match self {
            Pretrained::Torchvision { tag } => {
                let weights = torchvision_weights_for(model, tag.as_deref())?;
                Ok(Fetched {
                    path: torchvision_copy(weights, &cache_dir(), download)?,
                    model: None,
                    eval: Some(weights.eval()),
                    source: format!("torchvision {} {}", weights.model, weights.tag),
                })
            }
            Pretrained::Hub { repo } => {
                let found = hub::fetch(repo, download)?;
                Ok(Fetched {
                    path: found.weights,
                    model: Some(found.config.model.clone()),
                    eval: Some(found.config.eval.clone()),
                    source: format!("hf-hub:{repo}"),
                })
            }
            Pretrained::File(path) => Ok(Fetched {
                path: path.clone(),
                model: None,
                eval: None,
                source: path.display().to_string(),
            }),
        }
    }
}

/// The 1000 ImageNet class names in torchvision's order.
pub fn imagenet_classes() -> Vec<&'static str> {
    include_str!("imagenet_classes.txt").lines().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MODEL_NAMES;

    #[test]
    fn file_names_carry_their_hash() {
        assert_eq!(
            torchvision_file(50).unwrap(),
            ("resnet50-0676ba61.pth", "0676ba61")
        );
        assert!(torchvision_file(20).is_err());
    }

    /// torchvision's own choices: V1 for kiln's `torchvision`, its `DEFAULT` V2 where there is
    /// one, V2's resize of 232, and one line naming the choices for a tag that does not exist.
    #[test]
    fn weights_are_chosen_by_model_and_tag() {
        let v1 = torchvision_weights_for("resnet50", None).unwrap();
        assert_eq!((v1.tag, v1.resize), ("IMAGENET1K_V1", 256));
        let v2 = torchvision_weights_for("resnet50", Some("IMAGENET1K_V2")).unwrap();
        assert_eq!(
            (v2.file, v2.hash(), v2.eval().resize),
            ("resnet50-11ad3fa6.pth", "11ad3fa6", 232)
        );
        let default = torchvision_weights_for("resnext50_32x4d", Some("DEFAULT")).unwrap();
        assert_eq!(default.tag, "IMAGENET1K_V2");
        // resnext101_64x4d has only V1, published with resize 232.
        let only = torchvision_weights_for("resnext101_64x4d", Some("DEFAULT")).unwrap();
        assert_eq!((only.tag, only.resize), ("IMAGENET1K_V1", 232));
        let err = torchvision_weights_for("resnet18", Some("IMAGENET1K_V2"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("IMAGENET1K_V1, DEFAULT"), "{err}");
        let err = torchvision_weights_for("resnet50d", None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("resnet50d") && err.contains("wide_resnet101_2"),
            "{err}"
        );
        // Every name in the table is a network kiln builds, with one default each.
        for weights in TORCHVISION_WEIGHTS {
            assert!(MODEL_NAMES.contains(&weights.model), "{}", weights.model);
            assert_eq!(weights.hash().len(), 8);
        }
        for model in torchvision_models() {
            let defaults = TORCHVISION_WEIGHTS
                .iter()
                .filter(|w| w.model == model && w.default);
            assert_eq!(defaults.count(), 1, "{model}");
        }
    }

    #[test]
    fn specs_parse() {
        assert_eq!(
            Pretrained::parse("torchvision"),
            Pretrained::Torchvision { tag: None }
        );
        assert_eq!(
            Pretrained::parse("torchvision:IMAGENET1K_V2"),
            Pretrained::Torchvision {
                tag: Some("IMAGENET1K_V2".into())
            }
        );
        assert_eq!(
            Pretrained::parse("hf-hub:timm/resnet50.a1_in1k"),
            Pretrained::Hub {
                repo: "timm/resnet50.a1_in1k".into()
            }
        );
        assert_eq!(
            Pretrained::parse("runs/x/model.safetensors"),
            Pretrained::File("runs/x/model.safetensors".into())
        );
    }

    #[test]
    fn cached_copies_are_used_only_when_their_hash_matches() {
        let dir = tempfile::tempdir().unwrap();
        let weights = torchvision_weights_for("resnet18", None).unwrap();
        std::fs::write(dir.path().join(weights.file), b"not the real weights").unwrap();
        let err = find_or_fetch(weights, &[dir.path().to_path_buf()], false, BASE_URL).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("resnet18-f37072fd.pth")
                && message.contains(&*dir.path().to_string_lossy()),
            "{message}"
        );
    }

    /// A torchvision file in PyTorch's hub cache layout is used as it is; one that is not
    /// there is downloaded (here from loopback) and checked against the hash in its name; a
    /// truncated or damaged download leaves nothing behind. The file is a small state dict
    /// named as torchvision names its files, its hash prefix computed here.
    #[test]
    fn torchvision_files_come_from_torchs_cache_or_a_checked_download() {
        use kiln_test_hub::{Fault, TestHub, sha256};
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/resnet18_w4.pth");
        let bytes = std::fs::read(fixture).unwrap();
        let file: &'static str =
            Box::leak(format!("resnet18_w4-{}.pth", &sha256(&bytes)[..8]).into_boxed_str());
        let weights = TorchvisionWeights {
            file,
            ..TORCHVISION_WEIGHTS[0]
        };
        let dir = tempfile::tempdir().unwrap();
        let (kiln, torch) = (
            dir.path().join("kiln"),
            dir.path().join("torch/hub/checkpoints"),
        );
        std::fs::create_dir_all(&torch).unwrap();
        std::fs::write(torch.join(file), &bytes).unwrap();
        let places = [kiln.clone(), torch.clone()];
        let found = find_or_fetch(&weights, &places, false, "http://127.0.0.1:9").unwrap();
        assert_eq!(found, torch.join(file));

        let hub = TestHub::start();
        let base = format!("{}/models", hub.endpoint);
        for fault in [Fault::Truncated, Fault::Corrupted] {
            hub.add_static(&format!("/models/{file}"), bytes.clone(), fault);
            let err =
                find_or_fetch(&weights, std::slice::from_ref(&kiln), true, &base).unwrap_err();
            assert!(err.to_string().contains(file), "{err}");
            let left: Vec<_> = std::fs::read_dir(&kiln).unwrap().collect();
            assert!(left.is_empty(), "{fault:?} left {left:?}");
        }
        hub.add_static(&format!("/models/{file}"), bytes.clone(), Fault::None);
        let downloaded = find_or_fetch(&weights, std::slice::from_ref(&kiln), true, &base).unwrap();
        assert_eq!(downloaded, kiln.join(file));
        assert_eq!(std::fs::read(downloaded).unwrap(), bytes);
    }

    #[test]
    fn imagenet_has_a_thousand_classes() {
        let classes = imagenet_classes();
        assert_eq!(classes.len(), 1000);
        assert_eq!(classes[0], "tench");
        assert_eq!(classes[999], "toilet tissue");
    }
}
