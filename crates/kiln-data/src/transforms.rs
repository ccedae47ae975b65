//! torchvision's transforms on host images (8-bit RGB), matching their arithmetic on PIL images:
//! the functions here are the deterministic operations, [`Transform`] is one configured step and
//! [`Pipeline`] a validated list of them, as a config file writes it.
//!
//! Random transforms draw from the `rng` they are given; the loader seeds one per (epoch,
//! image), so augmentation does not depend on which worker thread ran it.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::RgbImage;
use rand::Rng;
use rand::seq::SliceRandom;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::augment::{self, AutoAugmentPolicy, Interpolation, Sampling};
pub use crate::color::{adjust_brightness, adjust_contrast, adjust_hue, adjust_saturation};

/// ImageNet's per-channel mean and standard deviation, as torchvision's weights expect.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// One step of a pipeline, written in a config as `{ op = "resize", size = 256 }`. Names and
/// defaults are torchvision's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Transform {
    /// `Resize(size, interpolation)`: the shorter side becomes `size`, antialiased as Pillow
    /// resamples (`interpolation` "bilinear", torchvision's default, or "bicubic", timm's).
    Resize {
        size: u32,
        #[serde(default, skip_serializing_if = "Resample::is_bilinear")]
        interpolation: Resample,
    },
    /// `CenterCrop(size)`, padding with black when the image is smaller.
    CenterCrop { size: u32 },
    /// `RandomResizedCrop(size, scale, ratio)`.
    RandomResizedCrop {
        size: u32,
        #[serde(default = "default_scale")]
        scale: [f64; 2],
        #[serde(default = "default_ratio")]
        ratio: [f64; 2],
    },
    /// `RandomCrop(size, padding)`, black padding; an image still smaller than `size` after the
    /// padding is padded up to it (torchvision's `pad_if_needed`).
    RandomCrop {
        size: u32,
        #[serde(default)]
        padding: u32,
    },
    /// `RandomHorizontalFlip(p)`.
    RandomHorizontalFlip {
        #[serde(default = "default_flip_p")]
        p: f64,
    },
    /// `ColorJitter(brightness, contrast, saturation, hue)`: each factor is drawn from
    /// `[max(0, 1 - x), 1 + x]` (hue from `[-hue, hue]`), applied in a random order; 0 leaves
    /// that adjustment out.
    ColorJitter {
        #[serde(default)]
        brightness: f64,
        #[serde(default)]
        contrast: f64,
        #[serde(default)]
        saturation: f64,
        #[serde(default)]
        hue: f64,
    },
    /// `TrivialAugmentWide(num_magnitude_bins, interpolation, fill)`: one operation at a
    /// random magnitude. `interpolation` ("nearest" or "bilinear") and `fill` (an RGB colour)
    /// are the geometric operations', as for the two policies below.
    TrivialAugmentWide {
        #[serde(default = "default_bins")]
        num_magnitude_bins: usize,
        #[serde(default)]
        interpolation: Interpolation,
        #[serde(default)]
        fill: [u8; 3],
    },
    /// `RandAugment(num_ops, magnitude, num_magnitude_bins, interpolation, fill)`.
    RandAugment {
        #[serde(default = "default_num_ops")]
        num_ops: usize,
        #[serde(default = "default_magnitude")]
        magnitude: usize,
        #[serde(default = "default_bins")]
        num_magnitude_bins: usize,
        #[serde(default)]
        interpolation: Interpolation,
        #[serde(default)]
        fill: [u8; 3],
    },
    /// `AutoAugment(policy, interpolation, fill)`, `policy` one of "imagenet", "cifar10",
    /// "svhn".
    AutoAugment {
        #[serde(default = "default_policy")]
        policy: AutoAugmentPolicy,
        #[serde(default)]
        interpolation: Interpolation,
        #[serde(default)]
        fill: [u8; 3],
    },
    /// `ToTensor()`: CHW floats in [0, 1]. Implied at the end of every pipeline.
    ToTensor,
    /// `Normalize(mean, std)`, after `ToTensor`.
    Normalize { mean: [f32; 3], std: [f32; 3] },
    /// `RandomErasing(p, scale, ratio, value)`, after `ToTensor` (torchvision's recipes put it
    /// after `Normalize`): with chance `p`, a box of `scale` of the area and aspect `ratio` set
    /// to `value` (a number, one per channel, or `"random"`: standard normal noise).
    RandomErasing {
        #[serde(default = "default_erasing_p")]
        p: f64,
        #[serde(default = "default_erasing_scale")]
        scale: [f64; 2],
        #[serde(default = "default_erasing_ratio")]
        ratio: [f64; 2],
        #[serde(default)]
        value: ErasingValue,
    },
}

/// How `Resize` resamples: Pillow's antialiased filters, as torchvision runs them on PIL images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resample {
    /// `InterpolationMode.BILINEAR`: Pillow's triangle filter.
    #[default]
    Bilinear,
    /// `InterpolationMode.BICUBIC`: Pillow's cubic filter (a = -0.5).
    Bicubic,
}

impl Resample {
    fn is_bilinear(&self) -> bool {
        *self == Resample::Bilinear
    }

    /// fast_image_resize's filter that computes Pillow's (its Catmull-Rom is Pillow's bicubic).
    fn filter(self) -> FilterType {
        match self {
            Resample::Bilinear => FilterType::Bilinear,
            Resample::Bicubic => FilterType::CatmullRom,
        }
    }
}

/// What `random_erasing` writes into its box.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ErasingValue {
    Number(f32),
    Channels([f32; 3]),
    /// Only `"random"`.
    Random(String),
}

impl Default for ErasingValue {
    fn default() -> Self {
        ErasingValue::Number(0.0)
    }
}

fn default_erasing_p() -> f64 {
    0.5
}

fn default_erasing_scale() -> [f64; 2] {
    [0.02, 0.33]
}

fn default_erasing_ratio() -> [f64; 2] {
    [0.3, 3.3]
}

fn default_bins() -> usize {
    31
}

fn default_num_ops() -> usize {
    2
}

fn default_magnitude() -> usize {
    9
}

fn default_policy() -> AutoAugmentPolicy {
    AutoAugmentPolicy::Imagenet
}

fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}

fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}

fn default_flip_p() -> f64 {
    0.5
}

impl Transform {
    fn check(&self) -> Result<(), String> {
        let positive = |name: &str, size: u32| match size {
            0 => Err(format!("{name}: size must be at least 1")),
            _ => Ok(()),
        };
        match *self {
            Transform::Resize { size, .. } => positive("resize", size),
            Transform::CenterCrop { size } => positive("center_crop", size),
            Transform::RandomCrop { size, .. } => positive("random_crop", size),
            Transform::RandomResizedCrop { size, scale, ratio } => {
                positive("random_resized_crop", size)?;
                if !(scale[0] > 0.0 && scale[0] <= scale[1]) {
                    return Err(format!(
                        "random_resized_crop: scale must satisfy 0 < min <= max, got {scale:?}"
                    ));
                }
                if !(ratio[0] > 0.0 && ratio[0] <= ratio[1]) {
                    return Err(format!(
                        "random_resized_crop: ratio must satisfy 0 < min <= max, got {ratio:?}"
                    ));
                }
                Ok(())
            }
            Transform::RandomHorizontalFlip { p } if !(0.0..=1.0).contains(&p) => Err(format!(
                "random_horizontal_flip: p must lie in [0, 1], got {p}"
            )),
            Transform::ColorJitter {
                brightness,
                contrast,
                saturation,
                hue,
            } => {
                for (name, value) in [
                    ("brightness", brightness),
                    ("contrast", contrast),
                    ("saturation", saturation),
                ] {
                    if !(value >= 0.0 && value.is_finite()) {
                        return Err(format!(
                            "color_jitter: {name} must be 0 or more, got {value}"
                        ));
                    }
                }
                if !(0.0..=0.5).contains(&hue) {
                    return Err(format!("color_jitter: hue must lie in [0, 0.5], got {hue}"));
                }
                Ok(())
            }
            Transform::TrivialAugmentWide {
                num_magnitude_bins, ..
            } if num_magnitude_bins < 2 => Err(format!(
                "trivial_augment_wide: num_magnitude_bins must be at least 2, got {num_magnitude_bins}"
            )),
            Transform::RandAugment {
                num_ops,
                magnitude,
                num_magnitude_bins,
                ..
            } => {
                if num_magnitude_bins < 2 {
                    return Err(format!(
                        "rand_augment: num_magnitude_bins must be at least 2, got {num_magnitude_bins}"
                    ));
                }
                if magnitude >= num_magnitude_bins {
                    return Err(format!(
                        "rand_augment: magnitude must be below num_magnitude_bins ({num_magnitude_bins}), got {magnitude}"
                    ));
                }
                if !(1..=16).contains(&num_ops) {
                    return Err(format!(
                        "rand_augment: num_ops must lie in [1, 16], got {num_ops}"
                    ));
                }
                Ok(())
            }
            Transform::Normalize { std, .. } if std.contains(&0.0) => {
                Err(format!("normalize: std must not be 0, got {std:?}"))
            }
            Transform::RandomErasing {
                p,
                scale,
                ratio,
                ref value,
            } => {
                if !(0.0..=1.0).contains(&p) {
                    return Err(format!("random_erasing: p must lie in [0, 1], got {p}"));
                }
                if !(0.0 <= scale[0] && scale[0] <= scale[1] && scale[1] <= 1.0) {
                    return Err(format!(
                        "random_erasing: scale must satisfy 0 <= min <= max <= 1, got {scale:?}"
                    ));
                }
                if !(ratio[0] > 0.0 && ratio[0] <= ratio[1] && ratio[1].is_finite()) {
                    return Err(format!(
                        "random_erasing: ratio must satisfy 0 < min <= max, got {ratio:?}"
                    ));
                }
                match value {
                    ErasingValue::Random(word) if word != "random" => Err(format!(
                        "random_erasing: value must be a number, three numbers or \"random\", got \"{word}\""
                    )),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// Applies an image-to-image step (everything but `ToTensor` and `Normalize`).
    fn apply(&self, image: RgbImage, rng: &mut impl Rng) -> RgbImage {
        match *self {
            Transform::Resize {
                size,
                interpolation,
            } => resize_shorter_side_with(&image, size, interpolation),
            Transform::CenterCrop { size } => center_crop(&image, size),
            Transform::RandomResizedCrop { size, scale, ratio } => {
                let (top, left, height, width) = random_resized_crop_box(&image, scale, ratio, rng);
                let cropped = crop(&image, left as i64, top as i64, width, height);
                resize_exact(&cropped, size, size)
            }
            Transform::RandomCrop { size, padding } => random_crop(&image, size, padding, rng),
            Transform::RandomHorizontalFlip { p } => {
                if rng.random::<f64>() < p {
                    image::imageops::flip_horizontal(&image)
                } else {
                    image
                }
            }
            Transform::ColorJitter {
                brightness,
                contrast,
                saturation,
                hue,
            } => color_jitter(image, [brightness, contrast, saturation, hue], rng),
            Transform::TrivialAugmentWide {
                num_magnitude_bins,
                interpolation,
                fill,
            } => {
                let sampling = Sampling {
                    interpolation,
                    fill,
                };
                augment::trivial_augment_wide(&image, num_magnitude_bins, sampling, rng)
            }
            Transform::RandAugment {
                num_ops,
                magnitude,
                num_magnitude_bins,
                interpolation,
                fill,
            } => {
                let sampling = Sampling {
                    interpolation,
                    fill,
                };
                augment::rand_augment(image, num_ops, magnitude, num_magnitude_bins, sampling, rng)
            }
            Transform::AutoAugment {
                policy,
                interpolation,
                fill,
            } => augment::auto_augment(
                image,
                policy,
                Sampling {
                    interpolation,
                    fill,
                },
                rng,
            ),
            Transform::ToTensor | Transform::Normalize { .. } | Transform::RandomErasing { .. } => {
                image
            }
        }
    }
}

/// A checked list of transforms: image steps first, then `ToTensor` (implied if absent), then at
/// most one `Normalize`, as torchvision requires.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    image_steps: Vec<Transform>,
    normalize: Option<([f32; 3], [f32; 3])>,
    /// The `random_erasing` steps, each with whether it comes before `normalize`.
    erasing: Vec<(Transform, bool)>,
    /// The most pixels any step may make ([`Pipeline::too_large`]).
    max_pixels: u64,
}

/// 64 megapixels (192 MiB of RGB): a resize may make no larger image unless told to.
pub const DEFAULT_MAX_PIXELS: u64 = 1 << 26;

impl Default for Pipeline {
    fn default() -> Self {
        Self {
            image_steps: Vec::new(),
            normalize: None,
            erasing: Vec::new(),
            max_pixels: DEFAULT_MAX_PIXELS,
        }
    }
}

impl Pipeline {
    pub fn new(transforms: &[Transform]) -> Result<Self, DataError> {
        let mut pipeline = Pipeline::default();
        let mut tensor = false;
        for transform in transforms {
            transform.check().map_err(DataError::Invalid)?;
            match *transform {
                Transform::ToTensor if tensor => {
                    return Err(DataError::Invalid("to_tensor appears twice".into()));
                }
                Transform::ToTensor => tensor = true,
                Transform::Normalize { .. } if !tensor => {
                    return Err(DataError::Invalid(
                        "normalize must follow to_tensor, as in torchvision".into(),
                    ));
                }
                Transform::Normalize { .. } if pipeline.normalize.is_some() => {
                    return Err(DataError::Invalid("normalize appears twice".into()));
                }
                Transform::Normalize { mean, std } => pipeline.normalize = Some((mean, std)),
                Transform::RandomErasing { .. } if !tensor => {
                    return Err(DataError::Invalid(
                        "random_erasing works on the tensor: put it after to_tensor (and normalize), as in torchvision".into(),
                    ));
                }
                Transform::RandomErasing { .. } => {
                    let before_normalize = pipeline.normalize.is_none();
                    pipeline.erasing.push((transform.clone(), before_normalize));
                }
                _ if tensor => {
                    return Err(DataError::Invalid(format!(
                        "{transform:?} comes after to_tensor; image transforms must come before it"
                    )));
                }
                _ => pipeline.image_steps.push(transform.clone()),
            }
        }
        Ok(pipeline)
    }

    /// The same pipeline with another limit on the pixels of any image a step makes.
    pub fn with_max_pixels(mut self, max_pixels: u64) -> Self {
        self.max_pixels = max_pixels;
        self
    }

    /// The most pixels any step may make.
    pub fn max_pixels(&self) -> u64 {
        self.max_pixels
    }

    /// The first (width, height) over the pixel limit that a step would make of an `input`-sized
    /// image (a resize of an extreme aspect ratio), found before anything is allocated.
    pub fn too_large(&self, input: (u32, u32)) -> Option<(u32, u32)> {
        let mut size = input;
        for step in &self.image_steps {
            size = match *step {
                Transform::Resize { size: side, .. } => shorter_side_to(size.0, size.1, side),
                Transform::CenterCrop { size: side }
                | Transform::RandomResizedCrop { size: side, .. }
                | Transform::RandomCrop { size: side, .. } => (side, side),
                _ => size,
            };
            if u64::from(size.0) * u64::from(size.1) > self.max_pixels {
                return Some(size);
            }
        }
        None
    }

    /// The (width, height) of the images this pipeline makes from `input`-sized ones; `None`
    /// where that depends on an unknown input size (a resize without a crop after it).
    pub fn output_size(&self, input: Option<(u32, u32)>) -> Option<(u32, u32)> {
        self.image_steps
            .iter()
            .fold(input, |size, step| match *step {
                Transform::Resize { size: side, .. } => {
                    size.map(|(w, h)| shorter_side_to(w, h, side))
                }
                Transform::CenterCrop { size: side }
                | Transform::RandomResizedCrop { size: side, .. }
                | Transform::RandomCrop { size: side, .. } => Some((side, side)),
                _ => size,
            })
    }

    pub fn transform(&self, mut image: RgbImage, rng: &mut impl Rng) -> RgbImage {
        for step in &self.image_steps {
            image = step.apply(image, rng);
        }
        image
    }

    /// `ToTensor`, `Normalize` and `RandomErasing` into `out`, a `[3, height, width]` slice. An
    /// erasing before `normalize` writes its value normalized, as normalizing after it would.
    pub fn write_tensor(&self, image: &RgbImage, out: &mut [f32], rng: &mut impl Rng) {
        let (mean, std) = self.normalize.unwrap_or(([0.0; 3], [1.0; 3]));
        write_normalized_chw(image, mean, std, out);
        let size = (image.height() as usize, image.width() as usize);
        for (step, before_normalize) in &self.erasing {
            let Transform::RandomErasing {
                p,
                scale,
                ratio,
                ref value,
            } = *step
            else {
                continue;
            };
            if rng.random::<f64>() >= p {
                continue;
            }
            let Some(rect) = erasing_box(size, scale, ratio, rng) else {
                continue;
            };
            let normalized = |c: usize, v: f32| match before_normalize {
                true => (v - mean[c]) / std[c],
                false => v,
            };
            match value {
                ErasingValue::Number(v) => erase(out, size, rect, |c| normalized(c, *v)),
                ErasingValue::Channels(v) => erase(out, size, rect, |c| normalized(c, v[c])),
                ErasingValue::Random(_) => erase(out, size, rect, |c| {
                    normalized(c, StandardNormal.sample(&mut *rng))
                }),
            }
        }
    }
}

/// `Resize(resize, interpolation)`, `CenterCrop(crop)`, `ToTensor()`, `Normalize(mean, std)`:
/// the evaluation pipeline of torchvision's ImageNet models (and timm's, bicubic).
#[derive(Debug, Clone, PartialEq)]
pub struct EvalTransform {
    pub resize: u32,
    pub crop: u32,
    pub interpolation: Resample,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl EvalTransform {
    /// Resize 256, center-crop 224, ImageNet normalization.
    pub fn imagenet() -> Self {
        Self {
            resize: 256,
            crop: 224,
            interpolation: Resample::Bilinear,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }

    /// The image as a `[3, crop, crop]` CHW buffer of normalized floats.
    pub fn apply(&self, image: &RgbImage) -> Vec<f32> {
        let resized = resize_shorter_side_with(image, self.resize, self.interpolation);
        let cropped = center_crop(&resized, self.crop);
        to_normalized_chw(&cropped, self.mean, self.std)
    }
}

/// torchvision's `Resize(size)` with an int: the shorter side becomes `size`, the longer one
/// `int(size * long / short)`.
pub fn resize_shorter_side(image: &RgbImage, size: u32) -> RgbImage {
    resize_shorter_side_with(image, size, Resample::Bilinear)
}

/// [`resize_shorter_side`] with `interpolation`.
pub fn resize_shorter_side_with(image: &RgbImage, size: u32, interpolation: Resample) -> RgbImage {
    let (w, h) = image.dimensions();
    let (new_w, new_h) = shorter_side_to(w, h, size);
    resize_exact_with(image, new_w.max(1), new_h.max(1), interpolation)
}

/// The size `Resize(size)` gives a `w` x `h` image: the shorter side becomes `size`.
fn shorter_side_to(w: u32, h: u32, size: u32) -> (u32, u32) {
    if w <= h {
        (size, (size as u64 * h as u64 / w as u64) as u32)
    } else {
        ((size as u64 * w as u64 / h as u64) as u32, size)
    }
}

/// Antialiased bilinear resampling as PIL does it (the triangle filter widened by the downscale
/// factor), through fast_image_resize, which implements Pillow's convolution with SIMD.
pub fn resize_exact(image: &RgbImage, width: u32, height: u32) -> RgbImage {
    resize_exact_with(image, width, height, Resample::Bilinear)
}

/// [`resize_exact`] with `interpolation` (Pillow's bicubic: its filter widened the same way).
pub fn resize_exact_with(
    image: &RgbImage,
    width: u32,
    height: u32,
    interpolation: Resample,
) -> RgbImage {
    if image.dimensions() == (width, height) {
        return image.clone();
    }
    let (w, h) = image.dimensions();
    // Pillow resamples rows first, then columns, through an 8-bit image: with a filter that
    // overshoots (bicubic) the order shows in the clipped values, so the two passes are made
    // one at a time in Pillow's order.
    if interpolation == Resample::Bicubic && w != width && h != height {
        let rows = resize_exact_with(image, width, h, interpolation);
        return resize_exact_with(&rows, width, height, interpolation);
    }
    let source = ImageRef::new(w, h, image.as_raw(), PixelType::U8x3)
        .expect("an RgbImage buffer holds width * height * 3 bytes");
    let mut target = Image::new(width, height, PixelType::U8x3);
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(interpolation.filter()));
    Resizer::new()
        .resize(&source, &mut target, &options)
        .expect("source and target are both U8x3");
    RgbImage::from_raw(width, height, target.into_vec())
        .expect("the target buffer holds width * height * 3 bytes")
}

/// The `width` x `height` window at (`left`, `top`); pixels outside the image are black, as
/// torchvision's padding fills them.
pub fn crop(image: &RgbImage, left: i64, top: i64, width: u32, height: u32) -> RgbImage {
    let (w, h) = (image.width() as i64, image.height() as i64);
    let mut out = RgbImage::new(width, height);
    let (x0, x1) = (left.max(0), (left + width as i64).min(w));
    if x0 >= x1 {
        return out;
    }
    let row_bytes = (x1 - x0) as usize * 3;
    let source = image.as_raw();
    let target_stride = width as usize * 3;
    let target = out.as_mut();
    for y in 0..height as i64 {
        let sy = top + y;
        if !(0..h).contains(&sy) {
            continue;
        }
        let from = (sy * w + x0) as usize * 3;
        let to = y as usize * target_stride + (x0 - left) as usize * 3;
        target[to..to + row_bytes].copy_from_slice(&source[from..from + row_bytes]);
    }
    out
}

/// torchvision's `CenterCrop(size)`: an image smaller than `size` is first padded with black,
/// `(size - side) // 2` before; the offset is then `round((side - size) / 2)`, with Python's
/// rounding (half to even).
pub fn center_crop(image: &RgbImage, size: u32) -> RgbImage {
    let offset = |side: u32| -> i64 {
        if side < size {
            -(((size - side) / 2) as i64)
        } else {
            ((side - size) as f64 / 2.0).round_ties_even() as i64
        }
    };
    let (w, h) = image.dimensions();
    crop(image, offset(w), offset(h), size, size)
}

/// `RandomCrop(size, padding)`: pad every side by `padding`, then (after padding a too-small
/// image up to `size`) cut a `size` square at a uniformly drawn offset.
pub fn random_crop(image: &RgbImage, size: u32, padding: u32, rng: &mut impl Rng) -> RgbImage {
    let pad = padding as i64;
    let (w, h) = (
        image.width() as i64 + 2 * pad,
        image.height() as i64 + 2 * pad,
    );
    let offset = |side: i64, rng: &mut dyn rand::RngCore| -> i64 {
        let size = size as i64;
        if side < size {
            -(size - side) / 2 - pad
        } else {
            rng.random_range(0..=side - size) - pad
        }
    };
    // torchvision draws the row offset first, then the column.
    let top = offset(h, rng);
    let left = offset(w, rng);
    crop(image, left, top, size, size)
}

/// `RandomResizedCrop.get_params`: up to ten tries at an area fraction from `scale` and a
/// log-uniform aspect ratio from `ratio`, else the largest central crop within `ratio`.
/// Returns (top, left, height, width).
pub fn random_resized_crop_box(
    image: &RgbImage,
    scale: [f64; 2],
    ratio: [f64; 2],
    rng: &mut impl Rng,
) -> (u32, u32, u32, u32) {
    let (width, height) = (image.width() as f64, image.height() as f64);
    let area = width * height;
    let log_ratio = [ratio[0].ln(), ratio[1].ln()];
    for _ in 0..10 {
        let target_area = area * uniform(rng, scale[0], scale[1]);
        let aspect = uniform(rng, log_ratio[0], log_ratio[1]).exp();
        let w = (target_area * aspect).sqrt().round_ties_even();
        let h = (target_area / aspect).sqrt().round_ties_even();
        if 0.0 < w && w <= width && 0.0 < h && h <= height {
            let top = rng.random_range(0..=(height - h) as u32);
            let left = rng.random_range(0..=(width - w) as u32);
            return (top, left, h as u32, w as u32);
        }
    }
    let in_ratio = width / height;
    let (w, h) = if in_ratio < ratio[0] {
        (width, (width / ratio[0]).round_ties_even())
    } else if in_ratio > ratio[1] {
        ((height * ratio[1]).round_ties_even(), height)
    } else {
        (width, height)
    };
    let (w, h) = (w as u32, h as u32);
    ((image.height() - h) / 2, (image.width() - w) / 2, h, w)
}

fn uniform(rng: &mut impl Rng, low: f64, high: f64) -> f64 {
    low + (high - low) * rng.random::<f64>()
}

/// `ColorJitter`: draws the four factors and a random order, then applies PIL's enhancements.
fn color_jitter(mut image: RgbImage, amounts: [f64; 4], rng: &mut impl Rng) -> RgbImage {
    let mut order = [0usize, 1, 2, 3];
    order.shuffle(rng);
    let range = |x: f64| ((1.0 - x).max(0.0), 1.0 + x);
    let [b, c, s, h] = amounts;
    let factors = [
        (b > 0.0).then(|| uniform(rng, range(b).0, range(b).1)),
        (c > 0.0).then(|| uniform(rng, range(c).0, range(c).1)),
        (s > 0.0).then(|| uniform(rng, range(s).0, range(s).1)),
        (h > 0.0).then(|| uniform(rng, -h, h)),
    ];
    for step in order {
        let Some(factor) = factors[step] else {
            continue;
        };
        image = match step {
            0 => adjust_brightness(&image, factor),
            1 => adjust_contrast(&image, factor),
            2 => adjust_saturation(&image, factor),
            _ => adjust_hue(&image, factor),
        };
    }
    image
}

/// The draws `RandomErasing` makes, as torch makes them: separate from the arithmetic, so that
/// a test can hand it torch's own.
pub trait ErasingDraws {
    /// `torch.empty(1).uniform_(low, high)`: float32.
    fn uniform(&mut self, low: f32, high: f32) -> f32;
    /// `torch.randint(0, n)`.
    fn below(&mut self, n: usize) -> usize;
}

impl<R: Rng> ErasingDraws for R {
    fn uniform(&mut self, low: f32, high: f32) -> f32 {
        low + (high - low) * self.random::<f32>()
    }

    fn below(&mut self, n: usize) -> usize {
        self.random_range(0..n)
    }
}

/// torchvision's `RandomErasing.get_params`: up to ten tries at a box of `scale` of the area
/// and aspect `ratio` (drawn log-uniform), in float32 as torch draws them; the first that fits
/// inside the image, placed uniformly, as (top, left, height, width). `None`: no box fitted,
/// and torchvision leaves the image as it is.
pub fn erasing_box(
    (height, width): (usize, usize),
    scale: [f64; 2],
    ratio: [f64; 2],
    draws: &mut impl ErasingDraws,
) -> Option<(usize, usize, usize, usize)> {
    let area = (height * width) as f64;
    let log_ratio = [(ratio[0] as f32).ln(), (ratio[1] as f32).ln()];
    for _ in 0..10 {
        let erase_area = area * f64::from(draws.uniform(scale[0] as f32, scale[1] as f32));
        let aspect = f64::from(draws.uniform(log_ratio[0], log_ratio[1]).exp());
        // Python's round: half to even.
        let h = (erase_area * aspect).sqrt().round_ties_even() as usize;
        let w = (erase_area / aspect).sqrt().round_ties_even() as usize;
        if !(h < height && w < width) {
            continue;
        }
        let top = draws.below(height - h + 1);
        let left = draws.below(width - w + 1);
        return Some((top, left, h, w));
    }
    None
}

/// torchvision's `F.erase`: the box (top, left, height, width) of each channel of `tensor`
/// (`[c, h, w]` of `size`) set to `fill(channel)`, called once per value written.
pub fn erase(
    tensor: &mut [f32],
    (height, width): (usize, usize),
    (top, left, h, w): (usize, usize, usize, usize),
    mut fill: impl FnMut(usize) -> f32,
) {
    let plane = height * width;
    for (c, channel) in tensor.chunks_exact_mut(plane).enumerate() {
        for row in channel.chunks_exact_mut(width).skip(top).take(h) {
            for value in &mut row[left..left + w] {
                *value = fill(c);
            }
        }
    }
}

/// `ToTensor()` then `Normalize(mean, std)`: CHW floats, `(value / 255 - mean) / std`.
pub fn to_normalized_chw(image: &RgbImage, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let mut out = vec![0f32; 3 * image.width() as usize * image.height() as usize];
    write_normalized_chw(image, mean, std, &mut out);
    out
}

fn write_normalized_chw(image: &RgbImage, mean: [f32; 3], std: [f32; 3], out: &mut [f32]) {
    let plane = image.width() as usize * image.height() as usize;
    assert_eq!(out.len(), 3 * plane, "output slice must hold [3, h, w]");
    // 256 possible values per channel: look them up rather than divide per pixel. The table
    // holds exactly what `(v / 255 - mean) / std` gives.
    let table: [[f32; 256]; 3] =
        std::array::from_fn(|c| std::array::from_fn(|v| (v as f32 / 255.0 - mean[c]) / std[c]));
    let (red, rest) = out.split_at_mut(plane);
    let (green, blue) = rest.split_at_mut(plane);
    for (i, pixel) in image.as_raw().chunks_exact(3).enumerate() {
        red[i] = table[0][pixel[0] as usize];
        green[i] = table[1][pixel[1] as usize];
        blue[i] = table[2][pixel[2] as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_pcg::Pcg64Mcg;

    fn gradient(w: u32, h: u32) -> RgbImage {
        RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]))
    }

    #[test]
    fn output_size_follows_the_steps_that_set_it() {
        let pipeline = |steps: &[Transform]| Pipeline::new(steps).unwrap();
        let resize = Transform::Resize {
            size: 256,
            interpolation: Resample::Bilinear,
        };
        let crop = Transform::CenterCrop { size: 224 };
        let flip = Transform::RandomHorizontalFlip { p: 0.5 };
        assert_eq!(
            pipeline(std::slice::from_ref(&resize)).output_size(Some((400, 300))),
            Some((341, 256))
        );
        assert_eq!(
            pipeline(std::slice::from_ref(&resize)).output_size(None),
            None
        );
        assert_eq!(
            pipeline(&[resize, crop, flip.clone()]).output_size(None),
            Some((224, 224))
        );
        assert_eq!(
            pipeline(&[flip]).output_size(Some((32, 32))),
            Some((32, 32))
        );
    }

    #[test]
    fn resize_keeps_the_aspect_ratio_like_torchvision() {
        assert_eq!(
            resize_shorter_side(&gradient(400, 300), 256).dimensions(),
            (341, 256)
        );
        assert_eq!(
            resize_shorter_side(&gradient(300, 500), 256).dimensions(),
            (256, 426)
        );
        // A uniform image stays uniform through the filter.
        let flat = RgbImage::from_pixel(90, 60, image::Rgb([9, 99, 199]));
        let resized = resize_shorter_side(&flat, 20);
        assert!(resized.pixels().all(|p| p.0 == [9, 99, 199]));
    }

    #[test]
    fn center_crop_takes_the_middle_and_pads_like_torchvision() {
        let cropped = center_crop(&gradient(10, 7), 4);
        // round((10 - 4) / 2) = 3, round((7 - 4) / 2) = round(1.5) = 2.
        assert_eq!(cropped.get_pixel(0, 0).0, [3, 2, 7]);
        assert_eq!(cropped.get_pixel(3, 3).0, [6, 5, 7]);
        // Python rounds half to even: round((9 - 4) / 2) = round(2.5) = 2.
        assert_eq!(center_crop(&gradient(9, 9), 4).get_pixel(0, 0).0, [2, 2, 7]);
        let padded = center_crop(&gradient(2, 2), 4);
        assert_eq!(padded.get_pixel(0, 0).0, [0, 0, 0]);
        assert_eq!(padded.get_pixel(1, 1).0, [0, 0, 7]);
        // 3 wide into 6: torchvision pads 1 left and 2 right.
        let odd = center_crop(&gradient(3, 6), 6);
        assert_eq!(odd.get_pixel(0, 0).0, [0, 0, 0]);
        assert_eq!(odd.get_pixel(1, 0).0, [0, 0, 7]);
        assert_eq!(odd.get_pixel(3, 5).0, [2, 5, 7]);
        assert_eq!(odd.get_pixel(4, 5).0, [0, 0, 0]);
    }

    #[test]
    fn normalization_matches_torchvision_arithmetic() {
        let image = RgbImage::from_fn(2, 1, |x, _| image::Rgb([255 * x as u8, 0, 128]));
        let out = to_normalized_chw(&image, IMAGENET_MEAN, IMAGENET_STD);
        let expect = |v: f32, c: usize| (v / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
        assert_eq!(out.len(), 6);
        assert_eq!(out[0], expect(0.0, 0));
        assert_eq!(out[1], expect(255.0, 0));
        assert_eq!(out[2], expect(0.0, 1));
        assert_eq!(out[5], expect(128.0, 2));
    }

    #[test]
    fn the_eval_pipeline_gives_the_normalized_center_224_square_of_the_resized_image() {
        let eval = EvalTransform::imagenet();
        // (image, its size after `Resize(256)`, the crop's left and top there): 240 x 320 goes
        // to 256 x 341, and Python's round((341 - 224) / 2) = round(58.5) is 58; 320 x 256 is
        // not resized.
        for (image, resized_size, (left, top)) in [
            (gradient(240, 320), (256, 341), (16, 58)),
            (gradient(320, 256), (320, 256), (48, 16)),
        ] {
            let resized = resize_shorter_side(&image, 256);
            assert_eq!(resized.dimensions(), resized_size);
            let out = eval.apply(&image);
            assert_eq!(out.len(), 3 * 224 * 224);
            for (y, x) in [(0, 0), (0, 223), (223, 0), (223, 223), (111, 57), (200, 3)] {
                let pixel = resized.get_pixel(x + left, y + top).0;
                for (c, &byte) in pixel.iter().enumerate() {
                    let value = (byte as f32 / 255.0 - eval.mean[c]) / eval.std[c];
                    let at = (c * 224 + y as usize) * 224 + x as usize;
                    assert_eq!(out[at], value, "channel {c}, y {y}, x {x}");
                }
            }
        }
    }

    #[test]
    fn random_crop_with_padding_stays_within_the_padded_image() {
        let image = gradient(8, 8);
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        let mut offsets = std::collections::BTreeSet::new();
        for _ in 0..400 {
            let out = random_crop(&image, 8, 2, &mut rng);
            // Find where the original pixel (0, 0) landed: the crop's offset in the padded image.
            let found = (0..8u32)
                .flat_map(|y| (0..8u32).map(move |x| (x, y)))
                .find(|&(x, y)| out.get_pixel(x, y).0 == [0, 0, 7]);
            if let Some(at) = found {
                offsets.insert(at);
            }
        }
        // Offsets 0..=4 in each direction put (0, 0) at 2 - offset when visible: 0, 1 or 2.
        assert_eq!(offsets.len(), 9, "{offsets:?}");
        assert!(offsets.iter().all(|&(x, y)| x <= 2 && y <= 2));
    }

    #[test]
    fn random_resized_crop_boxes_respect_scale_and_ratio() {
        let image = gradient(200, 100);
        let mut rng = Pcg64Mcg::seed_from_u64(7);
        for _ in 0..500 {
            let (top, left, h, w) =
                random_resized_crop_box(&image, [0.08, 1.0], [0.75, 4.0 / 3.0], &mut rng);
            assert!(top + h <= 100 && left + w <= 200);
            let area = (h * w) as f64 / 20_000.0;
            assert!((0.07..=1.01).contains(&area), "area fraction {area}");
        }
        // A very wide image cannot fit the ratio: the fallback is the central 4:3 crop.
        let wide = gradient(1000, 10);
        let (top, left, h, w) =
            random_resized_crop_box(&wide, [0.99, 1.0], [0.75, 4.0 / 3.0], &mut rng);
        assert_eq!((top, h, w, left), (0, 10, 13, (1000 - 13) / 2));
    }

    #[test]
    fn pipelines_are_checked_and_parsed_from_toml() {
        #[derive(Debug, Deserialize)]
        struct Config {
            transforms: Vec<Transform>,
        }
        let config: Config = toml::from_str(
            r#"transforms = [
                { op = "random_resized_crop", size = 224 },
                { op = "random_horizontal_flip" },
                { op = "color_jitter", brightness = 0.4 },
                { op = "to_tensor" },
                { op = "normalize", mean = [0.5, 0.5, 0.5], std = [0.2, 0.2, 0.2] },
            ]"#,
        )
        .unwrap();
        assert_eq!(
            config.transforms[0],
            Transform::RandomResizedCrop {
                size: 224,
                scale: [0.08, 1.0],
                ratio: [0.75, 4.0 / 3.0]
            }
        );
        assert!(Pipeline::new(&config.transforms).is_ok());

        let unknown = toml::from_str::<Config>(r#"transforms = [{ op = "resize", sise = 3 }]"#);
        assert!(unknown.unwrap_err().to_string().contains("sise"));
        let bad = |t: &[Transform]| Pipeline::new(t).unwrap_err().to_string();
        assert!(
            bad(&[Transform::Resize {
                size: 0,
                interpolation: Resample::Bilinear
            }])
            .contains("resize")
        );
        assert!(
            bad(&[Transform::Normalize {
                mean: [0.0; 3],
                std: [1.0; 3]
            }])
            .contains("to_tensor")
        );
        assert!(bad(&[Transform::ToTensor, Transform::CenterCrop { size: 3 }]).contains("before"));
        assert!(bad(&[Transform::RandomHorizontalFlip { p: 1.5 }]).contains("p must"));
        let erasing = |value: ErasingValue| Transform::RandomErasing {
            p: 0.5,
            scale: default_erasing_scale(),
            ratio: default_erasing_ratio(),
            value,
        };
        let zero = erasing(ErasingValue::Number(0.0));
        assert!(bad(std::slice::from_ref(&zero)).contains("after to_tensor"));
        let word = erasing(ErasingValue::Random("noise".into()));
        assert!(bad(&[Transform::ToTensor, word]).contains("\"random\""));
        let parsed: Config = toml::from_str(
            r#"transforms = [{ op = "to_tensor" }, { op = "random_erasing", value = "random" },
                { op = "random_erasing", p = 0.25, value = [1, 2, 3] }]"#,
        )
        .unwrap();
        assert_eq!(
            parsed.transforms[1],
            erasing(ErasingValue::Random("random".into()))
        );
        assert!(Pipeline::new(&parsed.transforms).is_ok());

        let policies: Config = toml::from_str(
            r#"transforms = [{ op = "trivial_augment_wide", interpolation = "bilinear" },
                { op = "rand_augment", num_ops = 3, fill = [128, 128, 128] },
                { op = "auto_augment", policy = "cifar10" }]"#,
        )
        .unwrap();
        assert_eq!(
            policies.transforms[1],
            Transform::RandAugment {
                num_ops: 3,
                magnitude: 9,
                num_magnitude_bins: 31,
                interpolation: Interpolation::Nearest,
                fill: [128; 3],
            }
        );
        assert!(Pipeline::new(&policies.transforms).is_ok());
        let one_bin = Transform::TrivialAugmentWide {
            num_magnitude_bins: 1,
            interpolation: Interpolation::Nearest,
            fill: [0; 3],
        };
        assert!(bad(&[one_bin]).contains("num_magnitude_bins"));
        assert!(bad(&[Transform::ToTensor, policies.transforms[2].clone()]).contains("before"));
    }

    /// The pipeline's tensor: the photo-like gradient, normalized, then `erasing`.
    fn erased(steps: &[Transform], seed: u64) -> (Vec<f32>, Vec<f32>) {
        let image = gradient(40, 30);
        let pipeline = Pipeline::new(steps).unwrap();
        let mut out = vec![0.0; 3 * 40 * 30];
        pipeline.write_tensor(&image, &mut out, &mut Pcg64Mcg::seed_from_u64(seed));
        let (mean, std) = pipeline.normalize.unwrap_or(([0.0; 3], [1.0; 3]));
        (out, to_normalized_chw(&image, mean, std))
    }

    #[test]
    fn random_erasing_fills_one_box_per_channel_with_its_value() {
        let norm = Transform::Normalize {
            mean: [0.5, 0.4, 0.3],
            std: [0.2, 0.25, 0.5],
        };
        let erase = |value: ErasingValue| Transform::RandomErasing {
            p: 1.0,
            scale: [0.1, 0.2],
            ratio: [0.5, 2.0],
            value,
        };
        for seed in 0..20 {
            // After normalize: the value as given. Before it: normalized as the image is.
            let after = [
                Transform::ToTensor,
                norm.clone(),
                erase(ErasingValue::Channels([7.0, 8.0, 9.0])),
            ];
            let before = [
                Transform::ToTensor,
                erase(ErasingValue::Number(0.5)),
                norm.clone(),
            ];
            for (steps, values) in [
                (&after[..], [7.0, 8.0, 9.0]),
                (&before[..], [0.0, 0.4, 0.4]),
            ] {
                let (out, clean) = erased(steps, seed);
                let changed: Vec<usize> = (0..out.len()).filter(|&i| out[i] != clean[i]).collect();
                let per_channel = changed.len() / 3;
                let share = per_channel as f64 / (40.0 * 30.0);
                assert!((0.08..=0.22).contains(&share), "erased {share} of the area");
                for &i in &changed {
                    assert!(
                        (out[i] - values[i / 1200]).abs() < 1e-6,
                        "{} at {i}",
                        out[i]
                    );
                }
                // One rectangle: rows times columns of the changed values.
                let rows: std::collections::BTreeSet<usize> =
                    changed.iter().map(|i| i % 1200 / 40).collect();
                let cols: std::collections::BTreeSet<usize> =
                    changed.iter().map(|i| i % 40).collect();
                assert_eq!(rows.len() * cols.len(), per_channel);
            }
        }
        // p = 0 erases nothing; "random" writes noise, different per value.
        let never = Transform::RandomErasing {
            p: 0.0,
            scale: [0.1, 0.2],
            ratio: [0.5, 2.0],
            value: ErasingValue::Number(0.0),
        };
        let (out, clean) = erased(&[Transform::ToTensor, never], 1);
        assert_eq!(out, clean);
        let noise = erase(ErasingValue::Random("random".into()));
        let (out, clean) = erased(&[Transform::ToTensor, noise], 1);
        let changed: Vec<f32> = (0..out.len())
            .filter(|&i| out[i] != clean[i])
            .map(|i| out[i])
            .collect();
        let mean = changed.iter().sum::<f32>() / changed.len() as f32;
        assert!(
            changed.len() > 300 && mean.abs() < 0.2,
            "{} values, mean {mean}",
            changed.len()
        );
    }
}
