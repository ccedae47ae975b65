//! Checkpoints: model, optimizer state and the run's position, written into a hidden temporary
//! folder and renamed into place when complete, so a kill at any moment leaves the last good
//! checkpoint readable and never a half-written one where a resume would look.
//!
//! burn's named MessagePack records keep parameter ids (which the optimizer state is keyed by)
//! and load on any backend, so a checkpoint written on one backend resumes on another.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln_models::ResNet;
use serde::{Deserialize, Serialize};

use crate::optim::AnyOptimizer;
use crate::scaler::LossScaler;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "could not write checkpoint {} ({reason}; is the disk full or read-only?); {}",
        path.display(),
        previous.as_ref().map_or("no earlier checkpoint exists".to_string(), |p| format!("the previous checkpoint {} is intact", p.display()))
    )]
    Write {
        path: PathBuf,
        reason: String,
        previous: Option<PathBuf>,
    },
    #[error("cannot read checkpoint {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("no checkpoint in {}: the run stopped before its first one; start it again instead", path.display())]
    None { path: PathBuf },
}

/// Where the run stands: enough to continue it exactly. The loader's randomness is a function
/// of (seed, epoch, image), so the position is the whole random state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Position {
    /// The epoch in progress (0-based) and the next batch of it.
    pub epoch: usize,
    pub batch: usize,
    /// Optimizer steps taken so far.
    pub iteration: usize,
    /// The running sums of the epoch in progress.
    pub sums: EpochSums,
    /// The best validation top-1 so far and the checkpoint that holds it.
    pub best_top1: Option<f64>,
    pub best_checkpoint: Option<String>,
    /// f16 training's loss scale and its count of good steps.
    #[serde(default)]
    pub loss_scale: Option<LossScaler>,
    /// The weights' average's updates since its last reset (`Ema::averaged`), where the run
    /// keeps one; the average itself is the checkpoint's `ema` file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema_averaged: Option<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochSums {
    pub loss: f64,
    pub correct: usize,
    pub seen: usize,
    pub skipped: usize,
    pub seconds: f64,
    /// The gradient norms before clipping (where clipping is on): their sum, largest and count.
    #[serde(default)]
    pub grad_norm_sum: f64,
    #[serde(default)]
    pub grad_norm_max: f64,
    #[serde(default)]
    pub grad_norm_steps: usize,
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::new()
}

const STATE: &str = "state.json";
const EMA: &str = "ema";

/// Writes a checkpoint named `name` in `dir`.
pub fn save<B: AutodiffBackend>(
    dir: &Path,
    name: &str,
    model: &ResNet<B>,
    optimizer: &AnyOptimizer<ResNet<B>, B>,
    ema: Option<&ResNet<B::InnerBackend>>,
    position: &Position,
) -> Result<PathBuf, CheckpointError> {
    let target = dir.join(name);
    let staging = dir.join(format!(".{name}.partial"));
    let result = (|| -> Result<(), String> {
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).map_err(|e| e.to_string())?;
        model
            .clone()
            .save_file(staging.join("model"), &recorder())
            .map_err(|e| e.to_string())?;
        optimizer
            .save(&staging.join("optimizer"))
            .map_err(|e| e.to_string())?;
        if let Some(ema) = ema {
            ema.clone()
                .save_file(staging.join(EMA), &recorder())
                .map_err(|e| e.to_string())?;
        }
        let state = serde_json::to_vec_pretty(position).map_err(|e| e.to_string())?;
        std::fs::write(staging.join(STATE), state).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(&target);
        std::fs::rename(&staging, &target).map_err(|e| e.to_string())
    })();
    result.map(|()| target.clone()).map_err(|reason| {
        let _ = std::fs::remove_dir_all(&staging);
        CheckpointError::Write {
            path: target,
            reason,
            previous: latest(dir).ok().map(|(path, _)| path),
        }
    })
}

/// The complete checkpoints in `dir`, oldest first by iteration. Hidden (partial) folders and
/// folders whose state cannot be read are not checkpoints.
pub fn list(dir: &Path) -> Vec<(PathBuf, Position)> {
    let mut found: Vec<(PathBuf, Position)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            let text = std::fs::read(e.path().join(STATE)).ok()?;
            let position: Position = serde_json::from_slice(&text).ok()?;
            Some((e.path(), position))
        })
        .collect();
    found.sort_by_key(|(path, p)| (p.iteration, p.epoch, p.batch, path.clone()));
    found
}

/// The most recent complete checkpoint.
pub fn latest(dir: &Path) -> Result<(PathBuf, Position), CheckpointError> {
    list(dir).pop().ok_or_else(|| CheckpointError::None {
        path: dir.to_path_buf(),
    })
}

/// A model with its optimizer: what a checkpoint restores.
pub type Trainable<B> = (ResNet<B>, AnyOptimizer<ResNet<B>, B>);

/// Loads the model and optimizer state of the checkpoint at `path` into freshly built ones.
pub fn load<B: AutodiffBackend>(
    path: &Path,
    model: ResNet<B>,
    optimizer: AnyOptimizer<ResNet<B>, B>,
    device: &B::Device,
) -> Result<Trainable<B>, CheckpointError> {
    let read = |reason: String| CheckpointError::Read {
        path: path.to_path_buf(),
        reason,
    };
    let model = model
        .load_file(path.join("model"), &recorder(), device)
        .map_err(|e| read(e.to_string()))?;
    // Each parameter's state goes to its group, found by the loaded model's ids.
    let mut optimizer = optimizer;
    optimizer.resolve(&kiln_models::weights::torch_parameters(&model), false);
    let optimizer = optimizer
        .load(&path.join("optimizer"), device)
        .map_err(|e| read(e.to_string()))?;
    Ok((model, optimizer))
}

/// Loads the weights' average of the checkpoint at `path` into `average`; `None` when the
/// checkpoint has none (written by a run without `[ema]`).
pub fn load_ema<B: Backend>(
    path: &Path,
    average: ResNet<B>,
    device: &B::Device,
) -> Result<Option<ResNet<B>>, CheckpointError> {
    let file = path.join(EMA);
    if !file.with_extension("mpk").exists() {
        return Ok(None);
    }
    average
        .load_file(file, &recorder(), device)
        .map(Some)
        .map_err(|e| CheckpointError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// Removes all but the `keep_last` most recent checkpoints and the one named `keep`.
pub fn prune(dir: &Path, keep_last: usize, keep: Option<&str>) {
    let all = list(dir);
    let old = all.len().saturating_sub(keep_last);
    for (path, _) in &all[..old] {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.as_deref() != keep {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}
