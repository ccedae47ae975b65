//! What a data set is to the loader: a length, an image and a label per index, class names.

use std::sync::Arc;

use image::RgbImage;
use rand::seq::SliceRandom;

use crate::DataError;
use crate::seed::{Purpose, stream};

/// A labelled image collection. `image` may decode a file, so it may fail for one index; the
/// loader then skips that image or stops, as configured.
pub trait Dataset: Send + Sync {
    fn len(&self) -> usize;
    fn image(&self, index: usize) -> Result<RgbImage, DataError>;
    fn label(&self, index: usize) -> usize;
    fn classes(&self) -> &[String];

    /// How a message names image `index`: its file where it has one.
    fn describe(&self, index: usize) -> String {
        format!("image {index}")
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file image `index` is decoded from, where it is one file of its own (an image
    /// folder's), so that `kiln shard` can keep its bytes.
    fn file(&self, index: usize) -> Option<std::path::PathBuf> {
        let _ = index;
        None
    }

    /// Image `index`'s encoded bytes and their format's file extension, where the data set
    /// holds them in memory (a Hugging Face set's), so that `kiln shard` keeps them as they are
    /// rather than writing the decoded pixels again as PNG.
    fn encoded(&self, index: usize) -> Option<(Vec<u8>, &'static str)> {
        let _ = index;
        None
    }
}

/// A data set shared between the loader's threads.
pub type SharedDataset = Arc<dyn Dataset>;

/// Images held decoded in memory, all of one size (CIFAR, the digits): `pixels` is
/// `len * height * width * 3` bytes, HWC.
pub struct InMemory {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
    pub labels: Vec<u16>,
    pub classes: Vec<String>,
}

impl Dataset for InMemory {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn image(&self, index: usize) -> Result<RgbImage, DataError> {
        let size = (self.width * self.height * 3) as usize;
        let bytes = self.pixels[index * size..(index + 1) * size].to_vec();
        Ok(RgbImage::from_raw(self.width, self.height, bytes).expect("size checked on load"))
    }

    fn label(&self, index: usize) -> usize {
        self.labels[index] as usize
    }

    fn classes(&self) -> &[String] {
        &self.classes
    }
}

/// A view of some of another data set's indices (a train/validation split).
pub struct Subset {
    pub inner: SharedDataset,
    pub indices: Vec<usize>,
}

impl Dataset for Subset {
    fn len(&self) -> usize {
        self.indices.len()
    }

    fn image(&self, index: usize) -> Result<RgbImage, DataError> {
        self.inner.image(self.indices[index])
    }

    fn label(&self, index: usize) -> usize {
        self.inner.label(self.indices[index])
    }

    fn describe(&self, index: usize) -> String {
        self.inner.describe(self.indices[index])
    }

    fn file(&self, index: usize) -> Option<std::path::PathBuf> {
        self.inner.file(self.indices[index])
    }

    fn encoded(&self, index: usize) -> Option<(Vec<u8>, &'static str)> {
        self.inner.encoded(self.indices[index])
    }

    fn classes(&self) -> &[String] {
        self.inner.classes()
    }
}

/// Splits a data set in two by a seeded shuffle: `(train, validation)`, the validation part
/// holding `round(len * val_fraction)` images (at least one of each part when possible).
pub fn split(
    dataset: SharedDataset,
    val_fraction: f64,
    seed: u64,
) -> Result<(SharedDataset, SharedDataset), DataError> {
    if !(val_fraction > 0.0 && val_fraction < 1.0) {
        return Err(DataError::Invalid(format!(
            "val_fraction must lie strictly between 0 and 1, got {val_fraction}"
        )));
    }
    let len = dataset.len();
    let val = ((len as f64 * val_fraction).round() as usize).clamp(1, len.saturating_sub(1));
    let mut order: Vec<usize> = (0..len).collect();
    order.shuffle(&mut stream(seed, Purpose::Split, 0, 0));
    let (val_indices, train_indices) = order.split_at(val);
    let part = |indices: &[usize]| -> SharedDataset {
        let mut indices = indices.to_vec();
        indices.sort_unstable();
        Arc::new(Subset {
            inner: dataset.clone(),
            indices,
        })
    };
    Ok((part(train_indices), part(val_indices)))
}
