//! burn-dataset's `Dataset` as the interface to kiln's data: every kiln source is a
//! `burn_dataset::Dataset<LabelledImage>` (so it can be used where burn expects a data set), and
//! [`FromBurn`] makes any `burn_dataset::Dataset<LabelledImage>` (an `InMemDataset`, a burn
//! user's own) a kiln [`Dataset`], which trains through kiln's loader.
//!
//! burn-dataset is the shape of a data set here, not a second pipeline: kiln's loader (seeded
//! per epoch and image, parallel, sharded over devices and machines, resumable at any batch)
//! stays the one that batches, and it works by index, which both traits give.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use image::RgbImage;

use crate::dataset::{Dataset, InMemory, SharedDataset, Subset};
use crate::huggingface::HuggingFace;
use crate::image_folder::ImageFolder;
use crate::image_io::decode_rgb;
use crate::shards::Shards;
use crate::synthetic::Synthetic;
use crate::{DataError, ImageLimits};

/// An image as a data set holds it: the bytes of an image file (PNG, JPEG, ...), decoded when
/// the loader needs it, or pixels already decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageData {
    Encoded(Arc<[u8]>),
    Pixels(RgbImage),
}

/// The item of kiln's data sets as burn-dataset sees them: an image and its class's index.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledImage {
    pub image: ImageData,
    pub label: usize,
}

impl ImageData {
    /// The pixels, decoding encoded bytes with kiln's decoders (PIL's conversions to RGB, the
    /// size limits that refuse a decompression bomb); `name` names the image in errors.
    pub fn decode(self, name: &str, limits: ImageLimits) -> Result<RgbImage, DataError> {
        match self {
            ImageData::Pixels(pixels) => Ok(pixels),
            ImageData::Encoded(bytes) => {
                let path = std::path::Path::new(name);
                if bytes.len() as u64 > limits.max_file_bytes {
                    return Err(DataError::Unreadable {
                        path: path.to_path_buf(),
                        reason: format!(
                            "the image is {} bytes, over the limit of {} (data.max_file_bytes raises it)",
                            bytes.len(),
                            limits.max_file_bytes
                        ),
                    });
                }
                decode_rgb(&bytes, path, limits)
            }
        }
    }
}

/// Item `index` of a kiln data set, decoded: `None` past its end and for an image that does not
/// decode (burn-dataset's `get` has no error; kiln's loader, which skips and counts such
/// images, reads the kiln trait instead).
fn item<D: Dataset + ?Sized>(dataset: &D, index: usize) -> Option<LabelledImage> {
    if index >= dataset.len() {
        return None;
    }
    let pixels = dataset.image(index).ok()?;
    Some(LabelledImage {
        image: ImageData::Pixels(pixels),
        label: dataset.label(index),
    })
}

/// `burn_dataset::Dataset<LabelledImage>` for kiln data set types. A blanket impl over every
/// `T: Dataset` is what the orphan rules forbid (burn-dataset's trait over a type parameter), so
/// each type is named.
macro_rules! burn_dataset_for {
    ($($kind:ty),* $(,)?) => {$(
        impl burn_dataset::Dataset<LabelledImage> for $kind {
            fn get(&self, index: usize) -> Option<LabelledImage> {
                item(self, index)
            }

            fn len(&self) -> usize {
                Dataset::len(self)
            }
        }
    )*};
}

// CIFAR and the digits are `InMemory`, a CSV's images an `ImageFolder`, a split a `Subset`.
burn_dataset_for!(
    InMemory,
    Subset,
    ImageFolder,
    Shards,
    Synthetic,
    HuggingFace,
    dyn Dataset,
);

/// What `Source::open` gives (`Splits`' parts) is a burn data set too.
impl burn_dataset::Dataset<LabelledImage> for SharedDataset {
    fn get(&self, index: usize) -> Option<LabelledImage> {
        item(self.as_ref(), index)
    }

    fn len(&self) -> usize {
        Dataset::len(self.as_ref())
    }
}

/// A burn-dataset `Dataset<LabelledImage>` with its class names, as a kiln [`Dataset`]: what
/// a burn user hands kiln's loader. `Arc::new(FromBurn::new(dataset, classes)?)` is a
/// [`SharedDataset`].
///
/// `get` is called once per image and epoch: an item's label is kept when its image is read,
/// so that the loader's `label` after `image` does not fetch (and decode) the item again.
pub struct FromBurn<D> {
    dataset: D,
    classes: Vec<String>,
    limits: ImageLimits,
    /// Each item's label once seen; `usize::MAX` before.
    labels: Vec<AtomicUsize>,
}

impl<D: burn_dataset::Dataset<LabelledImage>> FromBurn<D> {
    /// `dataset`, whose labels index `classes`. Encoded images are decoded within the default
    /// [`ImageLimits`] ([`FromBurn::with_limits`] sets others).
    pub fn new(dataset: D, classes: Vec<String>) -> Result<Self, DataError> {
        if classes.is_empty() {
            return Err(DataError::Invalid(
                "a burn data set handed to kiln needs its class names (one per label)".into(),
            ));
        }
        let labels = (0..dataset.len())
            .map(|_| AtomicUsize::new(usize::MAX))
            .collect();
        Ok(Self {
            dataset,
            classes,
            limits: ImageLimits::default(),
            labels,
        })
    }

    pub fn with_limits(self, limits: ImageLimits) -> Self {
        Self { limits, ..self }
    }

    /// The burn data set.
    pub fn inner(&self) -> &D {
        &self.dataset
    }

    fn checked_label(&self, index: usize, label: usize) -> Result<usize, DataError> {
        if label >= self.classes.len() {
            return Err(DataError::Invalid(format!(
                "item {index} of the burn data set has label {label}, past its {} class names ({}); give FromBurn one name per label",
                self.classes.len(),
                self.classes.join(", ")
            )));
        }
        if let Some(slot) = self.labels.get(index) {
            slot.store(label, Ordering::Relaxed);
        }
        Ok(label)
    }
}

impl<D: burn_dataset::Dataset<LabelledImage>> Dataset for FromBurn<D> {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn image(&self, index: usize) -> Result<RgbImage, DataError> {
        let name = self.describe(index);
        let Some(item) = self.dataset.get(index) else {
            return Err(DataError::Unreadable {
                path: name.into(),
                reason: "the burn data set's get returned None".into(),
            });
        };
        self.checked_label(index, item.label)?;
        item.image.decode(&name, self.limits)
    }

    /// The label seen with the image; an item never read is fetched for it (one `get`), and one
    /// that cannot be had is labelled 0 (the loader reads its image first, which fails).
    fn label(&self, index: usize) -> usize {
        match self.labels[index].load(Ordering::Relaxed) {
            usize::MAX => self
                .dataset
                .get(index)
                .and_then(|item| self.checked_label(index, item.label).ok())
                .unwrap_or(0),
            label => label,
        }
    }

    fn classes(&self) -> &[String] {
        &self.classes
    }

    fn describe(&self, index: usize) -> String {
        format!("item {index} of the burn data set")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_dataset::InMemDataset;

    fn png(colour: [u8; 3]) -> Arc<[u8]> {
        let mut bytes = Vec::new();
        RgbImage::from_pixel(3, 2, image::Rgb(colour))
            .write_to(
                &mut std::io::Cursor::new(&mut bytes),
                image::ImageFormat::Png,
            )
            .unwrap();
        bytes.into()
    }

    #[test]
    fn kiln_sets_are_burn_sets_and_back() {
        let synthetic = Synthetic::new(5, 4, 3, 2, 7).unwrap();
        let burn: &dyn burn_dataset::Dataset<LabelledImage> = &synthetic;
        assert_eq!(burn.len(), 5);
        let first = burn.get(0).unwrap();
        assert_eq!(first.label, synthetic.label(0));
        assert_eq!(first.image, ImageData::Pixels(synthetic.image(0).unwrap()));
        assert!(burn.get(5).is_none());
        // And back: the same images and labels through the adapter.
        let classes = synthetic.classes().to_vec();
        let back = FromBurn::new(synthetic, classes).unwrap();
        assert_eq!(Dataset::len(&back), 5);
        for i in 0..5 {
            assert_eq!(back.image(i).unwrap(), back.inner().image(i).unwrap());
            assert_eq!(back.label(i), back.inner().label(i));
        }
    }

    #[test]
    fn encoded_items_decode_and_bad_items_are_bad_images() {
        let items = vec![
            LabelledImage {
                image: ImageData::Encoded(png([10, 20, 30])),
                label: 1,
            },
            LabelledImage {
                image: ImageData::Encoded(Arc::from(&b"not an image"[..])),
                label: 0,
            },
            LabelledImage {
                image: ImageData::Pixels(RgbImage::new(3, 2)),
                label: 2,
            },
        ];
        let names = vec!["a".to_string(), "b".to_string()];
        let set = FromBurn::new(InMemDataset::new(items), names).unwrap();
        // Label before image: fetched once, then kept.
        assert_eq!(set.label(0), 1);
        assert_eq!(set.image(0).unwrap().get_pixel(2, 1).0, [10, 20, 30]);
        let bad = set.image(1).unwrap_err();
        assert!(bad.is_bad_image(), "{bad}");
        assert!(
            bad.to_string().contains("item 1 of the burn data set"),
            "{bad}"
        );
        // A label past the class names is the data set's error, not a skipped image.
        let past = set.image(2).unwrap_err();
        assert!(
            !past.is_bad_image() && past.to_string().contains("label 2"),
            "{past}"
        );
        assert!(FromBurn::new(InMemDataset::<LabelledImage>::new(vec![]), vec![]).is_err());
    }
}
