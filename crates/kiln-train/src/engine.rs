//! The training loop, generic over the backend. Read `train` top to bottom: open the data, build
//! the model and optimizer (or restore them), then for each epoch: steps, evaluation, metrics,
//! checkpoint. The engine never prints; it reports [`Event`]s to an [`Observer`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor};
use kiln_backend::MemoryMeter;
use kiln_data::{
    Batches, DataError, HostBatch, ImageLimits, Loader, LoaderConfig, Pipeline, Shard,
};
use kiln_models::pretrained::{self, PretrainedError};
use kiln_models::weights::{self, WeightsError};
use kiln_models::{ModelError, Precision, ResNet, ResNetConfig, Stem};

use crate::batch::{DeviceBatch, Uploaded};
use crate::checkpoint::{self, CheckpointError, EpochSums, Position};
use crate::config::{BatchSize, ModelSection, TrainConfig};
use crate::optim::AnyOptimizer;
use crate::panics::{self, OutOfMemory};
use crate::parallel::{ParallelError, Placement, Replicas};
use crate::plan::{self, Budget, Plan, PlanError};
use crate::run_dir::{EpochSummary, RunDir};
use crate::schedule::Schedule;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Pretrained(#[from] PretrainedError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Parallel(#[from] ParallelError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(
        "precision = \"{precision}\" does not run on this device ({reason}); use precision = \"f32\"{}",
        if *precision == "f32" { "" } else { " or train on a GPU that supports it (bf16 needs an NVIDIA GPU of the Ampere generation or later)" }
    )]
    PrecisionUnsupported {
        precision: &'static str,
        reason: String,
    },
    #[error(
        "out of device memory at batch_size {batch_size} ({per_device} per device), accumulate {accumulate} ({message}); {advice}"
    )]
    OutOfMemory {
        batch_size: usize,
        per_device: usize,
        accumulate: usize,
        message: String,
        advice: String,
    },
    #[error(
        "the run took {} of device memory at batch_size {batch_size} ({per_device} per device), more than max_memory = {}; {advice}",
        plan::bytes(*used), plan::bytes(*limit)
    )]
    OverMemory {
        batch_size: usize,
        per_device: usize,
        used: u64,
        limit: u64,
        advice: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the loss became {loss} at epoch {epoch}, iteration {iteration} (learning rate {lr:.3e}); training stopped. {}",
        checkpoint.as_ref().map_or("No checkpoint was written yet: lower optimizer.lr and start again".to_string(),
            |p| format!("The last good checkpoint is {}: lower the learning rate and resume, for example `kiln train --resume {} --set optimizer.lr=...`", p.display(), p.parent().and_then(Path::parent).unwrap_or(p).display()))
    )]
    NonFinite {
        epoch: usize,
        iteration: usize,
        loss: f64,
        lr: f64,
        checkpoint: Option<PathBuf>,
    },
}

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
    Iteration {
        epoch: usize,
        epochs: usize,
        batch: usize,
        batches: usize,
        iteration: usize,
        loss: f64,
        lr: f64,
        images: usize,
    },
    /// The memory plan, before anything is loaded: the batch (settled if it was `"auto"`),
    /// the estimated peak per device, and the budget it was checked against.
    Planned {
        batch_size: usize,
        auto: bool,
        per_device: usize,
        estimate_bytes: Option<u64>,
        budget: Option<Budget>,
    },
    Skipped(&'a DataError),
    Epoch(&'a EpochSummary),
    Checkpoint(&'a Path),
    Stopped(&'a Path),
    Finished {
        model: &'a Path,
    },
}

pub trait Observer {
    fn event(&mut self, event: Event<'_>);
}

/// An observer that ignores everything, for tests and library use.
pub struct Silent;

impl Observer for Silent {
    fn event(&mut self, _: Event<'_>) {}
}

/// How a run ended without error.
#[derive(Debug)]
pub enum Outcome {
    Finished {
        last: Option<EpochSummary>,
        model: PathBuf,
    },
    /// Stopped on request; resume from this checkpoint.
    Stopped { checkpoint: PathBuf },
}

/// Trains `config` on the devices (and machines) of `placement`, writing into `run`. With
/// `resume`, continues from the run's latest checkpoint. `memory` measures the first device for
/// each epoch's summary. `stop` (set by Ctrl-C) ends the run after the current step with a
/// checkpoint.
///
/// Before anything is loaded, the memory plan settles `batch_size = "auto"` and refuses a batch
/// that would not fit; a device running out of memory later ends the run with a batch that fits.
#[allow(clippy::too_many_arguments)]
pub fn train<B: AutodiffBackend>(
    config: &TrainConfig,
    run: &RunDir,
    resume: bool,
    placement: Placement<B::Device>,
    memory: &mut MemoryMeter,
    observer: &mut dyn Observer,
    stop: &AtomicBool,
) -> Result<Outcome, TrainError> {
    check_precision::<B>(config.precision(), &placement.devices[0])?;
    let budget = Budget::of(config, memory.available());
    let (config, plan) = plan_memory(config, run, placement.peers(), budget, observer)?;
    let limits = Limits {
        plan: plan.as_ref(),
        budget,
        max_memory: config.max_memory.map(|m| m.bytes()),
    };
    panics::catch_out_of_memory(|| {
        train_planned::<B>(
            &config, run, resume, placement, memory, &limits, observer, stop,
        )
    })
    .unwrap_or_else(|oom| Err(out_of_memory(&config, &limits, oom)))
}

/// The memory side of a run: the plan (when the config allows one) and the limits a step
/// is held to.
struct Limits<'a> {
    plan: Option<&'a Plan>,
    budget: Option<Budget>,
    max_memory: Option<u64>,
}

#[allow(clippy::too_many_arguments)]
fn train_planned<B: AutodiffBackend>(
    config: &TrainConfig,
    run: &RunDir,
    resume: bool,
    placement: Placement<B::Device>,
    memory: &mut MemoryMeter,
    limits: &Limits,
    observer: &mut dyn Observer,
    stop: &AtomicBool,
) -> Result<Outcome, TrainError> {
    let device = placement.devices[0].clone();
    B::seed(&device, config.seed);
    let (train_loader, val_loader) = loaders(config, shard(&placement))?;
    let classes = train_loader.dataset().classes().len();
    let in_use_before_model = memory.current().unwrap_or(0);
    let model =
        build_model::<B>(&config.model, classes, &device)?.with_precision(config.precision());
    let new_optimizer = || AnyOptimizer::<ResNet<B>, B>::new(&config.optimizer);
    let mut replicas = Replicas::new(
        model,
        new_optimizer,
        |device| loss_function::<B>(config, device),
        &placement,
        config.device.sync_bn,
    )?;
    let batches = train_loader.len();
    let schedule = Schedule::new(
        &config.schedule,
        config.optimizer.lr,
        config.epochs,
        batches.div_ceil(config.accumulate),
    );

    let mut position = Position::default();
    let mut history = Vec::new();
    let mut resumed_from = None;
    if resume {
        let (path, saved) = checkpoint::latest(&run.checkpoints())?;
        replicas.restore(
            |model, optimizer, device| checkpoint::load(&path, model, optimizer, device),
            new_optimizer,
        )?;
        replicas.restore_loss_scaler(saved.loss_scale.clone());
        position = saved;
        history = run.history();
        history.retain(|s| s.epoch <= position.epoch);
        resumed_from = Some(path);
    }
    observer.event(Event::Started {
        run_dir: &run.path,
        train_images: train_loader.dataset().len(),
        val_images: val_loader.as_ref().map(|l| l.dataset().len()),
        iterations_per_epoch: batches.div_ceil(config.accumulate),
        replicas: placement.peers(),
        resumed_from: resumed_from.as_deref(),
    });

    for epoch in position.epoch..config.epochs {
        let clock = Instant::now();
        memory.reset_peak();
        let mut host = train_loader.epoch_from(epoch as u64, position.batch);
        while let Some(step_batches) = next_step(&mut host, config.accumulate, observer)? {
            position.batch += step_batches.len();
            position.sums.skipped += step_batches.iter().map(|b| b.skipped.len()).sum::<usize>();
            let lr = schedule.lr(position.iteration);
            let step = replicas.step(step_batches, lr)?;
            memory.sample();
            check_max_memory(config, limits, memory, in_use_before_model)?;
            if step.images == 0 {
                continue;
            }
            if !step.loss.is_finite() {
                return Err(TrainError::NonFinite {
                    epoch: epoch + 1,
                    iteration: position.iteration,
                    loss: step.loss,
                    lr,
                    checkpoint: checkpoint::latest(&run.checkpoints()).ok().map(|(p, _)| p),
                });
            }
            position.iteration += 1;
            position.loss_scale = replicas.loss_scaler();
            position.sums.loss += step.loss * step.images as f64;
            position.sums.correct += step.correct;
            position.sums.seen += step.images;
            observer.event(Event::Iteration {
                epoch,
                epochs: config.epochs,
                batch: position.batch,
                batches,
                iteration: position.iteration,
                loss: step.loss,
                lr,
                images: step.images,
            });
            if stop.load(Ordering::SeqCst) {
                position.sums.seconds += clock.elapsed().as_secs_f64();
                let name = format!("epoch-{:04}-batch-{:06}", epoch + 1, position.batch);
                let path = checkpoint::save(
                    &run.checkpoints(),
                    &name,
                    replicas.model(),
                    replicas.optimizer(),
                    &position,
                )?;
                observer.event(Event::Stopped(&path));
                return Ok(Outcome::Stopped { checkpoint: path });
            }
        }

        let validation = match &val_loader {
            Some(loader) => Some(evaluate(&replicas.model().valid(), loader, &device)?),
            None => None,
        };
        let sums = std::mem::take(&mut position.sums);
        let seconds = sums.seconds + clock.elapsed().as_secs_f64();
        let mut summary = epoch_summary(
            epoch,
            &position,
            &sums,
            seconds,
            &schedule,
            validation.as_ref(),
        );
        summary.peak_memory_bytes = memory.peak_bytes();
        history.push(summary.clone());
        position.epoch = epoch + 1;
        position.batch = 0;
        run.write_history(&history, &lr_trace(&schedule, position.iteration))
            .map_err(io_error(&run.path))?;
        observer.event(Event::Epoch(&summary));
        if position.epoch % config.checkpoints.every_epochs == 0 || position.epoch == config.epochs
        {
            save_epoch_checkpoint(
                config,
                run,
                replicas.model(),
                replicas.optimizer(),
                &mut position,
                summary.val_top1,
                observer,
            )?;
        }
    }

    let model_path = run.model_path();
    weights::save_safetensors(&replicas.model().valid(), &model_path)?;
    replicas.finish()?;
    observer.event(Event::Finished { model: &model_path });
    Ok(Outcome::Finished {
        last: history.last().cloned(),
        model: model_path,
    })
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

/// Makes the memory plan: settles `batch_size = "auto"` (recording the number in the run's
/// config, so that a resumed run keeps it) and refuses a batch whose estimate exceeds the
/// budget. Without `"auto"` or `max_memory`, a config the plan cannot count (an image folder
/// without a crop) trains unplanned.
fn plan_memory(
    config: &TrainConfig,
    run: &RunDir,
    peers: usize,
    budget: Option<Budget>,
    observer: &mut dyn Observer,
) -> Result<(TrainConfig, Option<Plan>), TrainError> {
    let needed = config.batch_size == BatchSize::Auto || config.max_memory.is_some();
    let plan = match Plan::new(config, peers) {
        Ok(plan) => plan,
        Err(error) if needed => return Err(error.into()),
        Err(_) => return Ok((config.clone(), None)),
    };
    let settled = plan::settle_batch_size(config, &plan, budget.map(|b| b.bytes))?;
    let plan = Plan {
        batch_size: settled.batch_size.fixed(),
        ..plan
    };
    if let Some(budget) = budget {
        plan.check(budget.bytes, budget.source)?;
    }
    if settled != *config {
        run.record_config(&settled).map_err(io_error(&run.path))?;
    }
    let batch_size = settled.batch_size.fixed().unwrap_or(1);
    observer.event(Event::Planned {
        batch_size,
        auto: config.batch_size == BatchSize::Auto,
        per_device: plan.per_device(batch_size),
        estimate_bytes: plan.configured_peak(),
        budget,
    });
    Ok((settled, Some(plan)))
}

/// Stops a run whose measured peak went above `max_memory`.
fn check_max_memory(
    config: &TrainConfig,
    limits: &Limits,
    memory: &mut MemoryMeter,
    in_use_before_model: u64,
) -> Result<(), TrainError> {
    let Some(limit) = limits.max_memory else {
        return Ok(());
    };
    let Some(used) = memory
        .peak_bytes()
        .map(|peak| peak.saturating_sub(in_use_before_model))
    else {
        return Ok(());
    };
    if used <= limit {
        return Ok(());
    }
    let (batch_size, per_device) = batch_and_share(config, limits);
    Err(TrainError::OverMemory {
        batch_size,
        per_device,
        used,
        limit,
        advice: plan::advice(limits.plan, Some(limit), Some(used)),
    })
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

/// The next optimizer step's loader batches: `accumulate` of them, fewer at the end of an
/// epoch, `None` when the epoch is over. Reports the images each left out.
fn next_step(
    host: &mut Batches,
    accumulate: usize,
    observer: &mut dyn Observer,
) -> Result<Option<Vec<HostBatch>>, DataError> {
    let mut step = Vec::with_capacity(accumulate);
    for batch in host.by_ref().take(accumulate) {
        let batch = batch?;
        for skipped in &batch.skipped {
            observer.event(Event::Skipped(skipped));
        }
        step.push(batch);
    }
    Ok((!step.is_empty()).then_some(step))
}

/// The part of each batch this machine loads: all of it, or its share on a multi-machine run.
fn shard<D>(placement: &Placement<D>) -> Shard {
    match &placement.cluster {
        Some(cluster) => Shard {
            index: cluster.rank,
            count: cluster.nodes,
        },
        None => Shard::WHOLE,
    }
}

/// One optimizer step: forward, loss, backward, update. Returns the updated model, the batch's
/// mean loss and how many images it classified correctly. This is a one-device training step
/// without accumulation (`parallel::Replicas::step` adds the weighting, accumulation and
/// all-reduce around the same forward and backward); kiln's benchmarks and backend comparison
/// time and check it.
pub fn train_step<B: AutodiffBackend>(
    model: ResNet<B>,
    optimizer: &mut AnyOptimizer<ResNet<B>, B>,
    loss_fn: &CrossEntropyLoss<B>,
    batch: DeviceBatch<B>,
    lr: f64,
) -> (ResNet<B>, f64, usize) {
    let logits = model.forward(batch.images);
    let correct = count_correct(logits.clone().detach(), batch.labels.clone());
    let loss = loss_fn.forward(logits, batch.labels);
    let loss_value: f64 = loss.clone().into_scalar().elem();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    (optimizer.step(lr, model, grads), loss_value, correct)
}

pub(crate) fn count_correct<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> usize {
    let predicted = logits.argmax(1).flatten::<1>(0, 1);
    let hits: i64 = predicted.equal(labels).int().sum().into_scalar().elem();
    hits as usize
}

/// Validation loss, top-1 and top-5 accuracy.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub loss: f64,
    pub top1: f64,
    pub top5: f64,
    pub images: usize,
    pub skipped: usize,
}

/// Runs `model` over every batch of `loader` (epoch 0: the order, and any augmentation, of a
/// validation loader is fixed).
pub fn evaluate<B: Backend>(
    model: &ResNet<B>,
    loader: &Loader,
    device: &B::Device,
) -> Result<Evaluation, DataError> {
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let (mut loss, mut top1, mut top5, mut images, mut skipped) = (0.0, 0, 0, 0, 0);
    for batch in Uploaded::<B, _>::new(loader.epoch(0), device.clone()) {
        let batch = batch?;
        skipped += batch.skipped.len();
        if batch.is_empty() {
            continue;
        }
        let n = batch.len();
        let logits = model.forward(batch.images);
        let k = 5.min(logits.dims()[1]);
        let (_, best) = logits.clone().topk_with_indices(k, 1);
        let hits = best.equal(batch.labels.clone().unsqueeze_dim::<2>(1).repeat_dim(1, k));
        let in_top5: i64 = hits.int().sum().into_scalar().elem();
        top5 += in_top5 as usize;
        top1 += count_correct(logits.clone(), batch.labels.clone());
        let batch_loss: f64 = loss_fn.forward(logits, batch.labels).into_scalar().elem();
        loss += batch_loss * n as f64;
        images += n;
    }
    let share = |count: usize| count as f64 / images.max(1) as f64;
    Ok(Evaluation {
        loss: loss / images.max(1) as f64,
        top1: share(top1),
        top5: share(top5),
        images,
        skipped,
    })
}

/// The train and validation loaders the config describes; the train loader loads `shard` of
/// each batch.
pub fn loaders(config: &TrainConfig, shard: Shard) -> Result<(Loader, Option<Loader>), DataError> {
    let data = &config.data;
    let limits = ImageLimits {
        max_side: data.max_image_side,
        ..ImageLimits::default()
    };
    let batch_size = config.batch_size.fixed().ok_or_else(|| {
        DataError::Invalid("batch_size = \"auto\" is settled by `kiln train`; give a number".into())
    })?;
    let splits = data.source.open(config.seed, limits)?;
    let loader_config = LoaderConfig {
        batch_size,
        shuffle: true,
        drop_last: data.drop_last,
        workers: data.workers,
        prefetch: data.prefetch,
        seed: config.seed,
        on_bad_image: data.on_bad_image,
        shard,
    };
    let train = Loader::new(
        splits.train,
        Pipeline::new(&data.train_transforms)?,
        loader_config.clone(),
    )?;
    let val_config = LoaderConfig {
        shuffle: false,
        drop_last: false,
        shard: Shard::WHOLE,
        ..loader_config
    };
    let val = splits
        .val
        .map(|val| Loader::new(val, Pipeline::new(&data.val_transforms)?, val_config))
        .transpose()?;
    Ok((train, val))
}

/// The ResNet of the model section, with pretrained weights if asked for. A pretrained
/// classifier for another class count is left out, so fine-tuning starts with a fresh `fc`.
pub fn build_model<B: Backend>(
    section: &ModelSection,
    data_classes: usize,
    device: &B::Device,
) -> Result<ResNet<B>, TrainError> {
    let config = section.resnet(data_classes)?;
    let model = config.init::<B>(device)?;
    let path = match section.pretrained.as_deref() {
        None => return Ok(model),
        Some("torchvision") => {
            pretrained::torchvision_weights(config.depth, &pretrained::cache_dir(), true)?
        }
        Some(path) => PathBuf::from(path),
    };
    let (model, _report) = weights::load(model, &path)?;
    Ok(model)
}

pub(crate) fn loss_function<B: Backend>(
    config: &TrainConfig,
    device: &B::Device,
) -> CrossEntropyLoss<B> {
    let smoothing = config.loss.label_smoothing;
    CrossEntropyLossConfig::new()
        .with_smoothing((smoothing > 0.0).then_some(smoothing as f32))
        .init(device)
}

fn epoch_summary(
    epoch: usize,
    position: &Position,
    sums: &EpochSums,
    seconds: f64,
    schedule: &Schedule,
    validation: Option<&Evaluation>,
) -> EpochSummary {
    let seen = sums.seen.max(1) as f64;
    EpochSummary {
        epoch: epoch + 1,
        iteration: position.iteration,
        lr: schedule.lr(position.iteration.saturating_sub(1)),
        train_loss: sums.loss / seen,
        train_accuracy: sums.correct as f64 / seen,
        val_loss: validation.map(|v| v.loss),
        val_top1: validation.map(|v| v.top1),
        val_top5: validation.map(|v| v.top5),
        seconds,
        images_per_s: sums.seen as f64 / seconds.max(1e-9),
        skipped_images: sums.skipped + validation.map_or(0, |v| v.skipped),
        peak_memory_bytes: None,
    }
}

/// The learning rate at up to 500 evenly spread iterations, for the plot.
fn lr_trace(schedule: &Schedule, iterations: usize) -> Vec<(usize, f64)> {
    let step = (iterations / 500).max(1);
    (0..iterations)
        .step_by(step)
        .map(|i| (i, schedule.lr(i)))
        .collect()
}

fn save_epoch_checkpoint<B: AutodiffBackend>(
    config: &TrainConfig,
    run: &RunDir,
    model: &ResNet<B>,
    optimizer: &AnyOptimizer<ResNet<B>, B>,
    position: &mut Position,
    top1: Option<f64>,
    observer: &mut dyn Observer,
) -> Result<(), TrainError> {
    let name = format!("epoch-{:04}", position.epoch);
    let improved = top1.is_some_and(|t| position.best_top1.is_none_or(|best| t > best));
    if improved {
        position.best_top1 = top1;
        position.best_checkpoint = Some(name.clone());
    }
    let dir = run.checkpoints();
    let path = checkpoint::save(&dir, &name, model, optimizer, position)?;
    let keep_best = config
        .checkpoints
        .keep_best
        .then_some(())
        .and(position.best_checkpoint.as_deref());
    checkpoint::prune(&dir, config.checkpoints.keep_last, keep_best);
    observer.event(Event::Checkpoint(&path));
    Ok(())
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}
