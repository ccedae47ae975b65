//! The training loop, generic over the backend. Read `train` top to bottom: record the settled
//! config, start the run (data, model, optimizer, or a checkpoint's), then for each epoch: its
//! steps, then evaluation, records and checkpoint. The engine never prints; it reports
//! [`crate::events::Event`]s to an [`Observer`].

use std::sync::atomic::AtomicBool;

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use kiln_backend::MemoryMeter;
use kiln_models::{Precision, ResNetConfig, Stem};

use crate::error::{TrainError, io_error};
use crate::events::{Observer, RunEnd};
use crate::limits::{Limits, out_of_memory};
use crate::panics;
use crate::replicas::Placement;
use crate::trainer::{Context, Trainer};
use kiln_config::settle::Settled;
use kiln_records::run_dir::RunDir;

/// Trains the settled config (see [`kiln_config::settle`]) on the devices (and machines) of
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
) -> Result<RunEnd, TrainError> {
    let config = &settled.config;
    check_precision::<B>(config.precision(), &placement.devices[0])?;
    kiln_kernels::set_tf32(config.device.tf32);
    if !resume || settled.changed {
        // The run folder's config is the settled one; a resumed run reads it back, so it keeps
        // its batch.
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
fn epochs<B: AutodiffBackend>(mut trainer: Trainer<'_, B>) -> Result<RunEnd, TrainError> {
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
