//! The run's plots, over epochs: the training loss of every step (faint) and smoothed, with
//! the validation loss of each epoch on the same axes; accuracy (train, validation top-1 and
//! top-5, the weights' average); the learning rate. Written as `loss.svg`, `accuracy.svg` and
//! `lr.svg`, and inlined into `report.html`.

use crate::epoch::EpochSummary;
use crate::iterations::StepLoss;
use crate::plot::{Chart, PALETTE, Series, Style, XAxis, YFormat, smooth, smoothing_weight};

/// The three plots' SVG markup.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub loss: String,
    pub accuracy: String,
    pub lr: String,
}

impl Figures {
    /// The plots of a run with `history`, its steps' losses, and the learning rate at
    /// (epoch, rate) points.
    pub fn new(history: &[EpochSummary], steps: &[StepLoss], lr: &[(f64, f64)]) -> Self {
        let lr = Chart {
            title: "Learning rate",
            x_axis: XAxis::Epochs,
            y_label: "learning rate",
            y_format: YFormat::Scientific,
            series: vec![Series {
                name: String::new(),
                points: lr.to_vec(),
                style: Style::line(PALETTE[0]),
            }],
        };
        Self {
            loss: loss_chart(history, steps).svg(),
            accuracy: accuracy_chart(history).svg(),
            lr: lr.svg(),
        }
    }
}

/// (epoch, value) for each epoch that has the value.
pub fn per_epoch(
    history: &[EpochSummary],
    value: impl Fn(&EpochSummary) -> Option<f64>,
) -> Vec<(f64, f64)> {
    (history.iter())
        .filter_map(|s| value(s).map(|v| (s.epoch as f64, v)))
        .collect()
}

/// The steps' losses as TensorBoard smooths them, at (epoch, loss).
pub fn smoothed(steps: &[StepLoss]) -> Vec<(f64, f64)> {
    let losses: Vec<f64> = steps.iter().map(|s| s.loss).collect();
    let smoothed = smooth(&losses, smoothing_weight(losses.len()));
    steps.iter().map(|s| s.epoch).zip(smoothed).collect()
}

fn loss_chart(history: &[EpochSummary], steps: &[StepLoss]) -> Chart<'static> {
    let mut series = match steps.is_empty() {
        // A run recorded before kiln kept every step's loss: the epochs' means.
        true => vec![Series {
            name: "train (epoch mean)".into(),
            points: per_epoch(history, |s| Some(s.train_loss)),
            style: Style::dotted(PALETTE[0]),
        }],
        false => vec![
            Series {
                name: "train, each step".into(),
                points: steps.iter().map(|s| (s.epoch, s.loss)).collect(),
                style: Style::faint(PALETTE[0]),
            },
            Series {
                name: "train, smoothed".into(),
                points: smoothed(steps),
                style: Style::line(PALETTE[0]),
            },
        ],
    };
    series.push(Series {
        name: "validation".into(),
        points: per_epoch(history, |s| s.val_loss),
        style: Style::dotted(PALETTE[1]),
    });
    series.push(Series {
        name: "validation, average".into(),
        points: per_epoch(history, |s| s.ema_val_loss),
        style: Style::dotted(PALETTE[2]).dashed(),
    });
    Chart {
        title: "Loss",
        x_axis: XAxis::Epochs,
        y_label: "cross-entropy loss",
        y_format: YFormat::Plain,
        series: without_empty(series),
    }
}

fn accuracy_chart(history: &[EpochSummary]) -> Chart<'static> {
    let series = vec![
        Series {
            name: "train".into(),
            points: per_epoch(history, |s| Some(s.train_accuracy)),
            style: Style::dotted(PALETTE[0]),
        },
        Series {
            name: "validation top-1".into(),
            points: per_epoch(history, |s| s.val_top1),
            style: Style::dotted(PALETTE[1]),
        },
        Series {
            name: "validation top-5".into(),
            points: per_epoch(history, |s| s.val_top5),
            style: Style::dotted(PALETTE[2]).dashed(),
        },
        Series {
            name: "top-1, average".into(),
            points: per_epoch(history, |s| s.ema_val_top1),
            style: Style::dotted(PALETTE[3]).dashed(),
        },
    ];
    Chart {
        title: "Accuracy",
        x_axis: XAxis::Epochs,
        y_label: "accuracy",
        y_format: YFormat::Percent,
        series: without_empty(series),
    }
}

fn without_empty(series: Vec<Series>) -> Vec<Series> {
    series
        .into_iter()
        .filter(|s| !s.points.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loss_plot_has_every_step_smoothed_and_the_validation_points() {
        let history: Vec<EpochSummary> = (1..=3)
            .map(|epoch| EpochSummary {
                epoch,
                train_loss: 1.0 / epoch as f64,
                train_accuracy: 0.5,
                val_loss: Some(1.2 / epoch as f64),
                val_top1: Some(0.4 + 0.1 * epoch as f64),
                val_top5: Some(0.9),
                ..EpochSummary::default()
            })
            .collect();
        let steps: Vec<StepLoss> = (1..=30)
            .map(|i| StepLoss {
                iteration: i,
                epoch: i as f64 / 10.0,
                loss: 2.0 / i as f64,
                lr: 0.1,
            })
            .collect();
        let figures = Figures::new(&history, &steps, &[(0.0, 0.1), (3.0, 0.0)]);
        for name in ["train, each step", "train, smoothed", "validation"] {
            assert!(figures.loss.contains(&format!(">{name}<")), "{name}");
        }
        assert!(!figures.loss.contains("average"));
        assert_eq!(figures.loss.matches("<polyline").count(), 3);
        assert!(
            figures.accuracy.contains(">validation top-5<")
                && figures.accuracy.contains("%</text>")
        );
        assert!(figures.lr.contains(">0.10</text>"), "{}", figures.lr);
        // Without steps (an older run): the epochs' means.
        let older = Figures::new(&history, &[], &[]);
        assert!(older.loss.contains(">train (epoch mean)<"));
    }
}
