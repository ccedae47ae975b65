//! The training loop, generic over the backend. Read `train` top to bottom: open the data, build
//! the model and optimizer (or restore them), then for each epoch: steps, evaluation, metrics,
//! checkpoint. The engine never prints; it reports [`Event`]s to an [`Observer`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::activation::softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{IndexingUpdateOp, Int, Tensor};
use kiln_backend::MemoryMeter;
use kiln_data::{
    Batches, DataError, Dataset, HostBatch, Loader, LoaderConfig, Pipeline, Shard, max_workers,
};
use kiln_models::weights;
use kiln_models::{Precision, ResNet, ResNetConfig, Stem};

use crate::batch::Uploaded;
use crate::checkpoint::{self, EpochSums, Position};
use crate::config::{BatchSize, ClassWeights, TrainConfig, Tta};
use crate::confusion::Confusion;
use crate::early_stopping::{self, EarlyStop};
use crate::ema::Ema;
use crate::error::{TrainError, io_error};
use crate::optim::AnyOptimizer;
use crate::panics::{self, OutOfMemory};
use crate::parallel::{Asks, Placement, Replicas};
use crate::param_groups::ParamGroups;
use crate::plan::{self, Budget, Plan};
use crate::report::{ReportInputs, report_html};
use crate::run_dir::{EpochSummary, RunDir, write_atomically};
use crate::schedule::Schedule;
use crate::step::{StepStats, build_model, count_correct, loss_function};
use crate::tensorboard::EventWriter;

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
    kiln_kernels::set_tf32(config.device.tf32);
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
    run.write_classes(train_loader.dataset().classes())
        .map_err(io_error(&run.path))?;
    let class_weights = match &config.loss.class_weights {
        Some(weights) => Some(class_weights(
            weights,
            train_loader.dataset().as_ref(),
            classes,
        )?),
        None => None,
    };
    let in_use_before_model = memory.current().unwrap_or(0);
    let model =
        build_model::<B>(&config.model, classes, &device)?.with_precision(config.precision());
    let names: Vec<String> = (weights::torch_parameters(&model).into_iter())
        .map(|(name, _)| name)
        .collect();
    let groups = ParamGroups::new(&names, &config.model, &config.optimizer)
        .map_err(TrainError::ParamGroups)?;
    let groups = Arc::new(groups);
    let optimizer_config = config.optimizer.clone();
    let new_optimizer = {
        let groups = groups.clone();
        move || AnyOptimizer::<ResNet<B>, B>::with_groups(&optimizer_config, groups.clone())
    };
    let mut replicas = Replicas::new(
        model,
        new_optimizer.clone(),
        |device| loss_function::<B>(config, class_weights.as_deref(), device),
        &placement,
        config.device.sync_bn,
    )?
    .with_class_weights(class_weights.clone());
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
        let checkpoint::ResumePoint {
            path,
            position: saved,
            passed_over,
        } = checkpoint::newest_intact(&run.checkpoints())?;
        for (skipped, reason) in &passed_over {
            observer.event(Event::CheckpointSkipped {
                path: skipped,
                reason,
            });
        }
        let from = path.clone();
        replicas.restore(
            move |model, optimizer, device| Ok(checkpoint::load(&from, model, optimizer, device)?),
            new_optimizer,
            saved.loss_scale.clone(),
        )?;
        position = saved;
        history = run.history();
        history.retain(|s| s.epoch <= position.epoch);
        resumed_from = Some(path);
    }
    if config.ema.is_some() {
        start_ema(&mut replicas, resumed_from.clone(), position.ema_averaged)?;
    }
    let mut board = open_board(config, run, resume.then_some(position.iteration))?;
    observer.event(Event::Started {
        run_dir: &run.path,
        train_images: train_loader.dataset().len(),
        val_images: val_loader.as_ref().map(|l| l.dataset().len()),
        iterations_per_epoch: batches.div_ceil(config.accumulate),
        replicas: placement.peers(),
        resumed_from: resumed_from.as_deref(),
    });

    let device_text = describe_devices::<B>(&placement);
    let mut first_step = true;
    let mut last_saved = Instant::now();
    let mut lr = schedule.lr(position.iteration);
    let mut early_stop = None;
    for epoch in position.epoch..config.epochs {
        // Decided from the history alone, so that a resumed run stops where it would have.
        let rule = config.early_stopping.as_ref();
        early_stop = rule.and_then(|rule| early_stopping::verdict(rule, &history));
        if let Some(stop) = &early_stop {
            observer.event(Event::StoppedEarly(stop));
            break;
        }
        let clock = Instant::now();
        memory.reset_peak();
        // A function of the epoch, like the schedule, so that resuming changes nothing.
        replicas.set_frozen(groups.frozen_in(epoch));
        let mut host = train_loader.epoch_from(epoch as u64, position.batch);
        // Each step's batches are uploaded while the step before runs (see `load_next`).
        let mut loaded = load_next(&mut host, config.accumulate, &mut replicas, observer)?;
        let mut window = Window {
            start: Some(Instant::now()),
            ..Window::default()
        };
        while let Some(step_batches) = loaded {
            if first_step {
                observer.event(Event::FirstStep);
                first_step = false;
            }
            position.batch += step_batches.batches;
            position.sums.skipped += step_batches.skipped;
            lr = schedule.lr(position.iteration);
            let asks = Asks {
                stop: stop.load(Ordering::SeqCst),
                checkpoint: minutes_due(config, last_saved),
            };
            // On several machines, what any of them asks (a Ctrl-C, its clock) holds for all.
            let agreed = replicas.step(lr, asks)?;
            loaded = load_next(&mut host, config.accumulate, &mut replicas, observer)?;
            if step_batches.images == 0 && placement.cluster.is_none() {
                // Every image of the step was skipped: nothing trained, no iteration.
                continue;
            }
            position.iteration += 1;
            window.steps += 1;
            if let Some(ema) = config
                .ema
                .as_ref()
                .filter(|e| position.iteration % e.every == 0)
            {
                let (decay, warming_up) = (ema.decay, epoch < ema.warmup_epochs);
                replicas.with_first(move |replica| {
                    replica.update_ema(decay, warming_up);
                    Ok(())
                })?;
            }
            let stopping = agreed.stop;
            let mid_epoch_checkpoint = loaded.is_some()
                && !stopping
                && (agreed.checkpoint || steps_due(config, &position));
            // The device is read at the first iteration, every print_every, at a stop, at a
            // checkpoint and at the end of the epoch; in between, steps queue up unread.
            let read = position.iteration == 1
                || position.iteration % config.logging.print_every.max(1) == 0
                || stopping
                || mid_epoch_checkpoint
                || loaded.is_none();
            let reading = if read {
                let reading =
                    read_window(&mut replicas, &mut window, &mut position, epoch, lr, run)?;
                sample_memory(memory, &mut replicas)?;
                check_max_memory(config, limits, memory, in_use_before_model)?;
                Some(reading)
            } else {
                None
            };
            if let (Some(board), Some(reading)) = (&mut board, reading) {
                let step = position.iteration as i64;
                board
                    .scalar("train/running_loss", step, reading.loss)
                    .and_then(|()| board.scalar("train/lr", step, lr))
                    .map_err(io_error(&run.path))?;
            }
            observer.event(Event::Iteration {
                epoch,
                epochs: config.epochs,
                batch: position.batch,
                batches,
                iteration: position.iteration,
                lr,
                images: step_batches.images,
                loss: reading,
            });
            if stopping || mid_epoch_checkpoint {
                position.loss_scale = replicas.loss_scaler()?;
                // The epoch's time so far goes into the saved sums, not the running ones.
                let mut saved = position.clone();
                saved.sums.seconds += clock.elapsed().as_secs_f64();
                let name = format!("epoch-{:04}-batch-{:06}", epoch + 1, position.batch);
                let path = save_checkpoint(&mut replicas, run, name, &saved)?;
                last_saved = Instant::now();
                if stopping {
                    // Every machine has written its checkpoint before any ends.
                    replicas.finish()?;
                    observer.event(Event::Stopped(&path));
                    return Ok(Outcome::Stopped { checkpoint: path });
                }
                prune(config, run, &position);
                observer.event(Event::Checkpoint(&path));
            }
        }

        if window.steps > 0 {
            // The epoch's last steps were all skipped images: what came before is still unread.
            read_window(&mut replicas, &mut window, &mut position, epoch, lr, run)?;
        }
        let model = replicas.model()?;
        let validation = match &val_loader {
            Some(loader) => Some(evaluate(&model.valid(), loader, &device, Tta::None)?),
            None => None,
        };
        let average = ema_model(config, &mut replicas)?;
        let ema_validation = match (&val_loader, &average) {
            (Some(loader), Some(average)) => Some(evaluate(average, loader, &device, Tta::None)?),
            _ => None,
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
        if let Some(v) = &ema_validation {
            (summary.ema_val_loss, summary.ema_val_top1) = (Some(v.loss), Some(v.top1));
            summary.ema_val_top5 = Some(v.top5);
        }
        // Per class, the weights the run exports: the average's where `ema.export` says so.
        let exported = match exports_ema(config) {
            true => ema_validation.as_ref(),
            false => validation.as_ref(),
        };
        if let Some(v) = exported {
            let best = (history.iter())
                .filter_map(|s| exported_top1(config, s))
                .all(|top1| v.top1 > top1);
            run.write_per_class(&v.confusion, &v.class_names, epoch + 1, best)
                .map_err(io_error(&run.path))?;
        }
        history.push(summary.clone());
        position.epoch = epoch + 1;
        position.batch = 0;
        position.loss_scale = replicas.loss_scaler()?;
        run.write_history(&history, &lr_trace(&schedule, position.iteration))
            .map_err(io_error(&run.path))?;
        let inputs = ReportInputs {
            run: &run.path,
            history: &history,
            device: &device_text,
            per_class: exported.map(|v| (&v.confusion, v.class_names.as_slice())),
        };
        write_atomically(
            &run.path.join("report.html"),
            report_html(config, &inputs).as_bytes(),
        )
        .map_err(io_error(&run.path))?;
        if let Some(board) = &mut board {
            write_epoch(board, &summary).map_err(io_error(&run.path))?;
        }
        observer.event(Event::Epoch(&summary));
        if position.epoch % config.checkpoints.every_epochs == 0 || position.epoch == config.epochs
        {
            save_epoch_checkpoint(
                config,
                run,
                &mut replicas,
                &mut position,
                exported_top1(config, &summary),
                observer,
            )?;
            last_saved = Instant::now();
        }
    }

    let model_path = run.model_path();
    let average = ema_model(config, &mut replicas)?;
    match average.filter(|_| exports_ema(config)) {
        Some(average) => weights::save_safetensors(&average, &model_path)?,
        None => weights::save_safetensors(&replicas.model()?.valid(), &model_path)?,
    }
    replicas.finish()?;
    observer.event(Event::Finished { model: &model_path });
    Ok(Outcome::Finished {
        last: history.last().cloned(),
        model: model_path,
        early_stop,
    })
}

/// The loss's weight of each class (`loss.class_weights`), counting the training set's images
/// per class where the config asks for balanced weights.
fn class_weights(
    weights: &ClassWeights,
    dataset: &dyn Dataset,
    classes: usize,
) -> Result<Vec<f32>, TrainError> {
    let mut images = vec![0usize; classes];
    if matches!(weights, ClassWeights::Named(_)) {
        for index in 0..dataset.len() {
            images[dataset.label(index)] += 1;
        }
    }
    weights.resolve(&images).map_err(TrainError::ClassWeights)
}

/// A copy of the weights' average from replica 0, where the run keeps one.
fn ema_model<B: AutodiffBackend>(
    config: &TrainConfig,
    replicas: &mut Replicas<B>,
) -> Result<Option<ResNet<B::InnerBackend>>, TrainError> {
    match config.ema {
        Some(_) => replicas.with_first(|r| Ok(r.ema.as_ref().map(|e| e.model.clone()))),
        None => Ok(None),
    }
}

/// Whether the run exports its weights' average rather than its weights.
fn exports_ema(config: &TrainConfig) -> bool {
    config.ema.as_ref().is_some_and(|e| e.export)
}

/// Gives replica 0 the weights' average: the checkpoint's when resuming from one that has it,
/// else one that starts from the model's weights.
fn start_ema<B: AutodiffBackend>(
    replicas: &mut Replicas<B>,
    checkpoint: Option<PathBuf>,
    averaged: Option<usize>,
) -> Result<(), TrainError> {
    replicas.with_first(move |replica| {
        let mut ema = Ema::new(replica.model());
        if let Some(path) = checkpoint {
            let template = ema.model.clone();
            if let Some(model) = checkpoint::load_ema(&path, template, &replica.device)? {
                ema = Ema {
                    model,
                    averaged: averaged.unwrap_or(1),
                };
            }
        }
        replica.ema = Some(ema);
        Ok(())
    })
}

/// Reads the first device's memory pool on the thread of replica 0, whose pool it is.
fn sample_memory<B: AutodiffBackend>(
    memory: &mut MemoryMeter,
    replicas: &mut Replicas<B>,
) -> Result<(), TrainError> {
    match memory.reader() {
        Some(read) => memory.record(replicas.with_first(move |_| Ok(read()))?),
        None => memory.sample(),
    }
    Ok(())
}

/// A step's loader batches, uploaded to the replicas: how many batches, images and skipped
/// images it holds.
struct Loaded {
    batches: usize,
    images: usize,
    skipped: usize,
}

/// Takes the next step's loader batches (`None` when the epoch is over) and uploads them to
/// the replicas. Called right after a step is queued, so that on a GPU the upload and the
/// loader's work overlap the step's kernels.
fn load_next<B: AutodiffBackend>(
    host: &mut Batches,
    accumulate: usize,
    replicas: &mut Replicas<B>,
    observer: &mut dyn Observer,
) -> Result<Option<Loaded>, TrainError> {
    let Some(batches) = next_step(host, accumulate, observer)? else {
        return Ok(None);
    };
    let loaded = Loaded {
        batches: batches.len(),
        images: batches.iter().map(|b| b.labels.len()).sum(),
        skipped: batches.iter().map(|b| b.skipped.len()).sum(),
    };
    replicas.load(batches)?;
    Ok(Some(loaded))
}

/// The steps since the last reading of the device.
#[derive(Default)]
struct Window {
    steps: usize,
    images: usize,
    loss_sum: f64,
    start: Option<Instant>,
}

/// Reads the losses and correct counts of the steps since the last reading (one transfer per
/// device), adds them to the epoch's sums, and stops the run if a loss is not finite.
fn read_window<B: AutodiffBackend>(
    replicas: &mut Replicas<B>,
    window: &mut Window,
    position: &mut Position,
    epoch: usize,
    lr: f64,
    run: &RunDir,
) -> Result<Reading, TrainError> {
    let stats: Vec<StepStats> = replicas.take_stats()?;
    let first_iteration = (position.iteration + 1).saturating_sub(stats.len());
    for (offset, step) in stats.iter().enumerate() {
        if step.images == 0 {
            continue;
        }
        if !step.loss_sum.is_finite() {
            return Err(TrainError::NonFinite {
                epoch: epoch + 1,
                iteration: first_iteration + offset,
                loss: step.loss_sum / step.images as f64,
                lr,
                checkpoint: checkpoint::latest(&run.checkpoints()).ok().map(|(p, _)| p),
            });
        }
        let loss = step.loss_sum / step.images as f64;
        position.sums.loss += loss * step.images as f64;
        position.sums.correct += step.correct;
        position.sums.seen += step.images;
        if let Some(norm) = step.grad_norm {
            position.sums.grad_norm_sum += norm;
            position.sums.grad_norm_max = position.sums.grad_norm_max.max(norm);
            position.sums.grad_norm_steps += 1;
        }
        window.loss_sum += loss * step.images as f64;
        window.images += step.images;
    }
    let now = Instant::now();
    let start = window.start.replace(now);
    let reading = Reading {
        loss: window.loss_sum / window.images.max(1) as f64,
        steps: window.steps,
        seconds: start.map_or(0.0, |s| now.duration_since(s).as_secs_f64()),
    };
    *window = Window {
        start: Some(now),
        ..Window::default()
    };
    Ok(reading)
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
    let train_images = match config.batch_size {
        BatchSize::Auto => config.data.source.train_size(),
        BatchSize::Fixed(_) => None,
    };
    let (settled, auto) =
        plan::settle_batch_size(config, &plan, budget.map(|b| b.bytes), train_images)?;
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
        auto,
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

/// Validation loss, top-1 and top-5 accuracy, and the confusion matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub loss: f64,
    pub top1: f64,
    pub top5: f64,
    pub images: usize,
    pub skipped: usize,
    pub confusion: Confusion,
    /// The name of each of the model's classes (`class <i>` beyond the data set's).
    pub class_names: Vec<String>,
}

/// Evaluation's loss sum, top-1 and top-5 counts and confusion counts, on the device.
struct EvaluationSums<B: Backend> {
    loss: Tensor<B, 1>,
    top1: Tensor<B, 1, Int>,
    top5: Tensor<B, 1, Int>,
    /// Row-major `classes` x `classes`: true class, predicted class.
    confusion: Tensor<B, 1, Int>,
}

/// Runs `model` over every batch of `loader` (epoch 0: the order, and any augmentation, of a
/// validation loader is fixed). With `Tta::Hflip`, each image's class probabilities are the
/// mean of its own and its mirror's softmax, and the loss is their negative log at the label.
pub fn evaluate<B: Backend>(
    model: &ResNet<B>,
    loader: &Loader,
    device: &B::Device,
    tta: Tta,
) -> Result<Evaluation, DataError> {
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    // Sums stay on the device until the end: one read for the whole pass.
    let mut sums: Option<EvaluationSums<B>> = None;
    let (mut images, mut skipped, mut classes) = (0, 0, 0);
    for batch in Uploaded::<B, _>::new(loader.epoch(0), device.clone()) {
        let batch = batch?;
        skipped += batch.skipped.len();
        if batch.is_empty() {
            continue;
        }
        let n = batch.len();
        let (logits, loss) = match tta {
            Tta::None => {
                let logits = model.forward(batch.images);
                let loss = loss_fn.forward(logits.clone(), batch.labels.clone()) * n as f64;
                (logits, loss)
            }
            Tta::Hflip => {
                let mirrored = model.forward(batch.images.clone().flip([3]));
                let logits = model.forward(batch.images);
                let probs = (softmax(logits, 1) + softmax(mirrored, 1)) / 2.0;
                let at_label = probs
                    .clone()
                    .gather(1, batch.labels.clone().unsqueeze_dim(1));
                (probs, at_label.log().sum().neg())
            }
        };
        classes = logits.dims()[1];
        let k = 5.min(classes);
        let (_, best) = logits.clone().topk_with_indices(k, 1);
        let hits = best.equal(batch.labels.clone().unsqueeze_dim::<2>(1).repeat_dim(1, k));
        let top5 = hits.int().sum();
        // Each image adds one at (label, prediction) of the flattened matrix.
        let cells = batch.labels.clone() * classes as i64 + logits.clone().argmax(1).reshape([n]);
        let ones = Tensor::<B, 1, Int>::ones([n], device);
        let confusion = sums.as_ref().map_or_else(
            || Tensor::zeros([classes * classes], device),
            |s| s.confusion.clone(),
        );
        let confusion = confusion.scatter(0, cells, ones, IndexingUpdateOp::Add);
        let top1 = count_correct(logits, batch.labels);
        sums = Some(match sums {
            None => EvaluationSums {
                loss,
                top1,
                top5,
                confusion,
            },
            Some(s) => EvaluationSums {
                loss: s.loss + loss,
                top1: s.top1 + top1,
                top5: s.top5 + top5,
                confusion,
            },
        });
        images += n;
    }
    let (loss, top1, top5, confusion) = match sums {
        Some(sums) => {
            let counts = Tensor::cat(vec![sums.top1, sums.top5, sums.confusion], 0)
                .into_data()
                .convert::<i64>();
            let counts: Vec<u64> = (counts.to_vec::<i64>().expect("counts").into_iter())
                .map(|c| c as u64)
                .collect();
            let loss: Vec<f64> = (sums.loss.into_data().convert::<f64>().to_vec()).expect("a sum");
            let confusion = Confusion::from_counts(classes, counts[2..].to_vec());
            (loss[0], counts[0] as usize, counts[1] as usize, confusion)
        }
        None => (0.0, 0, 0, Confusion::from_counts(0, Vec::new())),
    };
    let share = |count: usize| count as f64 / images.max(1) as f64;
    let names = loader.dataset().classes();
    let class_names = (0..confusion.classes())
        .map(|i| {
            names
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("class {i}"))
        })
        .collect();
    Ok(Evaluation {
        loss: loss / images.max(1) as f64,
        top1: share(top1),
        top5: share(top5),
        images,
        skipped,
        confusion,
        class_names,
    })
}

/// The train and validation loaders the config describes; the train loader loads `shard` of
/// each batch.
pub fn loaders(config: &TrainConfig, shard: Shard) -> Result<(Loader, Option<Loader>), DataError> {
    let data = &config.data;
    let limits = data.image_limits();
    let batch_size = config.batch_size.fixed().ok_or_else(|| {
        DataError::Invalid("batch_size = \"auto\" is settled by `kiln train`; give a number".into())
    })?;
    if data.workers > max_workers() {
        log::warn!(
            "data.workers = {} is more decoding threads than this machine can use; using {} (four per core)",
            data.workers,
            max_workers()
        );
    }
    let splits = data.source.open(config.seed, limits)?;
    let classes = (config.model.num_classes).unwrap_or(splits.train.classes().len());
    let mixing = config.mixup.as_ref();
    let loader_config = LoaderConfig {
        batch_size,
        shuffle: true,
        drop_last: data.drop_last,
        workers: data.workers,
        prefetch: data.prefetch,
        seed: config.seed,
        on_bad_image: data.on_bad_image,
        shard,
        mixing: mixing.map(|m| m.mixing(config.loss.label_smoothing, classes)),
    };
    let train = Loader::new(
        splits.train,
        Pipeline::new(&data.train_transforms)?.with_max_pixels(data.max_resize_pixels),
        loader_config.clone(),
    )?;
    let val_config = LoaderConfig {
        shuffle: false,
        drop_last: false,
        shard: Shard::WHOLE,
        mixing: None,
        ..loader_config
    };
    let val = splits
        .val
        .map(|val| {
            let pipeline = Pipeline::new(&data.val_transforms)?;
            Loader::new(
                val,
                pipeline.with_max_pixels(data.max_resize_pixels),
                val_config,
            )
        })
        .transpose()?;
    Ok((train, val))
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
        ema_val_loss: None,
        ema_val_top1: None,
        ema_val_top5: None,
        grad_norm_mean: (sums.grad_norm_steps > 0)
            .then(|| sums.grad_norm_sum / sums.grad_norm_steps as f64),
        grad_norm_max: (sums.grad_norm_steps > 0).then_some(sums.grad_norm_max),
        val_macro_f1: validation.map(|v| v.confusion.macro_f1()),
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

/// The backend and devices of a run, as its report shows them.
fn describe_devices<B: AutodiffBackend>(placement: &Placement<B::Device>) -> String {
    let devices: Vec<String> = placement.devices.iter().map(|d| format!("{d:?}")).collect();
    let machines = match &placement.cluster {
        Some(cluster) => format!(" on each of {} machines", cluster.nodes),
        None => String::new(),
    };
    format!(
        "{} ({}){machines}",
        B::name(&placement.devices[0]),
        devices.join(", ")
    )
}

/// The top-1 an epoch is judged by: the exported weights' (see `exports_ema`).
fn exported_top1(config: &TrainConfig, summary: &EpochSummary) -> Option<f64> {
    match exports_ema(config) {
        true => summary.ema_val_top1,
        false => summary.val_top1,
    }
}

fn save_epoch_checkpoint<B: AutodiffBackend>(
    config: &TrainConfig,
    run: &RunDir,
    replicas: &mut Replicas<B>,
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
    let path = save_checkpoint(replicas, run, name, position)?;
    prune(config, run, position);
    observer.event(Event::Checkpoint(&path));
    Ok(())
}

/// Keeps the last `keep_last` epoch checkpoints, the best one where asked, and the newest
/// mid-epoch one if it is the newest of all.
fn prune(config: &TrainConfig, run: &RunDir, position: &Position) {
    let keep_best = config
        .checkpoints
        .keep_best
        .then_some(())
        .and(position.best_checkpoint.as_deref());
    checkpoint::prune(&run.checkpoints(), config.checkpoints.keep_last, keep_best);
}

/// The run's TensorBoard file, where `logging.tensorboard` asks for one: a new run's starts with
/// the config as text; a resumed run's is cut back to the step it resumes from.
fn open_board(
    config: &TrainConfig,
    run: &RunDir,
    resume_at: Option<usize>,
) -> Result<Option<EventWriter>, TrainError> {
    if !config.logging.tensorboard {
        return Ok(None);
    }
    let dir = run.path.join("tensorboard");
    let mut board = EventWriter::open(&dir, resume_at.map(|i| i as i64)).map_err(io_error(&dir))?;
    if resume_at.is_none() {
        let text = format!("```toml\n{}\n```", config.to_toml());
        board.text("config", 0, &text).map_err(io_error(&dir))?;
        board.flush().map_err(io_error(&dir))?;
    }
    Ok(Some(board))
}

/// Every number of the epoch's summary as `epoch/<name>` at the epoch's last step (the names of
/// `metrics.jsonl`, so that new metrics appear without a change here), flushed to disk.
fn write_epoch(board: &mut EventWriter, summary: &EpochSummary) -> std::io::Result<()> {
    let step = summary.iteration as i64;
    let fields = serde_json::to_value(summary)?;
    for (name, value) in fields.as_object().into_iter().flatten() {
        if let (Some(value), false) = (
            value.as_f64(),
            matches!(name.as_str(), "epoch" | "iteration"),
        ) {
            board.scalar(&format!("epoch/{name}"), step, value)?;
        }
    }
    board.flush()
}

/// Whether `checkpoints.every_steps` asks for a checkpoint after this step.
fn steps_due(config: &TrainConfig, position: &Position) -> bool {
    (config.checkpoints.every_steps).is_some_and(|every| position.iteration.is_multiple_of(every))
}

/// Whether `checkpoints.every_minutes` have passed since the last checkpoint.
fn minutes_due(config: &TrainConfig, last_saved: Instant) -> bool {
    (config.checkpoints.every_minutes)
        .is_some_and(|every| last_saved.elapsed().as_secs_f64() >= every * 60.0)
}

/// Writes replica 0's model and optimizer state with `position` (on replica 0's thread, where
/// its tensors live).
fn save_checkpoint<B: AutodiffBackend>(
    replicas: &mut Replicas<B>,
    run: &RunDir,
    name: String,
    position: &Position,
) -> Result<PathBuf, TrainError> {
    let (dir, mut position) = (run.checkpoints(), position.clone());
    replicas.with_first(move |replica| {
        position.ema_averaged = replica.ema.as_ref().map(|e| e.averaged);
        Ok(checkpoint::save(
            &dir,
            &name,
            replica.model(),
            &replica.optimizer,
            replica.ema.as_ref().map(|e| &e.model),
            &position,
        )?)
    })
}
