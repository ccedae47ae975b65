//! A run's folder, `runs/<name>-<timestamp>/`: what a run writes there and what reads it back.
//!
//! - `run_dir`: the folder (`RunDir`), its paths, the history (`metrics.jsonl`,
//!   `metrics.csv`), the per-class files, `summary.txt`, and opening a run to start or resume;
//!   `epoch`: one epoch's figures (`EpochSummary`), as the history keeps them.
//! - `iterations`: every step's loss (`iterations.csv`), cut back to the checkpoint on resume.
//! - `plot`: kiln's one plotter (SVG line charts by hand); `figures`: the run's three plots.
//! - `evaluation`: what validation found (`Evaluation`), which `confusion` (the matrix,
//!   per-class figures, `confusion.svg`) and `mistakes` (the most confident mistakes as
//!   thumbnails, `mistakes.csv`) record.
//! - `run_report`: `report.html`, the run on one page; `report`: several runs on one page
//!   (`kiln report`).
//! - `tensorboard`: TensorBoard's event files.
//! - `atomic`: every file above is written whole or not at all (`write_atomically`).
//!
//! No burn here: the loop hands these modules figures and host images, and they write files.

pub mod atomic;
pub mod confusion;
pub mod epoch;
pub mod evaluation;
pub mod figures;
pub mod iterations;
pub mod mistakes;
pub mod plot;
pub mod report;
pub mod run_dir;
pub mod run_report;
pub mod tensorboard;

pub use atomic::write_atomically;
pub use epoch::EpochSummary;
pub use evaluation::{Evaluation, ImagePrediction};
pub use run_dir::RunDir;
