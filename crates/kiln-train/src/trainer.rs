//! One training run in progress: the replicas (a model and its optimizer on each device), the
//! loaders, the schedule, where the run stands (`Position`) and its history, and the recorder
//! that writes the run folder. `engine::train` drives it epoch by epoch: `train_epoch` runs the
//! steps, `end_epoch` evaluates and records, `finish` writes the model.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use kiln_backend::MemoryMeter;
use kiln_data::{Batches, DataError, Dataset, HostBatch, Loader};
use kiln_models::{ResNet, weights};

use crate::checkpoint::{self, EpochSums, Position};
use crate::early_stopping::{self, EarlyStop};
use crate::ema::Ema;
use crate::error::TrainError;
use crate::evaluate::evaluate;
use crate::events::{Event, Observer, Reading, RunEnd};
use crate::limits::{Limits, over_memory};
use crate::loaders;
use crate::optim::AnyOptimizer;
use crate::param_groups::ParamGroups;
use crate::recorder::{Recorder, exported_top1, exports_ema};
use crate::replicas::{Placement, Replicas, StepRequests};
use crate::schedule::Schedule;
use crate::step::{StepStats, build_model, loss_function};
use kiln_config::config::{ClassWeights, TrainConfig, Tta};
use kiln_records::Evaluation;
use kiln_records::epoch::EpochSummary;
use kiln_records::iterations::StepLoss;
use kiln_records::run_dir::RunDir;

/// What a run borrows from its caller for its whole length.
pub struct Context<'a> {
    pub run: &'a RunDir,
    pub memory: &'a mut MemoryMeter,
    pub limits: &'a Limits<'a>,
    pub observer: &'a mut dyn Observer,
    /// Set by Ctrl-C: the run ends after the current step with a checkpoint.
    pub stop: &'a AtomicBool,
    /// The devices as people know them, where the caller named them (see `Settled::device`).
    pub device: Option<&'a str>,
}

pub struct Trainer<'a, B: AutodiffBackend> {
    pub config: &'a TrainConfig,
    pub position: Position,
    history: Vec<EpochSummary>,
    replicas: Replicas<B>,
    groups: Arc<ParamGroups>,
    train_loader: Loader,
    val_loader: Option<Loader>,
    schedule: Schedule,
    /// The first device: evaluation's.
    device: B::Device,
    in_cluster: bool,
    recorder: Recorder<'a>,
    cx: Context<'a>,
    /// The device's memory in use before the model was built (`max_memory` counts from it).
    in_use_before_model: u64,
    epoch_clock: Instant,
    last_saved: Instant,
    first_step: bool,
    lr: f64,
}

impl<'a, B: AutodiffBackend> Trainer<'a, B> {
    /// Opens the data, builds the replicas, and with `resume` restores them from the run's
    /// newest intact checkpoint.
    pub fn start(
        config: &'a TrainConfig,
        placement: Placement<B::Device>,
        resume: bool,
        cx: Context<'a>,
    ) -> Result<Self, TrainError> {
        let device = placement.devices[0].clone();
        B::seed(&device, config.seed);
        let (train_loader, val_loader) = loaders::open(config, loaders::share(&placement))?;
        let devices = describe_devices::<B>(&placement, cx.device);
        let mut recorder = Recorder::new(config, cx.run, devices);
        recorder.classes(train_loader.dataset().classes())?;
        let in_use_before_model = cx.memory.current().unwrap_or(0);
        let (mut replicas, groups) = build_replicas(config, train_loader.dataset(), &placement)?;
        let iterations = train_loader.len().div_ceil(config.accumulate);
        let schedule = Schedule::new(
            &config.schedule,
            config.optimizer.lr,
            config.epochs,
            iterations,
        );
        let (position, history, resumed_from) = match resume {
            true => restore(config, cx.run, &mut replicas, &groups, cx.observer)?,
            false => (Position::default(), Vec::new(), None),
        };
        if config.ema.is_some() {
            start_ema(&mut replicas, resumed_from.clone(), position.ema_averaged)?;
        }
        recorder.open(resume.then_some(position.iteration))?;
        cx.observer.event(Event::Started {
            run_dir: &cx.run.path,
            train_images: train_loader.dataset().len(),
            val_images: val_loader.as_ref().map(|l| l.dataset().len()),
            iterations_per_epoch: iterations,
            replicas: placement.peers(),
            resumed_from: resumed_from.as_deref(),
        });
        Ok(Self {
            config,
            lr: schedule.lr(position.iteration),
            position,
            history,
            replicas,
            groups,
            train_loader,
            val_loader,
            schedule,
            device,
            in_cluster: placement.cluster.is_some(),
            recorder,
            cx,
            in_use_before_model,
            epoch_clock: Instant::now(),
            last_saved: Instant::now(),
            first_step: true,
        })
    }

    /// `[early_stopping]`'s verdict, from the history alone, so that a resumed run stops where
    /// it would have.
    pub fn early_stop(&self) -> Option<EarlyStop> {
        let rule = self.config.early_stopping.as_ref()?;
        early_stopping::verdict(rule, &self.history)
    }

    /// Trains epoch `epoch` from the position's batch on. Returns the checkpoint written when
    /// a stop was asked (Ctrl-C here or on another machine).
    pub fn train_epoch(&mut self, epoch: usize) -> Result<Option<PathBuf>, TrainError> {
        self.epoch_clock = Instant::now();
        self.cx.memory.reset_peak();
        // A function of the epoch, like the schedule, so that resuming changes nothing.
        self.replicas.set_frozen(self.groups.frozen_in(epoch));
        let mut host = self
            .train_loader
            .epoch_from(epoch as u64, self.position.batch);
        // Each step's batches are uploaded while the step before runs (see `load_next`).
        let mut loaded = self.load_next(&mut host)?;
        let mut window = SinceReading::from_now();
        while let Some(step) = loaded {
            if std::mem::take(&mut self.first_step) {
                self.cx.observer.event(Event::FirstStep);
            }
            let agreed = self.step(&step)?;
            loaded = self.load_next(&mut host)?;
            if step.images == 0 && !self.in_cluster {
                // Every image of the step was skipped: nothing trained, no iteration.
                continue;
            }
            self.position.iteration += 1;
            window.steps += 1;
            self.update_ema(epoch)?;
            let last = loaded.is_none();
            let checkpoint = !last && !agreed.stop && (agreed.checkpoint || self.steps_due());
            self.report_step(epoch, &step, &mut window, agreed.stop || checkpoint || last)?;
            if agreed.stop || checkpoint {
                let path = self.mid_epoch_checkpoint(epoch)?;
                if agreed.stop {
                    return Ok(Some(path));
                }
                self.recorder.prune(&self.position);
                self.cx.observer.event(Event::Checkpoint(&path));
            }
        }
        if window.steps > 0 {
            // The epoch's last steps were all skipped images: what came before is still unread.
            self.read_window(&mut window, epoch)?;
        }
        Ok(None)
    }

    /// Validates, sums the epoch up, records it, and writes the epoch's checkpoint when due.
    pub fn end_epoch(&mut self, epoch: usize) -> Result<(), TrainError> {
        let (validation, average) = self.validate()?;
        let sums = std::mem::take(&mut self.position.sums);
        let seconds = sums.seconds + self.epoch_clock.elapsed().as_secs_f64();
        let mut summary = epoch_summary(epoch, &self.position, seconds, &self.schedule, &sums);
        add_validation(&mut summary, validation.as_ref(), average.as_ref());
        summary.peak_memory_bytes = self.cx.memory.peak_bytes();
        // Per class, the weights the run exports: the average's where `ema.export` says so.
        let exported = match exports_ema(self.config) {
            true => average.as_ref(),
            false => validation.as_ref(),
        };
        self.history.push(summary.clone());
        self.position.epoch = epoch + 1;
        self.position.batch = 0;
        self.position.loss_scale = self.replicas.loss_scaler()?;
        let val = self.val_loader.as_ref();
        (self.recorder).epoch(&self.history, exported, &self.schedule, val)?;
        self.cx.observer.event(Event::Epoch(&summary));
        let every = self.config.checkpoints.every_epochs;
        if self.position.epoch.is_multiple_of(every) || self.position.epoch == self.config.epochs {
            self.epoch_checkpoint(exported_top1(self.config, &summary))?;
        }
        Ok(())
    }

    /// Writes the exported weights and ends the replicas' threads (and the collective).
    pub fn finish(mut self, early_stop: Option<EarlyStop>) -> Result<RunEnd, TrainError> {
        if let Some(stop) = &early_stop {
            self.cx.observer.event(Event::StoppedEarly(stop));
        }
        let average = ema_model(self.config, &mut self.replicas)?;
        let model = match average.filter(|_| exports_ema(self.config)) {
            Some(average) => self.recorder.model(&average)?,
            None => self.recorder.model(&self.replicas.model()?.valid())?,
        };
        self.replicas.finish()?;
        self.cx.observer.event(Event::Finished { model: &model });
        let ending = early_stop.as_ref().map(ToString::to_string);
        (self.recorder).summary(self.history.last(), &model, ending.as_deref())?;
        Ok(RunEnd::Finished {
            last: self.history.last().cloned(),
            model,
            early_stop,
        })
    }

    /// Ends a run stopped at `checkpoint`, once every machine has written its own.
    pub fn stopped(self, checkpoint: PathBuf) -> Result<RunEnd, TrainError> {
        self.replicas.finish()?;
        self.cx.observer.event(Event::Stopped(&checkpoint));
        Ok(RunEnd::Stopped { checkpoint })
    }

    /// Queues one optimizer step on every replica. On several machines, what any of them asks
    /// (a Ctrl-C, its clock) holds for all: the answer is what they agreed.
    fn step(&mut self, step: &UploadedCounts) -> Result<StepRequests, TrainError> {
        self.position.batch += step.batches;
        self.position.sums.skipped += step.skipped;
        self.lr = self.schedule.lr(self.position.iteration);
        let asks = StepRequests {
            stop: self.cx.stop.load(Ordering::SeqCst),
            checkpoint: self.minutes_due(),
        };
        self.replicas.step(self.lr, asks)
    }

    /// Reads the device where `due` (a stop, a checkpoint, the epoch's end), at the first
    /// iteration and every `print_every`; in between, steps queue up unread. Reports the step.
    fn report_step(
        &mut self,
        epoch: usize,
        step: &UploadedCounts,
        window: &mut SinceReading,
        due: bool,
    ) -> Result<(), TrainError> {
        let iteration = self.position.iteration;
        let every = self.config.logging.print_every.max(1);
        let reading = match due || iteration == 1 || iteration.is_multiple_of(every) {
            true => {
                let reading = self.read_window(window, epoch)?;
                self.check_memory()?;
                self.recorder.reading(iteration, &reading, self.lr)?;
                Some(reading)
            }
            false => None,
        };
        self.cx.observer.event(Event::Iteration {
            epoch,
            epochs: self.config.epochs,
            batch: self.position.batch,
            batches: self.train_loader.len(),
            iteration,
            lr: self.lr,
            images: step.images,
            loss: reading,
        });
        Ok(())
    }

    /// Takes the next step's loader batches (`None` when the epoch is over) and uploads them
    /// to the replicas. Called right after a step is queued, so that on a GPU the upload and
    /// the loader's work overlap the step's kernels.
    fn load_next(&mut self, host: &mut Batches) -> Result<Option<UploadedCounts>, TrainError> {
        let Some(batches) = next_step(host, self.config.accumulate, self.cx.observer)? else {
            return Ok(None);
        };
        let loaded = UploadedCounts {
            batches: batches.len(),
            images: batches.iter().map(|b| b.labels.len()).sum(),
            skipped: batches.iter().map(|b| b.skipped.len()).sum(),
        };
        self.replicas.load(batches)?;
        Ok(Some(loaded))
    }

    /// Reads the losses and correct counts of the steps since the last reading (one transfer
    /// per device), adds them to the epoch's sums, and stops the run if a loss is not finite.
    fn read_window(
        &mut self,
        window: &mut SinceReading,
        epoch: usize,
    ) -> Result<Reading, TrainError> {
        let stats: Vec<StepStats> = self.replicas.take_stats()?;
        let first_iteration = (self.position.iteration + 1).saturating_sub(stats.len());
        let per_epoch = self.schedule.iterations_per_epoch() as f64;
        let mut steps = Vec::with_capacity(stats.len());
        for (offset, step) in stats.iter().enumerate().filter(|(_, s)| s.images > 0) {
            let loss = step.loss_sum / step.images as f64;
            let iteration = first_iteration + offset;
            steps.push(StepLoss {
                iteration,
                epoch: iteration as f64 / per_epoch,
                loss,
                lr: self.schedule.lr(iteration.saturating_sub(1)),
            });
            if !loss.is_finite() {
                return Err(TrainError::NonFinite {
                    epoch: epoch + 1,
                    iteration: first_iteration + offset,
                    loss,
                    lr: self.lr,
                    checkpoint: (checkpoint::latest(&self.cx.run.checkpoints()).ok())
                        .map(|(p, _)| p),
                });
            }
            add_step(&mut self.position.sums, step, loss);
            window.loss_sum += loss * step.images as f64;
            window.images += step.images;
        }
        self.recorder.steps(&steps)?;
        Ok(window.read())
    }

    /// Samples the first device's memory (on the thread of replica 0, whose pool it is) and
    /// stops a run whose measured peak went above `max_memory`.
    fn check_memory(&mut self) -> Result<(), TrainError> {
        match self.cx.memory.reader() {
            Some(read) => (self.cx.memory).record(self.replicas.with_first(move |_| Ok(read()))?),
            None => self.cx.memory.sample(),
        }
        let Some(limit) = self.cx.limits.max_memory else {
            return Ok(());
        };
        let used =
            (self.cx.memory.peak_bytes()).map(|peak| peak.saturating_sub(self.in_use_before_model));
        match used {
            Some(used) if used > limit => {
                Err(over_memory(self.config, self.cx.limits, used, limit))
            }
            _ => Ok(()),
        }
    }

    /// The weights' average's update, every `ema.every` optimizer steps.
    fn update_ema(&mut self, epoch: usize) -> Result<(), TrainError> {
        let Some(ema) =
            (self.config.ema.as_ref()).filter(|e| self.position.iteration.is_multiple_of(e.every))
        else {
            return Ok(());
        };
        let (decay, warming_up) = (ema.decay, epoch < ema.warmup_epochs);
        self.replicas.with_first(move |replica| {
            replica.update_ema(decay, warming_up);
            Ok(())
        })
    }

    /// The validation of the weights and of their average, where the run has a validation set.
    fn validate(&mut self) -> Result<(Option<Evaluation>, Option<Evaluation>), TrainError> {
        let Some(loader) = &self.val_loader else {
            return Ok((None, None));
        };
        let model = self.replicas.model()?.valid();
        let validation = evaluate(&model, loader, &self.device, Tta::None)?;
        let average = ema_model(self.config, &mut self.replicas)?;
        let average =
            (average.map(|a| evaluate(&a, loader, &self.device, Tta::None))).transpose()?;
        Ok((Some(validation), average))
    }

    fn mid_epoch_checkpoint(&mut self, epoch: usize) -> Result<PathBuf, TrainError> {
        self.position.loss_scale = self.replicas.loss_scaler()?;
        // The epoch's time so far goes into the saved sums, not the running ones.
        let mut saved = self.position.clone();
        saved.sums.seconds += self.epoch_clock.elapsed().as_secs_f64();
        let name = format!("epoch-{:04}-batch-{:06}", epoch + 1, self.position.batch);
        let path = self.save(name, &saved)?;
        self.last_saved = Instant::now();
        Ok(path)
    }

    /// The epoch's checkpoint, marked best where its top-1 is the best so far.
    fn epoch_checkpoint(&mut self, top1: Option<f64>) -> Result<(), TrainError> {
        let name = format!("epoch-{:04}", self.position.epoch);
        let position = &mut self.position;
        if top1.is_some_and(|t| position.best_top1.is_none_or(|best| t > best)) {
            position.best_top1 = top1;
            position.best_checkpoint = Some(name.clone());
        }
        let path = self.save(name, &self.position.clone())?;
        self.recorder.prune(&self.position);
        self.last_saved = Instant::now();
        self.cx.observer.event(Event::Checkpoint(&path));
        Ok(())
    }

    /// Writes checkpoint `name` of `position`: replica 0's model, optimizer state and weights'
    /// average, on its own thread (where its tensors live), once the steps it resumes after are
    /// on disk.
    fn save(&mut self, name: String, position: &Position) -> Result<PathBuf, TrainError> {
        self.recorder.before_checkpoint()?;
        let (dir, mut position) = (self.cx.run.checkpoints(), position.clone());
        self.replicas.with_first(move |replica| {
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

    /// Whether `checkpoints.every_steps` asks for a checkpoint after this step.
    fn steps_due(&self) -> bool {
        (self.config.checkpoints.every_steps)
            .is_some_and(|every| self.position.iteration.is_multiple_of(every))
    }

    /// Whether `checkpoints.every_minutes` have passed since the last checkpoint.
    fn minutes_due(&self) -> bool {
        (self.config.checkpoints.every_minutes)
            .is_some_and(|every| self.last_saved.elapsed().as_secs_f64() >= every * 60.0)
    }
}

/// One replica per device, from the model the config describes, with the loss's class weights
/// and the optimizer's parameter groups.
fn build_replicas<B: AutodiffBackend>(
    config: &TrainConfig,
    dataset: &Arc<dyn Dataset>,
    placement: &Placement<B::Device>,
) -> Result<(Replicas<B>, Arc<ParamGroups>), TrainError> {
    let classes = dataset.classes().len();
    let class_weights = (config.loss.class_weights.as_ref())
        .map(|weights| class_weights(weights, dataset.as_ref(), classes))
        .transpose()?;
    let model = build_model::<B>(&config.model, classes, &placement.devices[0])?
        .with_precision(config.precision());
    let names: Vec<String> = (weights::torch_parameters(&model).into_iter())
        .map(|(name, _)| name)
        .collect();
    let groups = ParamGroups::new(&names, &config.model, &config.optimizer)
        .map_err(TrainError::ParamGroups)?;
    let groups = Arc::new(groups);
    let replicas = Replicas::new(
        model,
        new_optimizer::<B>(config, &groups),
        |device| loss_function::<B>(config, class_weights.as_deref(), device),
        placement,
        config.device.sync_bn,
    )?;
    Ok((replicas.with_class_weights(class_weights), groups))
}

fn new_optimizer<B: AutodiffBackend>(
    config: &TrainConfig,
    groups: &Arc<ParamGroups>,
) -> impl Fn() -> AnyOptimizer<ResNet<B>, B> + Clone + Send + 'static {
    let (optimizer, groups) = (config.optimizer.clone(), groups.clone());
    move || AnyOptimizer::<ResNet<B>, B>::with_groups(&optimizer, groups.clone())
}

/// Restores the replicas from the run's newest intact checkpoint (reporting the damaged ones
/// passed over); returns its position, the history up to it, and its path.
fn restore<B: AutodiffBackend>(
    config: &TrainConfig,
    run: &RunDir,
    replicas: &mut Replicas<B>,
    groups: &Arc<ParamGroups>,
    observer: &mut dyn Observer,
) -> Result<(Position, Vec<EpochSummary>, Option<PathBuf>), TrainError> {
    let checkpoint::ResumePoint {
        path,
        position,
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
        new_optimizer::<B>(config, groups),
        position.loss_scale.clone(),
    )?;
    let mut history = run.history();
    history.retain(|s| s.epoch <= position.epoch);
    Ok((position, history, Some(path)))
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

/// A step's loader batches, uploaded to the replicas: how many batches, images and skipped
/// images it holds.
struct UploadedCounts {
    batches: usize,
    images: usize,
    skipped: usize,
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

/// The steps since the last reading of the device.
struct SinceReading {
    steps: usize,
    images: usize,
    loss_sum: f64,
    start: Instant,
}

impl SinceReading {
    fn from_now() -> Self {
        Self {
            steps: 0,
            images: 0,
            loss_sum: 0.0,
            start: Instant::now(),
        }
    }

    /// The window's reading; the next window starts now.
    fn read(&mut self) -> Reading {
        let next = Self::from_now();
        let reading = Reading {
            loss: self.loss_sum / self.images.max(1) as f64,
            steps: self.steps,
            seconds: next.start.duration_since(self.start).as_secs_f64(),
        };
        *self = next;
        reading
    }
}

fn epoch_summary(
    epoch: usize,
    position: &Position,
    seconds: f64,
    schedule: &Schedule,
    sums: &EpochSums,
) -> EpochSummary {
    let seen = sums.seen.max(1) as f64;
    EpochSummary {
        epoch: epoch + 1,
        iteration: position.iteration,
        lr: schedule.lr(position.iteration.saturating_sub(1)),
        train_loss: sums.loss / seen,
        train_accuracy: sums.correct as f64 / seen,
        val_loss: None,
        val_top1: None,
        val_top5: None,
        seconds,
        images_per_s: sums.seen as f64 / seconds.max(1e-9),
        skipped_images: sums.skipped,
        peak_memory_bytes: None,
        ema_val_loss: None,
        ema_val_top1: None,
        ema_val_top5: None,
        grad_norm_mean: (sums.grad_norm_steps > 0)
            .then(|| sums.grad_norm_sum / sums.grad_norm_steps as f64),
        grad_norm_max: (sums.grad_norm_steps > 0).then_some(sums.grad_norm_max),
        val_macro_f1: None,
    }
}

/// Adds a step's figures (`loss`, its mean over the step's images) to the epoch's sums.
fn add_step(sums: &mut EpochSums, step: &StepStats, loss: f64) {
    sums.loss += loss * step.images as f64;
    sums.correct += step.correct;
    sums.seen += step.images;
    if let Some(norm) = step.grad_norm {
        sums.grad_norm_sum += norm;
        sums.grad_norm_max = sums.grad_norm_max.max(norm);
        sums.grad_norm_steps += 1;
    }
}

/// Puts the validation of the weights and of their average into the epoch's summary.
fn add_validation(
    summary: &mut EpochSummary,
    validation: Option<&Evaluation>,
    average: Option<&Evaluation>,
) {
    if let Some(v) = validation {
        (summary.val_loss, summary.val_top1) = (Some(v.loss), Some(v.top1));
        summary.val_top5 = Some(v.top5);
        summary.val_macro_f1 = Some(v.confusion.macro_f1());
        summary.skipped_images += v.skipped;
    }
    if let Some(v) = average {
        (summary.ema_val_loss, summary.ema_val_top1) = (Some(v.loss), Some(v.top1));
        summary.ema_val_top5 = Some(v.top5);
    }
}

/// The devices of a run, as its report shows them: as people know them where the caller
/// named them (`named`), else as burn names them.
fn describe_devices<B: AutodiffBackend>(
    placement: &Placement<B::Device>,
    named: Option<&str>,
) -> String {
    let devices = match named {
        Some(name) => name.to_string(),
        None => {
            let devices: Vec<String> = placement.devices.iter().map(|d| format!("{d:?}")).collect();
            format!(
                "{} ({})",
                B::name(&placement.devices[0]),
                devices.join(", ")
            )
        }
    };
    match &placement.cluster {
        Some(cluster) => format!("{devices} on each of {} machines", cluster.nodes),
        None => devices,
    }
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
