//! kiln's transforms against torchvision's on PIL images: reference PNGs written by
//! `tests/fixtures/make_transform_fixtures.py` from a window of a real photograph.

use std::path::PathBuf;

use image::RgbImage;
use kiln_data::transforms::*;
use kiln_data::{ImageLimits, load_rgb};

fn fixture(name: &str) -> RgbImage {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    load_rgb(&path, ImageLimits::default()).unwrap()
}

/// The largest difference of any channel of any pixel, and how many values differ.
fn difference(ours: &RgbImage, theirs: &RgbImage) -> (u8, usize) {
    assert_eq!(ours.dimensions(), theirs.dimensions());
    let pairs = ours.as_raw().iter().zip(theirs.as_raw());
    let max = pairs.clone().map(|(a, b)| a.abs_diff(*b)).max().unwrap();
    (max, pairs.filter(|(a, b)| a != b).count())
}

fn assert_matches(ours: &RgbImage, reference: &str, max_allowed: u8) {
    let (max, count) = difference(ours, &fixture(reference));
    println!("{reference}: max difference {max}, {count} values differ");
    assert!(
        max <= max_allowed,
        "{reference}: differs by up to {max} ({count} values)"
    );
}

#[test]
fn resizing_matches_pil_antialiased_bilinear() {
    let photo = fixture("photo.png");
    assert_matches(&resize_shorter_side(&photo, 40), "resize_40.png", 1);
    assert_matches(&resize_shorter_side(&photo, 150), "resize_150.png", 1);
    let cropped = crop(&photo, 7, 5, 50, 40);
    assert_matches(
        &resize_exact(&cropped, 32, 32),
        "resized_crop_5_7_40_50_32.png",
        1,
    );
}

/// `Resize(size, interpolation=BICUBIC)` (timm's eval transforms), down and up: Pillow's cubic
/// filter, antialiased.
#[test]
fn resizing_matches_pil_antialiased_bicubic() {
    let photo = fixture("photo.png");
    for size in [40, 59, 150] {
        let ours = resize_shorter_side_with(&photo, size, Resample::Bicubic);
        assert_matches(&ours, &format!("resize_bicubic_{size}.png"), 1);
        // Not bilinear's pixels.
        let (max, _) = difference(&resize_shorter_side(&photo, size), &ours);
        assert!(max > 1, "bicubic and bilinear differ at {size}");
    }
}

#[test]
fn crops_and_flips_match_exactly() {
    let photo = fixture("photo.png");
    assert_matches(&center_crop(&photo, 30), "center_crop_30.png", 0);
    assert_matches(&center_crop(&photo, 80), "center_crop_80.png", 0);
    assert_matches(&image::imageops::flip_horizontal(&photo), "hflip.png", 0);
}

#[test]
fn color_adjustments_match_pil() {
    let photo = fixture("photo.png");
    assert_matches(&adjust_brightness(&photo, 1.4), "brightness_1.4.png", 0);
    assert_matches(&adjust_brightness(&photo, 0.5), "brightness_0.5.png", 0);
    assert_matches(&adjust_contrast(&photo, 0.6), "contrast_0.6.png", 0);
    assert_matches(&adjust_contrast(&photo, 1.8), "contrast_1.8.png", 0);
    assert_matches(&adjust_saturation(&photo, 0.3), "saturation_0.3.png", 0);
    assert_matches(&adjust_saturation(&photo, 1.9), "saturation_1.9.png", 0);
    assert_matches(&adjust_hue(&photo, 0.2), "hue_0.2.png", 0);
    assert_matches(&adjust_hue(&photo, -0.3), "hue_-0.3.png", 0);
}

#[test]
fn grayscale_palette_and_cmyk_files_become_rgb_like_pil() {
    let gray = fixture("gray.png");
    assert!(gray.pixels().all(|p| p.0[0] == p.0[1] && p.0[1] == p.0[2]));
    assert_matches(&fixture("palette.png"), "palette_as_rgb.png", 0);
    // JPEG decoders differ in their IDCT and upsampling, so CMYK is compared loosely.
    let (max, _) = difference(&fixture("cmyk.jpg"), &fixture("cmyk_as_rgb.png"));
    println!("cmyk.jpg: max difference {max}");
    assert!(
        max <= 12,
        "CMYK decodes to different colours than PIL's: {max}"
    );
}
