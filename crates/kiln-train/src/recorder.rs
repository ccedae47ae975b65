//! Everything a run writes into its folder, behind one writer: the class names, every step's
//! loss (`iterations.csv`), the running loss in TensorBoard, and at each epoch's end the history,
//! the plots, the per-class files and mistakes, `report.html`, TensorBoard's epoch scalars and
//! the checkpoint's moment. The loop hands it what to write; the checkpoints themselves are
//! `checkpoint`'s, which replica 0 writes on its own thread.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use kiln_data::Loader;
use kiln_models::{ResNet, weights};

use crate::checkpoint::{self, Position};
use crate::error::{TrainError, io_error};
use crate::events::Reading;
use crate::schedule::Schedule;
use kiln_config::config::TrainConfig;
use kiln_records::Evaluation;
use kiln_records::epoch::EpochSummary;
use kiln_records::figures::Figures;
use kiln_records::iterations::{IterationLog, StepLoss};
use kiln_records::mistakes::{self, SHOWN};
use kiln_records::run_dir::{RunDir, summary_text};
use kiln_records::run_report::{ReportInputs, report_html};
use kiln_records::tensorboard::EventWriter;
use kiln_records::write_atomically;

/// The writer of one run's folder.
pub struct Recorder<'a> {
    config: &'a TrainConfig,
    run: &'a RunDir,
    /// The run's TensorBoard file, where `logging.tensorboard` asks for one.
    board: Option<EventWriter>,
    /// `iterations.csv`, once opened.
    steps: Option<IterationLog>,
    /// The devices, as the report names them.
    devices: String,
}

impl<'a> Recorder<'a> {
    /// A writer of `run`, for a run on `devices` (as the report names them).
    pub fn new(config: &'a TrainConfig, run: &'a RunDir, devices: String) -> Self {
        Self {
            config,
            run,
            board: None,
            steps: None,
            devices,
        }
    }

    /// Opens the records that grow step by step: `iterations.csv`, and the TensorBoard file
    /// where `logging.tensorboard` asks for one (a new run's starts with the config as text). A
    /// resumed run's are cut back to the iteration it resumes from.
    pub fn open(&mut self, resume_at: Option<usize>) -> Result<(), TrainError> {
        let path = self.run.path.join("iterations.csv");
        self.steps = Some(IterationLog::open(&path, resume_at).map_err(io_error(&path))?);
        if self.config.logging.tensorboard {
            self.board = Some(open_board(self.config, self.run, resume_at)?);
        }
        Ok(())
    }

    /// Steps read from the device: each one's loss and learning rate in `iterations.csv`.
    pub fn steps(&mut self, steps: &[StepLoss]) -> Result<(), TrainError> {
        match &mut self.steps {
            Some(log) => (log.append(steps)).map_err(io_error(&self.run.path)),
            None => Ok(()),
        }
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

    /// What an epoch's end writes before its checkpoint: the per-class files and mistakes of
    /// `exported` (the evaluation of the weights the run exports; `val` decodes its images),
    /// the history and plots, the report and TensorBoard's epoch scalars. `history` ends with
    /// the epoch's summary.
    pub fn epoch(
        &mut self,
        history: &[EpochSummary],
        exported: Option<&Evaluation>,
        schedule: &Schedule,
        val: Option<&Loader>,
    ) -> Result<(), TrainError> {
        let (summary, before) = history.split_last().expect("the epoch's summary");
        let mut mistakes = String::new();
        if let Some(v) = exported {
            let best = (before.iter())
                .filter_map(|s| exported_top1(self.config, s))
                .all(|top1| v.top1 > top1);
            (self.run)
                .write_per_class(&v.confusion, &v.class_names, summary.epoch, best)
                .map_err(self.io())?;
            if let Some(loader) = val {
                mistakes = self.mistakes(v, history, best, loader)?;
            }
        }
        self.run.write_history(history).map_err(self.io())?;
        let steps = self.steps.as_ref().map_or(&[][..], IterationLog::rows);
        let figures = Figures::new(history, steps, &lr_trace(schedule, summary.iteration));
        self.run.write_plots(&figures).map_err(self.io())?;
        let inputs = ReportInputs {
            run: &self.run.path,
            history,
            device: &self.devices,
            per_class: exported.map(|v| (&v.confusion, v.class_names.as_slice())),
            figures: &figures,
            mistakes: &mistakes,
        };
        let page = report_html(self.config, &inputs);
        write_atomically(&self.run.path.join("report.html"), page.as_bytes()).map_err(self.io())?;
        if let Some(board) = &mut self.board {
            write_epoch(board, summary).map_err(io_error(&self.run.path))?;
        }
        Ok(())
    }

    /// Writes the epoch's `mistakes.csv` (and `best/`'s where it is the best epoch), and
    /// returns the page's galleries: this epoch's, and the best epoch's when that was earlier.
    fn mistakes(
        &self,
        v: &Evaluation,
        history: &[EpochSummary],
        best: bool,
        loader: &Loader,
    ) -> Result<String, TrainError> {
        let names = &v.class_names;
        let chosen = mistakes::select(&v.predictions, SHOWN);
        let csv = mistakes::csv(&chosen, names, loader);
        self.run.write_mistakes(&csv, best).map_err(self.io())?;
        let epoch = history.last().map_or(0, |s| s.epoch);
        let heading = match best {
            true => format!("Epoch {epoch}, the last and the best"),
            false => format!("Epoch {epoch}, the last"),
        };
        let mut html = mistakes::section(&heading, &chosen, names, loader);
        let best_csv = std::fs::read_to_string(self.run.path.join("best/mistakes.csv"));
        if let (false, Some(best_epoch), Ok(text)) =
            (best, best_epoch(self.config, history), best_csv)
        {
            let heading = format!("Epoch {best_epoch}, the best");
            html += &mistakes::section(&heading, &mistakes::parse_csv(&text), names, loader);
        }
        Ok(html)
    }

    /// Puts the steps that a checkpoint resumes after on disk before it is written.
    pub fn before_checkpoint(&self) -> Result<(), TrainError> {
        match &self.steps {
            Some(log) => log.sync().map_err(io_error(&self.run.path)),
            None => Ok(()),
        }
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
    pub fn model<B: Backend>(&self, weights: &ResNet<B>) -> Result<PathBuf, TrainError> {
        let path = self.run.model_path();
        weights::save_safetensors(weights, &path)?;
        Ok(path)
    }

    /// `summary.txt`, at the end of a run: where things are and how the run ended (`ending`
    /// says why it ended early, if it did).
    pub fn summary(
        &self,
        last: Option<&EpochSummary>,
        model: &Path,
        ending: Option<&str>,
    ) -> Result<(), TrainError> {
        let text = summary_text(self.config, self.run, last, model, ending);
        self.run.write_summary(&text).map_err(self.io())
    }

    fn io(&self) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
        io_error(&self.run.path)
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

/// The epoch whose exported weights first reached the best top-1 (the one `best/` holds).
fn best_epoch(config: &TrainConfig, history: &[EpochSummary]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for summary in history {
        if let Some(top1) = exported_top1(config, summary)
            && best.is_none_or(|(_, b)| top1 > b)
        {
            best = Some((summary.epoch, top1));
        }
    }
    best.map(|(epoch, _)| epoch)
}

/// The learning rate of up to 500 evenly spread steps, at (epoch, rate): step `i + 1` ends at
/// `(i + 1) / iterations per epoch` and takes `schedule.lr(i)`.
fn lr_trace(schedule: &Schedule, iterations: usize) -> Vec<(f64, f64)> {
    let step = (iterations / 500).max(1);
    let per_epoch = schedule.iterations_per_epoch() as f64;
    (0..iterations)
        .step_by(step)
        .map(|i| ((i + 1) as f64 / per_epoch, schedule.lr(i)))
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
