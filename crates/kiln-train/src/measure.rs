//! `kiln plan --measure`: the peak memory of real training steps (the trainer's own step, on
//! random images of the plan's size), to set beside the plan's estimate.

use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use kiln_backend::MemoryMeter;
use kiln_data::HostBatch;
use serde::Serialize;

use crate::batch::to_device;
use crate::error::TrainError;
use crate::optim::AnyOptimizer;
use crate::step::{Replica, StepPlan, build_model, loss_function};
use kiln_config::config::TrainConfig;
use kiln_config::plan::Plan;

/// The peak that `steps` real training steps of `plan`'s micro-batch took on `device`, above
/// what was in use before: the figure the estimate is checked against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    pub per_device: usize,
    pub peak_bytes: u64,
    pub seconds_per_step: f64,
}

/// Trains `steps` steps on random images of the plan's size (the engine's own step, with the
/// config's optimizer and accumulation; no pretrained weights) and reads the peak from
/// `memory`. `None` where the device cannot report memory.
pub fn peak<B: AutodiffBackend>(
    config: &TrainConfig,
    plan: &Plan,
    per_device: usize,
    steps: usize,
    device: &B::Device,
    memory: &mut MemoryMeter,
) -> Result<Option<Measured>, TrainError> {
    memory.reset_peak();
    let before = memory.current();
    let mut replica = fresh_replica::<B>(config, plan, device)?;
    let clock = Instant::now();
    for step in 0..steps {
        let batches = (0..config.accumulate)
            .map(|i| {
                to_device(
                    random_batch(per_device, plan.input, plan.classes, step + i),
                    device,
                )
            })
            .collect();
        let images = per_device * config.accumulate;
        replica.step(batches, &StepPlan::alone(images), config.optimizer.lr)?;
        replica.take_stats();
        memory.sample();
    }
    let seconds_per_step = clock.elapsed().as_secs_f64() / steps.max(1) as f64;
    let peak = memory.peak_bytes();
    drop(replica);
    Ok(before.zip(peak).map(|(before, peak)| Measured {
        per_device,
        peak_bytes: peak.saturating_sub(before),
        seconds_per_step,
    }))
}

/// The config's model (without pretrained weights: their values do not matter here), optimizer
/// and loss on `device`.
fn fresh_replica<B: AutodiffBackend>(
    config: &TrainConfig,
    plan: &Plan,
    device: &B::Device,
) -> Result<Replica<B>, TrainError> {
    let mut section = config.model.clone();
    section.pretrained = None;
    let model =
        build_model::<B>(&section, plan.classes, device)?.with_precision(config.precision());
    Ok(Replica::new(
        model,
        AnyOptimizer::new(&config.optimizer),
        // Class weights change no memory.
        loss_function::<B>(config, None, device),
        device.clone(),
    ))
}

/// A host batch of `n` images with values spread like normalized pixels.
fn random_batch(n: usize, (width, height): (u32, u32), classes: usize, seed: usize) -> HostBatch {
    let shape = [n, 3, height as usize, width as usize];
    let len = shape.iter().product::<usize>();
    let images = (0..len)
        .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0) - 1.0)
        .collect();
    HostBatch {
        images,
        shape,
        labels: (0..n).map(|i| ((i + seed) % classes) as i64).collect(),
        indices: (0..n).collect(),
        targets: None,
        skipped: Vec::new(),
    }
}

/// Compiles and tunes a config's kernels ahead of a run (`kiln warmup`): one training step at
/// each micro-batch size the run will see (a full one and the epoch's last, shorter one) and
/// one evaluation pass at each validation batch size, on random images of the run's size. On
/// a GPU whose caches are kept (see kiln-backend's `kernel_cache`), the run then compiles and
/// tunes nothing. `progress` hears each stage's name before it runs.
pub fn warm_up<B: AutodiffBackend>(
    config: &TrainConfig,
    plan: &Plan,
    sizes: &WarmUpSizes,
    device: &B::Device,
    mut progress: impl FnMut(&str),
) -> Result<(), TrainError> {
    let mut replica = fresh_replica::<B>(config, plan, device)?;
    for (i, &n) in sizes.train.iter().enumerate() {
        progress(&format!("training step, {n} images"));
        let batch = to_device(random_batch(n, plan.input, plan.classes, i), device);
        replica.step(vec![batch], &StepPlan::alone(n), config.optimizer.lr)?;
        replica.take_stats();
    }
    let model = burn::module::AutodiffModule::valid(replica.model());
    for (i, &n) in sizes.eval.iter().enumerate() {
        progress(&format!("evaluation, {n} images"));
        let batch =
            to_device::<B::InnerBackend>(random_batch(n, plan.input, plan.classes, i), device);
        let _ = model.forward(batch.images).argmax(1).into_data();
    }
    Ok(())
}

/// The batch sizes a run's kernels are compiled and tuned for, per device.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmUpSizes {
    pub train: Vec<usize>,
    pub eval: Vec<usize>,
}

impl WarmUpSizes {
    /// A full batch and the last, shorter one of an epoch of `train_images` (unless the loader
    /// drops it), and of a validation pass over `val_images`, each split over `replicas`.
    pub fn new(
        batch_size: usize,
        replicas: usize,
        train_images: usize,
        val_images: usize,
        drop_last: bool,
    ) -> Self {
        let per_device = |n: usize| n.div_ceil(replicas.max(1));
        let sizes = |images: usize, keep_last: bool| {
            let mut sizes = vec![per_device(batch_size.min(images.max(1)))];
            let last = images % batch_size;
            if keep_last && last > 0 && per_device(last) != sizes[0] {
                sizes.push(per_device(last));
            }
            sizes
        };
        Self {
            train: sizes(train_images, !drop_last),
            eval: match val_images {
                0 => Vec::new(),
                n => sizes(n, true),
            },
        }
    }

    pub fn stages(&self) -> usize {
        self.train.len() + self.eval.len()
    }
}
