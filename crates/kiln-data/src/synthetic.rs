//! Random images and labels of any size and count, for benchmarks and smoke tests. Each class
//! has its own mean colour under the noise, so a model can learn it and a loss can fall.

use image::RgbImage;
use rand::Rng;

use crate::DataError;
use crate::dataset::Dataset;
use crate::seed::{Purpose, stream};

pub struct Synthetic {
    len: usize,
    /// The index of image 0 in the endless synthetic sequence, so that a validation set draws
    /// other images than the training set.
    first: usize,
    width: u32,
    height: u32,
    classes: Vec<String>,
    seed: u64,
}

impl Synthetic {
    pub fn new(
        len: usize,
        width: u32,
        height: u32,
        num_classes: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        if len == 0 || width == 0 || height == 0 || num_classes == 0 {
            return Err(DataError::Invalid(format!(
                "a synthetic data set needs at least one image, pixel and class; got {len} images of {width}x{height} in {num_classes} classes"
            )));
        }
        Ok(Self {
            len,
            first: 0,
            width,
            height,
            classes: (0..num_classes).map(|c| format!("class{c}")).collect(),
            seed,
        })
    }

    /// The same data set, starting `first` images further along.
    pub fn offset(self, first: usize) -> Self {
        Self { first, ..self }
    }

    fn class_colour(&self, label: usize) -> [u8; 3] {
        let mut rng = stream(self.seed, Purpose::Synthetic, u64::MAX, label as u64);
        [rng.random(), rng.random(), rng.random()]
    }
}

impl Dataset for Synthetic {
    fn len(&self) -> usize {
        self.len
    }

    fn image(&self, index: usize) -> Result<RgbImage, DataError> {
        let colour = self.class_colour(self.label(index));
        let index = (self.first + index) as u64;
        let mut rng = stream(self.seed, Purpose::Synthetic, index, 1);
        Ok(RgbImage::from_fn(self.width, self.height, |_, _| {
            image::Rgb(colour.map(|c| c.saturating_add_signed(rng.random_range(-48..=48))))
        }))
    }

    fn label(&self, index: usize) -> usize {
        let index = (self.first + index) as u64;
        stream(self.seed, Purpose::Synthetic, index, 0).random_range(0..self.classes.len())
    }

    fn classes(&self) -> &[String] {
        &self.classes
    }
}
