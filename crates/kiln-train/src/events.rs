//! What the engine reports as a run goes, and how a run ended: the loop's words to whoever
//! shows them (the console, tests), kept apart from the loop so that its parts share them.

use std::path::{Path, PathBuf};

use kiln_data::DataError;

use crate::early_stopping::EarlyStop;
use kiln_config::plan::{self, MemoryBudget};
use kiln_records::epoch::EpochSummary;

/// What the engine reports as it goes.
pub enum Event<'a> {
    /// The run is open on its devices, before anything is settled or loaded: the devices as
    /// people know them, notes about them (no cuDNN on CUDA, ...), whether they compile kernels
    /// on first use (a GPU: the first step then includes it), and `logging.print_every`.
    Opened {
        device: &'a str,
        notes: &'a [String],
        compiles_kernels: bool,
        print_every: usize,
    },
    Started {
        run_dir: &'a Path,
        train_images: usize,
        val_images: Option<usize>,
        iterations_per_epoch: usize,
        /// Model replicas on all devices and machines together.
        replicas: usize,
        resumed_from: Option<&'a Path>,
    },
    /// Before the first step of a run: on a GPU, kernels are compiled (and tuned) now.
    FirstStep,
    /// After every step. `loss` is read from the device only every `print_every` iterations
    /// (and at the first): then it is the mean over the images since the last reading, and
    /// `seconds` the time those steps took.
    Iteration {
        epoch: usize,
        epochs: usize,
        batch: usize,
        batches: usize,
        iteration: usize,
        lr: f64,
        images: usize,
        loss: Option<Reading>,
    },
    /// The memory plan, before anything is loaded: the batch (settled if it was `"auto"`),
    /// the estimated peak per device, and the budget it was checked against.
    Planned {
        batch_size: usize,
        /// How `batch_size = "auto"` chose, where it did.
        auto: Option<plan::AutoBatch>,
        per_device: usize,
        estimate_bytes: Option<u64>,
        budget: Option<MemoryBudget>,
    },
    Skipped(&'a DataError),
    Epoch(&'a EpochSummary),
    Checkpoint(&'a Path),
    /// A checkpoint newer than the one resumed from, passed over because it is damaged.
    CheckpointSkipped {
        path: &'a Path,
        reason: &'a str,
    },
    Stopped(&'a Path),
    /// `[early_stopping]` ended the run before its last epoch.
    StoppedEarly(&'a EarlyStop),
    Finished {
        model: &'a Path,
    },
}

/// Figures read back from the device: the mean loss over the images of the steps since the
/// last reading, and how long those steps took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub loss: f64,
    pub steps: usize,
    pub seconds: f64,
}

pub trait Observer {
    fn event(&mut self, event: Event<'_>);
}

/// An observer that ignores everything, for tests and library use.
pub struct Silent;

impl Observer for Silent {
    fn event(&mut self, _: Event<'_>) {}
}

/// How a run ended without error (returned once per run: its size does not matter).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum RunEnd {
    Finished {
        last: Option<EpochSummary>,
        model: PathBuf,
        /// Why the run ended before its last epoch, if it did.
        early_stop: Option<EarlyStop>,
    },
    /// Stopped on request; resume from this checkpoint.
    Stopped { checkpoint: PathBuf },
}
