//! Random erasing's box against torchvision's `RandomErasing` for the same draws: fixtures
//! written by `tests/fixtures/make_erasing_fixtures.py`, which records torch's own draws on
//! windows of a real photograph and replays them into torchvision.

use std::path::PathBuf;

use kiln_data::transforms::{ErasingDraws, erasing_box};
use serde_json::Value;

/// torch's recorded draws, handed out in order.
struct Recorded {
    uniforms: Vec<f32>,
    integers: Vec<usize>,
    ranges: Vec<usize>,
}

impl ErasingDraws for Recorded {
    fn uniform(&mut self, low: f32, high: f32) -> f32 {
        let value = self.uniforms.remove(0);
        assert!((low..=high).contains(&value), "{low} <= {value} <= {high}");
        value
    }

    fn below(&mut self, n: usize) -> usize {
        assert_eq!(n, self.ranges.remove(0), "randint's range");
        self.integers.remove(0)
    }
}

fn numbers<T: serde::de::DeserializeOwned>(value: &Value) -> Vec<T> {
    serde_json::from_value(value.clone()).unwrap()
}

#[test]
fn random_erasing_boxes_are_torchvisions_for_the_same_draws() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/erasing.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let windows: Vec<[usize; 4]> = numbers(&fixture["windows"]);
    let cases = fixture["cases"].as_array().unwrap();
    let (mut erased, mut none_fitted) = (0, 0);
    for (index, case) in cases.iter().enumerate() {
        let [left, top, right, bottom] = windows[case["window"].as_u64().unwrap() as usize];
        let size = (bottom - top, right - left);
        let draws: Vec<f32> = numbers(&case["draws"]);
        let p = case["p"].as_f64().unwrap();
        let expected: Option<[usize; 4]> = serde_json::from_value(case["box"].clone()).unwrap();
        // torchvision's `torch.rand(1) < p` comes first.
        if f64::from(draws[0]) >= p {
            assert_eq!(expected, None, "case {index}");
            continue;
        }
        let mut recorded = Recorded {
            uniforms: draws[1..].to_vec(),
            integers: numbers(&case["integers"]),
            ranges: numbers(&case["ranges"]),
        };
        let scale: [f64; 2] = serde_json::from_value(case["scale"].clone()).unwrap();
        let ratio: [f64; 2] = serde_json::from_value(case["ratio"].clone()).unwrap();
        let found = erasing_box(size, scale, ratio, &mut recorded);
        let found = found.map(|(top, left, h, w)| [top, left, h, w]);
        assert_eq!(found, expected, "case {index}: {case}");
        assert!(
            recorded.uniforms.is_empty() && recorded.integers.is_empty(),
            "case {index}: kiln drew less than torchvision"
        );
        match found {
            Some(_) => erased += 1,
            None => none_fitted += 1,
        }
    }
    // The fixture covers boxes found, and ten tries without one.
    assert!(erased >= 40 && none_fitted >= 10, "{erased} {none_fitted}");
}
