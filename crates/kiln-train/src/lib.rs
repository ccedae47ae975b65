//! kiln's engine, generic over burn's backends.
//!
//! - `config`: the TOML schema, `--set` overrides and checks.
//! - `optim`, `schedule`: PyTorch's optimizers and learning-rate schedules; `param_groups`:
//!   frozen parameters and parameter groups by torchvision name.
//! - `step`: the one training step (and the model, loss and counts it needs), which training,
//!   the benchmarks, the backend comparison and `measure` all run.
//! - `engine`: the training loop and evaluation; `checkpoint` and `run_dir` keep its state and
//!   record; `progress` shows it on a console.
//! - `parallel`: data parallel replicas over devices and machines, each on a thread of its
//!   own; `collective`: what they exchange.
//! - `plan`: the memory a step needs, the batch that fits, `batch_size = "auto"` (arithmetic
//!   only); `measure`: the peak of real steps, to check it.
//! - `launch`: a run's shape and rank as SLURM or a torchrun-style launcher gives them.
//! - `error`: the run's errors. `batch`: host batches onto a device; `predict`: `kiln predict`.

pub mod batch;
pub mod checkpoint;
pub mod clip;
pub mod collective;
pub mod config;
pub mod confusion;
pub mod early_stopping;
pub mod ema;
pub mod engine;
pub mod error;
pub mod heartbeat;
pub mod launch;
pub mod lr_find;
pub mod measure;
pub mod optim;
pub mod panics;
pub mod parallel;
pub mod param_groups;
pub mod plan;
pub mod predict;
pub mod progress;
pub mod report;
pub mod run_dir;
pub mod scaler;
pub mod schedule;
pub mod step;
pub mod tensorboard;

pub use config::TrainConfig;
pub use engine::{Event, Observer, Outcome, Reading, Silent, evaluate, train};
pub use error::TrainError;
pub use run_dir::{EpochSummary, RunDir};
