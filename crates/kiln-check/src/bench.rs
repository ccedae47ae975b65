//! Throughput, step time and peak memory of training and inference, measured the way PyTorch
//! users measure it (`xtask/scripts/bench_torch.py` does the same in PyTorch): a fixed batch
//! already on the device, warm-up steps first, then timed steps, each ending with the host
//! waiting for the device.

use std::time::Instant;

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::GradientsParams;
use burn::tensor::ElementConversion;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use kiln_backend::MemoryMeter;
use kiln_config::config::OptimizerConfig;
use kiln_models::{Precision, ResNet, ResNetConfig, Stem};
use kiln_train::batch::DeviceBatch;
use kiln_train::optim::AnyOptimizer;
use kiln_train::step::{Replica, StepPlan};
use serde::{Deserialize, Serialize};

use crate::CheckError;
use crate::kernels::{KernelCounts, KernelLog};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Forward, loss, backward and an SGD-with-momentum update.
    Train,
    /// Forward in eval mode.
    Infer,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Train => "train",
            Mode::Infer => "infer",
        }
    }
}

/// A benchmark network as people train it: `resnet18-cifar` (CIFAR stem, 32x32, 10 classes) or
/// `resnetNN` (torchvision's, 224x224, 1000 classes); or `resnet18-tiny` (the CIFAR network at
/// width 4 on 8x8 images), whose arithmetic is negligible, so that its step time is the host's
/// and the launches' (the portable path's overhead).
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub model: ResNetConfig,
    pub image_size: usize,
    /// The float type of the convolutions (`kiln bench --precision`, as `precision` in a config).
    pub precision: Precision,
}

impl Workload {
    pub fn parse(name: &str) -> Result<Self, String> {
        let (base, suffix) = match name.rsplit_once('-') {
            Some((base, suffix @ ("cifar" | "tiny"))) => (base, suffix),
            _ => (name, ""),
        };
        let model = ResNetConfig::from_name(base).map_err(|e| {
            format!(
                "{e}; benchmark models are resnet18 ... resnet152, optionally with -cifar or -tiny"
            )
        })?;
        let cifar = |model: ResNetConfig| model.with_stem(Stem::Cifar).with_num_classes(10);
        let (model, image_size) = match suffix {
            "cifar" => (cifar(model), 32),
            "tiny" => (
                ResNetConfig {
                    width: 4,
                    ..cifar(model)
                },
                8,
            ),
            _ => (model, 224),
        };
        Ok(Self {
            name: name.to_string(),
            model,
            image_size,
            precision: Precision::F32,
        })
    }

    /// The same workload with its convolutions in `precision`.
    pub fn in_precision(self, precision: Precision) -> Self {
        Self { precision, ..self }
    }

    /// The row's variant: the backend, and the precision where it is not f32 (`cuda+bf16`, as
    /// PyTorch's rows say `channels_last+bf16`).
    pub fn variant(&self, backend: &str) -> String {
        match self.precision {
            Precision::F32 => backend.to_string(),
            low => format!("{backend}+{}", low.name()),
        }
    }

    /// Batch sizes worth measuring when none are given: a small and a large one for the size.
    pub fn default_batches(&self) -> Vec<usize> {
        if self.image_size <= 64 {
            vec![32, 128]
        } else {
            vec![16, 64]
        }
    }
}

/// How long to measure: `warmup` untimed steps (kernel compilation, autotuning, allocator
/// growth), then at least `min_steps` timed ones and at least `min_seconds`, at most `max_steps`.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub warmup: usize,
    pub min_steps: usize,
    pub min_seconds: f64,
    pub max_steps: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            warmup: 2,
            min_steps: 3,
            min_seconds: 3.0,
            max_steps: 200,
        }
    }
}

/// One row of a benchmark, from kiln or from PyTorch; the JSON that both write.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measurement {
    /// `kiln` or `pytorch`.
    pub framework: String,
    /// kiln's backend (`flex`, `cuda`, ...) or PyTorch's variant (`eager`, `channels_last+bf16`).
    pub variant: String,
    /// `cpu` or `gpu`: rows are compared only with rows of the same class.
    pub device_class: String,
    pub device: String,
    pub model: String,
    pub image_size: usize,
    pub batch: usize,
    pub mode: Mode,
    pub images_per_s: f64,
    /// Median over the timed steps.
    pub step_ms: f64,
    pub steps: usize,
    pub peak_memory_bytes: Option<u64>,
    /// Where a training step's time goes (`kiln bench --passes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passes: Option<Passes>,
    /// Host time of a training step (kiln's rows): median milliseconds until the training
    /// thread has queued the step (the autodiff graph and burn's operations; the GPU backends
    /// run them on threads of their own), and the process's CPU time per step, every thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostTime>,
    /// Kernels launched per training step, by kind (`kiln bench --kernels`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelCounts>,
}

/// A training step's host time, in milliseconds (see [`Measurement::host`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct HostTime {
    pub enqueue_ms: f64,
    pub cpu_ms: f64,
}

/// A training step's three parts, each timed to the host's having its result: the forward pass
/// with the loss, the backward pass with the gradients gathered per parameter, the optimizer's
/// update. Medians over the timed steps, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Passes {
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub optimizer_ms: f64,
}

/// What a measurement ran on, for its row.
pub struct Target<'a> {
    pub backend: &'a str,
    pub device: &'a str,
    pub device_class: &'a str,
}

/// What a measurement adds to its timings.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// Time a training step's passes apart (`kiln bench --passes`).
    pub passes: bool,
    /// Count a training step's kernels in cubecl's profiling log (`kiln bench --kernels`).
    pub kernels: Option<KernelLog>,
}

/// Measures one workload at one batch size on `device`; with `extras`, a training measurement
/// is followed by one of its parts, or a count of its kernels.
#[allow(clippy::too_many_arguments)]
pub fn measure<B: AutodiffBackend>(
    workload: &Workload,
    batch_size: usize,
    mode: Mode,
    budget: Budget,
    extras: &Extras,
    target: &Target,
    device: &B::Device,
    memory: &mut MemoryMeter,
) -> Result<Measurement, CheckError> {
    memory.reset_peak();
    B::seed(device, 0);
    let model: ResNet<B> = workload
        .model
        .init(device)?
        .with_precision(workload.precision);
    let batch = random_batch::<B>(workload, batch_size, device);
    let train = mode == Mode::Train;
    let passes =
        (extras.passes && train).then(|| time_passes(model.clone(), &batch, budget, device));
    let (step_ms, host, kernels) = match mode {
        Mode::Train => {
            let log = extras.kernels.as_ref();
            let trained = time_training(model, batch, budget, device, memory, log);
            (trained.step_ms, Some(trained.host), trained.kernels)
        }
        Mode::Infer => {
            let step_ms = time_inference(model.valid(), batch.images.inner(), budget, memory);
            (step_ms, None, None)
        }
    };
    let median = median(&step_ms);
    Ok(Measurement {
        framework: "kiln".into(),
        variant: workload.variant(target.backend),
        device_class: target.device_class.into(),
        device: target.device.into(),
        model: workload.name.clone(),
        image_size: workload.image_size,
        batch: batch_size,
        mode,
        images_per_s: batch_size as f64 * step_ms.len() as f64 / step_ms.iter().sum::<f64>()
            * 1000.0,
        step_ms: median,
        steps: step_ms.len(),
        peak_memory_bytes: memory.peak_bytes(),
        passes,
        host,
        kernels,
    })
}

/// A training measurement: each timed step's milliseconds, its host time, and its kernels
/// where counted.
struct Trained {
    step_ms: Vec<f64>,
    host: HostTime,
    kernels: Option<KernelCounts>,
}

/// Steps whose kernels are counted, after the timed ones.
const COUNTED_STEPS: usize = 3;

/// The trainer's own step (`Replica::step`), with SGD and momentum; a step ends when its loss
/// has reached the host, as it does every `print_every` steps in training.
fn time_training<B: AutodiffBackend>(
    model: ResNet<B>,
    batch: DeviceBatch<B>,
    budget: Budget,
    device: &B::Device,
    memory: &mut MemoryMeter,
    kernels: Option<&KernelLog>,
) -> Trained {
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut replica = Replica::new(model, sgd_with_momentum::<B>(), loss_fn, device.clone());
    let plan = StepPlan::alone(batch.len());
    let mut enqueue_ms = Vec::new();
    let mut step = |enqueue_ms: &mut Vec<f64>| {
        let step_batch = DeviceBatch {
            images: batch.images.clone(),
            labels: batch.labels.clone(),
            targets: None,
            skipped: Vec::new(),
            indices: Vec::new(),
        };
        let clock = Instant::now();
        replica
            .step(vec![step_batch], &plan, 0.01)
            .expect("one replica alone makes no collective call");
        enqueue_ms.push(milliseconds(clock));
        replica.take_stats();
    };
    let cpu_before = process_cpu_seconds();
    let step_ms = timed_steps(budget, memory, || step(&mut enqueue_ms));
    let cpu_ms =
        (process_cpu_seconds() - cpu_before) * 1000.0 / (budget.warmup + step_ms.len()) as f64;
    let host = HostTime {
        enqueue_ms: median(&enqueue_ms[budget.warmup.min(enqueue_ms.len())..]),
        cpu_ms,
    };
    let kernels = kernels.map(|log| {
        let _ = B::sync(device);
        let mark = log.mark();
        for _ in 0..COUNTED_STEPS {
            step(&mut Vec::new());
        }
        let _ = B::sync(device);
        log.since(mark, COUNTED_STEPS)
    });
    Trained {
        step_ms,
        host,
        kernels,
    }
}

/// The CPU time this process has used, every thread, in seconds (user and system).
fn process_cpu_seconds() -> f64 {
    #[cfg(unix)]
    {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `usage` is a valid out-pointer for one `rusage`.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0 {
            // SAFETY: initialised by the successful call.
            let usage = unsafe { usage.assume_init() };
            let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            return seconds(usage.ru_utime) + seconds(usage.ru_stime);
        }
    }
    f64::NAN
}

fn sgd_with_momentum<B: AutodiffBackend>() -> AnyOptimizer<ResNet<B>, B> {
    let mut config = OptimizerConfig::sgd(0.01);
    config.momentum = 0.9;
    AnyOptimizer::new(&config)
}

/// The training step of [`time_training`] cut into its passes, each waited for.
fn time_passes<B: AutodiffBackend>(
    mut model: ResNet<B>,
    batch: &DeviceBatch<B>,
    budget: Budget,
    device: &B::Device,
) -> Passes {
    let mut optimizer = sgd_with_momentum::<B>();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let (mut forward, mut backward, mut update) = (Vec::new(), Vec::new(), Vec::new());
    for step in 0..budget.warmup + budget.min_steps {
        let clock = Instant::now();
        let logits = model.forward(batch.images.clone());
        let loss = loss_fn.forward(logits, batch.labels.clone());
        let _: f64 = loss.clone().into_scalar().elem();
        let forward_ms = milliseconds(clock);

        let clock = Instant::now();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let _ = B::sync(device);
        let backward_ms = milliseconds(clock);

        let clock = Instant::now();
        model = optimizer.step(0.01, model, grads);
        let _ = B::sync(device);
        if step >= budget.warmup {
            forward.push(forward_ms);
            backward.push(backward_ms);
            update.push(milliseconds(clock));
        }
    }
    Passes {
        forward_ms: median(&forward),
        backward_ms: median(&backward),
        optimizer_ms: median(&update),
    }
}

fn milliseconds(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Eval-mode forward passes; a step ends when the predicted classes have reached the host.
fn time_inference<B: burn::tensor::backend::Backend>(
    model: ResNet<B>,
    images: Tensor<B, 4>,
    budget: Budget,
    memory: &mut MemoryMeter,
) -> Vec<f64> {
    timed_steps(budget, memory, || {
        let classes = model.forward(images.clone()).argmax(1);
        let _ = classes.into_data();
    })
}

/// Runs `step` through the warm-up and then as often as the budget says, timing each.
fn timed_steps(budget: Budget, memory: &mut MemoryMeter, mut step: impl FnMut()) -> Vec<f64> {
    for _ in 0..budget.warmup {
        step();
        memory.sample();
    }
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < budget.max_steps
        && (times.len() < budget.min_steps || start.elapsed().as_secs_f64() < budget.min_seconds)
    {
        let clock = Instant::now();
        step();
        times.push(milliseconds(clock));
        memory.sample();
    }
    times
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Normalised-looking noise and random labels, fixed for the whole measurement.
fn random_batch<B: AutodiffBackend>(
    workload: &Workload,
    batch: usize,
    device: &B::Device,
) -> DeviceBatch<B> {
    crate::seeded_batch(
        0,
        batch,
        workload.image_size,
        workload.model.num_classes,
        device,
    )
}

/// A markdown table of kiln's rows, each beside the PyTorch rows of the same workload on the
/// same class of device, with the ratio kiln / PyTorch of images per second.
pub fn markdown(kiln: &[Measurement], pytorch: &[Measurement]) -> String {
    let variants: std::collections::BTreeSet<&str> =
        pytorch.iter().map(|m| m.variant.as_str()).collect();
    let mut out = String::from(
        "| backend | device | model | batch | mode | kiln img/s | step ms | peak memory |",
    );
    let mut rule = String::from("|---|---|---|---|---|---:|---:|---:|");
    for variant in &variants {
        out += &format!(" PyTorch {variant} img/s | kiln / PyTorch | PyTorch peak memory |");
        rule += "---:|---:|---:|";
    }
    out += "\n";
    out += &rule;
    out += "\n";
    for row in kiln {
        out += &format!(
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {} |",
            row.variant,
            row.device,
            row.model,
            row.batch,
            row.mode.name(),
            row.images_per_s,
            row.step_ms,
            format_bytes(row.peak_memory_bytes)
        );
        for variant in &variants {
            match pytorch
                .iter()
                .find(|p| p.variant == *variant && p.same_workload(row))
            {
                Some(p) => {
                    out += &format!(
                        " {:.1} | {:.2}x | {} |",
                        p.images_per_s,
                        row.images_per_s / p.images_per_s,
                        format_bytes(p.peak_memory_bytes)
                    )
                }
                None => out += " | | |",
            }
        }
        out += "\n";
    }
    if kiln.iter().any(|row| row.host.is_some()) {
        out += "\n| backend | model | batch | step ms | host: queued ms | host: CPU ms, all threads |\n";
        out += "|---|---|---:|---:|---:|---:|\n";
        for row in kiln {
            if let Some(h) = &row.host {
                out += &format!(
                    "| {} | {} | {} | {:.1} | {:.1} | {:.1} |\n",
                    row.variant, row.model, row.batch, row.step_ms, h.enqueue_ms, h.cpu_ms
                );
            }
        }
    }
    for row in kiln {
        if let Some(k) = &row.kernels {
            out += &format!(
                "\nKernels per training step, {} {} batch {}: {:.0} launches\n\n",
                row.variant, row.model, row.batch, k.per_step
            );
            out += "| kernel | launches per step | device ms per step |\n|---|---:|---:|\n";
            for kind in &k.kinds {
                out += &format!(
                    "| {} | {:.1} | {:.2} |\n",
                    kind.kind, kind.per_step, kind.device_ms
                );
            }
        }
    }
    if kiln.iter().any(|row| row.passes.is_some()) {
        out += "\n| backend | model | batch | forward ms | backward ms | optimizer ms |\n";
        out += "|---|---|---:|---:|---:|---:|\n";
        for row in kiln {
            if let Some(p) = &row.passes {
                out += &format!(
                    "| {} | {} | {} | {:.1} | {:.1} | {:.1} |\n",
                    row.variant, row.model, row.batch, p.forward_ms, p.backward_ms, p.optimizer_ms
                );
            }
        }
    }
    out
}

impl Measurement {
    /// The same model, input, batch and mode on the same class of device.
    pub fn same_workload(&self, other: &Measurement) -> bool {
        self.device_class == other.device_class
            && self.model == other.model
            && self.image_size == other.image_size
            && self.batch == other.batch
            && self.mode == other.mode
    }
}

/// Bytes as MiB or GiB; `n/a` where the device could not tell.
pub fn format_bytes(bytes: Option<u64>) -> String {
    match bytes {
        Some(b) if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) => format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64),
        None => "n/a".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_low_precision_row_names_its_precision() {
        let f32 = Workload::parse("resnet18-cifar").unwrap();
        assert_eq!((f32.image_size, f32.precision), (32, Precision::F32));
        assert_eq!(f32.variant("cuda"), "cuda");
        let bf16 = f32.in_precision(Precision::Bf16);
        assert_eq!(bf16.variant("cuda"), "cuda+bf16");
        assert_eq!(bf16.name, "resnet18-cifar");
    }

    #[test]
    fn the_tiny_network_is_the_cifar_one_at_width_four_on_small_images() {
        let tiny = Workload::parse("resnet18-tiny").unwrap();
        assert_eq!((tiny.image_size, tiny.model.width), (8, 4));
        assert_eq!((tiny.model.stem, tiny.model.num_classes), (Stem::Cifar, 10));
        let full = Workload::parse("resnet50").unwrap();
        assert_eq!((full.image_size, full.model.width), (224, 64));
        assert!(Workload::parse("resnet18-huge").is_err());
    }
}
