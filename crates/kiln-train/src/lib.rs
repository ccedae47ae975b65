//! kiln's engine, generic over burn's backends.
//!
//! - `config`: the TOML schema, `--set` overrides and checks.
//! - `optim`, `schedule`: PyTorch's optimizers and learning-rate schedules; `param_groups`:
//!   frozen parameters and parameter groups by torchvision name.
//! - `step`: the one training step (and the model, loss and counts it needs), which training,
//!   the benchmarks, the backend comparison and `measure` all run.
//! - `settle`: the one place where a config's device-dependent defaults are settled.
//! - `engine`: the epoch loop over a `trainer` (the run in progress: replicas, loaders,
//!   schedule, position); `loaders` opens the data, `evaluate` validates. Everything a run
//!   writes goes through the `recorder` (`run_dir`, `iterations`, `checkpoint`, `report` with
//!   `figures`, `plot`, `confusion` and `mistakes`, `tensorboard`); `progress` shows the
//!   engine's `events` on a console; `epoch` is one epoch's figures, `limits` the memory a
//!   run is held to. `compare` puts several runs' records on one page.
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
pub mod compare;
pub mod config;
pub mod confusion;
pub mod early_stopping;
pub mod ema;
pub mod engine;
pub mod epoch;
pub mod error;
pub mod evaluate;
pub mod events;
pub mod figures;
pub mod heartbeat;
pub mod iterations;
pub mod launch;
mod limits;
pub mod loaders;
pub mod lr_find;
pub mod measure;
pub mod mistakes;
pub mod optim;
pub mod panics;
pub mod parallel;
pub mod param_groups;
pub mod plan;
pub mod plot;
pub mod predict;
pub mod progress;
pub mod recorder;
pub mod report;
pub mod run_dir;
pub mod scaler;
pub mod schedule;
pub mod settle;
pub mod step;
pub mod tensorboard;
mod trainer;

pub use config::TrainConfig;
pub use engine::train;
pub use epoch::EpochSummary;
pub use error::TrainError;
pub use evaluate::{Evaluation, evaluate};
pub use events::{Event, Observer, Outcome, Reading, Silent};
pub use run_dir::RunDir;
pub use settle::{Facts, Purpose, Settled, settle};
