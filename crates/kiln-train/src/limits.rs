//! The memory a run is held to: the plan and budget that settling found, `max_memory`, and the
//! errors for a run that went over them.

use crate::error::TrainError;
use crate::events::Event;
use crate::panics::OutOfMemory;
use kiln_config::config::TrainConfig;
use kiln_config::plan::{self, MemoryBudget, Plan};
use kiln_config::settle::Settled;

/// The memory side of a run: the plan (when the config allows one) and the limits a step
/// is held to.
pub struct Limits<'a> {
    pub plan: Option<&'a Plan>,
    pub budget: Option<MemoryBudget>,
    pub max_memory: Option<u64>,
}

impl<'a> Limits<'a> {
    pub(crate) fn of(settled: &'a Settled) -> Self {
        Self {
            plan: settled.plan.as_ref(),
            budget: settled.budget,
            max_memory: settled.config.max_memory.map(|m| m.bytes()),
        }
    }

    /// The memory plan as the console shows it, where there is one.
    pub(crate) fn planned(&self, settled: &Settled) -> Option<Event<'static>> {
        let plan = self.plan?;
        let batch_size = settled.config.batch_size.fixed().unwrap_or(1);
        Some(Event::Planned {
            batch_size,
            auto: settled.auto,
            per_device: plan.per_device(batch_size),
            estimate_bytes: plan.configured_peak(),
            budget: self.budget,
        })
    }
}

/// The error for a run whose measured peak went above `max_memory`.
pub(crate) fn over_memory(
    config: &TrainConfig,
    limits: &Limits,
    used: u64,
    limit: u64,
) -> TrainError {
    let (batch_size, per_device) = batch_and_share(config, limits);
    TrainError::OverMemory {
        batch_size,
        per_device,
        used,
        limit,
        advice: plan::advice(limits.plan, Some(limit), Some(used)),
    }
}

/// The error for a device that ran out of memory.
pub(crate) fn out_of_memory(config: &TrainConfig, limits: &Limits, oom: OutOfMemory) -> TrainError {
    let (batch_size, per_device) = batch_and_share(config, limits);
    TrainError::OutOfMemory {
        batch_size,
        per_device,
        accumulate: config.accumulate,
        message: oom.message,
        advice: plan::advice(limits.plan, limits.budget.map(|b| b.bytes), None),
    }
}

fn batch_and_share(config: &TrainConfig, limits: &Limits) -> (usize, usize) {
    let batch_size = config.batch_size.fixed().unwrap_or(0);
    let per_device = limits.plan.map_or(batch_size, |p| p.per_device(batch_size));
    (batch_size, per_device)
}
