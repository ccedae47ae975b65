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
