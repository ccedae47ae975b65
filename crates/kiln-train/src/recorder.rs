//! Everything a run writes into its folder, behind one writer: the class names, the running
//! loss in TensorBoard, and at each epoch's end the history, the per-class files, `report.html`,
//! TensorBoard's epoch scalars and the checkpoint. The loop calls it; nothing else writes there.

use std::path::PathBuf;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use kiln_models::weights;

use crate::checkpoint::{self, Position};
use crate::config::TrainConfig;
use crate::engine::Reading;
use crate::error::{TrainError, io_error};
use crate::evaluate::Evaluation;
use crate::parallel::Replicas;
use crate::report::{ReportInputs, report_html};
use crate::run_dir::{EpochSummary, RunDir, write_atomically};
use crate::schedule::Schedule;
use crate::tensorboard::EventWriter;

/// The writer of one run's folder.
pub struct Recorder<'a> {
    config: &'a TrainConfig,
    run: &'a RunDir,
    /// The run's TensorBoard file, where `logging.tensorboard` asks for one.
    board: Option<EventWriter>,
    /// The backend and devices, as the report names them.
    devices: String,
}

impl<'a> Recorder<'a> {
    /// A writer of `run`, for a run on `devices` (as the report names them).
    pub fn new(config: &'a TrainConfig, run: &'a RunDir, devices: String) -> Self {
        Self {
            config,
            run,
            board: None,
            devices,
        }
    }

    /// Opens the TensorBoard file, where `logging.tensorboard` asks for one: a new run's starts
    /// with the config as text; a resumed run's is cut back to the iteration it resumes from.
    pub fn open_board(&mut self, resume_at: Option<usize>) -> Result<(), TrainError> {
        if self.config.logging.tensorboard {
            self.board = Some(open_board(self.config, self.run, resume_at)?);
        }
        Ok(())
    }

    pub fn classes(&self, names: &[String]) -> Result<(), TrainError> {
        self.run.write_classes(names).map_err(self.io())
    }

    /// A reading of the device: the running loss and the learning rate in TensorBoard.
    pub fn reading(
        &mut self,
        iteration: usize,
        reading: &Reading,
        lr: f64,
    ) -> Result<(), TrainError> {
        let Some(board) = &mut self.board else {
            return Ok(());
        };
        let step = iteration as i64;
        (board.scalar("train/running_loss", step, reading.loss))
            .and_then(|()| board.scalar("train/lr", step, lr))
            .map_err(io_error(&self.run.path))
    }

    /// What an epoch's end writes before its checkpoint: the per-class files of `exported`
    /// (the evaluation of the weights the run exports), the history with the learning rate
    /// over the iterations so far, the report and TensorBoard's epoch scalars. `history` ends
    /// with the epoch's summary.
    pub fn epoch(
        &mut self,
        history: &[EpochSummary],
        exported: Option<&Evaluation>,
        schedule: &Schedule,
    ) -> Result<(), TrainError> {
        let (summary, before) = history.split_last().expect("the epoch's summary");
        if let Some(v) = exported {
            let best = (before.iter())
                .filter_map(|s| exported_top1(self.config, s))
                .all(|top1| v.top1 > top1);
            (self.run)
                .write_per_class(&v.confusion, &v.class_names, summary.epoch, best)
                .map_err(self.io())?;
        }
        (self.run)
            .write_history(history, &lr_trace(schedule, summary.iteration))
            .map_err(self.io())?;
        let inputs = ReportInputs {
            run: &self.run.path,
            history,
            device: &self.devices,
            per_class: exported.map(|v| (&v.confusion, v.class_names.as_slice())),
        };
        let page = report_html(self.config, &inputs);
        write_atomically(&self.run.path.join("report.html"), page.as_bytes()).map_err(self.io())?;
        if let Some(board) = &mut self.board {
            write_epoch(board, summary).map_err(io_error(&self.run.path))?;
        }
        Ok(())
    }

    /// Writes replica 0's model, optimizer state and weights' average with `position` as
    /// checkpoint `name` (on replica 0's thread, where its tensors live).
    pub fn checkpoint<B: AutodiffBackend>(
        &self,
        replicas: &mut Replicas<B>,
        name: String,
        position: &Position,
    ) -> Result<PathBuf, TrainError> {
        let (dir, mut position) = (self.run.checkpoints(), position.clone());
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

    /// Keeps the last `keep_last` epoch checkpoints, the best one where asked, and the newest
    /// mid-epoch one if it is the newest of all.
    pub fn prune(&self, position: &Position) {
        let checkpoints = &self.config.checkpoints;
        let keep_best = (checkpoints.keep_best)
            .then_some(())
            .and(position.best_checkpoint.as_deref());
        checkpoint::prune(&self.run.checkpoints(), checkpoints.keep_last, keep_best);
    }

    /// Writes the weights the run exports (`model.safetensors`).
    pub fn model<B: AutodiffBackend>(
        &self,
        replicas: &mut Replicas<B>,
    ) -> Result<PathBuf, TrainError> {
        let path = self.run.model_path();
        let average = ema_model(self.config, replicas)?;
        match average.filter(|_| exports_ema(self.config)) {
            Some(average) => weights::save_safetensors(&average, &path)?,
            None => weights::save_safetensors(&replicas.model()?.valid(), &path)?,
        }
        Ok(path)
    }

    fn io(&self) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
        io_error(&self.run.path)
    }
}

/// A copy of the weights' average from replica 0, where the run keeps one.
pub fn ema_model<B: AutodiffBackend>(
    config: &TrainConfig,
    replicas: &mut Replicas<B>,
) -> Result<Option<kiln_models::ResNet<B::InnerBackend>>, TrainError> {
    match config.ema {
        Some(_) => replicas.with_first(|r| Ok(r.ema.as_ref().map(|e| e.model.clone()))),
        None => Ok(None),
    }
}

/// Whether the run exports its weights' average rather than its weights.
pub fn exports_ema(config: &TrainConfig) -> bool {
    config.ema.as_ref().is_some_and(|e| e.export)
}

/// The top-1 an epoch is judged by: the exported weights' (see `exports_ema`).
pub fn exported_top1(config: &TrainConfig, summary: &EpochSummary) -> Option<f64> {
    match exports_ema(config) {
        true => summary.ema_val_top1,
        false => summary.val_top1,
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

fn open_board(
    config: &TrainConfig,
    run: &RunDir,
    resume_at: Option<usize>,
) -> Result<EventWriter, TrainError> {
    let dir = run.path.join("tensorboard");
    let mut board = EventWriter::open(&dir, resume_at.map(|i| i as i64)).map_err(io_error(&dir))?;
    if resume_at.is_none() {
        let text = format!("```toml\n{}\n```", config.to_toml());
        board.text("config", 0, &text).map_err(io_error(&dir))?;
        board.flush().map_err(io_error(&dir))?;
    }
    Ok(board)
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
