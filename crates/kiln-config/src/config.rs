//! The training config: a TOML file through serde, `--set key=value` overrides, and checks that
//! turn a bad value into one line naming the key.

use std::path::{Path, PathBuf};

pub use bytesize::ByteSize;
use kiln_backend::BackendChoice;
use kiln_data::{ImageLimits, MixMode, Mixing, OnBadImage, Source, Transform};
use kiln_models::{ModelError, Precision, ResNetConfig, Stem};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}{}: {message}", path.display(), line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Parse {
        path: PathBuf,
        line: Option<usize>,
        message: String,
    },
    #[error("--set {0}: expected key=value, for example --set optimizer.lr=0.01")]
    SetSyntax(String),
    #[error("--set {key}: {reason}")]
    SetPath { key: String, reason: String },
    #[error("{}: {key} {problem}", path.display())]
    Invalid {
        path: PathBuf,
        key: &'static str,
        problem: String,
    },
    #[error(
        "--resume with --set {key}: {reason}; start a new run with --config instead (model.pretrained can start it from this run's model.safetensors)"
    )]
    ResumeChange { key: &'static str, reason: String },
}

/// Everything a run needs, as written in `configs/*.toml`. Every key but `epochs`,
/// `batch_size`, `[data] source`, `[optimizer] name` and `lr` has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Names the run directory `runs/<name>-<timestamp>`.
    #[serde(default = "default_name")]
    pub name: String,
    #[serde(default)]
    pub seed: u64,
    pub epochs: usize,
    /// Images per forward pass, over all devices and machines together: the hyperparameters
    /// mean the same on one device or many. `"auto"`: the largest that fits (see `plan`).
    pub batch_size: BatchSize,
    /// Loader batches per optimizer step (gradient accumulation): the update is that of one
    /// batch `accumulate` times larger.
    #[serde(default = "one")]
    pub accumulate: usize,
    /// `"f32"`, or mixed precision: `"bf16"` or `"f16"` convolutions with f32 master weights,
    /// batch norm and classifier (f16 with dynamic loss scaling); see `kiln_models::Precision`.
    #[serde(default)]
    pub precision: Precision,
    /// The most device memory this job may take (`"6GiB"`, `"500MB"`), so that several jobs
    /// can share a device: checked against the plan before training and the measured peak after
    /// every step.
    #[serde(default)]
    pub max_memory: Option<MemorySize>,
    #[serde(default)]
    pub model: ModelConfig,
    pub data: DataConfig,
    pub optimizer: OptimizerConfig,
    #[serde(default)]
    pub schedule: ScheduleConfig,
    #[serde(default)]
    pub loss: LossConfig,
    #[serde(default)]
    pub device: DeviceConfig,
    #[serde(default)]
    pub checkpoints: CheckpointConfig,
    #[serde(default)]
    pub logging: LoggingConfig,
    /// A moving average of the weights, validated beside them (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema: Option<EmaConfig>,
    /// How `kiln eval` evaluates.
    #[serde(default)]
    pub eval: EvalConfig,
    /// Stop once a validation metric stops improving (absent: run every epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<EarlyStoppingConfig>,
    /// Mixup and CutMix on the training batches (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixup: Option<MixupConfig>,
}

/// `batch_size`: a number, or `"auto"` for the largest power of two that fits the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "NumberOrWord", into = "NumberOrWord")]
pub enum BatchSize {
    Fixed(usize),
    Auto,
}

impl BatchSize {
    /// The number, unless it is still to be settled by `plan`.
    pub fn fixed(self) -> Option<usize> {
        match self {
            BatchSize::Fixed(n) => Some(n),
            BatchSize::Auto => None,
        }
    }
}

impl std::fmt::Display for BatchSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchSize::Fixed(n) => write!(f, "{n}"),
            BatchSize::Auto => write!(f, "auto"),
        }
    }
}

/// A memory size: `"6GiB"`, `"500 MB"` or a number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "NumberOrWord", into = "NumberOrWord")]
pub struct MemorySize(pub ByteSize);

impl MemorySize {
    pub fn bytes(self) -> u64 {
        self.0.as_u64()
    }
}

/// A value that TOML may write as a number or as a string.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum NumberOrWord {
    Number(u64),
    Word(String),
}

impl TryFrom<NumberOrWord> for BatchSize {
    type Error = String;

    fn try_from(text: NumberOrWord) -> Result<Self, String> {
        match text {
            NumberOrWord::Number(n) => Ok(BatchSize::Fixed(n as usize)),
            NumberOrWord::Word(word) if word == "auto" => Ok(BatchSize::Auto),
            NumberOrWord::Word(word) => Err(format!(
                "batch_size must be a number or \"auto\", got \"{word}\""
            )),
        }
    }
}

impl From<BatchSize> for NumberOrWord {
    fn from(size: BatchSize) -> Self {
        match size {
            BatchSize::Fixed(n) => NumberOrWord::Number(n as u64),
            BatchSize::Auto => NumberOrWord::Word("auto".into()),
        }
    }
}

impl TryFrom<NumberOrWord> for MemorySize {
    type Error = String;

    fn try_from(text: NumberOrWord) -> Result<Self, String> {
        match text {
            NumberOrWord::Number(bytes) => Ok(MemorySize(ByteSize(bytes))),
            NumberOrWord::Word(word) => word.parse().map(MemorySize).map_err(|_| {
                format!("max_memory must be a size such as \"6GiB\" or \"500MB\", got \"{word}\"")
            }),
        }
    }
}

/// Written back exactly: in whole GiB or MiB where it is one, else in bytes.
impl From<MemorySize> for NumberOrWord {
    fn from(size: MemorySize) -> Self {
        let bytes = size.bytes();
        match bytes {
            0 => NumberOrWord::Number(0),
            _ if bytes.is_multiple_of(1 << 30) => NumberOrWord::Word(format!("{}GiB", bytes >> 30)),
            _ if bytes.is_multiple_of(1 << 20) => NumberOrWord::Word(format!("{}MiB", bytes >> 20)),
            _ => NumberOrWord::Number(bytes),
        }
    }
}

fn default_name() -> String {
    "run".into()
}

fn one() -> usize {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// One of `kiln_models::MODEL_NAMES`: `resnet18` to `resnet152`, `resnext50_32x4d`,
    /// `wide_resnet50_2`, `resnet50d`, ...
    pub name: String,
    /// `"imagenet"` (the network's own: a 7x7 stride-2 convolution and max pool, ResNet-D's deep
    /// stem), `"cifar"` (3x3, no pool) or `"deep"`.
    pub stem: Stem,
    pub width: usize,
    /// The data set's class count when absent.
    pub num_classes: Option<usize>,
    pub zero_init_residual: bool,
    /// Batch norm with fixed running statistics, for fine-tuning with few images per device.
    pub freeze_batch_norm: bool,
    /// Weights to start from: `"torchvision"` (the network's default ImageNet weights),
    /// `"torchvision:IMAGENET1K_V2"` (one by its tag), `"hf-hub:timm/resnet50d.ra2_in1k"` (timm's
    /// on the Hugging Face Hub), or a path to a state dict.
    pub pretrained: Option<String>,
    /// Parameters that do not train (torchvision names or prefixes, `"bn"`, `"bias"`; see
    /// `param_groups`): no gradient, no optimizer state, their batch norms in eval mode.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub freeze: Vec<String>,
    /// The epoch (counted from 1) from which the frozen parameters train too: the second phase
    /// of a two-phase fine-tune. Absent: they stay frozen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unfreeze_at_epoch: Option<usize>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            name: "resnet18".into(),
            stem: Stem::Imagenet,
            width: 64,
            num_classes: None,
            zero_init_residual: false,
            freeze_batch_norm: false,
            pretrained: None,
            freeze: Vec::new(),
            unfreeze_at_epoch: None,
        }
    }
}

impl ModelConfig {
    /// The network this section describes, for a data set of `data_classes` classes (unless
    /// `num_classes` says otherwise).
    pub fn resnet(&self, data_classes: usize) -> Result<ResNetConfig, ModelError> {
        let mut config = ResNetConfig::from_name(&self.name)?;
        config.num_classes = self.num_classes.unwrap_or(data_classes);
        config = config.with_input_stem(self.stem);
        config.width = self.width;
        config.zero_init_residual = self.zero_init_residual;
        config.freeze_batch_norm = self.freeze_batch_norm;
        Ok(config)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    pub source: Source,
    #[serde(default)]
    pub train_transforms: Vec<Transform>,
    #[serde(default)]
    pub val_transforms: Vec<Transform>,
    /// Decoding threads.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Batches prepared ahead.
    #[serde(default = "default_prefetch")]
    pub prefetch: usize,
    #[serde(default)]
    pub drop_last: bool,
    #[serde(default)]
    pub on_bad_image: OnBadImage,
    /// Images with a longer side are refused before decoding.
    #[serde(default = "default_max_image_side")]
    pub max_image_side: u32,
    /// Images with more pixels are refused before decoding (PIL's decompression-bomb limit).
    #[serde(default = "default_max_image_pixels")]
    pub max_image_pixels: u64,
    /// Image files larger than this are refused before they are read.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
    /// Train on what decodes of a truncated JPEG, instead of skipping it as PIL does.
    #[serde(default)]
    pub allow_truncated_images: bool,
    /// The most pixels a transform may make of one image; larger ones are skipped unmade.
    #[serde(default = "default_max_resize_pixels")]
    pub max_resize_pixels: u64,
}

impl DataConfig {
    /// No transforms (ToTensor only), two workers, bad images skipped.
    pub fn new(source: Source) -> Self {
        Self {
            source,
            train_transforms: Vec::new(),
            val_transforms: Vec::new(),
            workers: default_workers(),
            prefetch: default_prefetch(),
            drop_last: false,
            on_bad_image: OnBadImage::default(),
            max_image_side: default_max_image_side(),
            max_image_pixels: default_max_image_pixels(),
            max_file_bytes: default_max_file_bytes(),
            allow_truncated_images: false,
            max_resize_pixels: default_max_resize_pixels(),
        }
    }

    /// What image decoding accepts.
    pub fn image_limits(&self) -> ImageLimits {
        ImageLimits {
            max_side: self.max_image_side,
            max_pixels: self.max_image_pixels,
            max_file_bytes: self.max_file_bytes,
            allow_truncated: self.allow_truncated_images,
            ..ImageLimits::default()
        }
    }
}

fn default_max_resize_pixels() -> u64 {
    kiln_data::transforms::DEFAULT_MAX_PIXELS
}

fn default_max_file_bytes() -> u64 {
    ImageLimits::default().max_file_bytes
}

fn default_workers() -> usize {
    2
}

fn default_prefetch() -> usize {
    4
}

fn default_max_image_pixels() -> u64 {
    ImageLimits::default().max_pixels
}

fn default_max_image_side() -> u32 {
    16_384
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerName {
    Sgd,
    Adam,
    Adamw,
}

/// PyTorch's optimizers with PyTorch's defaults: SGD's dampening 0, Adam's eps 1e-8, AdamW's
/// weight decay 1e-2 (burn's own defaults differ).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    pub name: OptimizerName,
    pub lr: f64,
    #[serde(default)]
    pub momentum: f64,
    #[serde(default)]
    pub dampening: f64,
    #[serde(default)]
    pub nesterov: bool,
    /// 0 for SGD and Adam, 1e-2 for AdamW when absent.
    #[serde(default)]
    pub weight_decay: Option<f64>,
    #[serde(default = "default_betas")]
    pub betas: [f64; 2],
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// `torch.nn.utils.clip_grad_norm_(max_norm=...)` on every step's gradients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
    /// `torch.nn.utils.clip_grad_value_(clip_value=...)` on every step's gradients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_grad_value: Option<f64>,
    /// Parameter groups (`[[optimizer.groups]]`), each parameter in the first that names it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupConfig>,
    /// Parameters without weight decay, in any group: `["bn", "bias"]` is timm's filter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_weight_decay: Vec<String>,
}

/// `[[optimizer.groups]]`: a PyTorch parameter group of the parameters `params` names
/// (torchvision names or prefixes, `"bn"`, `"bias"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    pub params: Vec<String>,
    /// The group's learning rate is the schedule's times this.
    #[serde(default = "one_f64")]
    pub lr_scale: f64,
    /// The optimizer's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
}

fn one_f64() -> f64 {
    1.0
}

fn default_betas() -> [f64; 2] {
    [0.9, 0.999]
}

fn default_eps() -> f64 {
    1e-8
}

impl OptimizerConfig {
    /// `torch.optim.SGD(lr=lr)`: no momentum, no weight decay.
    pub fn sgd(lr: f64) -> Self {
        Self::with_name(OptimizerName::Sgd, lr)
    }

    /// `torch.optim.Adam(lr=lr)`.
    pub fn adam(lr: f64) -> Self {
        Self::with_name(OptimizerName::Adam, lr)
    }

    /// `torch.optim.AdamW(lr=lr)`: weight decay 1e-2.
    pub fn adamw(lr: f64) -> Self {
        Self::with_name(OptimizerName::Adamw, lr)
    }

    fn with_name(name: OptimizerName, lr: f64) -> Self {
        Self {
            name,
            lr,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: None,
            betas: default_betas(),
            eps: default_eps(),
            clip_grad_norm: None,
            clip_grad_value: None,
            groups: Vec::new(),
            no_weight_decay: Vec::new(),
        }
    }

    pub fn weight_decay(&self) -> f64 {
        self.weight_decay.unwrap_or(match self.name {
            OptimizerName::Adamw => 1e-2,
            _ => 0.0,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleName {
    Constant,
    Step,
    Multistep,
    Cosine,
    OneCycle,
}

/// The learning rate over the run, evaluated at every iteration. `step_size` and `milestones`
/// count epochs; a linear warm-up of `warmup_epochs` (may be fractional) precedes any schedule
/// but one-cycle, which has its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleConfig {
    pub name: ScheduleName,
    pub warmup_epochs: f64,
    /// The warm-up starts at `lr * warmup_start_factor`.
    pub warmup_start_factor: f64,
    pub step_size: Option<usize>,
    pub milestones: Vec<usize>,
    pub gamma: f64,
    /// Where cosine ends.
    pub min_lr: f64,
    /// One-cycle: the share of the run spent rising, and PyTorch's divisors.
    pub pct_start: f64,
    pub div_factor: f64,
    pub final_div_factor: f64,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        Self {
            name: ScheduleName::Constant,
            warmup_epochs: 0.0,
            warmup_start_factor: 0.1,
            step_size: None,
            milestones: Vec::new(),
            gamma: 0.1,
            min_lr: 0.0,
            pct_start: 0.3,
            div_factor: 25.0,
            final_div_factor: 1e4,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LossConfig {
    pub label_smoothing: f64,
    /// `CrossEntropyLoss(weight=...)`: a weight per class, or `"balanced"` for scikit-learn's
    /// `n_images / (n_classes * images_of_class)` over the training set. The loss is the
    /// weighted mean, as PyTorch's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_weights: Option<ClassWeights>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClassWeights {
    List(Vec<f64>),
    /// Only `"balanced"`.
    Named(String),
}

impl ClassWeights {
    /// The weight of each class, given how many training images each has (a class without
    /// images counts as having one, so that every weight stays finite and positive).
    pub fn resolve(&self, images_per_class: &[usize]) -> Result<Vec<f32>, String> {
        match self {
            ClassWeights::List(list) if list.len() != images_per_class.len() => Err(format!(
                "gives {} weights for {} classes",
                list.len(),
                images_per_class.len()
            )),
            ClassWeights::List(list) => Ok(list.iter().map(|&w| w as f32).collect()),
            ClassWeights::Named(_) => {
                let total: usize = images_per_class.iter().sum();
                let classes = images_per_class.len() as f64;
                let weight = |n: usize| (total as f64 / (classes * n.max(1) as f64)) as f32;
                Ok(images_per_class.iter().map(|&n| weight(n)).collect())
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeviceConfig {
    /// As `--backend`: auto, cuda, wgpu, vulkan, metal, flex, ndarray (any case), recorded in
    /// lower case.
    #[serde(with = "backend_choice")]
    pub backend: BackendChoice,
    /// As `--devices`: an index, a list or `all`.
    pub devices: String,
    /// With several devices: batch norm statistics over all devices' images together
    /// (PyTorch's `SyncBatchNorm`) instead of each device's own (PyTorch DDP's default). For
    /// small per-device batches; every batch norm layer then waits for all devices twice.
    pub sync_bn: bool,
    /// On CUDA, f32 convolutions may run on TF32 tensor cores (10-bit mantissas in the products,
    /// f32 sums), as PyTorch's default `torch.backends.cudnn.allow_tf32 = True`; `false` keeps
    /// them in full f32. Other backends compute in f32 either way.
    pub tf32: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            backend: BackendChoice::Auto,
            devices: "0".into(),
            sync_bn: false,
            tf32: true,
        }
    }
}

/// `device.backend` read as `--backend` reads it (`BackendChoice`'s `FromStr`, whose error
/// lists the backends) and written as it prints, so that a run's recorded `config.toml` reads
/// back the same on `--resume`.
mod backend_choice {
    use kiln_backend::BackendChoice;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(choice: &BackendChoice, to: S) -> Result<S::Ok, S::Error> {
        to.collect_str(choice)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<BackendChoice, D::Error> {
        let text = String::deserialize(from)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Write a checkpoint every this many epochs (and always after the last).
    pub every_epochs: usize,
    /// Also write one within an epoch every this many optimizer steps, so that a kill loses at
    /// most that many.
    pub every_steps: Option<usize>,
    /// Also write one within an epoch when this many minutes have passed since the last
    /// checkpoint (`kiln train` sets 30 on GPUs where it is not given).
    pub every_minutes: Option<f64>,
    /// How many of the most recent epoch checkpoints to keep; a mid-epoch checkpoint replaces
    /// the one before it.
    pub keep_last: usize,
    /// Also keep the checkpoint with the best validation top-1.
    pub keep_best: bool,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            every_epochs: 1,
            every_steps: None,
            every_minutes: None,
            keep_last: 2,
            keep_best: true,
        }
    }
}

/// `[ema]`: the weights' exponential moving average (see `kiln_train::ema`), with timm's defaults.
/// `decay` applies per update as given; torchvision's recipe derives its own from the batch
/// size, `every` and the epochs (`1 - (1 - 0.99998) * batch * every / epochs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmaConfig {
    pub decay: f64,
    /// Optimizer steps between updates.
    pub every: usize,
    /// Epochs during which the average only copies the weights.
    pub warmup_epochs: usize,
    /// Export the average (`model.safetensors`) and judge the best checkpoint by its top-1.
    pub export: bool,
}

impl Default for EmaConfig {
    fn default() -> Self {
        Self {
            decay: 0.9998,
            every: 32,
            warmup_epochs: 0,
            export: false,
        }
    }
}

/// `[mixup]`: timm's `Mixup` on each training batch (see `kiln_data::mix`), with the defaults
/// of timm's `train.py`. The loss's `label_smoothing` goes into the soft targets, as timm does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MixupConfig {
    /// Mixup's Beta(alpha, alpha); 0: no mixup.
    pub mixup_alpha: f64,
    /// CutMix's Beta(alpha, alpha); 0: no CutMix.
    pub cutmix_alpha: f64,
    /// The chance that a batch (pair, image) is mixed.
    pub prob: f64,
    /// With both on, the chance of CutMix rather than mixup.
    pub switch_prob: f64,
    /// `"batch"`, `"pair"` or `"elem"`: what one draw mixes.
    pub mode: MixMode,
}

impl Default for MixupConfig {
    fn default() -> Self {
        Self {
            mixup_alpha: 0.0,
            cutmix_alpha: 0.0,
            prob: 1.0,
            switch_prob: 0.5,
            mode: MixMode::Batch,
        }
    }
}

impl MixupConfig {
    /// The loader's mixing for a model of `classes` outputs.
    pub fn mixing(&self, label_smoothing: f64, classes: usize) -> Mixing {
        Mixing {
            mixup_alpha: self.mixup_alpha,
            cutmix_alpha: self.cutmix_alpha,
            prob: self.prob,
            switch_prob: self.switch_prob,
            mode: self.mode,
            label_smoothing,
            classes,
        }
    }
}

/// `[eval]`: how `kiln eval` evaluates a model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Test-time augmentation (`kiln eval --tta hflip` sets it too).
    pub tta: Tta,
}

/// Test-time augmentation: `"hflip"` averages the softmax of each image and its mirror.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tta {
    #[default]
    None,
    Hflip,
}

/// `[early_stopping]`, as PyTorch Lightning's `EarlyStopping`: the run ends once `metric` has
/// not improved by more than `min_delta` for `patience` epochs (the verdict is the
/// `early_stopping` module's, over the run's history).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EarlyStoppingConfig {
    #[serde(default = "default_stopping_metric")]
    pub metric: StoppingMetric,
    /// Epochs without an improvement before the run stops.
    pub patience: usize,
    /// The least change that counts as an improvement.
    #[serde(default)]
    pub min_delta: f64,
    /// `"max"` or `"min"`; by default the metric's own direction (top-1 up, losses down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<StoppingMode>,
}

fn default_stopping_metric() -> StoppingMetric {
    StoppingMetric::ValTop1
}

/// The metrics of `metrics.jsonl` that `[early_stopping]` can watch, named as there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoppingMetric {
    ValTop1,
    ValTop5,
    ValLoss,
    EmaValTop1,
    EmaValTop5,
    EmaValLoss,
}

impl StoppingMetric {
    /// Its name in the config and in `metrics.jsonl`.
    pub fn name(self) -> &'static str {
        match self {
            StoppingMetric::ValTop1 => "val_top1",
            StoppingMetric::ValTop5 => "val_top5",
            StoppingMetric::ValLoss => "val_loss",
            StoppingMetric::EmaValTop1 => "ema_val_top1",
            StoppingMetric::EmaValTop5 => "ema_val_top5",
            StoppingMetric::EmaValLoss => "ema_val_loss",
        }
    }

    /// Accuracies improve upwards, losses downwards.
    pub fn higher_is_better(self) -> bool {
        !matches!(self, StoppingMetric::ValLoss | StoppingMetric::EmaValLoss)
    }
}

/// `early_stopping.mode`: which way the metric improves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoppingMode {
    Max,
    Min,
}

impl EarlyStoppingConfig {
    pub fn higher_is_better(&self) -> bool {
        match self.mode {
            Some(mode) => mode == StoppingMode::Max,
            None => self.metric.higher_is_better(),
        }
    }

    /// What is wrong with the section's values that serde cannot see: the key and the problem.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if self.patience == 0 {
            let problem = "must be at least 1 (epochs)".to_string();
            return Some(("early_stopping.patience", problem));
        }
        if !(self.min_delta >= 0.0 && self.min_delta.is_finite()) {
            let problem = format!("must be 0 or more, got {}", self.min_delta);
            return Some(("early_stopping.min_delta", problem));
        }
        None
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// Print the running loss every this many iterations.
    pub print_every: usize,
    /// Where run directories go.
    pub runs_dir: PathBuf,
    /// Write TensorBoard's event files into the run's `tensorboard/`.
    pub tensorboard: bool,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            print_every: 100,
            runs_dir: PathBuf::from("runs"),
            tensorboard: true,
        }
    }
}

impl TrainConfig {
    /// A config with every default: `name = "run"`, seed 0, torchvision's ResNet-18, f32, a
    /// constant schedule, checkpoints every epoch, the auto backend on device 0.
    pub fn new(
        source: Source,
        optimizer: OptimizerConfig,
        epochs: usize,
        batch_size: usize,
    ) -> Self {
        Self {
            name: default_name(),
            seed: 0,
            epochs,
            batch_size: BatchSize::Fixed(batch_size),
            accumulate: 1,
            precision: Precision::F32,
            max_memory: None,
            model: ModelConfig::default(),
            data: DataConfig::new(source),
            optimizer,
            schedule: ScheduleConfig::default(),
            loss: LossConfig::default(),
            device: DeviceConfig::default(),
            checkpoints: CheckpointConfig::default(),
            logging: LoggingConfig::default(),
            ema: None,
            eval: EvalConfig::default(),
            early_stopping: None,
            mixup: None,
        }
    }

    /// Reads `path`, applies `overrides` (`key=value`, the value in TOML syntax or a bare
    /// string), and checks the values.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path, overrides)
    }

    /// Refuses, for `--resume`, a change to a key that gives a saved position another meaning:
    /// the batches of an epoch (`batch_size`, `accumulate`, `data.drop_last`), their order and
    /// augmentation (`seed`) or the images themselves (`data.source`). A resumed run would
    /// continue at the same batch number of a different sequence.
    pub fn check_resume_change(&self, saved: &TrainConfig) -> Result<(), ConfigError> {
        let changes: [(&'static str, bool, &str); 5] = [
            (
                "batch_size",
                self.batch_size != saved.batch_size,
                "the batches of every epoch",
            ),
            (
                "accumulate",
                self.accumulate != saved.accumulate,
                "the steps of every epoch",
            ),
            (
                "data.drop_last",
                self.data.drop_last != saved.data.drop_last,
                "the batches of every epoch",
            ),
            (
                "seed",
                self.seed != saved.seed,
                "the order and augmentation of every epoch",
            ),
            (
                "data.source",
                self.data.source != saved.data.source,
                "the images",
            ),
        ];
        match changes.into_iter().find(|(_, changed, _)| *changed) {
            Some((key, _, what)) => Err(ConfigError::ResumeChange {
                key,
                reason: format!(
                    "it changes {what}, so the saved position would point into another sequence of batches"
                ),
            }),
            None => Ok(()),
        }
    }

    /// [`load`](Self::load) from text; `path` only names it in messages.
    pub fn parse(text: &str, path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let parse_error = |e: toml::de::Error, source: Option<&str>| ConfigError::Parse {
            path: path.to_path_buf(),
            line: e
                .span()
                .zip(source)
                .map(|(span, text)| text[..span.start].matches('\n').count() + 1),
            message: e.message().trim().to_string(),
        };
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| parse_error(e, Some(text)))?;
        for assignment in overrides {
            apply_override(&mut table, assignment)?;
        }
        let value = toml::Value::Table(table);
        let config: TrainConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let key = e.path().to_string();
            // Read the file alone again to point at the line when the file is at fault; if it
            // is not, an override is.
            let mut error = match toml::from_str::<TrainConfig>(text) {
                Err(in_file) => parse_error(in_file, Some(text)),
                Ok(_) => parse_error(e.into_inner(), None),
            };
            // Name the key: toml's own message names the type, not where it was wanted.
            if let ConfigError::Parse { message, .. } = &mut error
                && key != "."
            {
                *message = format!("{key}: {message}");
            }
            error
        })?;
        config.check(path)?;
        Ok(config)
    }

    /// The float type of the convolutions.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The config as TOML, as the run directory records it.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("the config serializes")
    }

    /// Checks the values, as loading does; for configs built in code. Closed choices (the
    /// precision, the stem, the backend, names) are enums that serde already refused when they
    /// were wrong; these are the checks it cannot make, section by section.
    pub fn check(&self, path: &Path) -> Result<(), ConfigError> {
        let sections: [fn(&Self) -> Checked; 9] = [
            Self::check_run,
            Self::check_model,
            Self::check_optimizer,
            Self::check_schedule,
            Self::check_loss,
            Self::check_checkpoints,
            Self::check_recipes,
            Self::check_logging,
            Self::check_data,
        ];
        for section in sections {
            section(self).map_err(|(key, problem)| ConfigError::Invalid {
                path: path.to_path_buf(),
                key,
                problem,
            })?;
        }
        Ok(())
    }

    fn check_run(&self) -> Checked {
        if self.epochs == 0 {
            return invalid("epochs", "must be at least 1");
        }
        if self.batch_size == BatchSize::Fixed(0) {
            return invalid("batch_size", "must be at least 1");
        }
        if self.accumulate == 0 {
            return invalid("accumulate", "must be at least 1");
        }
        Ok(())
    }

    fn check_model(&self) -> Checked {
        let model = &self.model;
        if model.width == 0 || model.num_classes == Some(0) {
            return invalid("model", "width and num_classes must be at least 1");
        }
        match model.unfreeze_at_epoch {
            Some(_) if model.freeze.is_empty() => invalid(
                "model.unfreeze_at_epoch",
                "needs model.freeze: it says when the frozen parameters train",
            ),
            Some(epoch) if epoch < 2 => invalid(
                "model.unfreeze_at_epoch",
                format!(
                    "must be 2 or more (epochs count from 1; 1 would freeze nothing), got {epoch}"
                ),
            ),
            _ => Ok(()),
        }
    }

    fn check_optimizer(&self) -> Checked {
        let o = &self.optimizer;
        if !(o.lr > 0.0 && o.lr.is_finite()) {
            return invalid("optimizer.lr", format!("must be positive, got {}", o.lr));
        }
        if !(0.0..1.0).contains(&o.momentum) {
            let problem = format!("must lie in [0, 1), got {}", o.momentum);
            return invalid("optimizer.momentum", problem);
        }
        if !(0.0..=1.0).contains(&o.dampening) {
            let problem = format!("must lie in [0, 1], got {}", o.dampening);
            return invalid("optimizer.dampening", problem);
        }
        if o.nesterov && (o.momentum == 0.0 || o.dampening != 0.0) {
            let problem = "needs momentum > 0 and dampening 0, as in PyTorch";
            return invalid("optimizer.nesterov", problem);
        }
        if o.name != OptimizerName::Sgd && (o.momentum != 0.0 || o.nesterov) {
            return invalid("optimizer.momentum", "applies to sgd only; adam uses betas");
        }
        if o.weight_decay().is_nan() || o.weight_decay() < 0.0 {
            let problem = format!("must be 0 or more, got {}", o.weight_decay());
            return invalid("optimizer.weight_decay", problem);
        }
        if !o.betas.iter().all(|b| (0.0..1.0).contains(b)) {
            let problem = format!("must lie in [0, 1), got {:?}", o.betas);
            return invalid("optimizer.betas", problem);
        }
        if o.eps.is_nan() || o.eps <= 0.0 {
            return invalid("optimizer.eps", format!("must be positive, got {}", o.eps));
        }
        for (key, value) in [
            ("optimizer.clip_grad_norm", o.clip_grad_norm),
            ("optimizer.clip_grad_value", o.clip_grad_value),
        ] {
            if let Some(v) = value.filter(|v| !(*v > 0.0 && v.is_finite())) {
                return invalid(key, format!("must be positive, got {v}"));
            }
        }
        if o.clip_grad_norm.is_some() && o.clip_grad_value.is_some() {
            return invalid(
                "optimizer.clip_grad_norm",
                "and optimizer.clip_grad_value: give one of them (as timm's --clip-mode)",
            );
        }
        o.groups.iter().try_for_each(GroupConfig::check)
    }

    fn check_schedule(&self) -> Checked {
        let s = &self.schedule;
        let factor_ok = s.warmup_start_factor > 0.0 && s.warmup_start_factor <= 1.0;
        if s.warmup_epochs.is_nan() || s.warmup_epochs < 0.0 || !factor_ok {
            return invalid(
                "schedule.warmup_epochs",
                "warmup_epochs must be 0 or more and warmup_start_factor in (0, 1]",
            );
        }
        match s.name {
            ScheduleName::Step if s.step_size.unwrap_or(0) == 0 => invalid(
                "schedule.step_size",
                "the step schedule needs step_size >= 1 (epochs)",
            ),
            ScheduleName::Multistep if s.milestones.is_empty() => invalid(
                "schedule.milestones",
                "the multistep schedule needs milestones (epochs)",
            ),
            ScheduleName::OneCycle if !(s.pct_start > 0.0 && s.pct_start < 1.0) => invalid(
                "schedule.pct_start",
                format!("must lie in (0, 1), got {}", s.pct_start),
            ),
            _ => Ok(()),
        }
    }

    fn check_loss(&self) -> Checked {
        if !(0.0..1.0).contains(&self.loss.label_smoothing) {
            let problem = format!("must lie in [0, 1), got {}", self.loss.label_smoothing);
            return invalid("loss.label_smoothing", problem);
        }
        match &self.loss.class_weights {
            Some(ClassWeights::Named(name)) if name != "balanced" => invalid(
                "loss.class_weights",
                format!("must be \"balanced\" or a list of weights, got \"{name}\""),
            ),
            Some(ClassWeights::List(list)) if !list.iter().all(|w| *w > 0.0 && w.is_finite()) => {
                invalid(
                    "loss.class_weights",
                    format!("must all be positive, got {list:?}"),
                )
            }
            _ => Ok(()),
        }
    }

    fn check_checkpoints(&self) -> Checked {
        let c = &self.checkpoints;
        if c.every_steps == Some(0) {
            return invalid("checkpoints.every_steps", "must be at least 1");
        }
        if c.every_minutes.is_some_and(|m| !(m > 0.0 && m.is_finite())) {
            return invalid("checkpoints.every_minutes", "must be a positive number");
        }
        if c.every_epochs == 0 || c.keep_last == 0 {
            return invalid(
                "checkpoints",
                "every_epochs and keep_last must be at least 1",
            );
        }
        Ok(())
    }

    /// `[ema]`, `[early_stopping]` and `[mixup]`.
    fn check_recipes(&self) -> Checked {
        if let Some(ema) = &self.ema {
            if !(0.0..1.0).contains(&ema.decay) {
                return invalid(
                    "ema.decay",
                    format!("must lie in [0, 1), got {}", ema.decay),
                );
            }
            if ema.every == 0 {
                return invalid("ema.every", "must be at least 1 (optimizer steps)");
            }
        }
        if let Some(problem) = self.early_stopping.as_ref().and_then(|e| e.problem()) {
            return Err(problem);
        }
        if let Some(mixup) = &self.mixup {
            let mixing = mixup.mixing(self.loss.label_smoothing, 1);
            if let Err(problem) = mixing.check() {
                return invalid("[mixup]", problem);
            }
            if self.loss.class_weights.is_some() {
                let problem = "cannot be combined with [mixup]: a mixed image's soft target has \
                    no one class to weigh (timm's SoftTargetCrossEntropy has no weights either); \
                    leave one of them out";
                return invalid("loss.class_weights", problem);
            }
        }
        Ok(())
    }

    fn check_logging(&self) -> Checked {
        if self.logging.print_every == 0 {
            return invalid("logging.print_every", "must be at least 1");
        }
        Ok(())
    }

    fn check_data(&self) -> Checked {
        if self.data.max_image_side == 0 {
            return invalid("data.max_image_side", "must be at least 1");
        }
        if self.data.max_image_pixels == 0 {
            return invalid("data.max_image_pixels", "must be at least 1");
        }
        if let Err(e) = kiln_data::Pipeline::new(&self.data.train_transforms) {
            return invalid("data.train_transforms", e.to_string());
        }
        if let Err(e) = kiln_data::Pipeline::new(&self.data.val_transforms) {
            return invalid("data.val_transforms", e.to_string());
        }
        Ok(())
    }
}

impl GroupConfig {
    fn check(&self) -> Checked {
        if self.params.is_empty() {
            return invalid("optimizer.groups", "params must name at least one");
        }
        if !(self.lr_scale > 0.0 && self.lr_scale.is_finite()) {
            let problem = format!("lr_scale must be positive, got {}", self.lr_scale);
            return invalid("optimizer.groups", problem);
        }
        if let Some(decay) = self.weight_decay.filter(|d| !(*d >= 0.0 && d.is_finite())) {
            let problem = format!("weight_decay must be 0 or more, got {decay}");
            return invalid("optimizer.groups", problem);
        }
        Ok(())
    }
}

/// A section's check: the key at fault and what is wrong with it, for [`ConfigError::Invalid`].
type Checked = Result<(), (&'static str, String)>;

fn invalid(key: &'static str, problem: impl Into<String>) -> Checked {
    Err((key, problem.into()))
}

/// Sets `a.b.c = value` in `table`, creating tables on the way. The value is read as TOML
/// (`0.1`, `true`, `[1, 2]`, `{ kind = "digits" }`), else taken as a string; an empty value
/// removes the key.
fn apply_override(table: &mut toml::Table, assignment: &str) -> Result<(), ConfigError> {
    let (key, raw) = assignment
        .split_once('=')
        .ok_or_else(|| ConfigError::SetSyntax(assignment.to_string()))?;
    let (key, raw) = (key.trim(), raw.trim());
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(ConfigError::SetSyntax(assignment.to_string()));
    }
    if raw.is_empty() {
        // `--set key=` removes the key, so that its default applies.
        let mut current = table;
        for part in &parts[..parts.len() - 1] {
            match current.get_mut(*part).and_then(toml::Value::as_table_mut) {
                Some(next) => current = next,
                None => return Ok(()),
            }
        }
        current.remove(parts[parts.len() - 1]);
        return Ok(());
    }
    let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let mut current = table;
    for part in &parts[..parts.len() - 1] {
        let entry = current
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry.as_table_mut().ok_or_else(|| ConfigError::SetPath {
            key: key.to_string(),
            reason: format!("{part} is not a table"),
        })?;
    }
    current.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
epochs = 2
batch_size = 8
[data]
source = { kind = "digits" }
[optimizer]
name = "sgd"
lr = 0.1
"#;

    fn parse(text: &str, overrides: &[&str]) -> Result<TrainConfig, String> {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        TrainConfig::parse(text, Path::new("test.toml"), &overrides).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_follow_pytorch() {
        let config = parse(MINIMAL, &[]).unwrap();
        assert_eq!(config.optimizer.dampening, 0.0);
        assert_eq!(config.optimizer.eps, 1e-8);
        assert_eq!(config.optimizer.weight_decay(), 0.0);
        let adamw = parse(MINIMAL, &["optimizer.name=adamw"]).unwrap();
        assert_eq!(adamw.optimizer.weight_decay(), 1e-2);
        assert_eq!(config.schedule.name, ScheduleName::Constant);
        // The resolved config round-trips through its TOML form.
        assert_eq!(parse(&config.to_toml(), &[]).unwrap(), config);
    }

    #[test]
    fn batch_size_may_be_auto_and_memory_is_written_with_units() {
        let config = parse(MINIMAL, &["batch_size=auto", "max_memory=6GiB"]).unwrap();
        assert_eq!(config.batch_size, BatchSize::Auto);
        assert_eq!(config.max_memory, Some(MemorySize(ByteSize::gib(6))));
        assert_eq!(parse(&config.to_toml(), &[]).unwrap(), config);
        let decimal = parse(MINIMAL, &["max_memory=\"500 MB\""]).unwrap();
        assert_eq!(decimal.max_memory, Some(MemorySize(ByteSize::mb(500))));
        assert_eq!(parse(&decimal.to_toml(), &[]).unwrap(), decimal);
        let wrong = parse(MINIMAL, &["batch_size=most"]).unwrap_err();
        assert!(
            wrong.contains("batch_size") && wrong.contains("auto"),
            "{wrong}"
        );
        let wrong = parse(MINIMAL, &["max_memory=lots"]).unwrap_err();
        assert!(wrong.contains("max_memory"), "{wrong}");
    }

    #[test]
    fn overrides_reach_any_key() {
        let config = parse(
            MINIMAL,
            &[
                "optimizer.lr=0.5",
                "model.stem=cifar",
                "data.source={ kind = \"synthetic\", train_size = 4 }",
                "schedule.milestones=[1, 2]",
                "name = quick run",
                "logging.print_every=",
            ],
        )
        .unwrap();
        assert_eq!(config.optimizer.lr, 0.5);
        assert_eq!(config.model.stem, Stem::Cifar);
        assert_eq!(config.schedule.milestones, [1, 2]);
        assert_eq!(config.name, "quick run");
        assert!(matches!(
            config.data.source,
            Source::Synthetic { train_size: 4, .. }
        ));
    }

    #[test]
    fn unknown_keys_and_bad_values_get_one_line_naming_them() {
        let err = parse(&MINIMAL.replace("lr = 0.1", "lr = 0.1\nlrr = 2"), &[]).unwrap_err();
        assert!(err.contains("test.toml") && err.contains("lrr"), "{err}");
        assert!(err.contains("line 9"), "{err}");
        let err = parse(MINIMAL, &["optimizer.momentun=0.9"]).unwrap_err();
        assert!(err.contains("momentun"), "{err}");
        for (set, key) in [
            ("batch_size=0", "batch_size"),
            ("optimizer.lr=-1", "optimizer.lr"),
            ("epochs=0", "epochs"),
            ("optimizer.nesterov=true", "optimizer.nesterov"),
            ("schedule.name=step", "schedule.step_size"),
            ("loss.label_smoothing=1.5", "loss.label_smoothing"),
            ("model.stem=tiny", "model.stem"),
            ("precision=fp8", "precision"),
        ] {
            let err = parse(MINIMAL, &[set]).unwrap_err();
            assert!(err.contains(key), "{set}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        assert!(
            parse(MINIMAL, &["nonsense"])
                .unwrap_err()
                .contains("key=value")
        );
        let err = parse(&MINIMAL.replace("lr = 0.1", ""), &[]).unwrap_err();
        assert!(err.contains("lr"), "{err}");
    }

    /// The closed choices are enums: serde refuses a wrong one in one line that names the file,
    /// the key and the choices, and they are written back as the config spells them.
    #[test]
    fn closed_choices_name_the_file_the_key_and_the_choices() {
        for (set, key, choices) in [
            ("precision=fp8", "precision", "`f32`, `bf16`, `f16`"),
            (
                "model.stem=tiny",
                "model.stem",
                "`imagenet`, `cifar`, `deep`",
            ),
            ("device.backend=tpu", "device.backend", "auto, cuda, wgpu"),
            (
                "early_stopping={ patience = 1, metric = 'top1' }",
                "early_stopping.metric",
                "`val_top1`, `val_top5`, `val_loss`, `ema_val_top1`",
            ),
            (
                "early_stopping={ patience = 1, mode = 'up' }",
                "early_stopping.mode",
                "`max` or `min`",
            ),
        ] {
            let err = parse(MINIMAL, &[set]).unwrap_err();
            assert!(
                err.starts_with("test.toml: ") && err.contains(key) && err.contains(choices),
                "{set}: {err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        let err = parse(&format!("precision = \"fp8\"\n{MINIMAL}"), &[]).unwrap_err();
        assert!(err.starts_with("test.toml line 1: precision: "), "{err}");

        let config = parse(
            MINIMAL,
            &[
                "device.backend=CUDA",
                "precision=bf16",
                "model.stem=cifar",
                "early_stopping={ patience = 2, metric = 'ema_val_loss', mode = 'max' }",
            ],
        )
        .unwrap();
        assert_eq!(config.precision(), Precision::Bf16);
        let text = config.to_toml();
        for line in [
            "backend = \"cuda\"",
            "precision = \"bf16\"",
            "stem = \"cifar\"",
            "metric = \"ema_val_loss\"",
            "mode = \"max\"",
        ] {
            assert!(text.contains(line), "{line}:\n{text}");
        }
        assert_eq!(parse(&text, &[]).unwrap(), config);
        let defaults = parse(MINIMAL, &[]).unwrap().to_toml();
        for line in [
            "backend = \"auto\"",
            "precision = \"f32\"",
            "stem = \"imagenet\"",
        ] {
            assert!(defaults.contains(line), "{line}:\n{defaults}");
        }
    }

    #[test]
    fn resume_refuses_changes_that_move_the_saved_position() {
        let saved = parse(MINIMAL, &[]).unwrap();
        for (set, key) in [
            ("batch_size=3", "batch_size"),
            ("accumulate=2", "accumulate"),
            ("seed=9", "seed"),
            ("data.drop_last=true", "data.drop_last"),
        ] {
            let changed = parse(MINIMAL, &[set]).unwrap();
            let err = changed.check_resume_change(&saved).unwrap_err().to_string();
            assert!(err.contains(&format!("--set {key}:")), "{set}: {err}");
        }
        for harmless in ["epochs=9", "logging.print_every=3", "data.workers=1"] {
            let changed = parse(MINIMAL, &[harmless]).unwrap();
            assert!(changed.check_resume_change(&saved).is_ok(), "{harmless}");
        }
    }

    #[test]
    fn the_recipe_sections_name_their_bad_keys_and_values() {
        let mixup = "mixup.mixup_alpha=0.2";
        for (sets, named) in [
            (&["mixup.mixup_alpha=-1"][..], "mixup_alpha must"),
            (&["mixup.prob=0.5"], "mixup_alpha or cutmix_alpha"),
            (&[mixup, "mixup.mode=mixed"], "mixed"),
            (&[mixup, "mixup.switch=0.5"], "switch"),
            (&[mixup, "mixup.prob=2"], "prob must"),
            (
                &[mixup, "loss.class_weights=balanced"],
                "loss.class_weights",
            ),
            (
                &["data.train_transforms=[{ op = 'random_erasing' }]"],
                "random_erasing",
            ),
            (
                &["data.train_transforms=[{ op = 'to_tensor' }, { op = 'random_erasing', p = 2 }]"],
                "random_erasing: p must",
            ),
            (
                &["data.train_transforms=[{ op = 'rand_augment', magnitude = 31 }]"],
                "rand_augment: magnitude",
            ),
            (
                &["data.train_transforms=[{ op = 'auto_augment', policy = 'cifar100' }]"],
                "cifar100",
            ),
            (
                &[
                    "data.train_transforms=[{ op = 'trivial_augment_wide', interpolation = 'bicubic' }]",
                ],
                "bicubic",
            ),
            (&["ema.decay=1.5"], "ema.decay"),
            (&["optimizer.clip_grad_norm=-1"], "optimizer.clip_grad_norm"),
            (&["model.unfreeze_at_epoch=3"], "needs model.freeze"),
            (
                &["model.freeze=['layer1']", "model.unfreeze_at_epoch=1"],
                "model.unfreeze_at_epoch",
            ),
            (
                &["optimizer.groups=[{ params = ['fc'], lr_scale = 0 }]"],
                "lr_scale",
            ),
            (&["optimizer.groups=[{ params = ['fc'], lr = 2 }]"], "lr"),
            (&["optimizer.groups=[{ params = [] }]"], "optimizer.groups"),
            (&["model.freeze='layer1'"], "model.freeze"),
        ] {
            let err = parse(MINIMAL, sets).unwrap_err();
            assert!(err.contains(named), "{sets:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        let config = parse(MINIMAL, &[mixup, "mixup.mode=pair"]).unwrap();
        let mixing = config.mixup.unwrap().mixing(0.1, 10);
        assert_eq!(
            (mixing.mode, mixing.prob, mixing.classes),
            (MixMode::Pair, 1.0, 10)
        );
    }
}
