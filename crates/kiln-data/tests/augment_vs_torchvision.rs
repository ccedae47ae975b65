//! The automatic augmentation operations against torchvision's `_apply_op` on PIL images, and
//! the policies' magnitude tables against torch's: fixtures written by
//! `tests/fixtures/make_augment_fixtures.py` from windows of a real photograph.

use std::path::PathBuf;

use image::RgbImage;
use kiln_data::augment::{self, Entry, Interpolation, Op, Sampling};
use kiln_data::{ImageLimits, load_rgb};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn image(name: &str) -> RgbImage {
    load_rgb(
        &fixtures().join("augment").join(name),
        ImageLimits::default(),
    )
    .unwrap()
}

fn reference() -> Value {
    let text = std::fs::read_to_string(fixtures().join("augment.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

const OPS: [Op; 15] = [
    Op::Identity,
    Op::ShearX,
    Op::ShearY,
    Op::TranslateX,
    Op::TranslateY,
    Op::Rotate,
    Op::Brightness,
    Op::Color,
    Op::Contrast,
    Op::Sharpness,
    Op::Posterize,
    Op::Solarize,
    Op::AutoContrast,
    Op::Equalize,
    Op::Invert,
];

fn op(name: &str) -> Op {
    OPS.into_iter().find(|op| op.name() == name).unwrap()
}

#[test]
fn every_operation_matches_torchvision_on_pil_exactly() {
    let reference = reference();
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() >= 100);
    let mut failures = Vec::new();
    for case in cases {
        let name = case["op"].as_str().unwrap();
        let magnitude = case["magnitude"].as_f64().unwrap();
        let input = image(case["input"].as_str().unwrap());
        let interpolation = match case["interpolation"].as_str().unwrap() {
            "nearest" => Interpolation::Nearest,
            "bilinear" => Interpolation::Bilinear,
            other => panic!("{other}"),
        };
        let sampling = Sampling {
            interpolation,
            fill: [0; 3],
        };
        let ours = augment::apply_op(&input, op(name), magnitude, sampling);
        let theirs = image(case["file"].as_str().unwrap());
        assert_eq!(ours.dimensions(), theirs.dimensions(), "{case}");
        let differing = ours
            .as_raw()
            .iter()
            .zip(theirs.as_raw())
            .filter(|(a, b)| a != b)
            .count();
        if differing > 0 {
            failures.push(format!("{} ({differing} values differ)", case["file"]));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A different magnitude must give a different image, or the comparison above proves little.
#[test]
fn the_reference_images_tell_magnitudes_apart() {
    let input = image("input_wide.png");
    let s = Sampling::default();
    for (name, a, b) in [
        ("ShearX", 0.3, 0.31),
        ("Rotate", 30.0, 31.0),
        ("Sharpness", 0.99, 0.5),
        ("Solarize", 128.0, 120.0),
    ] {
        let one = augment::apply_op(&input, op(name), a, s);
        let other = augment::apply_op(&input, op(name), b, s);
        assert_ne!(one, other, "{name}");
    }
}

fn assert_table(ours: &[Entry], theirs: &Value, policy: &str) {
    let theirs = theirs.as_object().unwrap();
    assert_eq!(ours.len(), theirs.len(), "{policy}: operations");
    for entry in ours {
        let name = entry.op.name();
        let table = &theirs[name];
        assert_eq!(
            entry.signed,
            table["signed"].as_bool().unwrap(),
            "{policy} {name}"
        );
        let values: Vec<f32> = table["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        // Scalar tables (one 0.0) stand for operations without a magnitude.
        if entry.magnitudes.is_empty() {
            assert_eq!(values, [0.0], "{policy} {name}");
            continue;
        }
        assert_eq!(entry.magnitudes.len(), values.len(), "{policy} {name}");
        for (a, b) in entry.magnitudes.iter().zip(&values) {
            // torch's vectorised linspace rounds some values an ulp differently, by CPU.
            let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
            assert!(ulps <= 2, "{policy} {name}: {a} against torch's {b}");
        }
    }
}

#[test]
fn magnitude_tables_match_torchvisions() {
    let reference = reference();
    let size = &reference["image_size"];
    let size = (
        size[0].as_u64().unwrap() as u32,
        size[1].as_u64().unwrap() as u32,
    );
    let tables = &reference["tables"];
    assert_table(
        &augment::trivial_augment_space(31),
        &tables["trivial_augment_wide"],
        "trivial_augment_wide",
    );
    assert_table(
        &augment::rand_augment_space(31, size),
        &tables["rand_augment"],
        "rand_augment",
    );
    assert_table(
        &augment::auto_augment_space(size),
        &tables["auto_augment"],
        "auto_augment",
    );
}
