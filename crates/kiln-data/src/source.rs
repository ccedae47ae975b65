//! Which data set a run trains on, as a config writes it, and opening it into train and
//! validation parts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::cifar::{self, Cifar};
use crate::csv_labels;
use crate::dataset::{Dataset, SharedDataset, split};
use crate::huggingface::{self, HubSettings};
use crate::image_folder::ImageFolder;
use crate::shards::{self, Shards};
use crate::synthetic::Synthetic;
use crate::{DataError, ImageLimits, digits, registry};

/// A data set, written in a config as a table with a `kind`, for example
/// `{ kind = "cifar10", root = "data", download = true }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Source {
    /// CIFAR-10 under `root` (torchvision's `./data` layout, either format).
    Cifar10 {
        #[serde(default = "default_root")]
        root: PathBuf,
        #[serde(default)]
        download: bool,
    },
    Cifar100 {
        #[serde(default = "default_root")]
        root: PathBuf,
        #[serde(default)]
        download: bool,
    },
    /// `train/<class>/<image>`; validation from `val`, or a seeded `val_fraction` of `train`.
    ImageFolder {
        train: PathBuf,
        #[serde(default)]
        val: Option<PathBuf>,
        #[serde(default)]
        val_fraction: Option<f64>,
    },
    /// A CSV of image paths (relative to `root`, by default the CSV's folder) and labels, as
    /// Kaggle ships data sets; validation from `val` (another such file) or a seeded
    /// `val_fraction`. `path_column` and `label_column` name the header's columns.
    Csv {
        file: PathBuf,
        #[serde(default)]
        root: Option<PathBuf>,
        #[serde(default)]
        val: Option<PathBuf>,
        #[serde(default)]
        val_fraction: Option<f64>,
        #[serde(default = "default_path_column")]
        path_column: String,
        #[serde(default = "default_label_column")]
        label_column: String,
    },
    /// WebDataset's tar shards (`key.jpg` + `key.cls` members), named with brace ranges
    /// (`data/train-{000000..000127}.tar`), as `kiln shard` writes them; `val` likewise.
    Shards {
        train: String,
        #[serde(default)]
        val: Option<String>,
    },
    /// A Hugging Face data set (`repo = "uoft-cs/cifar10"`): its parquet files, from the
    /// Hugging Face cache or downloaded into it. `train` and `val` name splits (`train`; then
    /// `validation`, else `test`, else none), or `val_fraction` holds part of `train` out;
    /// `config` picks one of several; `image_column` and `label_column` are found from the
    /// features (`Image`, `ClassLabel`) when not given.
    #[serde(rename = "huggingface")]
    HuggingFace {
        repo: String,
        #[serde(default = "default_revision")]
        revision: String,
        #[serde(default)]
        config: Option<String>,
        #[serde(default = "default_train_split")]
        train: String,
        #[serde(default)]
        val: Option<String>,
        #[serde(default)]
        val_fraction: Option<f64>,
        #[serde(default)]
        image_column: Option<String>,
        #[serde(default)]
        label_column: Option<String>,
    },
    /// A data set the program registered under `name` ([`crate::register`]): a burn-dataset
    /// `Dataset` through [`crate::FromBurn`], or any kiln data set built in code.
    Registered { name: String },
    /// The 8x8 handwritten digits shipped with kiln: 1,500 train, 297 validation.
    Digits {},
    /// Random images whose classes differ in mean colour.
    Synthetic {
        #[serde(default = "default_synthetic_train")]
        train_size: usize,
        #[serde(default = "default_synthetic_val")]
        val_size: usize,
        #[serde(default = "default_synthetic_side")]
        image_size: u32,
        #[serde(default = "default_synthetic_classes")]
        num_classes: usize,
    },
}

fn default_root() -> PathBuf {
    PathBuf::from("data")
}

fn default_path_column() -> String {
    "filename".into()
}

fn default_label_column() -> String {
    "label".into()
}

fn default_revision() -> String {
    "main".into()
}

fn default_train_split() -> String {
    "train".into()
}

fn default_synthetic_train() -> usize {
    1024
}

fn default_synthetic_val() -> usize {
    256
}

fn default_synthetic_side() -> u32 {
    32
}

fn default_synthetic_classes() -> usize {
    10
}

/// An opened data set: what to train on and, when there is one, what to validate on.
#[derive(Clone)]
pub struct Splits {
    pub train: SharedDataset,
    pub val: Option<SharedDataset>,
}

impl Source {
    /// The side of every image, where the data set fixes it (CIFAR, digits, synthetic); `None`
    /// for an image folder, whose images come in any size.
    pub fn image_size(&self) -> Option<(u32, u32)> {
        match self {
            Source::Cifar10 { .. } | Source::Cifar100 { .. } => Some((32, 32)),
            Source::Digits {} => Some((8, 8)),
            Source::Synthetic { image_size, .. } => Some((*image_size, *image_size)),
            Source::ImageFolder { .. }
            | Source::Csv { .. }
            | Source::Shards { .. }
            | Source::HuggingFace { .. }
            | Source::Registered { .. } => None,
        }
    }

    /// The number of classes without opening the data: known for the built-in sets, the class
    /// folders of an image folder's `train`. `None` where that folder cannot be read.
    pub fn class_count(&self) -> Option<usize> {
        match self {
            Source::Cifar10 { .. } | Source::Digits {} => Some(10),
            Source::Cifar100 { .. } => Some(100),
            Source::Synthetic { num_classes, .. } => Some(*num_classes),
            Source::Csv { file, .. } => {
                Some(csv_labels::classes(file, &self.columns()?).ok()?.len())
            }
            Source::Shards { train, .. } => Some(shard_manifest(train)?.classes.len()),
            Source::HuggingFace { .. } => Some(self.peek_hub()?.0.len()),
            Source::Registered { name } => Some(registry::registered(name)?.train.classes().len()),
            Source::ImageFolder { train, .. } => {
                let entries = std::fs::read_dir(train).ok()?;
                Some(
                    entries
                        .filter_map(Result::ok)
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .count(),
                )
            }
        }
    }

    /// The number of training images, without decoding any: fixed for the built-in sets, the
    /// image files under an image folder's `train` (less its `val_fraction`). `None` where that
    /// folder cannot be read.
    pub fn train_size(&self) -> Option<usize> {
        match self {
            Source::Cifar10 { .. } | Source::Cifar100 { .. } => Some(50_000),
            Source::Digits {} => Some(digits::TRAIN),
            Source::Synthetic { train_size, .. } => Some(*train_size),
            Source::ImageFolder {
                train,
                val_fraction,
                ..
            } => {
                let files = ImageFolder::count(train)?;
                Some(less_held_out(files, *val_fraction))
            }
            Source::Csv {
                file, val_fraction, ..
            } => {
                let rows = csv_labels::count(file, &self.columns()?).ok()?;
                Some(less_held_out(rows, *val_fraction))
            }
            Source::Shards { train, .. } => {
                let files = shards::expand(train).ok()?;
                let manifest = shard_manifest(train)?;
                let names: Vec<String> = files
                    .iter()
                    .filter_map(|f| Some(f.file_name()?.to_string_lossy().into_owned()))
                    .collect();
                // Only where the manifest lists every shard of the pattern.
                let listed: Vec<_> = manifest
                    .splits
                    .values()
                    .flat_map(|s| &s.shards)
                    .filter(|s| names.contains(&s.file))
                    .collect();
                (listed.len() == names.len()).then(|| listed.iter().map(|s| s.samples).sum())
            }
            Source::HuggingFace { val_fraction, .. } => {
                Some(less_held_out(self.peek_hub()?.1, *val_fraction))
            }
            Source::Registered { name } => Some(registry::registered(name)?.train.len()),
        }
    }

    /// A Hugging Face source's request of its repository.
    fn hub_request(&self) -> Option<huggingface::Request<'_>> {
        let Source::HuggingFace {
            repo,
            revision,
            config,
            train,
            val,
            val_fraction,
            image_column,
            label_column,
        } = self
        else {
            return None;
        };
        let val = match (val, val_fraction) {
            (Some(name), _) => huggingface::Val::Named(name),
            (None, Some(_)) => huggingface::Val::None,
            (None, None) => huggingface::Val::Default,
        };
        Some(huggingface::Request {
            repo,
            revision,
            config: config.as_deref(),
            train,
            val,
            columns: huggingface::ParquetColumns {
                image: image_column.clone(),
                label: label_column.clone(),
            },
        })
    }

    /// A Hugging Face source's class names and training rows, from the cache's footers.
    fn peek_hub(&self) -> Option<(Vec<String>, usize)> {
        huggingface::peek(&self.hub_request()?, &HubSettings::from_env().cache)
    }

    /// A CSV source's columns.
    fn columns(&self) -> Option<csv_labels::Columns<'_>> {
        match self {
            Source::Csv {
                path_column,
                label_column,
                ..
            } => Some(csv_labels::Columns {
                path: path_column,
                label: label_column,
            }),
            _ => None,
        }
    }

    /// Opens the data set: reads CIFAR into memory (downloading it if allowed), lists an image
    /// folder, or builds the shipped or synthetic set. `seed` drives a `val_fraction` split.
    /// A Hugging Face set is looked for and fetched where the environment says
    /// ([`HubSettings::from_env`]).
    pub fn open(&self, seed: u64, limits: ImageLimits) -> Result<Splits, DataError> {
        self.open_with(seed, limits, &HubSettings::from_env())
    }

    /// [`Source::open`] with the Hugging Face cache and Hub given.
    pub fn open_with(
        &self,
        seed: u64,
        limits: ImageLimits,
        hub: &HubSettings,
    ) -> Result<Splits, DataError> {
        match self {
            Source::Registered { name } => registry::registered(name).ok_or_else(|| {
                let names = registry::names();
                DataError::Invalid(format!(
                    "data.source names the registered data set `{name}`, which this process has not registered ({}); a program registers it with kiln_data::register(\"{name}\", splits) before training, and again before resuming the run",
                    if names.is_empty() {
                        "it has registered none".to_string()
                    } else {
                        format!("it has {}", names.join(", "))
                    }
                ))
            }),
            Source::HuggingFace {
                val, val_fraction, ..
            } => {
                if val.is_some() && val_fraction.is_some() {
                    return Err(DataError::Invalid(
                        "huggingface: give either val (a split) or val_fraction, not both".into(),
                    ));
                }
                let request = self.hub_request().expect("a Hugging Face source");
                let (train, val) = huggingface::open(&request, hub, limits)?;
                let train: SharedDataset = Arc::new(train);
                match val_fraction {
                    Some(fraction) => {
                        let (train, val) = split(train, *fraction, seed)?;
                        Ok(Splits {
                            train,
                            val: Some(val),
                        })
                    }
                    None => Ok(Splits {
                        train,
                        val: val.map(|v| Arc::new(v) as SharedDataset),
                    }),
                }
            }
            Source::Cifar10 { root, download } | Source::Cifar100 { root, download } => {
                let which = match self {
                    Source::Cifar10 { .. } => Cifar::Cifar10,
                    _ => Cifar::Cifar100,
                };
                let sets = cifar::open(which, root, *download)?;
                Ok(Splits {
                    train: Arc::new(sets.train),
                    val: Some(Arc::new(sets.test)),
                })
            }
            Source::ImageFolder {
                train,
                val,
                val_fraction,
            } => {
                let train_set = Arc::new(ImageFolder::open(train, limits)?);
                let classes = train_set.classes().to_vec();
                let open_val = |val: &Path| -> Result<SharedDataset, DataError> {
                    let val_set = ImageFolder::open(val, limits)?;
                    if val_set.classes() != classes {
                        return Err(DataError::Invalid(format!(
                            "the class folders of {} ({}) differ from those of {} ({}); labels would not match",
                            val.display(),
                            val_set.classes().join(", "),
                            train.display(),
                            classes.join(", ")
                        )));
                    }
                    Ok(Arc::new(val_set))
                };
                held_out(
                    train_set,
                    val.as_deref(),
                    open_val,
                    *val_fraction,
                    seed,
                    "image_folder",
                    "a folder",
                )
            }
            Source::Csv {
                file,
                root,
                val,
                val_fraction,
                ..
            } => {
                let columns = self.columns().expect("a CSV source has columns");
                let root = root
                    .clone()
                    .unwrap_or_else(|| file.parent().unwrap_or(Path::new(".")).to_path_buf());
                let train = Arc::new(csv_labels::open(file, &root, &columns, None, limits)?);
                let classes = train.classes().to_vec();
                let open_val = |val: &Path| -> Result<SharedDataset, DataError> {
                    let val_set = csv_labels::open(val, &root, &columns, Some(&classes), limits)?;
                    Ok(Arc::new(val_set))
                };
                held_out(
                    train,
                    val.as_deref(),
                    open_val,
                    *val_fraction,
                    seed,
                    "csv",
                    "a CSV file",
                )
            }
            Source::Shards { train, val } => {
                let train = Shards::open(train, limits)?;
                let val = match val {
                    Some(val) => Some(Arc::new(Shards::open_with(
                        val,
                        Some(train.classes()),
                        limits,
                    )?) as SharedDataset),
                    None => None,
                };
                Ok(Splits {
                    train: Arc::new(train),
                    val,
                })
            }
            Source::Digits {} => {
                let (train, val) = digits::splits();
                Ok(Splits {
                    train,
                    val: Some(val),
                })
            }
            Source::Synthetic {
                train_size,
                val_size,
                image_size,
                num_classes,
            } => {
                let side = *image_size;
                let train = Synthetic::new(*train_size, side, side, *num_classes, seed)?;
                // Validation images are other draws of the same class colours.
                let val = (*val_size > 0)
                    .then(|| Synthetic::new(*val_size, side, side, *num_classes, seed))
                    .transpose()?
                    .map(|set| Arc::new(set.offset(*train_size)) as SharedDataset);
                Ok(Splits {
                    train: Arc::new(train),
                    val,
                })
            }
        }
    }
}

/// The manifest beside the first shard of `pattern`.
fn shard_manifest(pattern: &str) -> Option<shards::Manifest> {
    let files = shards::expand(pattern).ok()?;
    shards::Manifest::beside(files.first()?)
}

/// `files` less the part a `val_fraction` holds out.
fn less_held_out(files: usize, val_fraction: Option<f64>) -> usize {
    let held_out = (files as f64 * val_fraction.unwrap_or(0.0)).round() as usize;
    files - held_out.min(files)
}

/// `train` with its validation part: the set at `val` (opened by `open_val`), a seeded
/// `val_fraction` of `train`, or none; a `kind` of source given both is an error.
fn held_out(
    train: SharedDataset,
    val: Option<&Path>,
    open_val: impl FnOnce(&Path) -> Result<SharedDataset, DataError>,
    val_fraction: Option<f64>,
    seed: u64,
    kind: &str,
    what: &str,
) -> Result<Splits, DataError> {
    match (val, val_fraction) {
        (Some(_), Some(_)) => Err(DataError::Invalid(format!(
            "{kind}: give either val ({what}) or val_fraction, not both"
        ))),
        (Some(val), None) => Ok(Splits {
            train,
            val: Some(open_val(val)?),
        }),
        (None, Some(fraction)) => {
            let (train, val) = split(train, fraction, seed)?;
            Ok(Splits {
                train,
                val: Some(val),
            })
        }
        (None, None) => Ok(Splits { train, val: None }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Config {
        source: Source,
    }

    #[test]
    fn sources_parse_from_toml_and_unknown_keys_are_named() {
        let config: Config =
            toml::from_str("source = { kind = \"cifar10\", download = true }").unwrap();
        assert_eq!(
            config.source,
            Source::Cifar10 {
                root: "data".into(),
                download: true
            }
        );
        let err = toml::from_str::<Config>("source = { kind = \"digits\", root = \"x\" }")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("root"), "{err}");
        let err = toml::from_str::<Config>("source = { kind = \"mnist\" }")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("mnist"), "{err}");
    }

    #[test]
    fn hugging_face_sources_take_the_hubs_defaults_and_round_trip() {
        let config: Config =
            toml::from_str("source = { kind = \"huggingface\", repo = \"uoft-cs/cifar10\" }")
                .unwrap();
        let Source::HuggingFace {
            repo,
            revision,
            train,
            val,
            ..
        } = &config.source
        else {
            panic!("{:?}", config.source);
        };
        assert_eq!(
            (repo.as_str(), revision.as_str(), train.as_str(), val),
            ("uoft-cs/cifar10", "main", "train", &None)
        );
        assert_eq!(config.source.image_size(), None);
        // As a run's config.toml records it.
        #[derive(Serialize)]
        struct Saved<'a> {
            source: &'a Source,
        }
        let text = toml::to_string(&Saved {
            source: &config.source,
        })
        .unwrap();
        assert!(text.contains("kind = \"huggingface\""), "{text}");
        assert_eq!(
            toml::from_str::<Config>(&text).unwrap().source,
            config.source
        );
        let err = toml::from_str::<Config>(
            "source = { kind = \"huggingface\", repo = \"x/y\", split = \"train\" }",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("split"), "{err}");
    }

    #[test]
    fn a_csv_source_reads_its_rows_beside_the_images_and_holds_out_a_fraction() {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = String::from("image,class\n");
        for i in 0..8 {
            let name = format!("img{i}.png");
            image::RgbImage::new(2, 2)
                .save(dir.path().join(&name))
                .unwrap();
            rows += &format!("{name},{}\n", ["b", "a"][i % 2]);
        }
        let file = dir.path().join("train.csv");
        std::fs::write(&file, rows).unwrap();
        let text = format!(
            "source = {{ kind = \"csv\", file = {:?}, val_fraction = 0.25, path_column = \"image\", label_column = \"class\" }}",
            file.display().to_string()
        );
        let source = toml::from_str::<Config>(&text).unwrap().source;
        assert_eq!(
            (source.class_count(), source.train_size()),
            (Some(2), Some(6))
        );
        let splits = source.open(3, ImageLimits::default()).unwrap();
        let val = splits.val.unwrap();
        assert_eq!((splits.train.len(), val.len()), (6, 2));
        assert_eq!(splits.train.classes(), ["a", "b"]);
        // The same seed holds out the same images.
        let again = source.open(3, ImageLimits::default()).unwrap().val.unwrap();
        assert_eq!(again.describe(0), val.describe(0));
    }

    #[test]
    fn synthetic_sets_split_into_train_and_validation() {
        let source = Source::Synthetic {
            train_size: 20,
            val_size: 5,
            image_size: 6,
            num_classes: 3,
        };
        let splits = source.open(1, ImageLimits::default()).unwrap();
        let val = splits.val.unwrap();
        assert_eq!((splits.train.len(), val.len()), (20, 5));
        assert_eq!(splits.train.image(0).unwrap().dimensions(), (6, 6));
        assert!(val.label(4) < 3);
        // Same seed, same data; validation images are not copies of training ones.
        let again = source.open(1, ImageLimits::default()).unwrap();
        assert_eq!(
            again.train.image(3).unwrap(),
            splits.train.image(3).unwrap()
        );
        assert_ne!(val.image(0).unwrap(), splits.train.image(0).unwrap());
    }
}
