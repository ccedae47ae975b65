//! Mixup and CutMix against timm's `Mixup` for the same draws: the mixed images and the soft
//! targets, per batch, pair and image (`tests/fixtures/make_mix_fixtures.py` wrote them).

use kiln_data::mix::{Draw, MixMode, Mixing};
use serde_json::Value;

fn floats(value: &Value) -> Vec<f32> {
    let values = value.as_array().expect("an array of numbers");
    values.iter().map(|v| v.as_f64().unwrap() as f32).collect()
}

#[test]
fn mixed_images_and_targets_match_timm() {
    let text = include_str!("fixtures/mix.json");
    let fixture: Value = serde_json::from_str(text).unwrap();
    let shape: Vec<usize> = serde_json::from_value(fixture["shape"].clone()).unwrap();
    let shape: [usize; 4] = shape.try_into().unwrap();
    let labels: Vec<i64> = serde_json::from_value(fixture["labels"].clone()).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 7);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let mixing = Mixing {
            mixup_alpha: case["mixup_alpha"].as_f64().unwrap(),
            cutmix_alpha: case["cutmix_alpha"].as_f64().unwrap(),
            prob: case["prob"].as_f64().unwrap(),
            switch_prob: 0.5,
            mode: serde_json::from_value::<MixMode>(case["mode"].clone()).unwrap(),
            label_smoothing: fixture["label_smoothing"].as_f64().unwrap(),
            classes: fixture["classes"].as_u64().unwrap() as usize,
        };
        let draws: Vec<Draw> = case["draws"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| Draw {
                lam: d["lam"].as_f64().unwrap(),
                cutmix_center: d.get("center").map(|c| {
                    let c: [usize; 2] = serde_json::from_value(c.clone()).unwrap();
                    (c[0], c[1])
                }),
            })
            .collect();
        let mut images = floats(&case["images"]);
        let mixed = mixing.apply(&mut images, shape, &labels, &draws);
        assert_eq!(images, floats(&case["mixed"]), "{name}: images");
        assert_eq!(mixed.targets, floats(&case["targets"]), "{name}: targets");
        assert_ne!(
            floats(&case["images"]) == images,
            name != "batch left alone",
            "{name}: the case mixes something (or, left alone, nothing)"
        );
    }
}
