use std::io::Cursor;
use std::path::Path;

use image::RgbImage;

use crate::DataError;

/// What decoding accepts. Sizes are checked before anything large is read: a file's length from
/// its metadata, an image's sides from its header, so that a decompression bomb (a small file
/// that expands to gigabytes) is refused unread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImageLimits {
    pub max_side: u32,
    /// Pixels (width x height), checked from the header (`data.max_image_pixels`).
    pub max_pixels: u64,
    /// Decoded bytes.
    pub max_bytes: u64,
    /// Bytes of the file itself (`data.max_file_bytes`).
    pub max_file_bytes: u64,
    /// Decode truncated JPEG files as far as they go (PIL's `LOAD_TRUNCATED_IMAGES`), instead of
    /// refusing them as PIL does by default.
    pub allow_truncated: bool,
}

impl Default for ImageLimits {
    /// 16,384 pixels a side, PIL's decompression-bomb limit of pixels, 1 GiB decoded and 256 MiB
    /// of file, far above any photograph.
    fn default() -> Self {
        Self {
            max_side: 16_384,
            max_pixels: PIL_MAX_PIXELS,
            max_bytes: 1 << 30,
            max_file_bytes: 256 << 20,
            allow_truncated: false,
        }
    }
}

/// The pixel count over which PIL refuses an image as a decompression bomb
/// (`DecompressionBombError`: twice `Image.MAX_IMAGE_PIXELS`).
pub const PIL_MAX_PIXELS: u64 = 2 * 89_478_485;

/// Decodes an image file of any common format to 8-bit RGB, as PIL's `convert("RGB")` does:
/// grayscale is replicated, alpha is dropped, palettes are expanded, 16-bit is scaled down.
pub fn load_rgb(path: &Path, limits: ImageLimits) -> Result<RgbImage, DataError> {
    let unreadable = |reason: String| DataError::Unreadable {
        path: path.to_path_buf(),
        reason,
    };
    let length = std::fs::metadata(path)
        .map_err(|e| unreadable(e.to_string()))?
        .len();
    if length > limits.max_file_bytes {
        return Err(unreadable(format!(
            "the file is {length} bytes, over the limit of {} (data.max_file_bytes raises it)",
            limits.max_file_bytes
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| unreadable(e.to_string()))?;
    decode_rgb(&bytes, path, limits)
}

/// [`load_rgb`] of an image file's bytes read elsewhere (a member of a tar shard); `path` names
/// it in messages.
pub(crate) fn decode_rgb(
    bytes: &[u8],
    path: &Path,
    limits: ImageLimits,
) -> Result<RgbImage, DataError> {
    let unreadable = |reason: String| DataError::Unreadable {
        path: path.to_path_buf(),
        reason,
    };
    let reader = || {
        image::ImageReader::new(Cursor::new(bytes))
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
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels {
        return Err(unreadable(format!(
            "its header says {width}x{height}, {pixels} pixels, over the limit of {} that guards              against decompression bombs, as PIL's; data.max_image_pixels raises it if the image is genuine",
            limits.max_pixels
        )));
    }
    let mut decode_limits = image::Limits::default();
    decode_limits.max_image_width = Some(limits.max_side);
    decode_limits.max_image_height = Some(limits.max_side);
    decode_limits.max_alloc = Some(limits.max_bytes);
    let mut reader = reader()?;
    if reader.format() == Some(image::ImageFormat::Jpeg)
        && !limits.allow_truncated
        && !jpeg_is_complete(bytes)
    {
        return Err(unreadable(
            "the JPEG file is truncated (it ends before its end-of-image marker), as PIL refuses it; \
             replace the file, or set data.allow_truncated_images = true to train on what decodes"
                .into(),
        ));
    }
    reader.limits(decode_limits);
    let image = reader.decode().map_err(|e| unreadable(e.to_string()))?;
    Ok(image.into_rgb8())
}

/// Whether a JPEG stream reaches its end-of-image marker: its segments are walked by their
/// lengths (so that an embedded EXIF thumbnail's own marker does not count) and each scan's
/// entropy-coded data up to the next marker.
fn jpeg_is_complete(bytes: &[u8]) -> bool {
    const SOI: u8 = 0xD8;
    const EOI: u8 = 0xD9;
    const SOS: u8 = 0xDA;
    if bytes.get(..2) != Some(&[0xFF, SOI]) {
        return false;
    }
    let mut at = 2;
    loop {
        // Markers may be padded with any number of 0xFF bytes.
        while bytes.get(at) == Some(&0xFF) && bytes.get(at + 1) == Some(&0xFF) {
            at += 1;
        }
        let (Some(&0xFF), Some(&marker)) = (bytes.get(at), bytes.get(at + 1)) else {
            return false;
        };
        at += 2;
        match marker {
            EOI => return true,
            // Restart markers and TEM carry no length.
            0xD0..=0xD7 | 0x01 => continue,
            _ => {}
        }
        let Some(length) = bytes.get(at..at + 2) else {
            return false;
        };
        at += usize::from(u16::from_be_bytes([length[0], length[1]]));
        if marker == SOS {
            // Entropy-coded data: 0xFF is followed by 0x00 (a stuffed byte) or a restart
            // marker inside it; any other marker ends it.
            loop {
                match (bytes.get(at), bytes.get(at + 1)) {
                    (Some(0xFF), Some(0x00 | 0xD0..=0xD7)) => at += 2,
                    (Some(0xFF), Some(_)) => break,
                    (Some(_), _) => at += 1,
                    (None, _) => return false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, ImageBuffer, Luma, RgbImage, Rgba, RgbaImage};

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
        let tiny_files = ImageLimits {
            max_file_bytes: 100,
            ..ImageLimits::default()
        };
        let err = load_rgb(&good, tiny_files).unwrap_err().to_string();
        assert!(err.contains("data.max_file_bytes"), "{err}");
        let few_pixels = ImageLimits {
            max_pixels: 64 * 64 - 1,
            ..ImageLimits::default()
        };
        let err = load_rgb(&good, few_pixels).unwrap_err().to_string();
        assert!(err.contains("data.max_image_pixels"), "{err}");
        assert!(
            load_rgb(
                &good,
                ImageLimits {
                    max_pixels: 64 * 64,
                    ..few_pixels
                }
            )
            .is_ok()
        );
    }

    /// PIL refuses a JPEG that ends early, even by its last two bytes; the `image` crate would
    /// decode it and fill the rest in gray.
    #[test]
    fn truncated_jpegs_are_refused_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        // Busy enough that most of the file is entropy-coded data, where a cut leaves the
        // headers whole and the `image` crate decodes what is there and fills in the rest.
        let photo = RgbImage::from_fn(256, 192, |x, y| {
            image::Rgb([(x * y % 251) as u8, (x * 7 + y * 3) as u8, (x ^ y) as u8])
        });
        let whole = dir.path().join("whole.jpg");
        photo.save(&whole).unwrap();
        let bytes = std::fs::read(&whole).unwrap();
        // Also a file with an EXIF-like thumbnail (its own end marker inside an APP1 segment),
        // whole and with its main image cut.
        let mut thumbnail = vec![0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x06, 0xFF, 0xD8, 0xFF, 0xD9];
        thumbnail.extend_from_slice(&bytes[2..]);
        let cases = [
            ("half.jpg", bytes[..bytes.len() / 2].to_vec(), false),
            ("nearly.jpg", bytes[..bytes.len() - 2].to_vec(), false),
            (
                "trailing.jpg",
                [&bytes[..], b"trailing bytes"].concat(),
                true,
            ),
            ("thumbnail.jpg", thumbnail.clone(), true),
            (
                "thumbnail-cut.jpg",
                thumbnail[..thumbnail.len() - 40].to_vec(),
                false,
            ),
        ];
        for (name, data, complete) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, &data).unwrap();
            let loaded = load_rgb(&path, ImageLimits::default());
            assert_eq!(loaded.is_ok(), complete, "{name}: {loaded:?}");
            if !complete {
                let err = loaded.unwrap_err().to_string();
                assert!(err.contains(name) && err.contains("truncated"), "{err}");
                let allowed = ImageLimits {
                    allow_truncated: true,
                    ..ImageLimits::default()
                };
                assert_eq!(load_rgb(&path, allowed).unwrap().dimensions(), (256, 192));
            }
        }
        assert!(load_rgb(&whole, ImageLimits::default()).is_ok());
    }
}
