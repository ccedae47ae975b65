use std::path::PathBuf;

/// Everything that can go wrong between a path on disk and a host batch. Each message names the
/// file or folder and, where there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read image {}: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: String },
    #[error("image {} is {width}x{height}, over the limit of {max} pixels a side; data.max_image_side raises it if the image is genuine", path.display())]
    TooLarge {
        path: PathBuf,
        width: u32,
        height: u32,
        max: u32,
    },
    #[error("{image} is {}x{}, which the transforms would resize to {}x{}, over the limit of {max} pixels; data.max_resize_pixels raises it, or crop such images first", from.0, from.1, to.0, to.1)]
    ResizeTooLarge {
        image: String,
        from: (u32, u32),
        to: (u32, u32),
        max: u64,
    },
    #[error("{}: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("{what} not found at {}: {hint}", path.display())]
    Missing {
        what: String,
        path: PathBuf,
        hint: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Download(#[from] kiln_download::DownloadError),
    #[error("{0}")]
    Invalid(String),
    #[error(
        "images in one batch have different sizes ({first:?} and {other:?}, width x height); end the transforms with a crop to a fixed size, such as center_crop or random_resized_crop"
    )]
    MixedSizes {
        first: (u32, u32),
        other: (u32, u32),
    },
    #[error("a data loader worker failed on batch {batch}: {reason}")]
    Worker { batch: usize, reason: String },
    #[error(
        "hf:{repo} is not a Hugging Face data set name: write repo = \"<owner>/<name>\", as the Hub names it (uoft-cs/cifar10)"
    )]
    HubName { repo: String },
    #[error(
        "hf:{repo}: the data set is not in the Hugging Face cache ({}) and downloads are off ({why}); download it where there is network (`huggingface-cli download --repo-type dataset {repo}`, or datasets.load_dataset(\"{repo}\")) and copy that cache here, or set HF_HOME to it",
        cache.display()
    )]
    HubNotCached {
        repo: String,
        cache: PathBuf,
        why: &'static str,
    },
    #[error(
        "hf:{repo}: {endpoint} has no such data set repository (HTTP {status}); check the name (the Hub lists data sets at https://huggingface.co/datasets), or log in with `huggingface-cli login` (HF_TOKEN) if it is private or gated"
    )]
    HubUnknownRepo {
        repo: String,
        endpoint: String,
        status: u16,
    },
    #[error(
        "could not download {file} of hf:{repo} from {endpoint} ({reason}); nothing was kept in the cache. Without network access set HF_HUB_OFFLINE=1 to use the cache only"
    )]
    HubNetwork {
        repo: String,
        file: String,
        endpoint: String,
        reason: String,
    },
    #[error(
        "{file} of hf:{repo} arrived with SHA-256 {actual}, the Hub says {expected}; it was removed from the cache (a proxy or a truncated transfer?): run again"
    )]
    HubDamaged {
        repo: String,
        file: String,
        expected: String,
        actual: String,
    },
    /// What the repository's files do not give: no parquet files, no such config, several.
    #[error("hf:{repo}: {what}")]
    HubLayout { repo: String, what: String },
    #[error(
        "hf:{repo} has no split `{split}` (its splits: {}); name one with data.source.{key} = \"...\"",
        found.join(", ")
    )]
    HubSplit {
        repo: String,
        split: String,
        found: Vec<String>,
        key: &'static str,
    },
    #[error(
        "{} has no image column (its columns: {}); name the column of images with data.source.image_column = \"...\"",
        file.display(),
        columns.join(", ")
    )]
    NoImageColumn { file: PathBuf, columns: Vec<String> },
    #[error(
        "{}: column `{column}` was taken as the labels ({taken}), but it is {found}, not a ClassLabel with class names; cast it in datasets (ds.cast_column(\"{column}\", ClassLabel(names=[...]))) and save the files again, or name the column of class labels with data.source.label_column = \"...\" (the columns: {})",
        file.display(),
        columns.join(", ")
    )]
    NotClassLabel {
        file: PathBuf,
        column: String,
        /// Why this column: `label_column names it`, `it is named label`.
        taken: &'static str,
        /// What it is instead: `a plain int64 (feature Value)`.
        found: String,
        columns: Vec<String>,
    },
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> DataError {
        let path = path.into();
        move |source| DataError::Io { path, source }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> DataError {
        DataError::Corrupt {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// Whether this is one bad image (skippable under `on_bad_image = "skip"`) rather than a
    /// broken data set or a bug.
    pub fn is_bad_image(&self) -> bool {
        matches!(
            self,
            DataError::Unreadable { .. }
                | DataError::TooLarge { .. }
                | DataError::ResizeTooLarge { .. }
        )
    }
}
