//! Early stopping (`[early_stopping]`), as PyTorch Lightning's `EarlyStopping` callback: the run
//! ends once a validation metric has not improved by more than `min_delta` for `patience`
//! epochs. The verdict is a function of the run's history alone, so a resumed run stops where
//! an uninterrupted one would.

use kiln_config::config::{EarlyStoppingConfig, StoppingMetric};
use kiln_records::epoch::EpochSummary;

/// Why the run should stop after the last epoch of `history`, or `None` to go on. An epoch
/// without the metric (no validation set) neither improves nor counts.
pub fn verdict(rule: &EarlyStoppingConfig, history: &[EpochSummary]) -> Option<EarlyStop> {
    let sign = if rule.higher_is_better() { 1.0 } else { -1.0 };
    let mut best: Option<(f64, usize)> = None;
    let mut waited = 0;
    for summary in history {
        let Some(value) = metric(summary, rule.metric) else {
            continue;
        };
        match best {
            Some((b, _)) if sign * (value - b) <= rule.min_delta => waited += 1,
            _ => {
                best = Some((value, summary.epoch));
                waited = 0;
            }
        }
    }
    let (best, best_epoch) = best?;
    (waited >= rule.patience).then(|| EarlyStop {
        metric: rule.metric.name().to_string(),
        best,
        best_epoch,
        waited,
    })
}

fn metric(summary: &EpochSummary, metric: StoppingMetric) -> Option<f64> {
    match metric {
        StoppingMetric::ValTop1 => summary.val_top1,
        StoppingMetric::ValTop5 => summary.val_top5,
        StoppingMetric::ValLoss => summary.val_loss,
        StoppingMetric::EmaValTop1 => summary.ema_val_top1,
        StoppingMetric::EmaValTop5 => summary.ema_val_top5,
        StoppingMetric::EmaValLoss => summary.ema_val_loss,
    }
}

/// Why a run stopped early.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlyStop {
    pub metric: String,
    pub best: f64,
    /// Counted from 1.
    pub best_epoch: usize,
    /// Epochs since the best without an improvement.
    pub waited: usize,
}

impl std::fmt::Display for EarlyStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stopped early: {} has not improved for {} epochs (best {:.4} at epoch {})",
            self.metric, self.waited, self.best, self.best_epoch
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use StoppingMetric::{EmaValLoss, ValLoss, ValTop1};
    use kiln_config::config::StoppingMode;

    fn history(top1: &[Option<f64>]) -> Vec<EpochSummary> {
        top1.iter()
            .enumerate()
            .map(|(i, &t)| EpochSummary {
                epoch: i + 1,
                val_top1: t,
                val_loss: t.map(|t| 1.0 - t),
                ..EpochSummary::default()
            })
            .collect()
    }

    fn rule(metric: StoppingMetric, patience: usize, min_delta: f64) -> EarlyStoppingConfig {
        EarlyStoppingConfig {
            metric,
            patience,
            min_delta,
            mode: None,
        }
    }

    #[test]
    fn stops_after_patience_epochs_without_an_improvement_beyond_min_delta() {
        let h = history(&[
            Some(0.5),
            Some(0.6),
            Some(0.605),
            Some(0.59),
            None,
            Some(0.6),
        ]);
        // 0.605 is no improvement over 0.6 by more than 0.01: three epochs without one.
        let stop = verdict(&rule(ValTop1, 3, 0.01), &h).unwrap();
        assert_eq!((stop.best, stop.best_epoch, stop.waited), (0.6, 2, 3));
        assert!(verdict(&rule(ValTop1, 4, 0.01), &h).is_none());
        // Without min_delta, 0.605 is the best: two epochs since.
        assert!(verdict(&rule(ValTop1, 3, 0.0), &h).is_none());
        // Losses go down by default; `mode` overrides the direction.
        let loss = verdict(&rule(ValLoss, 3, 0.01), &h).unwrap();
        assert_eq!(loss.best_epoch, 2);
        let upside_down = EarlyStoppingConfig {
            mode: Some(StoppingMode::Max),
            ..rule(ValLoss, 2, 0.0)
        };
        assert_eq!(verdict(&upside_down, &h).unwrap().best_epoch, 1);
        assert!(verdict(&rule(ValTop1, 1, 0.0), &history(&[None, None])).is_none());
    }

    #[test]
    fn bad_values_name_their_key() {
        // A metric it cannot watch is refused as the config is read (`config`'s tests).
        assert_eq!(
            rule(ValTop1, 0, 0.0).problem().unwrap().0,
            "early_stopping.patience"
        );
        assert_eq!(
            rule(ValTop1, 1, -1.0).problem().unwrap().0,
            "early_stopping.min_delta"
        );
        assert!(rule(EmaValLoss, 1, 0.0).problem().is_none());
    }
}
