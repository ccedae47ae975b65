//! kiln as a library: the entry points that the `kiln` binary and the examples share. They pick
//! the backend (through kiln-backend, the one place that names concrete backends) and call the
//! generic engine of kiln-train on it.
//!
//! Every command that runs generic code on a backend lives here (training, evaluation, the
//! memory plan's measure, the learning-rate range test, `compare`, `bench`, `export`,
//! `predict`), and the binary calls it through plain functions: an optimised build instantiates
//! generic code in each crate that calls it, and when `compare`, `bench`, `export` and `predict`
//! were the binary's own modules, the binary compiled the network, autodiff and optimizers for
//! every backend a second time (ten minutes of a clean build on two cores).
//!
//! The library works and the binary talks: functions here take plain option structs and return
//! data (reports, rows, what was written), with progress through callbacks; the binary owns the
//! flags (clap), the printing and the exit status.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod check;
pub mod export_model;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use kiln_backend::{
    BackendTask, MemoryMeter, Resolved, configure_kernel_cache, probe, resolve, run_on,
};
use kiln_data::Shard;
use kiln_models::{Stem, weights};
use kiln_train::config::BatchSize;
use kiln_train::evaluate::Evaluation;
use kiln_train::loaders::loaders;
use kiln_train::measure::{self, Measured, WarmUpSizes};
use kiln_train::parallel::Placement;
use kiln_train::plan::{Budget, Plan};
use kiln_train::predict::{PredictRequest, Prediction};
use kiln_train::progress::Console;
use kiln_train::step::build_model;
use kiln_train::{Facts, Outcome, Purpose, RunDir, TrainConfig, TrainError, settle};

pub use kiln_backend::{BackendChoice, DeviceSelection, KernelCache};
pub use kiln_train::lr_find::{LrFind, LrFindOptions, LrPoint};
pub use kiln_train::parallel::Cluster;

/// Trains `config` into `run` on the requested backend and devices (data parallel when there
/// are several, or several machines in `cluster`), showing progress on the console. `stop` ends
/// the run after the current step with a checkpoint.
pub fn train(
    config: &TrainConfig,
    run: &RunDir,
    resume: bool,
    backend: BackendChoice,
    devices: &DeviceSelection,
    cluster: Option<Cluster>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Outcome> {
    let resolved = resolve(backend, devices, &probe())?;
    configure_kernel_cache(&resolved);
    let task = Train {
        config: config.clone(),
        run: RunDir::open(&run.path),
        resume,
        compiles_kernels: resolved.backend.compiles_kernels(),
        notices: kiln_backend::notices(resolved.backend),
        device: resolved.human_name(),
        memory: MemoryMeter::for_device(&resolved),
        cluster,
        stop,
    };
    Ok(run_on(&resolved, task)??)
}

struct Train {
    config: TrainConfig,
    run: RunDir,
    resume: bool,
    compiles_kernels: bool,
    /// What the console says about the device when the run starts.
    notices: Vec<String>,
    /// The devices as people know them, for the console and the report.
    device: String,
    memory: MemoryMeter,
    cluster: Option<Cluster>,
    stop: Arc<AtomicBool>,
}

impl BackendTask for Train {
    type Output = Result<Outcome, TrainError>;

    fn run<B: AutodiffBackend>(mut self, devices: Vec<B::Device>) -> Self::Output {
        let mut console = Console::new(self.config.logging.print_every, self.compiles_kernels)
            .with_notes(self.notices)
            .with_device(self.device.clone());
        let placement = Placement {
            devices,
            cluster: self.cluster,
        };
        let facts = Facts {
            compiles_kernels: self.compiles_kernels,
            available_bytes: self.memory.available(),
            replicas: placement.peers(),
        };
        let settled = settle(&self.config, &facts, Purpose::Train)?.with_device(self.device);
        let outcome = kiln_train::train::<B>(
            &settled,
            &self.run,
            self.resume,
            placement,
            &mut self.memory,
            &mut console,
            &self.stop,
        )?;
        if let Outcome::Finished {
            last,
            model,
            early_stop,
        } = &outcome
        {
            let text = kiln_train::run_dir::summary_text(
                &settled.config,
                &self.run,
                last.as_ref(),
                model,
                early_stop.as_ref().map(ToString::to_string).as_deref(),
            );
            self.run
                .write_summary(&text)
                .map_err(|source| TrainError::Io {
                    path: self.run.path.clone(),
                    source,
                })?;
        }
        Ok(outcome)
    }
}

/// Evaluates `weights` (a kiln export or a torchvision state dict) on the validation part of
/// the config's data set.
pub fn evaluate(
    config: &TrainConfig,
    weights: PathBuf,
    backend: BackendChoice,
    devices: &DeviceSelection,
) -> anyhow::Result<Evaluation> {
    let resolved = resolve(backend, devices, &probe())?;
    configure_kernel_cache(&resolved);
    let task = Eval {
        config: settled_without_training(config, &resolved)?,
        weights,
    };
    Ok(run_on(&resolved, task)??)
}

/// `config` settled for work that keeps no optimizer state for a whole run (evaluation, the
/// range test, the warm-up): `batch_size = "auto"` is the training batch that fits one device.
fn settled_without_training(
    config: &TrainConfig,
    resolved: &Resolved,
) -> Result<TrainConfig, TrainError> {
    let facts = Facts {
        compiles_kernels: resolved.backend.compiles_kernels(),
        available_bytes: MemoryMeter::for_device(resolved).available(),
        replicas: 1,
    };
    Ok(settle(config, &facts, Purpose::Evaluate)?.config)
}

struct Eval {
    config: TrainConfig,
    weights: PathBuf,
}

impl BackendTask for Eval {
    type Output = Result<Evaluation, TrainError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        let device = devices
            .into_iter()
            .next()
            .expect("resolve gives at least one device");
        let (_, val) = loaders(&self.config, Shard::WHOLE)?;
        let Some(val) = val else {
            return Err(TrainError::Data(kiln_data::DataError::Invalid(
                "the data set has no validation part: give image_folder a val folder or val_fraction"
                    .into(),
            )));
        };
        let classes = val.dataset().classes().len();
        let model = build_model::<B>(&self.config.model, classes, &device)?;
        let (model, _) = weights::load(model, &self.weights)?;
        let tta = self.config.eval.tta;
        Ok(kiln_train::evaluate(&model.valid(), &val, &device, tta)?)
    }
}

/// `kiln eval --mistakes`' page: `evaluation`'s `count` most confident mistakes and least
/// confident right answers, as thumbnails of the validation images of `config`'s data set.
pub fn mistakes_page(
    config: &TrainConfig,
    evaluation: &Evaluation,
    count: usize,
    title: &str,
) -> anyhow::Result<String> {
    let mut config = config.clone();
    if config.batch_size == BatchSize::Auto {
        // Images are decoded one by one here: any batch will do.
        config.batch_size = BatchSize::Fixed(1);
    }
    let (_, val) = loaders(&config, Shard::WHOLE)?;
    let val = val.ok_or_else(|| anyhow::anyhow!("the data set has no validation part"))?;
    Ok(kiln_train::mistakes::page(title, evaluation, &val, count))
}

/// What `kiln plan` reports: the estimate, the budget it is set against, what fits, and (when
/// asked) the peak of real training steps.
#[derive(Debug, serde::Serialize)]
pub struct PlanReport {
    pub backend: String,
    pub plan: Plan,
    pub estimate_bytes: Option<u64>,
    pub budget: Option<Budget>,
    pub largest_per_device: Option<usize>,
    pub auto_batch_size: Option<usize>,
    pub measured: Option<Measured>,
}

/// Estimates `config`'s peak memory per device on the requested devices, against `memory`
/// bytes (default: `max_memory`, else what the device has free). With `measure`, also trains
/// a few steps of random images on the first device and reads the real peak.
pub fn plan(
    config: &TrainConfig,
    backend: BackendChoice,
    devices: &DeviceSelection,
    memory: Option<u64>,
    measure: bool,
) -> anyhow::Result<PlanReport> {
    let resolved = resolve(backend, devices, &probe())?;
    configure_kernel_cache(&resolved);
    let mut meter = MemoryMeter::for_device(&resolved);
    let plan = Plan::new(config, resolved.devices.len())?;
    let budget = match memory {
        Some(bytes) => Some(Budget {
            bytes,
            source: " given by --memory",
        }),
        None => Budget::of(config, meter.available()),
    };
    let train_images = config.data.source.train_size();
    let auto_batch_size = budget
        .and_then(|b| plan.auto_batch_size(b.bytes, train_images).ok())
        .map(|auto| auto.batch_size);
    let per_device = match config.batch_size {
        BatchSize::Fixed(batch) => plan.per_device(batch),
        BatchSize::Auto => auto_batch_size.map_or(1, |batch| plan.per_device(batch)),
    };
    let measured = match measure {
        true => run_on(
            &resolved,
            Measure {
                config: config.clone(),
                plan: plan.clone(),
                per_device,
                meter: &mut meter,
            },
        )??,
        false => None,
    };
    Ok(PlanReport {
        backend: resolved.backend.to_string(),
        estimate_bytes: Some(plan.peak_bytes(per_device)),
        budget,
        largest_per_device: budget.and_then(|b| plan.largest_per_device(b.bytes)),
        auto_batch_size,
        measured,
        plan,
    })
}

struct Measure<'a> {
    config: TrainConfig,
    plan: Plan,
    per_device: usize,
    meter: &'a mut MemoryMeter,
}

impl BackendTask for Measure<'_> {
    type Output = Result<Option<Measured>, TrainError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        /// The first step creates the optimizer's state; the peak comes in the second.
        const STEPS: usize = 3;
        measure::measure::<B>(
            &self.config,
            &self.plan,
            self.per_device,
            STEPS,
            &devices[0],
            self.meter,
        )
    }
}

/// Leslie Smith's learning-rate range test (`kiln_train::lr_find`) on `config`'s model and
/// data, on the first requested device; `progress` hears each step. Nothing is written.
pub fn lr_find(
    config: &TrainConfig,
    backend: BackendChoice,
    devices: &DeviceSelection,
    options: LrFindOptions,
    progress: &mut dyn FnMut(usize, &LrPoint),
) -> anyhow::Result<LrFind> {
    options.check().map_err(anyhow::Error::msg)?;
    let resolved = resolve(backend, devices, &probe())?;
    configure_kernel_cache(&resolved);
    let task = RangeTest {
        config: settled_without_training(config, &resolved)?,
        options,
        progress,
    };
    Ok(run_on(&resolved, task)??)
}

/// `progress` is a trait object, not a type parameter: generic over the caller's closure, the
/// whole range test (training on every backend) would be compiled again in the binary.
struct RangeTest<'a> {
    config: TrainConfig,
    options: LrFindOptions,
    progress: &'a mut dyn FnMut(usize, &LrPoint),
}

impl BackendTask for RangeTest<'_> {
    type Output = Result<LrFind, TrainError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        let device = devices
            .into_iter()
            .next()
            .expect("resolve gives at least one device");
        kiln_train::lr_find::lr_find::<B>(&self.config, &self.options, &device, self.progress)
    }
}

/// How far [`warmup`] has got: first how many stages it has, then each stage as it starts.
pub enum WarmUpProgress<'a> {
    Stages(usize),
    Stage(&'a str),
}

/// Compiles and tunes the kernels `config`'s run will use on the requested device, so that the
/// run itself starts at full speed (`kiln warmup`); says where they are kept. `progress` is a
/// trait object for the reason [`RangeTest`]'s is.
pub fn warmup(
    config: &TrainConfig,
    backend: BackendChoice,
    devices: &DeviceSelection,
    progress: &mut dyn FnMut(WarmUpProgress<'_>),
) -> anyhow::Result<KernelCache> {
    let resolved = resolve(backend, devices, &probe())?;
    let cache = configure_kernel_cache(&resolved);
    if cache == KernelCache::None {
        return Ok(cache);
    }
    let config = settled_without_training(config, &resolved)?;
    let plan = Plan::new(&config, resolved.devices.len())?;
    let (train, val) = loaders(&config, Shard::WHOLE)?;
    let sizes = WarmUpSizes::new(
        config.batch_size.fixed().unwrap_or(1),
        resolved.devices.len(),
        train.dataset().len(),
        val.map_or(0, |v| v.dataset().len()),
        config.data.drop_last,
    );
    run_on(
        &resolved,
        WarmUp {
            config,
            plan,
            sizes,
            progress,
        },
    )??;
    Ok(cache)
}

struct WarmUp<'a> {
    config: TrainConfig,
    plan: Plan,
    sizes: WarmUpSizes,
    progress: &'a mut dyn FnMut(WarmUpProgress<'_>),
}

impl BackendTask for WarmUp<'_> {
    type Output = Result<(), TrainError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        let WarmUp {
            config,
            plan,
            sizes,
            progress,
        } = self;
        progress(WarmUpProgress::Stages(sizes.stages()));
        measure::warm_up::<B>(&config, &plan, &sizes, &devices[0], |stage| {
            progress(WarmUpProgress::Stage(stage))
        })
    }
}

/// The first non-empty line of a panic's message (cubecl's begin with a newline).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown cause".to_string());
    message
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or("no message")
        .to_string()
}

/// `--stem imagenet|cifar`, for the commands that take a network without a config.
pub fn parse_stem(s: &str) -> Result<Stem, String> {
    match s {
        "imagenet" => Ok(Stem::Imagenet),
        "cifar" => Ok(Stem::Cifar),
        "deep" => Ok(Stem::Deep),
        other => Err(format!(
            "unknown stem `{other}`: choose imagenet (the network's own), cifar or deep"
        )),
    }
}

/// Classifies `request`'s images on the resolved device (`kiln predict`).
pub fn predict(resolved: &Resolved, request: PredictRequest) -> anyhow::Result<Vec<Prediction>> {
    Ok(run_on(resolved, Predict(request))??)
}

struct Predict(PredictRequest);

impl BackendTask for Predict {
    type Output = Result<Vec<Prediction>, kiln_train::predict::PredictError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        kiln_train::predict::predict::<B::InnerBackend>(&self.0, &devices[0])
    }
}
