//! The hostile-input corpus: files a user's data set or weights can hold that kiln must refuse
//! by name or take in stride. The corpus is built here, by code, from nothing but the shipped
//! fixtures, and given to `kiln` as a user would: each bad file gets its line, no run panics,
//! nothing in a file runs. (Archives' hostile entries are tested where archives are unpacked,
//! in kiln-data's `archive.rs`.)

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::{errors, kiln};

/// A PNG of `width` x `height` 1-bit grey pixels, every row zeros: a decompression bomb.
fn png_bomb(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, width, height);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::One);
    let mut writer = encoder.write_header().unwrap();
    let mut stream = writer.stream_writer().unwrap();
    let row = vec![0u8; (width as usize).div_ceil(8)];
    for _ in 0..height {
        stream.write_all(&row).unwrap();
    }
    stream.finish().unwrap();
    writer.finish().unwrap();
    bytes
}

/// A small PNG whose header is rewritten to say `width` x `height` (its checksum made to
/// match), so that only the pixels that follow are too few.
fn png_header_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    image::GrayImage::from_pixel(8, 8, image::Luma([7]))
        .write_to(
            &mut std::io::Cursor::new(&mut bytes),
            image::ImageFormat::Png,
        )
        .unwrap();
    // The signature (8 bytes), IHDR's length and type (8), then its width and height.
    bytes[16..20].copy_from_slice(&width.to_be_bytes());
    bytes[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = crc32fast::hash(&bytes[12..29]);
    bytes[29..33].copy_from_slice(&crc.to_be_bytes());
    bytes
}

/// A palette PNG: each pixel an index into four colours.
fn palette_png(path: &Path) {
    let file = std::fs::File::create(path).unwrap();
    let mut encoder = png::Encoder::new(file, 16, 16);
    encoder.set_color(png::ColorType::Indexed);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_palette(vec![0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255]);
    let mut writer = encoder.write_header().unwrap();
    let indices: Vec<u8> = (0..256).map(|i| (i % 4) as u8).collect();
    writer.write_image_data(&indices).unwrap();
}

/// A picture of stripes, different per `seed`.
fn stripes(width: u32, height: u32, seed: u32) -> image::RgbImage {
    image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x * 7 + seed * 40) as u8, (y * 5) as u8, (seed * 90) as u8])
    })
}

/// Noise that PNG cannot compress: a file of about 3 bytes a pixel.
fn noise(side: u32) -> image::RgbImage {
    let mut state = 12345u32;
    image::RgbImage::from_fn(side, side, |_, _| {
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 24) as u8
        };
        image::Rgb([next(), next(), next()])
    })
}

/// Writes the image folder: two classes of good images, and the corpus in class `a`. Returns
/// the names of the files that must be skipped, each by name, and of the odd but valid ones
/// that must train.
fn image_corpus(root: &Path) -> (Vec<&'static str>, Vec<&'static str>) {
    for (class, seed) in [("a", 0), ("b", 3)] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        for i in 0..6 {
            let path = root.join(class).join(format!("good{i}.png"));
            stripes(20, 20, seed + i).save(path).unwrap();
        }
    }
    let bad = root.join("a");
    std::fs::write(bad.join("empty.png"), b"").unwrap();
    std::fs::write(
        bad.join("text.png"),
        b"this is a text file, not a picture\n",
    )
    .unwrap();
    std::fs::write(
        bad.join("huge_header.png"),
        png_header_claiming(60_000, 60_000),
    )
    .unwrap();
    // 256 million pixels of zeros in 31 kB: within the side limit, over PIL's pixel limit.
    std::fs::write(bad.join("bomb.png"), png_bomb(16_000, 16_000)).unwrap();
    // Within the side limit, but resized to 128 on its short side it would be 268 Mpx.
    stripes(16_384, 1, 1).save(bad.join("extreme.png")).unwrap();
    let mut jpeg = Vec::new();
    stripes(64, 64, 2)
        .write_to(
            &mut std::io::Cursor::new(&mut jpeg),
            image::ImageFormat::Jpeg,
        )
        .unwrap();
    std::fs::write(bad.join("truncated.jpg"), &jpeg[..jpeg.len() / 2]).unwrap();
    // Over the `data.max_file_bytes` the test sets.
    noise(300).save(bad.join("oversized.png")).unwrap();
    std::fs::create_dir(bad.join("dir.jpg")).unwrap();
    // Over the limit of a side.
    stripes(20_000, 2, 4).save(bad.join("wide.png")).unwrap();
    stripes(3, 20_000, 5).save(bad.join("tall.png")).unwrap();

    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/kiln-data/tests/fixtures");
    std::fs::copy(fixtures.join("cmyk.jpg"), bad.join("cmyk.jpg")).unwrap();
    image::ImageBuffer::<image::Luma<u16>, _>::from_fn(20, 20, |x, y| {
        image::Luma([(x * 3000 + y * 100) as u16])
    })
    .save(bad.join("gray16.png"))
    .unwrap();
    palette_png(&bad.join("palette.png"));
    image::RgbaImage::from_fn(20, 20, |x, y| {
        image::Rgba([x as u8 * 9, y as u8 * 9, 0, 100])
    })
    .save(bad.join("rgba.png"))
    .unwrap();
    let skipped = vec![
        "empty.png",
        "text.png",
        "huge_header.png",
        "bomb.png",
        "extreme.png",
        "truncated.jpg",
        "oversized.png",
        "wide.png",
        "tall.png",
    ];
    let trained = vec!["cmyk.jpg", "gray16.png", "palette.png", "rgba.png"];
    (skipped, trained)
}

fn assert_no_panic(stderr: &[String]) {
    for line in stderr {
        assert!(
            !line.contains("panicked") && !line.contains("stopped unexpectedly"),
            "{stderr:#?}"
        );
    }
}

#[test]
fn a_folder_of_hostile_images_trains_with_each_bad_file_skipped_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    let (skipped, trained) = image_corpus(&root);
    let config = dir.path().join("hostile.toml");
    std::fs::write(
        &config,
        format!(
            r#"
name = "hostile"
epochs = 1
batch_size = 4
[model]
name = "resnet18"
stem = "cifar"
width = 4
[data]
source = {{ kind = "image_folder", train = "{root}", val = "{root}" }}
workers = 1
max_file_bytes = 200000
train_transforms = [{{ op = "resize", size = 128 }}, {{ op = "center_crop", size = 128 }}]
val_transforms = [{{ op = "resize", size = 128 }}, {{ op = "center_crop", size = 128 }}]
[optimizer]
name = "sgd"
lr = 0.01
[logging]
runs_dir = "{runs}"
"#,
            root = root.display(),
            runs = dir.path().join("runs").display(),
        ),
    )
    .unwrap();
    let output = kiln(&[
        "train",
        "--config",
        &config.to_string_lossy(),
        "--backend",
        "flex",
    ]);
    let stderr = errors(&output);
    assert!(output.status.success(), "{stderr:#?}");
    assert_no_panic(&stderr);
    let warnings: Vec<&String> = stderr.iter().filter(|l| l.contains("skipped")).collect();
    for name in &skipped {
        assert!(
            warnings.iter().any(|l| l.contains(name)),
            "{name} was not named as skipped: {stderr:#?}"
        );
    }
    for name in &trained {
        assert!(
            !warnings.iter().any(|l| l.contains(name)),
            "{name} was skipped: {stderr:#?}"
        );
    }
    // Every limit says which key raises it.
    for (name, key) in [
        ("huge_header.png", "data.max_image_side"),
        ("bomb.png", "data.max_image_pixels"),
        ("wide.png", "data.max_image_side"),
        ("extreme.png", "data.max_resize_pixels"),
        ("oversized.png", "data.max_file_bytes"),
        ("truncated.jpg", "data.allow_truncated_images"),
    ] {
        let line = warnings.iter().find(|l| l.contains(name)).unwrap();
        assert!(line.contains(key), "{name}: {line}");
    }
}

/// A `.pth` whose pickle is `pickle` (protocol 2), as `torch.save` lays the archive out.
fn pth_with_pickle(path: &Path, pickle: &[u8]) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("archive/data.pkl", stored).unwrap();
    zip.write_all(pickle).unwrap();
    zip.start_file("archive/version", stored).unwrap();
    zip.write_all(b"3\n").unwrap();
    zip.finish().unwrap();
}

/// A pickle that calls `module.name(argument)` when Python unpickles it.
fn calling_pickle(module: &str, name: &str, argument: &str) -> Vec<u8> {
    let mut pickle = vec![0x80, 2];
    pickle.extend(format!("c{module}\n{name}\n").bytes());
    pickle.push(b'X');
    pickle.extend((argument.len() as u32).to_le_bytes());
    pickle.extend(argument.bytes());
    pickle.extend([0x85, b'R', b'.']); // TUPLE1, REDUCE, STOP
    pickle
}

/// The shipped ResNet-18 safetensors fixture with `poison` as `fc.weight`'s first value.
fn poisoned(fixture: &Path, into: &Path, poison: f32) {
    let bytes = std::fs::read(fixture).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let mut data = view.data().to_vec();
            if name == "fc.weight" {
                data[..4].copy_from_slice(&poison.to_le_bytes());
            }
            (name, view.dtype(), view.shape().to_vec(), data)
        })
        .collect();
    owned.sort_by(|a, b| a.0.cmp(&b.0));
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(name, dtype, shape, data)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap();
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, into).unwrap();
}

/// The fixture `.pth` again with every entry compressed, plus 64 MiB of zeros that compress a
/// thousandfold.
fn zip_bomb(fixture: &Path, into: &Path) {
    let zeros = vec![0u8; 64 << 20];
    let extra = ("resnet18_w4/data/999", zeros.as_slice());
    kiln_models::weights::recompressed(fixture, into, Some(extra)).unwrap();
}

#[test]
fn hostile_weight_files_are_refused_in_one_line_and_run_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let image = dir.path().join("picture.png");
    stripes(40, 40, 1).save(&image).unwrap();
    let witness = dir.path().join("pwned");
    let mut files: Vec<PathBuf> = Vec::new();
    let mut add = |name: &str| {
        files.push(dir.path().join(name));
        dir.path().join(name)
    };
    let command = format!("touch {}", witness.display());
    pth_with_pickle(
        &add("os_system.pth"),
        &calling_pickle("posix", "system", &command),
    );
    pth_with_pickle(
        &add("imports.pth"),
        &calling_pickle("builtins", "__import__", "subprocess"),
    );
    zip_bomb(&fixtures.join("resnet18_w4.pth"), &add("bomb.pth"));
    let safetensors = fixtures.join("resnet18_w4.safetensors");
    poisoned(&safetensors, &add("nan.safetensors"), f32::NAN);
    poisoned(&safetensors, &add("inf.safetensors"), f32::INFINITY);
    let pth = std::fs::read(fixtures.join("resnet18_w4.pth")).unwrap();
    std::fs::write(add("truncated.pth"), &pth[..pth.len() / 3]).unwrap();

    for weights in &files {
        let output = kiln(&[
            "predict",
            &image.to_string_lossy(),
            "--pretrained",
            &weights.to_string_lossy(),
            "--model",
            "resnet18",
            "--width",
            "4",
            "--num-classes",
            "10",
            "--backend",
            "flex",
        ]);
        let stderr = errors(&output);
        assert!(!output.status.success(), "{} loaded", weights.display());
        assert_no_panic(&stderr);
        let lines: Vec<&String> = stderr.iter().filter(|l| l.contains("error")).collect();
        assert_eq!(lines.len(), 1, "{stderr:#?}");
        let name = weights.file_name().unwrap().to_string_lossy();
        assert!(lines[0].contains(&*name), "{stderr:#?}");
    }
    assert!(!witness.exists(), "a pickle ran a command");
}
