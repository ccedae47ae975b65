//! The entry points of the commands that train or run a model: `kiln train`, `eval`, `plan`,
//! `lr-find`, `warmup` and `predict`. Each resolves the backend through kiln-backend (the one
//! place that names concrete backends) and runs this crate's generic code on it; the binary,
//! the examples and the tests call these plain functions once per command.
//!
//! Generic code is compiled in the crate that instantiates it: a `BackendTask` here puts the
//! network, autodiff and optimizers for every backend into this crate's build, once (when the
//! commands were the binary's own modules, the binary compiled them a second time: ten minutes
//! of a clean build on two cores). Requests are plain data; what happens on the way goes to an
//! [`Observer`] (the binary's console, or a test's), and the result comes back as data.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use kiln_backend::{
    BackendChoice, BackendTask, DeviceSelection, KernelCache, MemoryMeter, Resolved,
    configure_kernel_cache, probe, resolve, run_on,
};
use kiln_config::config::BatchSize;
use kiln_config::plan::{Fitting, MemoryBudget, Plan};
use kiln_config::{DeviceFacts, SettleFor, TrainConfig, settle};
use kiln_data::BatchShare;
use kiln_models::weights;
use kiln_records::Evaluation;
use kiln_records::run_dir::{OpenRun, RunDir, Start, open_run};

use crate::cluster::Cluster;
use crate::events::{Event, Observer, RunEnd};
use crate::loaders;
use crate::lr_find::{LrFind, LrFindOptions, LrPoint};
use crate::measure::{self, Measured, WarmUpSizes};
use crate::predict::{PredictError, PredictPlan, PredictRequest, Prediction};
use crate::replicas::Placement;
use crate::step::build_model;
use crate::{TrainError, engine};

/// What `kiln train` asks for: the run (a config to start, or a run folder to resume) and where
/// it trains.
pub struct TrainRequest<'a> {
    pub start: Start<'a>,
    /// `--set` overrides of the config's keys.
    pub overrides: &'a [String],
    /// The backend and devices; the config's where `None`.
    pub backend: Option<BackendChoice>,
    pub devices: Option<DeviceSelection>,
    /// The other machines of a multi-machine run.
    pub cluster: Option<Cluster>,
    /// Set (by Ctrl-C) to end the run after the current step with a checkpoint.
    pub stop: Arc<AtomicBool>,
}

/// Trains the run `request` names, on its backend and devices (data parallel when there are
/// several, or several machines in its cluster), reporting to `observer`. A new run that fails
/// before recording anything leaves no folder behind.
pub fn train(request: TrainRequest<'_>, observer: &mut dyn Observer) -> anyhow::Result<RunEnd> {
    let OpenRun {
        config,
        run,
        resume,
    } = open_run(request.start, request.overrides)?;
    let result = train_run(&config, &run, resume, request, observer);
    if result.is_err() && !resume {
        run.remove_if_empty();
    }
    result
}

fn train_run(
    config: &TrainConfig,
    run: &RunDir,
    resume: bool,
    request: TrainRequest<'_>,
    observer: &mut dyn Observer,
) -> anyhow::Result<RunEnd> {
    let backend = request.backend.unwrap_or(config.device.backend);
    let devices = match request.devices {
        Some(devices) => devices,
        None => config.device.devices.parse()?,
    };
    let resolved = resolve(backend, &devices, &probe())?;
    configure_kernel_cache(&resolved);
    let task = Train {
        config,
        run,
        resume,
        compiles_kernels: resolved.backend.compiles_kernels(),
        notes: kiln_backend::notices(resolved.backend),
        device: resolved.human_name(),
        memory: MemoryMeter::for_device(&resolved),
        cluster: request.cluster,
        stop: &request.stop,
        observer,
    };
    Ok(run_on(&resolved, task)??)
}

struct Train<'a> {
    config: &'a TrainConfig,
    run: &'a RunDir,
    resume: bool,
    compiles_kernels: bool,
    /// What the observer hears about the device when the run opens.
    notes: Vec<String>,
    /// The devices as people know them, for the observer and the report.
    device: String,
    memory: MemoryMeter,
    cluster: Option<Cluster>,
    stop: &'a AtomicBool,
    observer: &'a mut dyn Observer,
}

impl BackendTask for Train<'_> {
    type Output = Result<RunEnd, TrainError>;

    fn run<B: AutodiffBackend>(mut self, devices: Vec<B::Device>) -> Self::Output {
        self.observer.event(Event::Opened {
            device: &self.device,
            notes: &self.notes,
            compiles_kernels: self.compiles_kernels,
            print_every: self.config.logging.print_every,
        });
        let placement = Placement {
            devices,
            cluster: self.cluster,
        };
        let facts = DeviceFacts {
            compiles_kernels: self.compiles_kernels,
            available_bytes: self.memory.available(),
            replicas: placement.peers(),
        };
        let settled = settle(self.config, &facts, SettleFor::Training)?.with_device(self.device);
        engine::train::<B>(
            &settled,
            self.run,
            self.resume,
            placement,
            &mut self.memory,
            self.observer,
            self.stop,
        )
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
    let facts = DeviceFacts {
        compiles_kernels: resolved.backend.compiles_kernels(),
        available_bytes: MemoryMeter::for_device(resolved).available(),
        replicas: 1,
    };
    Ok(settle(config, &facts, SettleFor::Evaluation)?.config)
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
        let (_, val) = loaders::open(&self.config, BatchShare::WHOLE)?;
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
        Ok(crate::evaluate(&model.valid(), &val, &device, tta)?)
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
    let (_, val) = loaders::open(&config, BatchShare::WHOLE)?;
    let val = val.ok_or_else(|| anyhow::anyhow!("the data set has no validation part"))?;
    Ok(kiln_records::mistakes::page(title, evaluation, &val, count))
}

/// What `kiln plan` reports: the estimate, the budget it is set against, what fits, and (when
/// asked) the peak of real training steps.
#[derive(Debug, serde::Serialize)]
pub struct PlanReport {
    pub backend: String,
    pub plan: Plan,
    pub estimate_bytes: Option<u64>,
    pub budget: Option<MemoryBudget>,
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
    let fitting = Fitting::of(config, resolved.devices.len(), memory, meter.available())?;
    let measured = match measure {
        true => run_on(
            &resolved,
            PeakOfSteps {
                config: config.clone(),
                plan: fitting.plan.clone(),
                per_device: fitting.per_device,
                meter: &mut meter,
            },
        )??,
        false => None,
    };
    Ok(PlanReport {
        backend: resolved.backend.to_string(),
        estimate_bytes: Some(fitting.estimate_bytes),
        budget: fitting.budget,
        largest_per_device: fitting.largest_per_device,
        auto_batch_size: fitting.auto_batch_size,
        measured,
        plan: fitting.plan,
    })
}

struct PeakOfSteps<'a> {
    config: TrainConfig,
    plan: Plan,
    per_device: usize,
    meter: &'a mut MemoryMeter,
}

impl BackendTask for PeakOfSteps<'_> {
    type Output = Result<Option<Measured>, TrainError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        /// The first step creates the optimizer's state; the peak comes in the second.
        const STEPS: usize = 3;
        measure::peak::<B>(
            &self.config,
            &self.plan,
            self.per_device,
            STEPS,
            &devices[0],
            self.meter,
        )
    }
}

/// Leslie Smith's learning-rate range test ([`crate::lr_find`]) on `config`'s model and data,
/// on the first requested device; `progress` hears each step. Nothing is written.
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
/// whole range test (training on every backend) would be compiled again in the caller.
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
        crate::lr_find::run::<B>(&self.config, &self.options, &device, self.progress)
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
    let (train, val) = loaders::open(&config, BatchShare::WHOLE)?;
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

/// Finds the weights `request` names (verified, from a cache or downloaded where allowed) and
/// classifies its images on the resolved device (`kiln predict`).
pub fn predict(resolved: &Resolved, request: PredictRequest) -> anyhow::Result<Vec<Prediction>> {
    let plan = crate::predict::plan(&request.setup)?;
    Ok(run_on(resolved, Predict(request, plan))??)
}

struct Predict(PredictRequest, PredictPlan);

impl BackendTask for Predict {
    type Output = Result<Vec<Prediction>, PredictError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        crate::predict::predict::<B::InnerBackend>(&self.0, &self.1, &devices[0])
    }
}
