//! PIL's colour adjustments on host images (8-bit RGB), as torchvision's `adjust_*` functions
//! call them on PIL images: `ImageEnhance`'s blends with a degenerate image, and the hue shift
//! through PIL's 8-bit HSV. `transforms` (ColorJitter) and `augment` (the policies) use them.

use image::{Rgb, RgbImage};

/// PIL's `Image.blend(degenerate, image, factor)`: `degenerate + factor * (image - degenerate)`
/// in single precision, clipped to [0, 255] and truncated.
pub(crate) fn blend(degenerate: impl Fn(usize) -> u8, image: &RgbImage, factor: f64) -> RgbImage {
    let alpha = factor as f32;
    let mut out = image.clone();
    for (i, value) in out.as_mut().iter_mut().enumerate() {
        let from = degenerate(i) as f32;
        let blended = from + alpha * (*value as f32 - from);
        *value = blended.clamp(0.0, 255.0) as u8;
    }
    out
}

/// PIL's RGB to L conversion (ITU-R 601-2 luma in 16-bit fixed point, rounded).
fn luma(pixel: &Rgb<u8>) -> u8 {
    let [r, g, b] = pixel.0.map(u32::from);
    ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) as u8
}

/// `F.adjust_brightness`: a blend with black.
pub fn adjust_brightness(image: &RgbImage, factor: f64) -> RgbImage {
    blend(|_| 0, image, factor)
}

/// `F.adjust_contrast`: a blend with the mean gray level, rounded to an integer as PIL does.
pub fn adjust_contrast(image: &RgbImage, factor: f64) -> RgbImage {
    let pixels = (image.width() as u64 * image.height() as u64).max(1);
    let sum: u64 = image.pixels().map(|p| luma(p) as u64).sum();
    let mean = (sum as f64 / pixels as f64 + 0.5) as u8;
    blend(|_| mean, image, factor)
}

/// `F.adjust_saturation`: a blend with the grayscale image.
pub fn adjust_saturation(image: &RgbImage, factor: f64) -> RgbImage {
    let gray: Vec<u8> = image.pixels().map(luma).collect();
    blend(|i| gray[i / 3], image, factor)
}

/// `F.adjust_hue`: rotate the hue channel of PIL's 8-bit HSV by `factor * 255`, wrapping.
pub fn adjust_hue(image: &RgbImage, factor: f64) -> RgbImage {
    let shift = (factor * 255.0) as i32 as u8;
    let mut out = image.clone();
    for pixel in out.pixels_mut() {
        let [h, s, v] = rgb_to_hsv(pixel.0);
        pixel.0 = hsv_to_rgb([h.wrapping_add(shift), s, v]);
    }
    out
}

/// PIL's `convert("HSV")` for one pixel. PIL stores in `float` but computes with `double`
/// literals; the casts below follow its C exactly, since a hue shift of 1 changes the result.
fn rgb_to_hsv([r, g, b]: [u8; 3]) -> [u8; 3] {
    let max = r.max(g).max(b);
    let min = r.min(g).min(b);
    if max == min {
        return [0, 0, max];
    }
    let range = (max - min) as f32;
    let s = range / max as f32;
    let rc = (max - r) as f32 / range;
    let gc = (max - g) as f32 / range;
    let bc = (max - b) as f32 / range;
    let h = if r == max {
        bc - gc
    } else if g == max {
        (2.0 + rc as f64 - bc as f64) as f32
    } else {
        (4.0 + gc as f64 - rc as f64) as f32
    };
    let h = ((h as f64 / 6.0 + 1.0) % 1.0) as f32;
    let clip = |x: f64| (x as i32).clamp(0, 255) as u8;
    [clip(h as f64 * 255.0), clip(s as f64 * 255.0), max]
}

/// PIL's `convert("RGB")` from HSV for one pixel, with the same care for its casts.
fn hsv_to_rgb([h, s, v]: [u8; 3]) -> [u8; 3] {
    if s == 0 {
        return [v, v, v];
    }
    let sector = h as f32 as f64 * 6.0 / 255.0;
    let i = sector.floor() as i32;
    let f = (sector - i as f32 as f64) as f32 as f64;
    let fs = (s as f32 as f64 / 255.0) as f32 as f64;
    let v64 = v as f32 as f64;
    let clip = |x: f64| (x.round() as i32).clamp(0, 255) as u8;
    let p = clip(v64 * (1.0 - fs));
    let q = clip(v64 * (1.0 - fs * f));
    let t = clip(v64 * (1.0 - fs * (1.0 - f)));
    match i % 6 {
        0 => [v, t, p],
        1 => [q, v, p],
        2 => [p, v, t],
        3 => [p, q, v],
        4 => [t, p, v],
        _ => [v, p, q],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsv_round_trip_is_close_and_gray_is_untouched() {
        for rgb in [[200u8, 30, 30], [10, 250, 40], [0, 0, 255], [77, 77, 77]] {
            let back = hsv_to_rgb(rgb_to_hsv(rgb));
            for c in 0..3 {
                assert!(
                    (back[c] as i32 - rgb[c] as i32).abs() <= 3,
                    "{rgb:?} -> {back:?}"
                );
            }
        }
        let gray = RgbImage::from_pixel(3, 3, Rgb([90, 90, 90]));
        assert_eq!(adjust_hue(&gray, 0.3), gray);
        assert_eq!(adjust_saturation(&gray, 1.7), gray);
    }
}
