//! What the engine's CPU tests share: taking turns, test configs, runs on flex.

#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard};

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use kiln_backend::MemoryMeter;
use kiln_models::{ResNet, weights};
use kiln_train::parallel::Placement;
use kiln_train::{
    Facts, Observer, Outcome, Purpose, RunDir, TrainConfig, TrainError, settle, train,
};

pub type B = Autodiff<Flex>;

/// burn seeds a backend's random generator process-wide, and burn-collective's server is
/// process-wide too, so runs in parallel tests would disturb each other; they take turns.
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn take_turn() -> MutexGuard<'static, ()> {
    ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Parses `text` with `overrides`, writing runs under `runs`.
pub fn parse(text: &str, runs: &Path, overrides: &[&str]) -> TrainConfig {
    let mut overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    overrides.push(format!("logging.runs_dir = '{}'", runs.display()));
    TrainConfig::parse(text, Path::new("test.toml"), &overrides).unwrap()
}

/// Trains on `replicas` copies of the CPU device.
pub fn train_on_cpu(
    config: &TrainConfig,
    run: &RunDir,
    resume: bool,
    replicas: usize,
    observer: &mut dyn Observer,
    stop: &AtomicBool,
) -> Result<Outcome, TrainError> {
    let placement = Placement {
        devices: vec![Default::default(); replicas],
        cluster: None,
    };
    let facts = Facts {
        compiles_kernels: false,
        available_bytes: None,
        replicas: placement.peers(),
    };
    let settled = settle(config, &facts, Purpose::Train)?;
    train::<B>(
        &settled,
        run,
        resume,
        placement,
        &mut MemoryMeter::none(),
        observer,
        stop,
    )
}

/// Every value of the model's state dict (torchvision's names, in name order), flattened.
pub fn flat_parameters<Bk: Backend>(model: &ResNet<Bk>) -> Vec<f32> {
    weights::torch_state_dict(model)
        .into_values()
        .flat_map(|data| data.convert::<f32>().to_vec::<f32>().unwrap())
        .collect()
}
