//! Memory planning: the peak device memory of a training step, counted from the model's
//! footprint, the batch and the optimizer; the largest batch that fits a budget; and a
//! measurement of the real peak to check the count against.
//!
//! Pure arithmetic: nothing here touches a device (`measure` runs the real steps).
//!
//! The count is the weights, one set of gradients, the optimizer's state, the gradient sums of
//! an accumulation in progress, a backend workspace, and per image the activations that
//! autodiff keeps for the backward pass. Two constants were measured on burn 0.21's flex backend
//! with `kiln plan --measure` (ResNet-18 at 32x32 and ResNet-50 at 112x112 and 224x224, batches 2
//! to 128, SGD with and without momentum, Adam, accumulation): `ACTIVATIONS_KEPT` and
//! `WORKSPACE`. GPU memory pools were not measured here.

use kiln_data::Pipeline;
use kiln_models::{Footprint, Precision};
use serde::Serialize;

use crate::config::{BatchSize, OptimizerName, TrainConfig};

/// The share of all layer outputs that a step keeps per image: 0.90 to 0.94 of the elements that
/// `Footprint::activations_per_image` counts, for ResNet-18 and ResNet-50 alike.
const ACTIVATIONS_KEPT: f64 = 0.92;

/// What a step takes besides tensors the count knows of (convolution scratch, thread pools):
/// 10 to 35 MiB measured.
const WORKSPACE: u64 = 24 << 20;

/// The fewest optimizer steps an epoch that `batch_size = "auto"` leaves, where the training
/// set is large enough: a larger batch than that trains on too few updates to learn much.
pub const AUTO_MIN_STEPS: usize = 16;

/// What `batch_size = "auto"` settled on, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoBatch {
    pub batch_size: usize,
    /// The largest power of two the memory allows.
    pub memory: usize,
    pub train_images: Option<usize>,
}

impl std::fmt::Display for AutoBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.train_images {
            Some(images) if self.batch_size < self.memory => write!(
                f,
                "the largest power of two that leaves {AUTO_MIN_STEPS} steps an epoch of {images} images; memory allows {}",
                self.memory
            ),
            _ => write!(f, "the largest power of two that fits the memory"),
        }?;
        write!(
            f,
            ". optimizer.lr is used as written: when a batch size changes, scale lr with it (linear scaling)"
        )
    }
}

/// Headroom that `batch_size = "auto"` leaves below the budget, for what the count misses
/// (allocator and pool rounding, the data loader's buffers, other processes).
const AUTO_HEADROOM: f64 = 0.85;

const F32: u64 = 4;

/// With 16-bit convolutions (bf16, f16) a step keeps 0.55 of f32's bytes per image (batch norm
/// still keeps f32 tensors), and the weights' 16-bit copies add half the weights: measured on
/// flex for ResNet-18 at batches 8 and 32.
const SIXTEEN_BIT_ACTIVATIONS: f64 = 0.55;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "cannot tell the input size of the images: the data set's images come in any size and train_transforms has no crop. Add a crop (for example {{ op = \"random_resized_crop\", size = 224 }}) to [data] train_transforms"
    )]
    UnknownInputSize,
    #[error(
        "cannot tell how many classes the data set has: set model.num_classes, or check that the image folder's train directory exists"
    )]
    UnknownClasses,
    #[error(
        "batch_size = \"auto\" needs to know how much memory the device has, and this one does not say: set max_memory (for example max_memory = \"8GiB\") or a number for batch_size"
    )]
    UnknownBudget,
    #[error(
        "not even one image per device fits in {}: the model's weights and optimizer state alone take {} ({})",
        bytes(*budget), bytes(*fixed), plan_hint()
    )]
    NothingFits { budget: u64, fixed: u64 },
    #[error(
        "batch_size {batch_size} with accumulate {accumulate} needs about {} per device, more than the {}{}; {} ({})",
        bytes(*needed), bytes(*budget), budget_source, fit_advice(fit), plan_hint()
    )]
    TooLarge {
        batch_size: usize,
        accumulate: usize,
        needed: u64,
        budget: u64,
        budget_source: &'static str,
        fit: Option<Fit>,
    },
    #[error(transparent)]
    Data(#[from] kiln_data::DataError),
    #[error(transparent)]
    Model(#[from] kiln_models::ModelError),
}

fn plan_hint() -> &'static str {
    "`kiln plan --config <file>` shows the estimate"
}

fn fit_advice(fit: &Option<Fit>) -> String {
    match fit {
        Some(fit) => format!(
            "batch_size = {} with accumulate = {} fits and keeps the same update",
            fit.batch_size, fit.accumulate
        ),
        None => "nothing fits: a smaller model or input size is needed".into(),
    }
}

/// A byte count for people: `1.2 GiB`.
pub fn bytes(count: u64) -> String {
    bytesize::ByteSize(count).display().iec().to_string()
}

/// A batch size and accumulation, over all devices, whose micro-batches fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Fit {
    pub batch_size: usize,
    pub accumulate: usize,
}

/// The estimate for one config on `replicas` devices.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub model: String,
    /// Width and height of the training images.
    pub input: (u32, u32),
    pub classes: usize,
    pub parameters: u64,
    pub replicas: usize,
    /// The configured batch over all devices (`None` for `"auto"`).
    pub batch_size: Option<usize>,
    pub accumulate: usize,
    /// What one device holds whatever the batch: weights (and batch-norm statistics), one set
    /// of gradients, optimizer state, the gradient sums of an accumulation, and workspace (with
    /// the 16-bit weight copies of mixed precision).
    pub weights_bytes: u64,
    pub gradient_bytes: u64,
    pub optimizer_bytes: u64,
    pub accumulated_gradient_bytes: u64,
    pub workspace_bytes: u64,
    /// What each image of a device's micro-batch adds.
    pub bytes_per_image: u64,
}

impl Plan {
    /// Counts `config`'s model at its training input size, on `replicas` devices.
    pub fn new(config: &TrainConfig, replicas: usize) -> Result<Self, PlanError> {
        let data = &config.data;
        let (width, height) = Pipeline::new(&data.train_transforms)?
            .output_size(data.source.image_size())
            .ok_or(PlanError::UnknownInputSize)?;
        let classes = config
            .model
            .num_classes
            .or_else(|| data.source.class_count())
            .filter(|&c| c > 0)
            .ok_or(PlanError::UnknownClasses)?;
        let model = config.model.resnet(classes)?;
        let footprint: Footprint = model.footprint(height as usize, width as usize)?;
        let parameters = footprint.parameters;
        let optimizer_slots = match config.optimizer.name {
            OptimizerName::Sgd if config.optimizer.momentum > 0.0 => 1,
            OptimizerName::Sgd => 0,
            OptimizerName::Adam | OptimizerName::Adamw => 2,
        };
        let input = 3 * u64::from(width) * u64::from(height);
        let mut kept = (footprint.activations_per_image + input) as f64 * ACTIVATIONS_KEPT;
        let mut workspace = WORKSPACE;
        if config.precision() != Precision::F32 {
            kept *= SIXTEEN_BIT_ACTIVATIONS;
            workspace += 2 * parameters;
        }
        Ok(Plan {
            model: config.model.name.clone(),
            input: (width, height),
            classes,
            parameters,
            replicas: replicas.max(1),
            batch_size: config.batch_size.fixed(),
            accumulate: config.accumulate,
            weights_bytes: F32 * (parameters + footprint.buffers),
            gradient_bytes: F32 * parameters,
            optimizer_bytes: F32 * parameters * optimizer_slots,
            accumulated_gradient_bytes: if config.accumulate > 1 {
                F32 * parameters
            } else {
                0
            },
            workspace_bytes: workspace,
            bytes_per_image: (kept * F32 as f64) as u64,
        })
    }

    /// Images per device in one forward pass of a `batch_size` batch over all devices.
    pub fn per_device(&self, batch_size: usize) -> usize {
        batch_size.div_ceil(self.replicas)
    }

    /// What one device holds regardless of the batch.
    pub fn fixed_bytes(&self) -> u64 {
        self.weights_bytes
            + self.gradient_bytes
            + self.optimizer_bytes
            + self.accumulated_gradient_bytes
            + self.workspace_bytes
    }

    /// Peak memory of one device with `per_device` images per forward pass.
    pub fn peak_bytes(&self, per_device: usize) -> u64 {
        self.fixed_bytes() + self.bytes_per_image * per_device as u64
    }

    /// The configured batch's peak (`None` for `"auto"`).
    pub fn configured_peak(&self) -> Option<u64> {
        self.batch_size.map(|b| self.peak_bytes(self.per_device(b)))
    }

    /// The most images per device whose peak stays within `budget`.
    pub fn largest_per_device(&self, budget: u64) -> Option<usize> {
        let room = budget.checked_sub(self.fixed_bytes())?;
        let images = (room / self.bytes_per_image.max(1)) as usize;
        (images > 0).then_some(images)
    }

    /// `batch_size = "auto"`: the largest power of two over all devices whose micro-batches fit
    /// `budget` with headroom, and which leaves `train_images` (where known) at least
    /// [`AUTO_MIN_STEPS`] optimizer steps an epoch, with at least one image per device.
    pub fn auto_batch_size(
        &self,
        budget: u64,
        train_images: Option<usize>,
    ) -> Result<AutoBatch, PlanError> {
        let room = (budget as f64 * AUTO_HEADROOM) as u64;
        let per_device = self
            .largest_per_device(room)
            .ok_or(PlanError::NothingFits {
                budget: room,
                fixed: self.fixed_bytes(),
            })?;
        let memory = 1 << (per_device * self.replicas).ilog2();
        let data = train_images.map(|images| {
            let steps = images / (AUTO_MIN_STEPS * self.accumulate);
            1usize << steps.max(self.replicas).max(1).ilog2()
        });
        Ok(AutoBatch {
            batch_size: data.map_or(memory, |data| data.min(memory)),
            memory,
            train_images,
        })
    }

    /// A batch and accumulation that give the configured update (`batch_size * accumulate`
    /// images per step) in micro-batches that fit `budget`.
    pub fn fit(&self, budget: u64) -> Option<Fit> {
        let step_images = self.batch_size? * self.accumulate;
        let mut plan = self.clone();
        plan.accumulated_gradient_bytes = F32 * self.parameters;
        let per_device = plan.largest_per_device(budget)?;
        let accumulate = step_images.div_ceil(per_device * self.replicas);
        Some(Fit {
            batch_size: step_images.div_ceil(accumulate),
            accumulate,
        })
    }

    /// Refuses a configured batch whose estimate exceeds `budget`, naming one that fits.
    pub fn check(&self, budget: u64, budget_source: &'static str) -> Result<(), PlanError> {
        match (self.batch_size, self.configured_peak()) {
            (Some(batch_size), Some(needed)) if needed > budget => Err(PlanError::TooLarge {
                batch_size,
                accumulate: self.accumulate,
                needed,
                budget,
                budget_source,
                fit: self.fit(budget),
            }),
            _ => Ok(()),
        }
    }
}

/// The memory a run may take on each device, and where that figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemoryBudget {
    pub bytes: u64,
    /// Follows the figure: " allowed by max_memory" or " free on the device".
    pub source: &'static str,
}

impl MemoryBudget {
    /// `max_memory` where set (or what the device has, if less), else what the device has.
    pub fn of(config: &TrainConfig, available: Option<u64>) -> Option<MemoryBudget> {
        let limit = config.max_memory.map(|m| m.bytes());
        match (limit, available) {
            (Some(limit), Some(free)) if free < limit => Some(MemoryBudget {
                bytes: free,
                source: " free on the device",
            }),
            (Some(limit), _) => Some(MemoryBudget {
                bytes: limit,
                source: " allowed by max_memory",
            }),
            (None, Some(free)) => Some(MemoryBudget {
                bytes: free,
                source: " free on the device",
            }),
            (None, None) => None,
        }
    }
}

/// What `kiln plan` shows of a config on some devices: its plan, the budget it is set
/// against, the estimate for the configured (or `"auto"`) batch, and what fits.
#[derive(Debug, Clone, Serialize)]
pub struct Fitting {
    pub plan: Plan,
    pub budget: Option<MemoryBudget>,
    /// Images per device of the configured batch, or of `"auto"`'s (1 where no budget says).
    pub per_device: usize,
    pub estimate_bytes: u64,
    pub largest_per_device: Option<usize>,
    pub auto_batch_size: Option<usize>,
}

impl Fitting {
    /// `config` on `replicas` devices against `memory` bytes where given (`kiln plan --memory`),
    /// else its budget from `max_memory` and what the device has `available`.
    pub fn of(
        config: &TrainConfig,
        replicas: usize,
        memory: Option<u64>,
        available: Option<u64>,
    ) -> Result<Self, PlanError> {
        let plan = Plan::new(config, replicas)?;
        let budget = match memory {
            Some(bytes) => Some(MemoryBudget {
                bytes,
                source: " given by --memory",
            }),
            None => MemoryBudget::of(config, available),
        };
        let train_images = config.data.source.train_size();
        let auto_batch_size = budget
            .and_then(|b| plan.auto_batch_size(b.bytes, train_images).ok())
            .map(|auto| auto.batch_size);
        let per_device = match config.batch_size {
            BatchSize::Fixed(batch) => plan.per_device(batch),
            BatchSize::Auto => auto_batch_size.map_or(1, |batch| plan.per_device(batch)),
        };
        Ok(Self {
            estimate_bytes: plan.peak_bytes(per_device),
            largest_per_device: budget.and_then(|b| plan.largest_per_device(b.bytes)),
            budget,
            per_device,
            auto_batch_size,
            plan,
        })
    }
}

/// What to do when a run did not fit: a batch and accumulation that the estimate fits in
/// `budget` (scaled by how far the measured `used` was above the estimate), else halving.
pub fn advice(plan: Option<&Plan>, budget: Option<u64>, used: Option<u64>) -> String {
    let fit = plan.zip(budget).and_then(|(plan, budget)| {
        let estimate = plan.configured_peak()? as f64;
        let scale = used.map_or(1.0, |used| (estimate / used as f64).min(1.0));
        plan.fit((budget as f64 * scale) as u64)
    });
    match (fit, budget) {
        (Some(fit), Some(budget)) => format!(
            "batch_size = {} with accumulate = {} keeps the same update and should fit in {} ({})",
            fit.batch_size,
            fit.accumulate,
            bytes(budget),
            plan_hint()
        ),
        _ => "halve batch_size and double accumulate to keep the same update".into(),
    }
}

/// Settles `batch_size = "auto"` for `budget` bytes per device and a training set of
/// `train_images` (where known); a fixed batch stays. Returns how `"auto"` chose, if it did.
pub fn settle_batch_size(
    config: &TrainConfig,
    plan: &Plan,
    budget: Option<u64>,
    train_images: Option<usize>,
) -> Result<(TrainConfig, Option<AutoBatch>), PlanError> {
    let mut settled = config.clone();
    if config.batch_size != BatchSize::Auto {
        return Ok((settled, None));
    }
    let budget = budget.ok_or(PlanError::UnknownBudget)?;
    let auto = plan.auto_batch_size(budget, train_images)?;
    settled.batch_size = BatchSize::Fixed(auto.batch_size);
    Ok((settled, Some(auto)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OptimizerConfig;
    use kiln_data::Source;
    use kiln_models::Stem;

    fn cifar(batch_size: usize) -> TrainConfig {
        let mut config = TrainConfig::new(
            Source::Cifar10 {
                root: "data".into(),
                download: false,
            },
            OptimizerConfig::sgd(0.1),
            1,
            batch_size,
        );
        config.model.stem = Stem::Cifar;
        config.optimizer.momentum = 0.9;
        config
    }

    #[test]
    fn memory_grows_with_the_batch_and_the_optimizers_state() {
        let plan = Plan::new(&cifar(32), 1).unwrap();
        assert_eq!(plan.input, (32, 32));
        assert_eq!(plan.classes, 10);
        assert_eq!(plan.optimizer_bytes, 4 * plan.parameters);
        assert!(plan.peak_bytes(64) > plan.peak_bytes(32));
        let mut adam = cifar(32);
        adam.optimizer = OptimizerConfig::adam(1e-3);
        assert_eq!(
            Plan::new(&adam, 1).unwrap().optimizer_bytes,
            8 * plan.parameters
        );
        // 16-bit convolutions keep fewer bytes per image.
        let mut bf16 = cifar(32);
        bf16.precision = Precision::Bf16;
        assert!(Plan::new(&bf16, 1).unwrap().bytes_per_image < plan.bytes_per_image);
        // Two devices halve the images each holds.
        let two = Plan::new(&cifar(64), 2).unwrap();
        assert_eq!(two.configured_peak(), plan.configured_peak());
    }

    #[test]
    fn a_batch_too_large_for_the_budget_is_refused_with_one_that_fits() {
        let plan = Plan::new(&cifar(256), 1).unwrap();
        let budget = plan.peak_bytes(100);
        let Err(PlanError::TooLarge { fit: Some(fit), .. }) = plan.check(budget, "") else {
            panic!("a batch of 256 was let into room for 100");
        };
        assert!(fit.batch_size * fit.accumulate >= 256);
        assert!(fit.batch_size * (fit.accumulate - 1) < 256);
        let mut fitting = plan.clone();
        fitting.batch_size = Some(fit.batch_size);
        fitting.accumulate = fit.accumulate;
        fitting.accumulated_gradient_bytes = 4 * plan.parameters;
        assert!(fitting.configured_peak().unwrap() <= budget);
        assert!(plan.check(plan.peak_bytes(256), "").is_ok());
    }

    #[test]
    fn auto_takes_the_largest_power_of_two_that_fits_with_headroom() {
        let mut config = cifar(1);
        config.batch_size = BatchSize::Auto;
        let plan = Plan::new(&config, 2).unwrap();
        let budget = plan.peak_bytes(100);
        let (settled, _) = settle_batch_size(&config, &plan, Some(budget), None).unwrap();
        let batch = settled.batch_size.fixed().unwrap();
        assert!(batch.is_power_of_two());
        assert!(plan.peak_bytes(plan.per_device(batch)) as f64 <= budget as f64 * 0.85);
        assert!(plan.peak_bytes(plan.per_device(2 * batch)) as f64 > budget as f64 * 0.85);
        assert!(matches!(
            settle_batch_size(&config, &plan, None, None),
            Err(PlanError::UnknownBudget)
        ));
        assert!(matches!(
            settle_batch_size(&config, &plan, Some(plan.fixed_bytes()), None),
            Err(PlanError::NothingFits { .. })
        ));
    }

    /// The quickstart's 1,500 images with 16 GiB to spare: memory alone would allow a batch of
    /// 131,072 (one step an epoch, which trained to 13.8%); the data caps it.
    #[test]
    fn auto_never_takes_a_batch_that_leaves_too_few_steps_an_epoch() {
        let mut config = cifar(1);
        config.batch_size = BatchSize::Auto;
        let plan = Plan::new(&config, 1).unwrap();
        let budget = 16 << 30;
        let memory = plan.auto_batch_size(budget, None).unwrap();
        assert!(memory.batch_size >= 1024, "{memory:?}");
        let (settled, auto) = settle_batch_size(&config, &plan, Some(budget), Some(1500)).unwrap();
        // 1500 / 16 = 93: 64 leaves 24 steps, 128 would leave 12.
        assert_eq!(settled.batch_size, BatchSize::Fixed(64));
        let note = auto.unwrap().to_string();
        assert!(note.contains("16 steps an epoch of 1500 images"), "{note}");
        assert!(note.contains("optimizer.lr"), "{note}");
        // Two devices: at least one image each, even for a tiny set.
        let two = Plan::new(&config, 2).unwrap();
        assert_eq!(two.auto_batch_size(budget, Some(5)).unwrap().batch_size, 2);
        // A set that is large enough leaves memory in charge.
        let large = plan.auto_batch_size(budget, Some(10_000_000)).unwrap();
        assert_eq!(large.batch_size, memory.batch_size);
    }
}
