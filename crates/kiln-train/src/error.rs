//! The errors of a training run, each one line that names the problem and what to do.

use std::path::{Path, PathBuf};

use burn::collective::CollectiveError;
use kiln_data::DataError;
use kiln_models::ModelError;
use kiln_models::pretrained::PretrainedError;
use kiln_models::weights::WeightsError;

use crate::checkpoint::CheckpointError;
use kiln_config::plan::{self, PlanError};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Pretrained(#[from] PretrainedError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Parallel(#[from] ParallelError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("loss.class_weights {0}: give one per class, in the order of the data set's classes")]
    ClassWeights(String),
    #[error("{0}")]
    ParamGroups(String),
    #[error(
        "precision = \"{precision}\" does not run on this device ({reason}); use precision = \"f32\"{}",
        if *precision == "f32" { "" } else { " or train on a GPU that supports it (bf16 needs an NVIDIA GPU of the Ampere generation or later)" }
    )]
    PrecisionUnsupported {
        precision: &'static str,
        reason: String,
    },
    #[error(
        "out of device memory at batch_size {batch_size} ({per_device} per device), accumulate {accumulate} ({message}); {advice}"
    )]
    OutOfMemory {
        batch_size: usize,
        per_device: usize,
        accumulate: usize,
        message: String,
        advice: String,
    },
    #[error(
        "the run took {} of device memory at batch_size {batch_size} ({per_device} per device), more than max_memory = {}; {advice}",
        plan::bytes(*used), plan::bytes(*limit)
    )]
    OverMemory {
        batch_size: usize,
        per_device: usize,
        used: u64,
        limit: u64,
        advice: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the loss became {loss} at epoch {epoch}, iteration {iteration} (learning rate {lr:.3e}); training stopped. {}",
        checkpoint.as_ref().map_or("No checkpoint was written yet: lower optimizer.lr and start again".to_string(),
            |p| format!("The last good checkpoint is {}: lower the learning rate and resume, for example `kiln train --resume {} --set optimizer.lr=...`", p.display(), p.parent().and_then(Path::parent).unwrap_or(p).display()))
    )]
    NonFinite {
        epoch: usize,
        iteration: usize,
        loss: f64,
        lr: f64,
        checkpoint: Option<PathBuf>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ParallelError {
    #[error(
        "{0} is not a usable host:port for the coordinator or a node (for example 10.0.0.1:29500)"
    )]
    Address(String),
    #[error(
        "the data-parallel all-reduce failed: {0}. On a multi-machine run, check that every machine started with the same --nodes and --coordinator, and that the coordinator's and each node's port are open"
    )]
    Collective(String),
    #[error(
        "cannot start the coordinator on port {0}: {1}. Choose a free port in --coordinator on every machine"
    )]
    CoordinatorPort(u16, String),
    #[error(
        "cannot listen for the other machines' heartbeats on port {0} (the coordinator's port + 1 + --nodes): {1}. Choose a --coordinator port with that one free too, on every machine"
    )]
    HeartbeatPort(u16, String),
    #[error(
        "lost a machine of the run: {0}; this machine stops too. Once every machine can run again, resume each with --resume <its run directory> and the same --nodes and --coordinator"
    )]
    MachineLost(String),
    #[error(
        "replica {replica} (device {replica} of this machine) failed: {message}; the other replicas were stopped"
    )]
    ReplicaFailed { replica: usize, message: String },
    #[error(
        "sync_bn needs burn's Autodiff backend without gradient checkpointing, which this build does not train on; set sync_bn = false"
    )]
    SyncBatchNorm,
}

impl From<CollectiveError> for ParallelError {
    fn from(error: CollectiveError) -> Self {
        let lost = match &error {
            CollectiveError::Global(global) => format!("{global:?}").starts_with("PeerLost"),
            _ => false,
        };
        match crate::panics::network_failure() {
            Some(cause) => ParallelError::MachineLost(cause),
            None if lost => ParallelError::MachineLost(format!("{error:?}")),
            None => ParallelError::Collective(format!("{error:?}")),
        }
    }
}

/// Turns an I/O error into a [`TrainError`] naming `path`.
pub fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}
