//! PyTorch parity: kiln's ResNets against the reference files that
//! `tests/fixtures/make_resnet_fixtures.py` writes (PyTorch is not needed to run this).
//!
//! Every compiled backend with a device is checked against PyTorch's float64 answer: eval logits,
//! train logits and loss within 1e-4, every gradient within 1e-3, and the batch-norm buffers
//! after the train-mode forward. Errors are relative to the largest magnitude in the reference
//! tensor, so that entries that are nearly zero do not turn float noise into huge relative errors.
//!
//! Some gradients are ill-conditioned in float32 (in the Bottleneck network PyTorch's own float32
//! gradients below layer4 are 1e-2 from float64). Such a gradient may be as far from the exact
//! value as twice PyTorch's float32 error, which the fixture records; never less than 1e-3.
//!
//! Set `KILN_REQUIRE_WGPU=1` (CI does) to fail instead of skipping when no wgpu adapter exists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_backend::{Backend, BackendChoice, BackendTask, DeviceSelection, probe, resolve, run_on};
use kiln_models::{ResNetConfig, weights};

const LOGITS_TOLERANCE: f64 = 1e-4;
const GRADIENT_TOLERANCE: f64 = 1e-3;
/// Running statistics follow the logits they came from.
const BUFFER_TOLERANCE: f64 = 1e-4;
/// How much further than PyTorch's float32 a gradient may land from the exact one.
const FLOAT32_ERROR_FACTOR: f64 = 2.0;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The reference tensors, by name.
fn expected(name: &str) -> BTreeMap<String, TensorData> {
    let bytes = std::fs::read(fixture(&format!("{name}_expected.safetensors"))).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(key, view)| {
            let shape = view.shape().to_vec();
            let data = match view.dtype() {
                safetensors::Dtype::F32 => TensorData::new(
                    view.data()
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                        .collect::<Vec<f32>>(),
                    shape,
                ),
                safetensors::Dtype::I64 => TensorData::new(
                    view.data()
                        .chunks_exact(8)
                        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                        .collect::<Vec<i64>>(),
                    shape,
                ),
                other => panic!("{key}: unexpected dtype {other:?}"),
            };
            (key, data)
        })
        .collect()
}

/// The largest difference between two tensors, relative to the largest magnitude in `expected`.
fn relative_error(actual: &TensorData, expected: &TensorData) -> Result<f64, String> {
    if actual.shape != expected.shape {
        return Err(format!(
            "shape {:?}, expected {:?}",
            actual.shape, expected.shape
        ));
    }
    let a = actual.clone().convert::<f64>().to_vec::<f64>().unwrap();
    let e = expected.clone().convert::<f64>().to_vec::<f64>().unwrap();
    let scale = e.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-6);
    let worst = a
        .iter()
        .zip(&e)
        .fold(0f64, |m, (a, e)| m.max((a - e).abs()));
    Ok(worst / scale)
}

/// The worst error seen in each stage, and a line for each check that failed.
#[derive(Default)]
struct Report {
    worst: BTreeMap<&'static str, f64>,
    failures: Vec<String>,
}

impl Report {
    /// Checks that `actual` is within `tolerance` of `expected`.
    fn compare(
        &mut self,
        stage: &'static str,
        name: &str,
        actual: &TensorData,
        expected: &TensorData,
        tolerance: f64,
    ) {
        match relative_error(actual, expected) {
            Ok(error) => {
                let worst = self.worst.entry(stage).or_default();
                *worst = worst.max(error);
                if error > tolerance {
                    self.failures.push(format!(
                        "{stage} {name}: relative error {error:.3e} (allowed {tolerance:.1e})"
                    ));
                }
            }
            Err(e) => self.failures.push(format!("{stage} {name}: {e}")),
        }
    }

    fn summary(&self) -> String {
        let stages: Vec<String> = self
            .worst
            .iter()
            .map(|(stage, error)| format!("{stage} {error:.1e}"))
            .collect();
        stages.join(", ")
    }
}

struct Parity {
    fixture: &'static str,
    depth: usize,
}

impl BackendTask for Parity {
    type Output = Report;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Report {
        let device = &devices[0];
        let reference = expected(self.fixture);
        let mut report = Report::default();

        let model = ResNetConfig::new(self.depth)
            .with_num_classes(10)
            .with_width(4)
            .init::<B>(device)
            .unwrap();
        let (model, _) = weights::load(model, &fixture(&format!("{}.pth", self.fixture))).unwrap();
        let input = Tensor::<B, 4>::from_data(reference["input"].clone(), device);
        let target = Tensor::<B, 1, Int>::from_data(reference["target"].clone(), device);

        let eval_logits = model.valid().forward(input.clone().inner()).into_data();
        report.compare(
            "eval logits",
            "",
            &eval_logits,
            &reference["eval_logits"],
            LOGITS_TOLERANCE,
        );

        let logits = model.forward(input);
        let loss = CrossEntropyLossConfig::new()
            .init(device)
            .forward(logits.clone(), target);
        let train_logits = logits.into_data();
        report.compare(
            "train logits",
            "",
            &train_logits,
            &reference["train_logits"],
            LOGITS_TOLERANCE,
        );
        report.compare(
            "loss",
            "",
            &loss.clone().into_data(),
            &reference["loss"],
            LOGITS_TOLERANCE,
        );

        let gradients = weights::torch_gradients(&model, &loss.backward());
        let expected_count = reference.keys().filter(|k| k.starts_with("grad.")).count();
        if gradients.len() != expected_count {
            report.failures.push(format!(
                "{} gradients, PyTorch has {expected_count}",
                gradients.len()
            ));
        }
        for (name, grad) in &gradients {
            let (Some(exact), Some(pytorch32)) = (
                reference.get(&format!("grad.{name}")),
                reference.get(&format!("grad32.{name}")),
            ) else {
                report
                    .failures
                    .push(format!("PyTorch has no gradient for {name}"));
                continue;
            };
            let pytorch_error = relative_error(pytorch32, exact).unwrap();
            let tolerance = GRADIENT_TOLERANCE.max(FLOAT32_ERROR_FACTOR * pytorch_error);
            report.compare("gradients", name, grad, exact, tolerance);
        }

        for (name, buffer) in weights::torch_state_dict(&model) {
            if let Some(e) = reference.get(&format!("after.{name}")) {
                report.compare("batch-norm buffers", &name, &buffer, e, BUFFER_TOLERANCE);
            }
        }
        report
    }
}

/// Runs one fixture on every CPU backend compiled in, and on wgpu where an adapter exists.
fn check_everywhere(fixture: &'static str, depth: usize) {
    let probe = probe();
    let require_wgpu = std::env::var_os("KILN_REQUIRE_WGPU").is_some();
    let mut tested = 0;
    let mut failures = Vec::new();
    for backend in [Backend::Flex, Backend::NdArray, Backend::Wgpu] {
        let resolved = match resolve(
            BackendChoice::Explicit(backend),
            &DeviceSelection::default(),
            &probe,
        ) {
            Ok(resolved) => resolved,
            Err(why) if backend == Backend::Wgpu && require_wgpu && backend.is_compiled() => {
                panic!("KILN_REQUIRE_WGPU is set but wgpu is unusable: {why}")
            }
            Err(why) => {
                eprintln!("{fixture}: skipping {backend}: {why}");
                continue;
            }
        };
        let report = run_on(&resolved, Parity { fixture, depth }).unwrap();
        eprintln!(
            "{fixture} on {backend} ({}), worst relative errors: {}",
            resolved.devices[0].name,
            report.summary()
        );
        tested += 1;
        failures.extend(
            report
                .failures
                .into_iter()
                .map(|f| format!("{backend}: {f}")),
        );
    }
    assert!(tested > 0, "no backend could run the parity test");
    assert!(
        failures.is_empty(),
        "{fixture} differs from PyTorch:\n{}",
        failures.join("\n")
    );
}

#[test]
fn resnet18_structure_matches_pytorch() {
    check_everywhere("resnet18_w4", 18);
}

#[test]
fn resnet50_structure_matches_pytorch() {
    check_everywhere("resnet50_w4", 50);
}
