use std::io::Cursor;
use std::path::Path;

use image::RgbImage;

use crate::DataError;

/// How large an image may be before it is refused unread, so that a decompression bomb (a small
/// file that expands to gigabytes) is caught from its header.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImageLimits {
    pub max_side: u32,
    pub max_bytes: u64,
}

impl Default for ImageLimits {
    /// 16,384 pixels a side and 1 GiB decoded, far above any photograph.
    fn default() -> Self {
        Self {
            max_side: 16_384,
            max_bytes: 1 << 30,
        }
    }
}

/// Decodes an image file of any common format to 8-bit RGB, as PIL's `convert("RGB")` does:
/// grayscale is replicated, alpha is dropped, palettes are expanded, 16-bit is scaled down.
pub fn load_rgb(path: &Path, limits: ImageLimits) -> Result<RgbImage, DataError> {
    let unreadable = |reason: String| DataError::Unreadable {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| unreadable(e.to_string()))?;
    let reader = || {
        image::ImageReader::new(Cursor::new(&bytes))
            .with_guessed_format()
            .map_err(|e| unreadable(e.to_string()))
    };
    let (width, height) = reader()?
        .into_dimensions()
        .map_err(|e| unreadable(e.to_string()))?;
    if width > limits.max_side || height > limits.max_side {
        return Err(DataError::TooLarge {
            path: path.to_path_buf(),
            width,
            height,
            max: limits.max_side,
        });
    }
    let mut decode_limits = image::Limits::default();
    decode_limits.max_image_width = Some(limits.max_side);
    decode_limits.max_image_height = Some(limits.max_side);
    decode_limits.max_alloc = Some(limits.max_bytes);
    let mut reader = reader()?;
    reader.limits(decode_limits);
    let image = reader.decode().map_err(|e| unreadable(e.to_string()))?;
    Ok(image.into_rgb8())
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, ImageBuffer, Luma, Rgba, RgbaImage};

    #[test]
    fn other_color_types_become_rgb() {
        let dir = tempfile::tempdir().unwrap();
        let gray = dir.path().join("gray.png");
        GrayImage::from_pixel(3, 2, Luma([77])).save(&gray).unwrap();
        let rgba = dir.path().join("rgba.png");
        RgbaImage::from_pixel(3, 2, Rgba([10, 20, 30, 0]))
            .save(&rgba)
            .unwrap();
        let deep = dir.path().join("deep.png");
        ImageBuffer::<Luma<u16>, Vec<u16>>::from_pixel(3, 2, Luma([65535]))
            .save(&deep)
            .unwrap();

        assert_eq!(
            load_rgb(&gray, ImageLimits::default())
                .unwrap()
                .get_pixel(0, 0)
                .0,
            [77, 77, 77]
        );
        assert_eq!(
            load_rgb(&rgba, ImageLimits::default())
                .unwrap()
                .get_pixel(2, 1)
                .0,
            [10, 20, 30]
        );
        assert_eq!(
            load_rgb(&deep, ImageLimits::default())
                .unwrap()
                .get_pixel(1, 1)
                .0,
            [255, 255, 255]
        );
    }

    #[test]
    fn corrupt_truncated_and_oversized_images_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.png");
        RgbaImage::from_pixel(64, 64, Rgba([1, 2, 3, 255]))
            .save(&good)
            .unwrap();
        let bytes = std::fs::read(&good).unwrap();
        let truncated = dir.path().join("truncated.png");
        std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
        let garbage = dir.path().join("garbage.jpg");
        std::fs::write(&garbage, b"\xff\xd8\xff\xe0 not really a jpeg").unwrap();
        for path in [&truncated, &garbage, &dir.path().join("missing.png")] {
            let err = load_rgb(path, ImageLimits::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains(&*path.to_string_lossy()), "{err}");
        }
        let small = ImageLimits {
            max_side: 32,
            ..ImageLimits::default()
        };
        let err = load_rgb(&good, small).unwrap_err();
        assert!(
            matches!(err, DataError::TooLarge { width: 64, .. }),
            "{err}"
        );
    }
}
