//! kiln's training, generic over burn's backends: the step, the loop, and the devices and
//! machines it runs on. The config comes settled from kiln-config; what a run writes goes
//! into its folder through kiln-records.
//!
//! - The step: `step` (`Replica`: one model, optimizer and loss on one device, and its
//!   `step`), `optim` (PyTorch's optimizers per parameter group), `schedule`, `param_groups`,
//!   `clip`, `ema`, `scaler` (f16's loss scale), `batch` (host batches onto a device).
//! - The loop: `engine::train`, the epoch loop over a `trainer` (the run in progress); `loaders`
//!   opens the data, `evaluate` validates, `early_stopping` reads the history; `events` are what
//!   the loop reports to an `Observer` (`progress::Console` shows them); `limits` is the memory
//!   a run is held to, `error` the run's errors, `panics` turns a runtime's panics into them.
//! - The run's records: `recorder` hands each file's content to kiln-records at the right
//!   moment; `checkpoint` writes and reads checkpoints.
//! - Several devices: `replicas` (one model replica per device, each on a thread of its own,
//!   and their all-reduce), `collective` (what they exchange). Several machines: `cluster` (the
//!   coordinator, `heartbeat`, kiln's own line between machines, and `launch`, SLURM's and
//!   torchrun's environments).
//! - Other work on a model: `lr_find` (the range test), `measure` (the peak of real steps, and
//!   the kernels' warm-up), `predict` (`kiln predict`), `export` (`kiln export`: ONNX or
//!   safetensors).
//! - `entry`: each command's entry point (`train`, `evaluate`, `plan`, `lr_find`, `warmup`,
//!   `predict`), where the backend is resolved and this crate's generic code instantiated.

pub mod batch;
pub mod checkpoint;
pub mod clip;
pub mod cluster;
pub mod collective;
pub mod early_stopping;
pub mod ema;
pub mod engine;
pub mod entry;
pub mod error;
pub mod evaluate;
pub mod events;
pub mod export;
mod limits;
pub mod loaders;
pub mod lr_find;
pub mod measure;
pub mod optim;
pub mod panics;
pub mod param_groups;
pub mod predict;
pub mod progress;
pub mod recorder;
pub mod replicas;
pub mod scaler;
pub mod schedule;
pub mod step;
mod trainer;

pub use engine::train;
pub use error::TrainError;
pub use evaluate::evaluate;
pub use events::{Event, Observer, Reading, RunEnd, Silent};
