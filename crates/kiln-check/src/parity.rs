//! One training step of kiln's ResNets against PyTorch's float64 answer: the files that
//! `tests/fixtures/make_resnet_fixtures.py` writes (`<name>.pth` with torchvision's weights and
//! `<name>_expected.safetensors` with the input, the targets and PyTorch's results).
//!
//! Eval logits, train logits and loss within 1e-4, every gradient within 1e-3, and the
//! batch-norm buffers after the train-mode forward. Errors are relative to the largest magnitude
//! in the reference tensor, so that entries that are nearly zero do not turn float noise into
//! huge relative errors. Some gradients are ill-conditioned in float32 (in the Bottleneck network
//! PyTorch's own float32 gradients below layer4 are 1e-2 from float64): such a gradient may be as
//! far from the exact value as twice PyTorch's float32 error, which the fixture records.

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_models::{ResNetConfig, weights};

use crate::CheckError;
use crate::compare::values;
use crate::trajectory::read_tensors;

const LOGITS_TOLERANCE: f64 = 1e-4;
const GRADIENT_TOLERANCE: f64 = 1e-3;
/// Running statistics follow the logits they came from.
const BUFFER_TOLERANCE: f64 = 1e-4;
/// How much further than PyTorch's float32 a gradient may land from the exact one.
const FLOAT32_ERROR_FACTOR: f64 = 2.0;

/// The worst error seen in each stage, and a line for each check that failed.
#[derive(Debug, Default, serde::Serialize)]
pub struct Parity {
    pub worst: BTreeMap<&'static str, f64>,
    pub failures: Vec<String>,
}

impl Parity {
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
                if error > tolerance || error.is_nan() {
                    self.failures.push(format!(
                        "{stage} {name}: relative error {error:.3e} (allowed {tolerance:.1e})"
                    ));
                }
            }
            Err(e) => self.failures.push(format!("{stage} {name}: {e}")),
        }
    }

    /// `stage error, ...` for each stage.
    pub fn summary(&self) -> String {
        let stages: Vec<String> = (self.worst.iter())
            .map(|(stage, error)| format!("{stage} {error:.1e}"))
            .collect();
        stages.join(", ")
    }
}

/// The largest difference between two tensors, relative to the largest magnitude in `expected`.
fn relative_error(actual: &TensorData, expected: &TensorData) -> Result<f64, String> {
    if actual.shape != expected.shape {
        return Err(format!(
            "shape {:?}, expected {:?}",
            actual.shape, expected.shape
        ));
    }
    let (a, e) = (values(actual), values(expected));
    let scale = e.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-6);
    let worst = (a.iter().zip(&e)).fold(0f64, |m, (a, e)| m.max((a - e).abs()));
    Ok(worst / scale)
}

/// The network of `make_resnet_fixtures.py`'s files: a ResNet of `depth` layers, width 4, 10
/// classes.
pub fn fixture_model(depth: usize) -> ResNetConfig {
    ResNetConfig::new(depth).with_num_classes(10).with_width(4)
}

/// Runs fixture `name` (a ResNet of `depth` layers, width 4, 10 classes) from `dir` on `device`.
pub fn check<B: AutodiffBackend>(
    dir: &Path,
    name: &str,
    depth: usize,
    device: &B::Device,
) -> Result<Parity, CheckError> {
    check_model::<B>(dir, name, &fixture_model(depth), device)
}

/// Runs fixture `name`, whose network is `model` (any of the family: `make_family_fixtures.py`
/// writes ResNeXt's and ResNet-D's), from `dir` on `device`.
pub fn check_model<B: AutodiffBackend>(
    dir: &Path,
    name: &str,
    model: &ResNetConfig,
    device: &B::Device,
) -> Result<Parity, CheckError> {
    let reference = read_tensors(&dir.join(format!("{name}_expected.safetensors")))?;
    let tensor = |key: &str| {
        reference.get(key).cloned().ok_or_else(|| CheckError::Read {
            path: dir.join(format!("{name}_expected.safetensors")),
            reason: format!("no tensor `{key}`"),
        })
    };
    let mut parity = Parity::default();

    let model = model.init::<B>(device)?;
    let (model, _) = weights::load(model, &dir.join(format!("{name}.pth")))?;
    let input = Tensor::<B, 4>::from_data(tensor("input")?, device);
    let target = Tensor::<B, 1, Int>::from_data(tensor("target")?, device);

    let eval_logits = model.valid().forward(input.clone().inner()).into_data();
    let expected = tensor("eval_logits")?;
    parity.compare("eval logits", "", &eval_logits, &expected, LOGITS_TOLERANCE);

    let logits = model.forward(input);
    let loss = CrossEntropyLossConfig::new()
        .init(device)
        .forward(logits.clone(), target);
    let expected = tensor("train_logits")?;
    parity.compare(
        "train logits",
        "",
        &logits.into_data(),
        &expected,
        LOGITS_TOLERANCE,
    );
    let expected = tensor("loss")?;
    parity.compare(
        "loss",
        "",
        &loss.clone().into_data(),
        &expected,
        LOGITS_TOLERANCE,
    );

    let gradients = weights::torch_gradients(&model, &loss.backward());
    let expected_count = reference.keys().filter(|k| k.starts_with("grad.")).count();
    if gradients.len() != expected_count {
        parity.failures.push(format!(
            "{} gradients, PyTorch has {expected_count}",
            gradients.len()
        ));
    }
    for (name, grad) in &gradients {
        let (Some(exact), Some(pytorch32)) = (
            reference.get(&format!("grad.{name}")),
            reference.get(&format!("grad32.{name}")),
        ) else {
            parity
                .failures
                .push(format!("PyTorch has no gradient for {name}"));
            continue;
        };
        let pytorch_error = relative_error(pytorch32, exact).unwrap_or(f64::INFINITY);
        let tolerance = GRADIENT_TOLERANCE.max(FLOAT32_ERROR_FACTOR * pytorch_error);
        parity.compare("gradients", name, grad, exact, tolerance);
    }

    for (name, buffer) in weights::torch_state_dict(&model) {
        if let Some(e) = reference.get(&format!("after.{name}")) {
            parity.compare("batch-norm buffers", &name, &buffer, e, BUFFER_TOLERANCE);
        }
    }
    Ok(parity)
}
