//! The learning rate at every iteration, as PyTorch's schedulers would set it when stepped once
//! per iteration (epoch-based ones change at epoch boundaries).

use std::f64::consts::PI;

use kiln_config::config::{ScheduleConfig, ScheduleName};

#[derive(Debug, Clone)]
pub struct Schedule {
    config: ScheduleConfig,
    base_lr: f64,
    iterations_per_epoch: usize,
    total: usize,
}

impl Schedule {
    pub fn new(
        config: &ScheduleConfig,
        base_lr: f64,
        epochs: usize,
        iterations_per_epoch: usize,
    ) -> Self {
        Self {
            config: config.clone(),
            base_lr,
            iterations_per_epoch: iterations_per_epoch.max(1),
            total: (epochs * iterations_per_epoch).max(1),
        }
    }

    /// Optimizer steps per epoch.
    pub fn iterations_per_epoch(&self) -> usize {
        self.iterations_per_epoch
    }

    /// The learning rate for iteration `it` (counted from 0 over the whole run).
    pub fn lr(&self, it: usize) -> f64 {
        let c = &self.config;
        if c.name == ScheduleName::OneCycle {
            return self.one_cycle(it);
        }
        let warmup = (c.warmup_epochs * self.iterations_per_epoch as f64).round() as usize;
        if it < warmup {
            let progress = it as f64 / warmup as f64;
            return self.base_lr
                * (c.warmup_start_factor + (1.0 - c.warmup_start_factor) * progress);
        }
        let epoch = it / self.iterations_per_epoch;
        match c.name {
            ScheduleName::Constant | ScheduleName::OneCycle => self.base_lr,
            ScheduleName::Step => {
                let steps = epoch / c.step_size.unwrap_or(usize::MAX).max(1);
                self.base_lr * c.gamma.powi(steps as i32)
            }
            ScheduleName::Multistep => {
                let passed = c.milestones.iter().filter(|&&m| epoch >= m).count();
                self.base_lr * c.gamma.powi(passed as i32)
            }
            ScheduleName::Cosine => {
                let span = (self.total - warmup).max(1) as f64;
                let t = (it - warmup) as f64 / span;
                c.min_lr + (self.base_lr - c.min_lr) * (1.0 + (PI * t).cos()) / 2.0
            }
        }
    }

    /// PyTorch's `OneCycleLR` with cosine annealing: from `lr / div_factor` up to `lr` over
    /// `pct_start` of the run, then down to `lr / div_factor / final_div_factor`.
    fn one_cycle(&self, it: usize) -> f64 {
        let c = &self.config;
        let initial = self.base_lr / c.div_factor;
        let minimum = initial / c.final_div_factor;
        let peak_step = (c.pct_start * self.total as f64) - 1.0;
        let last_step = self.total as f64 - 1.0;
        let anneal = |from: f64, to: f64, fraction: f64| {
            to + (from - to) / 2.0 * (1.0 + (PI * fraction).cos())
        };
        let it = it as f64;
        if it <= peak_step {
            anneal(initial, self.base_lr, it / peak_step.max(1.0))
        } else {
            anneal(
                self.base_lr,
                minimum,
                (it - peak_step) / (last_step - peak_step).max(1.0),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(edit: impl FnOnce(&mut ScheduleConfig)) -> Schedule {
        let mut config = ScheduleConfig::default();
        edit(&mut config);
        Schedule::new(&config, 0.1, 10, 5)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn epoch_schedules_change_at_epoch_boundaries() {
        let step = schedule(|c| {
            c.name = ScheduleName::Step;
            c.step_size = Some(3);
        });
        assert!(close(step.lr(14), 0.1) && close(step.lr(15), 0.01) && close(step.lr(30), 0.001));
        let multi = schedule(|c| {
            c.name = ScheduleName::Multistep;
            c.milestones = vec![2, 5];
            c.gamma = 0.5;
        });
        assert!(close(multi.lr(9), 0.1) && close(multi.lr(10), 0.05) && close(multi.lr(25), 0.025));
    }

    #[test]
    fn cosine_after_warmup_ends_at_min_lr() {
        let cosine = schedule(|c| {
            c.name = ScheduleName::Cosine;
            c.warmup_epochs = 1.0;
            c.min_lr = 0.001;
        });
        assert!(close(cosine.lr(0), 0.01));
        assert!(close(cosine.lr(4), 0.01 + 0.09 * 4.0 / 5.0));
        assert!(close(cosine.lr(5), 0.1));
        // Halfway through the 45 cosine iterations: the mean of the ends.
        assert!((cosine.lr(5 + 22) - 0.0505).abs() < 0.004);
        assert!(cosine.lr(49) > 0.001 && cosine.lr(49) < 0.0012);
    }

    #[test]
    fn one_cycle_matches_pytorch_values() {
        // torch.optim.lr_scheduler.OneCycleLR(max_lr=0.1, total_steps=50), read off step by step.
        let cycle = schedule(|c| c.name = ScheduleName::OneCycle);
        for (it, expected) in [
            (0, 0.0040000000000000036),
            (7, 0.052000000000000005),
            (14, 0.1),
            (30, 0.05671183644422961),
            (49, 4e-07),
        ] {
            assert!(
                (cycle.lr(it) - expected).abs() < 1e-12,
                "{it}: {}",
                cycle.lr(it)
            );
        }
    }
}
