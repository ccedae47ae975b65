//! The training loop, generic over the backend. Read `train` top to bottom: settle the memory
//! limits, start the run (data, model, optimizer, or a checkpoint's), then for each epoch: its
//! steps, then evaluation, records and checkpoint. The engine never prints; it reports
//! [`Event`]s to an [`Observer`].

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use kiln_backend::MemoryMeter;
use kiln_data::DataError;
use kiln_models::{Precision, ResNetConfig, Stem};

use crate::config::TrainConfig;
use crate::early_stopping::EarlyStop;
use crate::error::{TrainError, io_error};
use crate::panics::{self, OutOfMemory};
use crate::parallel::Placement;
use crate::plan::{self, Budget, Plan};
use crate::run_dir::{EpochSummary, RunDir};
use crate::settle::Settled;
use crate::trainer::{Context, Trainer};

/// What the engine reports as it goes.
pub enum Event<'a> {
    Started {
        run_dir: &'a Path,
        train_images: usize,
        val_images: Option<usize>,
        iterations_per_epoch: usize,
        /// Model replicas on all devices and machines together.
        replicas: usize,
        resumed_from: Option<&'a Path>,
    },
    /// Before the first step of a run: on a GPU, kernels are compiled (and tuned) now.
    FirstStep,
    /// After every step. `loss` is read from the device only every `print_every` iterations
    /// (and at the first): then it is the mean over the images since the last reading, and
    /// `seconds` the time those steps took.
    Iteration {
        epoch: usize,
        epochs: usize,
        batch: usize,
        batches: usize,
        iteration: usize,
        lr: f64,
        images: usize,
        loss: Option<Reading>,
    },
    /// The memory plan, before anything is loaded: the batch (settled if it was `"auto"`),
    /// the estimated peak per device, and the budget it was checked against.
    Planned {
        batch_size: usize,
        /// How `batch_size = "auto"` chose, where it did.
        auto: Option<plan::AutoBatch>,
        per_device: usize,
        estimate_bytes: Option<u64>,
        budget: Option<Budget>,
    },
    Skipped(&'a DataError),
    Epoch(&'a EpochSummary),
    Checkpoint(&'a Path),
    /// A checkpoint newer than the one resumed from, passed over because it is damaged.
    CheckpointSkipped {
        path: &'a Path,
        reason: &'a str,
    },
    Stopped(&'a Path),
    /// `[early_stopping]` ended the run before its last epoch.
    StoppedEarly(&'a EarlyStop),
    Finished {
        model: &'a Path,
    },
}

/// Figures read back from the device: the mean loss over the images of the steps since the
/// last reading, and how long those steps took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub loss: f64,
    pub steps: usize,
    pub seconds: f64,
}

pub trait Observer {
    fn event(&mut self, event: Event<'_>);
}

/// An observer that ignores everything, for tests and library use.
pub struct Silent;

impl Observer for Silent {
    fn event(&mut self, _: Event<'_>) {}
}

/// How a run ended without error (returned once per run: its size does not matter).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    Finished {
        last: Option<EpochSummary>,
        model: PathBuf,
        /// Why the run ended before its last epoch, if it did.
        early_stop: Option<EarlyStop>,
    },
    /// Stopped on request; resume from this checkpoint.
    Stopped { checkpoint: PathBuf },
}

/// Trains the settled config (see [`crate::settle`]) on the devices (and machines) of
/// `placement`, writing into `run`. With `resume`, continues from the run's latest checkpoint.
/// `memory` measures the first device for each epoch's summary. `stop` (set by Ctrl-C) ends the
/// run after the current step with a checkpoint. A device that runs out of memory ends the run
/// with a batch that fits.
pub fn train<B: AutodiffBackend>(
    settled: &Settled,
    run: &RunDir,
    resume: bool,
    placement: Placement<B::Device>,
    memory: &mut MemoryMeter,
    observer: &mut dyn Observer,
    stop: &AtomicBool,
) -> Result<Outcome, TrainError> {
    let config = &settled.config;
    check_precision::<B>(config.precision(), &placement.devices[0])?;
    kiln_kernels::set_tf32(config.device.tf32);
    if settled.changed {
        // A resumed run reads the settled config back: it keeps its batch.
        run.record_config(config).map_err(io_error(&run.path))?;
    }
    let limits = Limits::of(settled);
    if let Some(event) = limits.planned(settled) {
        observer.event(event);
    }
    let cx = Context {
        run,
        memory,
        limits: &limits,
        observer,
        stop,
        device: settled.device.as_deref(),
    };
    panics::catch_out_of_memory(|| {
        let trainer = Trainer::<B>::start(config, placement, resume, cx)?;
        epochs(trainer)
    })
    .unwrap_or_else(|oom| Err(out_of_memory(config, &limits, oom)))
}

/// The epoch loop.
fn epochs<B: AutodiffBackend>(mut trainer: Trainer<'_, B>) -> Result<Outcome, TrainError> {
    for epoch in trainer.position.epoch..trainer.config.epochs {
        if let Some(early) = trainer.early_stop() {
            return trainer.finish(Some(early));
        }
        if let Some(checkpoint) = trainer.train_epoch(epoch)? {
            return trainer.stopped(checkpoint);
        }
        trainer.end_epoch(epoch)?;
    }
    trainer.finish(None)
}

/// The memory side of a run: the plan (when the config allows one) and the limits a step
/// is held to.
pub struct Limits<'a> {
    pub plan: Option<&'a Plan>,
    pub budget: Option<Budget>,
    pub max_memory: Option<u64>,
}

impl<'a> Limits<'a> {
    fn of(settled: &'a Settled) -> Self {
        Self {
            plan: settled.plan.as_ref(),
            budget: settled.budget,
            max_memory: settled.config.max_memory.map(|m| m.bytes()),
        }
    }

    /// The memory plan as the console shows it, where there is one.
    fn planned(&self, settled: &Settled) -> Option<Event<'static>> {
        let plan = self.plan?;
        let batch_size = settled.config.batch_size.fixed().unwrap_or(1);
        Some(Event::Planned {
            batch_size,
            auto: settled.auto,
            per_device: plan.per_device(batch_size),
            estimate_bytes: plan.configured_peak(),
            budget: self.budget,
        })
    }
}

/// Trains one step of a tiny network in `precision` on `device`, so that a type the device
/// cannot compute in is refused before anything is loaded, in one line.
fn check_precision<B: AutodiffBackend>(
    precision: Precision,
    device: &B::Device,
) -> Result<(), TrainError> {
    if precision == Precision::F32 {
        return Ok(());
    }
    let probe = || {
        let model = ResNetConfig::new(18)
            .with_width(1)
            .with_num_classes(2)
            .with_stem(Stem::Cifar)
            .init::<B>(device)
            .expect("a valid config")
            .with_precision(precision);
        let images = Tensor::<B, 4>::ones([2, 3, 8, 8], device);
        let loss = model.forward(images).sum();
        let grads = loss.backward();
        model.conv1.weight.grad(&grads).map(|g| g.into_data())
    };
    match panics::quietly(probe) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(TrainError::PrecisionUnsupported {
            precision: precision.name(),
            reason: "no gradient reached the weights".into(),
        }),
        Err(reason) => Err(TrainError::PrecisionUnsupported {
            precision: precision.name(),
            reason,
        }),
    }
}

/// The error for a run whose measured peak went above `max_memory`.
pub(crate) fn over_memory(
    config: &TrainConfig,
    limits: &Limits,
    used: u64,
    limit: u64,
) -> TrainError {
    let (batch_size, per_device) = batch_and_share(config, limits);
    TrainError::OverMemory {
        batch_size,
        per_device,
        used,
        limit,
        advice: plan::advice(limits.plan, Some(limit), Some(used)),
    }
}

/// The error for a device that ran out of memory.
fn out_of_memory(config: &TrainConfig, limits: &Limits, oom: OutOfMemory) -> TrainError {
    let (batch_size, per_device) = batch_and_share(config, limits);
    TrainError::OutOfMemory {
        batch_size,
        per_device,
        accumulate: config.accumulate,
        message: oom.message,
        advice: plan::advice(limits.plan, limits.budget.map(|b| b.bytes), None),
    }
}

fn batch_and_share(config: &TrainConfig, limits: &Limits) -> (usize, usize) {
    let batch_size = config.batch_size.fixed().unwrap_or(0);
    let per_device = limits.plan.map_or(batch_size, |p| p.per_device(batch_size));
    (batch_size, per_device)
}
