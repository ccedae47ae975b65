//! The same numbers on every backend: one set of weights, saved once and loaded everywhere, one
//! batch, and every stage of a training step compared against a reference backend.
//!
//! Errors are relative to the largest magnitude in the reference tensor (as in the PyTorch parity
//! tests), so entries near zero do not turn float noise into huge relative errors. After optimizer
//! steps each parameter is compared with its own update (how far the reference's steps moved it
//! from the shared initial weights), in the Euclidean norm over the tensor: `|after - reference|
//! / |reference - initial|`. The two backends start from the same weights, so every difference is
//! a difference of updates, and a wrong update on any one tensor (a missing weight decay, a wrong
//! momentum, a learning rate 10% off) shows as the fraction it is wrong by, instead of vanishing
//! beside the largest weight of the network. The norm, not the largest entry: AdamW divides each
//! gradient by its own running size, so the few entries whose gradients are as small as float32
//! rounding step by whatever that rounding says, on every backend (the largest entry of one
//! tensor's difference moved between 0.6% and 3.7% of its largest update from one wgpu run to
//! the next against the same flex run); in the norm they weigh what they are, a few entries of
//! thousands. Batch-norm buffers after the steps are a stage of their own, relative to their own
//! magnitude.
//!
//! Bottleneck networks (ResNet-50 and deeper) at random initialisation are ill-conditioned in
//! float32: rounding alone moves their gradients by percents (PyTorch's own float32 gradients are
//! 1e-2 from float64 there, and two summation orders differ as much). Compare them with
//! `zero_init_residual`, as their training recipes initialise them; basic-block networks need no
//! such care.

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::TensorData;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_config::config::OptimizerConfig;
use kiln_models::{ResNet, ResNetConfig, weights};
use kiln_train::batch::DeviceBatch;
use kiln_train::optim::AnyOptimizer;
use kiln_train::step::{Replica, StepPlan};
use serde::Serialize;

use crate::CheckError;

/// What to compare: a network, its input size, a batch size and how many optimizer steps.
#[derive(Debug, Clone)]
pub struct CompareSpec {
    pub model: ResNetConfig,
    pub image_size: usize,
    pub batch: usize,
    pub steps: usize,
    pub seed: u64,
}

/// The stages of a training step, in the order they happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    EvalLogits,
    TrainLogits,
    Loss,
    Gradients,
    BatchNormStatistics,
    SgdSteps,
    SgdBuffers,
    AdamwSteps,
    AdamwBuffers,
}

impl Stage {
    /// Whether errors are relative to each tensor's update rather than its magnitude (see the
    /// module's documentation).
    fn relative_to_update(self) -> bool {
        matches!(self, Stage::SgdSteps | Stage::AdamwSteps)
    }

    pub fn name(self) -> &'static str {
        match self {
            Stage::EvalLogits => "eval logits",
            Stage::TrainLogits => "train logits",
            Stage::Loss => "loss",
            Stage::Gradients => "gradients",
            Stage::BatchNormStatistics => "bn running stats",
            Stage::SgdSteps => "after SGD steps",
            Stage::SgdBuffers => "SGD steps' bn buffers",
            Stage::AdamwSteps => "after AdamW steps",
            Stage::AdamwBuffers => "AdamW steps' bn buffers",
        }
    }
}

/// One backend's numbers for every stage, read back to the host and keyed by torchvision names.
#[derive(Debug, Default)]
pub struct Capture {
    pub stages: BTreeMap<Stage, BTreeMap<String, TensorData>>,
    /// The weights every backend starts from: what the optimizer steps' updates are measured
    /// against.
    pub initial: BTreeMap<String, TensorData>,
}

/// The optimizers compared: SGD with momentum and weight decay as an ImageNet recipe sets it,
/// and AdamW with PyTorch's defaults.
fn optimizers() -> [(Stage, Stage, OptimizerConfig); 2] {
    let mut sgd = OptimizerConfig::sgd(0.1);
    sgd.momentum = 0.9;
    sgd.weight_decay = Some(5e-4);
    [
        (Stage::SgdSteps, Stage::SgdBuffers, sgd),
        (
            Stage::AdamwSteps,
            Stage::AdamwBuffers,
            OptimizerConfig::adamw(1e-3),
        ),
    ]
}

/// Whether a state-dict entry is a batch-norm buffer rather than a parameter.
fn is_buffer(name: &str) -> bool {
    name.contains("running_") || name.ends_with("num_batches_tracked")
}

/// Initialises the network on `B` with the spec's seed and saves it to `path`, so that every
/// backend starts from these exact weights.
pub fn save_initial_weights<B: Backend>(
    spec: &CompareSpec,
    device: &B::Device,
    path: &Path,
) -> Result<(), CheckError> {
    B::seed(device, spec.seed);
    let model = spec.model.init::<B>(device)?;
    weights::save_safetensors(&model, path)?;
    Ok(())
}

/// Runs every stage on `B` from the weights in `path`.
pub fn capture<B: AutodiffBackend>(
    spec: &CompareSpec,
    path: &Path,
    device: &B::Device,
) -> Result<Capture, CheckError> {
    let load = || -> Result<ResNet<B>, CheckError> {
        let model = spec.model.init::<B>(device)?;
        Ok(weights::load(model, path)?.0)
    };
    let mut capture = Capture::default();
    let loss_fn = CrossEntropyLossConfig::new().init(device);

    let model = load()?;
    capture.initial = weights::torch_state_dict(&model);
    let batch = step_batch::<B>(spec, 0, device);
    let eval_logits = model.valid().forward(batch.images.clone().inner());
    capture.put(Stage::EvalLogits, "logits", eval_logits.into_data());

    let logits = model.forward(batch.images.clone());
    let loss = loss_fn.forward(logits.clone(), batch.labels.clone());
    capture.put(Stage::TrainLogits, "logits", logits.into_data());
    capture.put(Stage::Loss, "loss", loss.clone().into_data());
    let grads = loss.backward();
    capture
        .stages
        .insert(Stage::Gradients, weights::torch_gradients(&model, &grads));
    capture.stages.insert(
        Stage::BatchNormStatistics,
        weights::torch_state_dict(&model)
            .into_iter()
            .filter(|(name, _)| name.contains("running_"))
            .collect(),
    );

    // The parameters after a few steps of the trainer's own step function.
    for (stage, buffers, config) in optimizers() {
        let mut replica = Replica::new(
            load()?,
            AnyOptimizer::<ResNet<B>, B>::new(&config),
            loss_fn.clone(),
            device.clone(),
        );
        for step in 0..spec.steps {
            let batch = step_batch::<B>(spec, step, device);
            let images = batch.len();
            replica.step(vec![batch], &StepPlan::alone(images), config.lr)?;
        }
        let (kept, trained) = weights::torch_state_dict(&replica.model().valid())
            .into_iter()
            .partition(|(name, _)| is_buffer(name));
        capture.stages.insert(stage, trained);
        capture.stages.insert(buffers, kept);
    }
    Ok(capture)
}

impl Capture {
    fn put(&mut self, stage: Stage, name: &str, data: TensorData) {
        self.stages
            .entry(stage)
            .or_default()
            .insert(name.to_string(), data);
    }
}

/// Step `step`'s batch: unit-variance uniform noise and labels from the spec's seed, the same
/// on every backend.
fn step_batch<B: Backend>(spec: &CompareSpec, step: usize, device: &B::Device) -> DeviceBatch<B> {
    let seed = spec.seed ^ ((step as u64 + 1) << 32);
    crate::seeded_batch(
        seed,
        spec.batch,
        spec.image_size,
        spec.model.num_classes,
        device,
    )
}

/// How far a float32 backend's parameters may be after the optimizer steps, in the norm of each
/// tensor's update: summation order moves gradients by up to 1e-3 of their size (the gradient
/// stage's tolerance), and the updates follow them. Measured (`kiln compare`, width-8 ResNet-18,
/// Intel Xeon): 1.4e-5 after SGD and 7e-5 to 3e-4 after AdamW for ndarray and wgpu against flex.
const SGD_FLOAT32: f64 = 1e-2;
const ADAMW_FLOAT32: f64 = 1e-2;
/// The same with TF32 products (CUDA), about ten times noisier; still below the 10% of one
/// tensor's update that the mutation tests get wrong on purpose.
const SGD_TF32: f64 = 5e-2;
const ADAMW_TF32: f64 = 5e-2;

/// How far a backend may be from the reference, per stage, relative to the reference's largest
/// magnitude (after optimizer steps, to each parameter's update).
#[derive(Debug, Clone, Serialize)]
pub struct Tolerances(BTreeMap<Stage, f64>);

impl Tolerances {
    /// Backends that compute in float32 throughout (flex, ndarray, wgpu): only summation order
    /// differs. Forward values agree to a few ulps of the largest value; gradients pass through
    /// every layer backwards and pick up more; the steps multiply gradient noise by the
    /// learning rate (AdamW's near-zero gradients more: see the module's documentation).
    pub fn float32() -> Self {
        Self(BTreeMap::from([
            (Stage::EvalLogits, 1e-4),
            (Stage::TrainLogits, 1e-4),
            (Stage::Loss, 1e-5),
            (Stage::Gradients, 1e-3),
            (Stage::BatchNormStatistics, 1e-4),
            (Stage::SgdSteps, SGD_FLOAT32),
            (Stage::SgdBuffers, 1e-4),
            (Stage::AdamwSteps, ADAMW_FLOAT32),
            (Stage::AdamwBuffers, 1e-4),
        ]))
    }

    /// Backends that may multiply float32 matrices on tensor cores in TF32 (CUDA): about three
    /// decimal digits per product instead of seven, so ten times looser than [`Self::float32`]
    /// and more for gradients, which go through two matrix products per layer.
    pub fn tensor_cores() -> Self {
        Self(BTreeMap::from([
            (Stage::EvalLogits, 1e-2),
            (Stage::TrainLogits, 1e-2),
            (Stage::Loss, 1e-3),
            (Stage::Gradients, 5e-2),
            (Stage::BatchNormStatistics, 1e-2),
            (Stage::SgdSteps, SGD_TF32),
            (Stage::SgdBuffers, 1e-2),
            (Stage::AdamwSteps, ADAMW_TF32),
            (Stage::AdamwBuffers, 1e-2),
        ]))
    }

    /// The tolerances a backend is held to: CUDA may multiply on tensor cores in TF32, every
    /// other backend computes in float32 throughout.
    pub fn for_backend(backend: kiln_backend::Backend) -> Self {
        match backend {
            kiln_backend::Backend::Cuda => Self::tensor_cores(),
            _ => Self::float32(),
        }
    }

    pub fn get(&self, stage: Stage) -> f64 {
        self.0[&stage]
    }
}

/// A stage's worst difference from the reference.
#[derive(Debug, Clone, Serialize)]
pub struct StageDiff {
    pub stage: Stage,
    /// The largest difference of any entry.
    pub max_abs: f64,
    /// The worst tensor's relative error: its largest difference over its largest magnitude, or
    /// after optimizer steps the norm of its difference over the norm of its update.
    pub max_rel: f64,
    /// The tensor where `max_rel` was found, or what was wrong with it.
    pub worst: String,
    pub tolerance: f64,
    pub passed: bool,
}

/// Compares every stage of `actual` with `reference`.
pub fn diff(reference: &Capture, actual: &Capture, tolerances: &Tolerances) -> Vec<StageDiff> {
    reference
        .stages
        .iter()
        .map(|(&stage, expected)| {
            let mut result = StageDiff {
                stage,
                max_abs: 0.0,
                max_rel: 0.0,
                worst: String::new(),
                tolerance: tolerances.get(stage),
                passed: true,
            };
            let tensors = actual.stages.get(&stage);
            for (name, want) in expected {
                let (abs, rel, problem) = match tensors.and_then(|t| t.get(name)) {
                    None => (f64::INFINITY, f64::INFINITY, Some("missing")),
                    Some(got) if got.shape != want.shape => {
                        (f64::INFINITY, f64::INFINITY, Some("wrong shape"))
                    }
                    Some(got) => {
                        let abs = largest_difference(got, want);
                        let initial = reference.initial.get(name);
                        let rel = match initial.filter(|_| stage.relative_to_update()) {
                            Some(initial) => distance(got, want) / update_size(want, initial),
                            None => abs / largest_magnitude(want).max(1e-12),
                        };
                        (abs, rel, None)
                    }
                };
                // A NaN is the worst error there is.
                let (abs, rel) = if rel.is_nan() {
                    (f64::INFINITY, f64::INFINITY)
                } else {
                    (abs, rel)
                };
                result.max_abs = result.max_abs.max(abs);
                if rel > result.max_rel {
                    result.max_rel = rel;
                    result.worst = match problem {
                        Some(p) => format!("{name} ({p})"),
                        None => name.clone(),
                    };
                }
            }
            result.passed = result.max_rel <= result.tolerance;
            result
        })
        .collect()
}

/// A tensor's values as f64 (empty if they cannot be read).
pub(crate) fn values(data: &TensorData) -> Vec<f64> {
    data.clone()
        .convert::<f64>()
        .to_vec::<f64>()
        .unwrap_or_default()
}

/// The size of the move from `initial` to `after` in [`distance`]'s norm, at least a millionth
/// of the tensor's (an update of zero, where nothing moved, compares as a tiny one).
fn update_size(after: &TensorData, initial: &TensorData) -> f64 {
    distance(after, initial).max(1e-6 * norm(after))
}

/// The Euclidean norm of a tensor.
fn norm(data: &TensorData) -> f64 {
    values(data).iter().map(|v| v * v).sum::<f64>().sqrt()
}

/// The Euclidean distance between two tensors (the root of their differences' summed squares);
/// NaN if either side has a NaN.
fn distance(actual: &TensorData, expected: &TensorData) -> f64 {
    values(actual)
        .iter()
        .zip(&values(expected))
        .map(|(a, e)| (a - e) * (a - e))
        .sum::<f64>()
        .sqrt()
}

fn largest_magnitude(data: &TensorData) -> f64 {
    values(data).iter().fold(0f64, |m, v| m.max(v.abs()))
}

/// The largest absolute difference; NaN if either side has a NaN where the other has a number.
fn largest_difference(actual: &TensorData, expected: &TensorData) -> f64 {
    values(actual)
        .iter()
        .zip(&values(expected))
        .map(|(a, e)| (a - e).abs())
        .fold(0f64, |m, d| {
            if d.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(d)
            }
        })
}
