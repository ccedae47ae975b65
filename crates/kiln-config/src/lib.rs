//! What a kiln run is asked to do, and what it comes to on the machine it runs on.
//!
//! - `config`: the TOML schema (`TrainConfig`), `--set` overrides, and the checks serde cannot
//!   make, one function per section.
//! - `settle`: the one place where a config's machine-dependent defaults are settled (the
//!   checkpoint interval on GPUs, `batch_size = "auto"`, the decoding threads); the `Settled`
//!   config is what a run folder records and everything after reads.
//! - `plan`: the memory a training step needs, the batch that fits, and the budget it is held
//!   to: arithmetic only, before anything is loaded.
//!
//! Nothing here trains, loads or writes: the data and the model read the settled config, the
//! loop runs it, and the run's records keep it.

pub mod config;
pub mod plan;
pub mod settle;

pub use config::{ConfigError, TrainConfig};
pub use plan::{MemoryBudget, Plan, PlanError};
pub use settle::{DeviceFacts, SettleFor, Settled, settle};
