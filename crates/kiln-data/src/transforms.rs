//! torchvision's transforms on host images, matching their arithmetic.

use image::RgbImage;
use image::imageops::{self, FilterType};

/// ImageNet's per-channel mean and standard deviation, as torchvision's weights expect.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// `Resize(resize)`, `CenterCrop(crop)`, `ToTensor()`, `Normalize(mean, std)`: the evaluation
/// pipeline of torchvision's ImageNet models.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalTransform {
    pub resize: u32,
    pub crop: u32,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl EvalTransform {
    /// Resize 256, center-crop 224, ImageNet normalization.
    pub fn imagenet() -> Self {
        Self {
            resize: 256,
            crop: 224,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }

    /// The image as a `[3, crop, crop]` CHW buffer of normalized floats.
    pub fn apply(&self, image: &RgbImage) -> Vec<f32> {
        let resized = resize_shorter_side(image, self.resize);
        let cropped = center_crop(&resized, self.crop);
        to_normalized_chw(&cropped, self.mean, self.std)
    }
}

/// torchvision's `Resize(size)` with an int: the shorter side becomes `size`, the longer one
/// `int(size * long / short)`, with antialiased bilinear filtering as PIL does it (the triangle
/// filter widened by the downscale factor).
pub fn resize_shorter_side(image: &RgbImage, size: u32) -> RgbImage {
    let (w, h) = image.dimensions();
    let (new_w, new_h) = if w <= h {
        (size, (size as u64 * h as u64 / w as u64) as u32)
    } else {
        ((size as u64 * w as u64 / h as u64) as u32, size)
    };
    if (new_w, new_h) == (w, h) {
        return image.clone();
    }
    imageops::resize(image, new_w, new_h, FilterType::Triangle)
}

/// torchvision's `CenterCrop(size)`: the offset is `round((side - size) / 2)`. An image smaller
/// than `size` is padded with black, as torchvision does.
pub fn center_crop(image: &RgbImage, size: u32) -> RgbImage {
    let (w, h) = image.dimensions();
    let offset = |side: u32| ((side as f64 - size as f64) / 2.0).round() as i64;
    let (left, top) = (offset(w), offset(h));
    RgbImage::from_fn(size, size, |x, y| {
        let (sx, sy) = (x as i64 + left, y as i64 + top);
        if (0..w as i64).contains(&sx) && (0..h as i64).contains(&sy) {
            *image.get_pixel(sx as u32, sy as u32)
        } else {
            image::Rgb([0, 0, 0])
        }
    })
}

/// `ToTensor()` then `Normalize(mean, std)`: CHW floats, `(value / 255 - mean) / std`.
pub fn to_normalized_chw(image: &RgbImage, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let (w, h) = image.dimensions();
    let plane = (w * h) as usize;
    let mut out = vec![0f32; 3 * plane];
    for (i, pixel) in image.pixels().enumerate() {
        for c in 0..3 {
            out[c * plane + i] = (pixel.0[c] as f32 / 255.0 - mean[c]) / std[c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(w: u32, h: u32) -> RgbImage {
        RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]))
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
    fn center_crop_takes_the_middle() {
        let cropped = center_crop(&gradient(10, 7), 4);
        // round((10 - 4) / 2) = 3, round((7 - 4) / 2) = round(1.5) = 2.
        assert_eq!(cropped.get_pixel(0, 0).0, [3, 2, 7]);
        assert_eq!(cropped.get_pixel(3, 3).0, [6, 5, 7]);
        let padded = center_crop(&gradient(2, 2), 4);
        assert_eq!(padded.get_pixel(0, 0).0, [0, 0, 0]);
        assert_eq!(padded.get_pixel(1, 1).0, [0, 0, 7]);
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
    fn the_eval_pipeline_gives_a_224_square() {
        let out = EvalTransform::imagenet().apply(&gradient(320, 240));
        assert_eq!(out.len(), 3 * 224 * 224);
    }
}
