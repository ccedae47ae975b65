//! kiln as a library: the entry points that the `kiln` binary and the examples share. They pick
//! the backend (through kiln-backend, the one place that names concrete backends) and call the
//! generic engine of kiln-train on it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use kiln_backend::{BackendTask, MemoryMeter, probe, resolve, run_on};
use kiln_data::Shard;
use kiln_models::weights;
use kiln_train::engine::{Evaluation, build_model, loaders};
use kiln_train::parallel::Placement;
use kiln_train::progress::Console;
use kiln_train::{Outcome, RunDir, TrainConfig, TrainError};

pub use kiln_backend::{BackendChoice, DeviceSelection};
pub use kiln_train::parallel::Cluster;

/// Trains `config` into `run` on the requested backend and devices (data parallel when there
/// are several, or several machines in `cluster`), showing progress on the console. `stop` ends
/// the run after the current step with a checkpoint.
pub fn train(
    config: &TrainConfig,
    run: &RunDir,
    resume: bool,
    backend: BackendChoice,
    devices: &DeviceSelection,
    cluster: Option<Cluster>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Outcome> {
    let resolved = resolve(backend, devices, &probe())?;
    let task = Train {
        config: config.clone(),
        run: RunDir::open(&run.path),
        resume,
        memory: MemoryMeter::for_device(&resolved),
        cluster,
        stop,
    };
    Ok(run_on(&resolved, task)??)
}

struct Train {
    config: TrainConfig,
    run: RunDir,
    resume: bool,
    memory: MemoryMeter,
    cluster: Option<Cluster>,
    stop: Arc<AtomicBool>,
}

impl BackendTask for Train {
    type Output = Result<Outcome, TrainError>;

    fn run<B: AutodiffBackend>(mut self, devices: Vec<B::Device>) -> Self::Output {
        let mut console = Console::new(self.config.logging.print_every);
        let placement = Placement {
            devices,
            cluster: self.cluster,
        };
        let outcome = kiln_train::train::<B>(
            &self.config,
            &self.run,
            self.resume,
            placement,
            &mut self.memory,
            &mut console,
            &self.stop,
        )?;
        if let Outcome::Finished { last, model } = &outcome {
            let text =
                kiln_train::run_dir::summary_text(&self.config, &self.run, last.as_ref(), model);
            self.run
                .write_summary(&text)
                .map_err(|source| TrainError::Io {
                    path: self.run.path.clone(),
                    source,
                })?;
        }
        Ok(outcome)
    }
}

/// Evaluates `weights` (a kiln export or a torchvision state dict) on the validation part of
/// the config's data set.
pub fn evaluate(
    config: &TrainConfig,
    weights: PathBuf,
    backend: BackendChoice,
    devices: &DeviceSelection,
) -> anyhow::Result<Evaluation> {
    let resolved = resolve(backend, devices, &probe())?;
    let task = Eval {
        config: config.clone(),
        weights,
    };
    Ok(run_on(&resolved, task)??)
}

struct Eval {
    config: TrainConfig,
    weights: PathBuf,
}

impl BackendTask for Eval {
    type Output = Result<Evaluation, TrainError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        let device = devices
            .into_iter()
            .next()
            .expect("resolve gives at least one device");
        let (_, val) = loaders(&self.config, Shard::WHOLE)?;
        let Some(val) = val else {
            return Err(TrainError::Data(kiln_data::DataError::Invalid(
                "the data set has no validation part: give image_folder a val folder or val_fraction"
                    .into(),
            )));
        };
        let classes = val.dataset().classes().len();
        let model = build_model::<B>(&self.config.model, classes, &device)?;
        let (model, _) = weights::load(model, &self.weights)?;
        Ok(kiln_train::evaluate(&model.valid(), &val, &device)?)
    }
}
