//! `kiln lr-find`: Leslie Smith's learning-rate range test, as fastai's `lr_find` and PyTorch
//! Lightning's `Tuner.lr_find` run it. The config's model, optimizer and data train for up to
//! `steps` steps while the rate grows exponentially from `start` to `end`; the loss is smoothed
//! (an exponential average with bias correction); the test stops once the smoothed loss exceeds
//! `divergence` times its minimum, and suggests the rate where the smoothed loss falls fastest
//! (Lightning's suggestion: the steepest negative slope, the first ten points and the last left
//! out). Nothing is written to a run: the model is built fresh and dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;
use kiln_data::BatchShare;
use kiln_models::weights;
use serde::Serialize;

use crate::batch::to_device;
use crate::error::TrainError;
use crate::loaders;
use crate::optim::AnyOptimizer;
use crate::param_groups::ParamGroups;
use crate::step::{Replica, StepPlan, build_model, loss_function};
use kiln_config::config::TrainConfig;
use kiln_records::plot::{Chart, PALETTE, Series, Style, XAxis, YFormat};
use kiln_records::write_atomically;

/// The range and the stopping rule.
#[derive(Debug, Clone, PartialEq)]
pub struct LrFindOptions {
    pub start: f64,
    pub end: f64,
    pub steps: usize,
    /// Stop once the smoothed loss exceeds this many times its minimum.
    pub divergence: f64,
    /// The exponential average's weight of the past (fastai's 0.98).
    pub smoothing: f64,
}

impl Default for LrFindOptions {
    fn default() -> Self {
        Self {
            start: 1e-7,
            end: 10.0,
            steps: 100,
            divergence: 4.0,
            smoothing: 0.98,
        }
    }
}

impl LrFindOptions {
    /// One line naming what is wrong, if anything.
    pub fn check(&self) -> Result<(), String> {
        if !(self.start > 0.0 && self.end > self.start && self.end.is_finite()) {
            return Err(format!(
                "--start and --end must satisfy 0 < start < end, got {} and {}",
                self.start, self.end
            ));
        }
        if self.steps < 2 {
            return Err(format!("--steps must be at least 2, got {}", self.steps));
        }
        Ok(())
    }

    /// The rate of step `i`: `start * (end / start) ^ (i / (steps - 1))`.
    pub fn lr(&self, i: usize) -> f64 {
        self.start * (self.end / self.start).powf(i as f64 / (self.steps - 1) as f64)
    }
}

/// One step of the test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LrPoint {
    pub lr: f64,
    pub loss: f64,
    pub smoothed: f64,
}

/// What the test found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LrFind {
    pub points: Vec<LrPoint>,
    /// Where the smoothed loss falls fastest; `None` when too few points were recorded.
    pub suggestion: Option<f64>,
    /// The loss diverged before `end`.
    pub diverged: bool,
}

/// Runs the range test on `device`; `progress` hears each step's point.
pub fn run<B: AutodiffBackend>(
    config: &TrainConfig,
    options: &LrFindOptions,
    device: &B::Device,
    mut progress: impl FnMut(usize, &LrPoint),
) -> Result<LrFind, TrainError> {
    B::seed(device, config.seed);
    let (train, _) = loaders::open(config, BatchShare::WHOLE)?;
    let classes = train.dataset().classes().len();
    let model =
        build_model::<B>(&config.model, classes, device)?.with_precision(config.precision());
    let names: Vec<String> = (weights::torch_parameters(&model).into_iter())
        .map(|(name, _)| name)
        .collect();
    let groups = ParamGroups::new(&names, &config.model, &config.optimizer)
        .map_err(TrainError::ParamGroups)?;
    let frozen = groups.frozen_in(0);
    let optimizer = AnyOptimizer::with_groups(&config.optimizer, Arc::new(groups));
    let loss = loss_function::<B>(config, None, device);
    let mut replica = Replica::new(model, optimizer, loss, device.clone());

    let mut points: Vec<LrPoint> = Vec::new();
    let (mut average, mut lowest, mut diverged) = (0.0, f64::INFINITY, false);
    let mut epoch = 0;
    'test: loop {
        let mut any = false;
        for batch in train.epoch(epoch as u64) {
            let batch = batch?;
            let n = batch.labels.len();
            if n == 0 {
                continue;
            }
            any = true;
            let i = points.len();
            let lr = options.lr(i);
            let plan = StepPlan {
                frozen,
                ..StepPlan::alone(n)
            };
            replica.step(vec![to_device(batch, device)], &plan, lr)?;
            // One read a step: the test needs each loss before choosing to go on.
            let stats = replica.take_stats();
            let loss = stats.iter().map(|s| s.loss_sum).sum::<f64>() / n as f64;
            average = options.smoothing * average + (1.0 - options.smoothing) * loss;
            let smoothed = average / (1.0 - options.smoothing.powi(i as i32 + 1));
            let point = LrPoint { lr, loss, smoothed };
            progress(i, &point);
            points.push(point);
            lowest = lowest.min(smoothed);
            if !smoothed.is_finite() || (i > 0 && smoothed > options.divergence * lowest) {
                diverged = true;
                break 'test;
            }
            if points.len() == options.steps {
                break 'test;
            }
        }
        if !any {
            return Err(TrainError::Data(kiln_data::DataError::Invalid(
                "the training set has no readable images".into(),
            )));
        }
        epoch += 1;
    }
    let suggestion = steepest(&points);
    Ok(LrFind {
        points,
        suggestion,
        diverged,
    })
}

/// Lightning's suggestion: the rate at the most negative slope of the smoothed loss over
/// log-rate (numpy's `gradient`: central differences inside, one-sided at the ends), leaving out
/// the first ten points and the last one.
fn steepest(points: &[LrPoint]) -> Option<f64> {
    const SKIP_BEGIN: usize = 10;
    const SKIP_END: usize = 1;
    if points.len() < SKIP_BEGIN + SKIP_END + 2 {
        return None;
    }
    let kept = &points[SKIP_BEGIN..points.len() - SKIP_END];
    let x: Vec<f64> = kept.iter().map(|p| p.lr.ln()).collect();
    let y: Vec<f64> = kept.iter().map(|p| p.smoothed).collect();
    let last = kept.len() - 1;
    let slope = |i: usize| match i {
        0 => (y[1] - y[0]) / (x[1] - x[0]),
        i if i == last => (y[last] - y[last - 1]) / (x[last] - x[last - 1]),
        i => (y[i + 1] - y[i - 1]) / (x[i + 1] - x[i - 1]),
    };
    (0..kept.len())
        .filter(|&i| slope(i).is_finite())
        .min_by(|&a, &b| slope(a).total_cmp(&slope(b)))
        .map(|i| kept[i].lr)
}

/// `lr-find.csv`: step, rate, loss, smoothed loss.
pub fn csv(result: &LrFind) -> String {
    let mut text = String::from("step,lr,loss,smoothed_loss\n");
    for (i, p) in result.points.iter().enumerate() {
        text += &format!("{i},{},{},{}\n", p.lr, p.loss, p.smoothed);
    }
    text
}

/// Writes `lr-find.csv` and `lr-find.svg` (both losses over the rate's log10) into `dir`;
/// returns the paths.
pub fn write_files(result: &LrFind, dir: &Path) -> std::io::Result<[PathBuf; 2]> {
    std::fs::create_dir_all(dir)?;
    let (csv_path, svg_path) = (dir.join("lr-find.csv"), dir.join("lr-find.svg"));
    write_atomically(&csv_path, csv(result).as_bytes())?;
    let line = |f: fn(&LrPoint) -> f64| -> Vec<(f64, f64)> {
        (result.points.iter())
            .filter(|p| f(p).is_finite())
            .map(|p| (p.lr.log10(), f(p)))
            .collect()
    };
    let title = match result.suggestion {
        Some(lr) => format!("learning-rate range test: suggested {lr:.2e}"),
        None => "learning-rate range test".to_string(),
    };
    let chart = Chart {
        title: &title,
        x_axis: XAxis::Values("log10 learning rate"),
        y_label: "loss",
        y_format: YFormat::Plain,
        series: vec![
            Series {
                name: "loss".into(),
                points: line(|p| p.loss),
                style: Style::faint(PALETTE[0]),
            },
            Series {
                name: "smoothed".into(),
                points: line(|p| p.smoothed),
                style: Style::line(PALETTE[0]),
            },
        ],
    };
    write_atomically(&svg_path, chart.svg().as_bytes())?;
    Ok([csv_path, svg_path])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_grow_exponentially_from_start_to_end() {
        let options = LrFindOptions::default();
        assert!((options.lr(0) - 1e-7).abs() < 1e-20);
        assert!((options.lr(99) - 10.0).abs() < 1e-12);
        assert!((options.lr(33) / options.lr(32) - options.lr(1) / options.lr(0)).abs() < 1e-9);
        assert!(
            LrFindOptions {
                steps: 1,
                ..options.clone()
            }
            .check()
            .is_err()
        );
        assert!(
            LrFindOptions {
                start: 1.0,
                end: 0.1,
                ..options
            }
            .check()
            .is_err()
        );
    }

    /// A loss that falls fastest at 1e-3 on a log scale (a smooth step there), flat before,
    /// rising after: the suggestion is the rate at the step.
    #[test]
    fn the_suggestion_is_where_the_loss_falls_fastest() {
        let options = LrFindOptions::default();
        let points: Vec<LrPoint> = (0..100)
            .map(|i| {
                let lr = options.lr(i);
                let smoothed = 2.0 - (lr.log10() + 3.0).tanh() + (lr / 1.0).powi(2);
                LrPoint {
                    lr,
                    loss: smoothed,
                    smoothed,
                }
            })
            .collect();
        let suggestion = steepest(&points).unwrap();
        assert!(
            (suggestion.log10() + 3.0).abs() < 0.1,
            "suggested {suggestion}"
        );
        assert_eq!(steepest(&points[..12]), None);
    }
}
