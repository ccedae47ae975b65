//! Checks on kiln's backends, generic over burn's `Backend` like the engine they check.
//!
//! - [`compare`]: the same weights and batch on several backends; logits, loss, gradients, batch
//!   norm statistics and the parameters after optimizer steps, each compared with a reference.
//! - [`bench`]: training and inference throughput, step time and peak memory, and the same
//!   figures from PyTorch (written by `xtask/scripts/bench_torch.py`) side by side.

pub mod bench;
pub mod compare;

/// Why a check could not run (as opposed to a check that ran and found a difference).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Model(#[from] kiln_models::ModelError),
    #[error(transparent)]
    Weights(#[from] kiln_models::weights::WeightsError),
    #[error("cannot read {path}: {reason}")]
    Read {
        path: std::path::PathBuf,
        reason: String,
    },
}
