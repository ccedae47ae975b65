//! Checkpoints: model, optimizer state and the run's position, written into a hidden temporary
//! folder, checksummed (`SHA256SUMS`, in `sha256sum`'s format), flushed to disk and renamed into
//! place when complete, so a kill or a power cut at any moment leaves the last good checkpoint
//! readable and never a half-written one where a resume would look. A resume takes the newest
//! checkpoint whose files still match their checksums ([`newest_intact`]).
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
    #[error("no intact checkpoint in {} ({reasons}); start the run again instead", path.display())]
    NoneIntact { path: PathBuf, reasons: String },
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

fn named_mpk() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::new()
}

const STATE: &str = "state.json";
const EMA: &str = "ema";
const MANIFEST: &str = "SHA256SUMS";

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
            .save_file(staging.join("model"), &named_mpk())
            .map_err(|e| e.to_string())?;
        optimizer
            .save(&staging.join("optimizer"))
            .map_err(|e| e.to_string())?;
        if let Some(ema) = ema {
            ema.clone()
                .save_file(staging.join(EMA), &named_mpk())
                .map_err(|e| e.to_string())?;
        }
        let state = serde_json::to_vec_pretty(position).map_err(|e| e.to_string())?;
        std::fs::write(staging.join(STATE), state).map_err(|e| e.to_string())?;
        write_manifest(&staging).map_err(|e| e.to_string())?;
        replace(&staging, &target, dir).map_err(|e| e.to_string())
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

/// Writes `SHA256SUMS` for the files in `folder` and flushes every file, the manifest and the
/// folder itself to disk.
fn write_manifest(folder: &Path) -> std::io::Result<()> {
    let mut lines = String::new();
    for name in files(folder)? {
        let path = folder.join(&name);
        lines.push_str(&format!("{}  {name}\n", sha256(&path)?));
        std::fs::File::open(&path)?.sync_all()?;
    }
    let manifest = folder.join(MANIFEST);
    std::fs::write(&manifest, lines)?;
    std::fs::File::open(&manifest)?.sync_all()?;
    std::fs::File::open(folder)?.sync_all()
}

/// Moves the finished `staging` folder to `target`. A checkpoint already there (the same name
/// written again) is set aside first and removed only once the new one is in place, and the
/// parent folder is flushed, so that some complete checkpoint of that name exists at every moment.
fn replace(staging: &Path, target: &Path, dir: &Path) -> std::io::Result<()> {
    let old = target.with_file_name(format!(
        ".{}.old",
        target.file_name().unwrap_or_default().to_string_lossy()
    ));
    let _ = std::fs::remove_dir_all(&old);
    let had_old = std::fs::rename(target, &old).is_ok();
    std::fs::rename(staging, target)?;
    std::fs::File::open(dir)?.sync_all()?;
    if had_old {
        let _ = std::fs::remove_dir_all(&old);
    }
    Ok(())
}

/// The names of the plain files in `folder` except the manifest, sorted.
fn files(folder: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(folder)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_file() && name != MANIFEST {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

fn sha256(path: &Path) -> std::io::Result<String> {
    kiln_download::sha256_file(path).map_err(std::io::Error::other)
}

/// Checks the checkpoint at `path` against its `SHA256SUMS`: every file listed is there with the
/// same digest, and no file is missing from the list. A checkpoint written before kiln kept
/// manifests has none and passes.
pub fn verify(path: &Path) -> Result<(), String> {
    let manifest = match std::fs::read_to_string(path.join(MANIFEST)) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read its {MANIFEST}: {e}")),
    };
    let mut listed = Vec::new();
    for line in manifest.lines() {
        let Some((digest, name)) = line.split_once("  ") else {
            return Err(format!("its {MANIFEST} is damaged (line {line:?})"));
        };
        let actual = sha256(&path.join(name)).map_err(|e| format!("{name}: {e}"))?;
        if actual != digest {
            return Err(format!(
                "{name} does not match its checksum (damaged on disk)"
            ));
        }
        listed.push(name.to_string());
    }
    let present = files(path).map_err(|e| e.to_string())?;
    match present.iter().find(|name| !listed.contains(name)) {
        Some(extra) => Err(format!("{extra} is not in its {MANIFEST}")),
        None if listed.is_empty() => Err(format!("its {MANIFEST} lists no files")),
        None => Ok(()),
    }
}

/// Where a resume starts: a checkpoint, and the newer ones passed over, each with the reason.
pub struct ResumePoint {
    pub path: PathBuf,
    pub position: Position,
    pub passed_over: Vec<(PathBuf, String)>,
}

/// The newest checkpoint in `dir` that is whole: its state readable and its files matching
/// their checksums. Each newer one passed over is returned with the reason, for a warning.
pub fn newest_intact(dir: &Path) -> Result<ResumePoint, CheckpointError> {
    let mut skipped = unreadable(dir);
    let mut candidates = list(dir);
    while let Some((path, position)) = candidates.pop() {
        match verify(&path) {
            Ok(()) => {
                // Only those newer than the one taken are worth a word.
                skipped
                    .retain(|(_, _, iteration)| iteration.is_none_or(|i| i > position.iteration));
                let passed_over = skipped.into_iter().map(|(p, why, _)| (p, why)).collect();
                return Ok(ResumePoint {
                    path,
                    position,
                    passed_over,
                });
            }
            Err(why) => skipped.push((path, why, Some(position.iteration))),
        }
    }
    Err(match skipped.is_empty() {
        true => CheckpointError::None {
            path: dir.to_path_buf(),
        },
        false => CheckpointError::NoneIntact {
            path: dir.to_path_buf(),
            reasons: skipped
                .iter()
                .map(|(p, why, _)| format!("{}: {why}", p.display()))
                .collect::<Vec<_>>()
                .join("; "),
        },
    })
}

/// Checkpoint folders whose state cannot be read at all, with the reason (their iteration is
/// unknown).
fn unreadable(dir: &Path) -> Vec<(PathBuf, String, Option<usize>)> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| e.path().is_dir())
        .filter_map(|e| {
            let why = match std::fs::read(e.path().join(STATE)) {
                Err(err) => format!("{STATE}: {err}"),
                Ok(text) => serde_json::from_slice::<Position>(&text).err()?.to_string(),
            };
            Some((e.path(), format!("{STATE} is unreadable ({why})"), None))
        })
        .collect()
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
        .load_file(path.join("model"), &named_mpk(), device)
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
        .load_file(file, &named_mpk(), device)
        .map(Some)
        .map_err(|e| CheckpointError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// Removes all but the `keep_last` most recent epoch checkpoints, the one named `keep` and the
/// newest checkpoint; older mid-epoch checkpoints go.
pub fn prune(dir: &Path, keep_last: usize, keep: Option<&str>) {
    let mut all = list(dir);
    // The newest checkpoint stays whatever it is; mid-epoch ones (a position inside an epoch)
    // replace each other and do not count towards `keep_last`.
    let newest = all.pop();
    let (mid_epoch, epochs): (Vec<_>, Vec<_>) = all.into_iter().partition(|(_, p)| p.batch > 0);
    let kept_epochs = keep_last.saturating_sub(usize::from(
        newest.as_ref().is_some_and(|(_, p)| p.batch == 0),
    ));
    let old = epochs.len().saturating_sub(kept_epochs);
    for (path, _) in epochs[..old].iter().chain(&mid_epoch) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.as_deref() != keep {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}
