//! The one place where a config's machine-dependent defaults are settled: the checkpoint
//! interval on GPUs, `batch_size = "auto"` (for training through the memory plan, for
//! evaluation from the batch that training would fit) and the decoding threads the machine can
//! use. The settled config is what a run folder records and what
//! everything after reads; nothing rewrites it later.

use kiln_data::max_workers;

use crate::config::{BatchSize, TrainConfig};
use crate::plan::{self, AutoBatch, MemoryBudget, Plan, PlanError};

/// What settling needs to know of the devices a run was given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceFacts {
    /// A backend that compiles its kernels at run time (the GPUs): its runs are long.
    pub compiles_kernels: bool,
    /// The first device's memory, where the device reports it.
    pub available_bytes: Option<u64>,
    /// Model replicas on all devices and machines together.
    pub replicas: usize,
}

/// What a config is settled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleFor {
    Training,
    /// No gradients and no optimizer state: any batch that training would fit fits.
    Evaluation,
}

/// A settled config, with the memory plan that settled it.
#[derive(Debug, Clone)]
pub struct Settled {
    pub config: TrainConfig,
    /// Whether settling changed the config: the run folder then records the settled one.
    pub changed: bool,
    /// The memory plan, when the config allows one (an image folder without a crop does not).
    pub plan: Option<Plan>,
    /// How `batch_size = "auto"` chose, where it did.
    pub auto: Option<AutoBatch>,
    /// The memory the plan was checked against.
    pub budget: Option<MemoryBudget>,
    /// The devices as people know them ("NVIDIA H200"), for the report, where the caller
    /// named them (kiln-train knows no concrete device): see `with_device`.
    pub device: Option<String>,
}

impl Settled {
    /// The same, on devices that people know as `name`.
    pub fn with_device(self, name: String) -> Self {
        Self {
            device: Some(name),
            ..self
        }
    }
}

/// GPU runs are long and a kill would lose a whole epoch: they checkpoint every half hour
/// too, unless the config says when.
const GPU_CHECKPOINT_MINUTES: f64 = 30.0;

/// Evaluation's batch where no plan can choose one.
const UNPLANNED_EVAL_BATCH: usize = 64;

/// Settles `config` for the devices `facts` describes. Training refuses a batch whose estimate
/// exceeds the budget; evaluation never fails here.
pub fn settle(
    config: &TrainConfig,
    facts: &DeviceFacts,
    purpose: SettleFor,
) -> Result<Settled, PlanError> {
    let budget = MemoryBudget::of(config, facts.available_bytes);
    let (mut settled, plan, auto) = match purpose {
        SettleFor::Training => plan_training(config, facts.replicas, budget)?,
        SettleFor::Evaluation => (evaluation_batch(config, budget), None, None),
    };
    settled.data.workers = workers(config.data.workers);
    let checkpoints = &mut settled.checkpoints;
    if facts.compiles_kernels
        && checkpoints.every_minutes.is_none()
        && checkpoints.every_steps.is_none()
    {
        checkpoints.every_minutes = Some(GPU_CHECKPOINT_MINUTES);
    }
    Ok(Settled {
        changed: settled != *config,
        config: settled,
        plan,
        auto,
        budget,
        device: None,
    })
}

/// At most [`max_workers`] decoding threads: more only cost memory.
fn workers(asked: usize) -> usize {
    if asked > max_workers() {
        log::warn!(
            "data.workers = {asked} is more decoding threads than this machine can use; using {} (four per core)",
            max_workers()
        );
    }
    asked.min(max_workers())
}

/// The memory plan of training: settles `"auto"` and checks the batch against the budget.
/// Without `"auto"` or `max_memory`, a config the plan cannot count trains unplanned.
fn plan_training(
    config: &TrainConfig,
    replicas: usize,
    budget: Option<MemoryBudget>,
) -> Result<(TrainConfig, Option<Plan>, Option<AutoBatch>), PlanError> {
    let needed = config.batch_size == BatchSize::Auto || config.max_memory.is_some();
    let plan = match Plan::new(config, replicas) {
        Ok(plan) => plan,
        Err(error) if needed => return Err(error),
        Err(_) => return Ok((config.clone(), None, None)),
    };
    let train_images = match config.batch_size {
        BatchSize::Auto => config.data.source.train_size(),
        BatchSize::Fixed(_) => None,
    };
    let (settled, auto) =
        plan::settle_batch_size(config, &plan, budget.map(|b| b.bytes), train_images)?;
    let plan = Plan {
        batch_size: settled.batch_size.fixed(),
        ..plan
    };
    if let Some(budget) = budget {
        plan.check(budget.bytes, budget.source)?;
    }
    Ok((settled, Some(plan), auto))
}

/// Evaluation's batch for `"auto"`: the training batch that fits on one device, which
/// evaluation needs less memory for.
fn evaluation_batch(config: &TrainConfig, budget: Option<MemoryBudget>) -> TrainConfig {
    let mut settled = config.clone();
    if config.batch_size == BatchSize::Auto {
        let batch = Plan::new(config, 1)
            .ok()
            .zip(budget)
            .and_then(|(plan, budget)| plan.auto_batch_size(budget.bytes, None).ok())
            .map_or(UNPLANNED_EVAL_BATCH, |auto| auto.batch_size);
        settled.batch_size = BatchSize::Fixed(batch);
    }
    settled
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OptimizerConfig;
    use kiln_data::Source;

    fn config(batch_size: BatchSize) -> TrainConfig {
        let source = Source::Synthetic {
            train_size: 64,
            val_size: 16,
            image_size: 16,
            num_classes: 3,
        };
        let mut config = TrainConfig::new(source, OptimizerConfig::sgd(0.1), 1, 8);
        config.batch_size = batch_size;
        config
    }

    const CPU: DeviceFacts = DeviceFacts {
        compiles_kernels: false,
        available_bytes: None,
        replicas: 1,
    };
    const GPU: DeviceFacts = DeviceFacts {
        compiles_kernels: true,
        available_bytes: Some(80 << 30),
        replicas: 1,
    };

    #[test]
    fn gpu_runs_checkpoint_every_half_hour_unless_the_config_says_when() {
        let given = config(BatchSize::Fixed(8));
        let settled = settle(&given, &GPU, SettleFor::Training).unwrap();
        assert_eq!(settled.config.checkpoints.every_minutes, Some(30.0));
        assert!(settled.changed);
        let mut every_steps = given.clone();
        every_steps.checkpoints.every_steps = Some(100);
        let settled = settle(&every_steps, &GPU, SettleFor::Training).unwrap();
        assert_eq!(settled.config, every_steps);
        assert!(!settled.changed);
    }

    #[test]
    fn a_fixed_batch_on_the_cpu_is_left_as_it_is() {
        let given = config(BatchSize::Fixed(8));
        let settled = settle(&given, &CPU, SettleFor::Training).unwrap();
        assert_eq!(settled.config, given);
        assert!(!settled.changed);
        assert!(settled.auto.is_none());
    }

    #[test]
    fn more_workers_than_the_machine_can_use_are_settled_to_what_it_can() {
        let mut given = config(BatchSize::Fixed(8));
        given.data.workers = 100_000;
        let settled = settle(&given, &CPU, SettleFor::Training).unwrap();
        assert_eq!(settled.config.data.workers, max_workers());
        assert!(settled.changed);
    }

    #[test]
    fn auto_is_settled_to_a_number_for_training_and_for_evaluation() {
        let given = config(BatchSize::Auto);
        let train = settle(&given, &GPU, SettleFor::Training).unwrap();
        let batch = train.config.batch_size.fixed().expect("a number");
        assert!(train.auto.is_some() && train.changed);
        let plan = train.plan.expect("a plan");
        assert_eq!(plan.batch_size, Some(batch));
        let eval = settle(&given, &GPU, SettleFor::Evaluation).unwrap();
        assert!(eval.config.batch_size.fixed().is_some());
        // Without a budget evaluation still gets a batch, where training would be refused.
        let eval = settle(&given, &CPU, SettleFor::Evaluation).unwrap();
        assert_eq!(eval.config.batch_size.fixed(), Some(UNPLANNED_EVAL_BATCH));
    }
}
