//! One epoch's figures, as `metrics.jsonl` records them and the console, the report, the plots
//! and early stopping read them.

use serde::{Deserialize, Serialize};

/// What an epoch came to. `val_*` are absent without a validation set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochSummary {
    /// Counted from 1, as the console shows it.
    pub epoch: usize,
    pub iteration: usize,
    pub lr: f64,
    pub train_loss: f64,
    pub train_accuracy: f64,
    pub val_loss: Option<f64>,
    pub val_top1: Option<f64>,
    pub val_top5: Option<f64>,
    pub seconds: f64,
    pub images_per_s: f64,
    pub skipped_images: usize,
    /// The epoch's peak memory (see `kiln_backend::MemoryMeter`); absent where the device
    /// cannot tell, and in runs recorded before kiln measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// The weights' moving average (`[ema]`) on the validation set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema_val_loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema_val_top1: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema_val_top5: Option<f64>,
    /// The mean and largest global gradient norm of the epoch's steps, before clipping; only
    /// where clipping is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_norm_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_norm_max: Option<f64>,
    /// The mean of the per-class F1 scores on the validation set (see `confusion`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_macro_f1: Option<f64>,
}
