//! kiln's engine, generic over burn's backends.
//!
//! - `config`: the TOML schema, `--set` overrides and checks.
//! - `optim`, `schedule`: PyTorch's optimizers and learning-rate schedules.
//! - `engine`: the training loop and evaluation; `checkpoint` and `run_dir` keep its state and
//!   record; `progress` shows it on a console.
//! - `parallel`: data parallel replicas over devices and machines.
//! - `plan`: the memory a step needs, the batch that fits, `batch_size = "auto"`.
//! - `batch`: host batches onto a device; `predict`: `kiln predict`.

pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod engine;
pub mod optim;
pub mod panics;
pub mod parallel;
pub mod plan;
pub mod predict;
pub mod progress;
pub mod run_dir;
pub mod scaler;
pub mod schedule;

pub use config::TrainConfig;
pub use engine::{Event, Observer, Outcome, Silent, TrainError, evaluate, train};
pub use run_dir::{EpochSummary, RunDir};
