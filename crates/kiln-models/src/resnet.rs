//! ResNet as torchvision's `resnet.py` builds it: a block, a stage, a network. The same file
//! builds the family around it: ResNeXt and Wide ResNet (torchvision's `groups` and
//! `width_per_group`), and timm's ResNet-D (the deep stem and the average-pool shortcut).
//!
//! Field names are torchvision's (`conv1`, `bn1`, `layer1`, `downsample`, `fc`), so weight files
//! map onto the model by name (`weights` maps the few that differ, and timm's ResNet-D names).

use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Initializer, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::module::avg_pool2d;
use burn::tensor::{Tensor, backend::Backend, s};
use serde::{Deserialize, Serialize};

use crate::ModelError;
use crate::batch_norm::BatchNorm2d;
use crate::precision::{Precision, convolve, kiln_options, to_f32};

/// The first layers: torchvision's ImageNet stem, the CIFAR one for 32x32 inputs, or timm's deep
/// stem (ResNet-C and ResNet-D).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Stem {
    /// 7x7 stride-2 convolution and a 3x3 stride-2 max-pool: inputs shrink 4x.
    #[default]
    Imagenet,
    /// 3x3 stride-1 convolution, no max-pool: the usual choice for 32x32 inputs.
    Cifar,
    /// Three 3x3 convolutions (half the width, half the width, the width), the first of stride
    /// 2, then the max-pool: timm's `stem_type='deep'` with `stem_width` half the first stage's.
    Deep,
}

impl Stem {
    pub fn name(self) -> &'static str {
        match self {
            Stem::Imagenet => "imagenet",
            Stem::Cifar => "cifar",
            Stem::Deep => "deep",
        }
    }
}

/// Which of torchvision's two blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Basic,
    Bottleneck,
}

impl BlockKind {
    /// Output channels of a block relative to its `planes`.
    pub fn expansion(self) -> usize {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 4,
        }
    }
}

/// The block type and blocks per stage of a depth, as torchvision (and, for 26 and 200, timm)
/// define them.
pub fn architecture(depth: usize) -> Result<(BlockKind, [usize; 4]), ModelError> {
    match depth {
        18 => Ok((BlockKind::Basic, [2, 2, 2, 2])),
        // timm's resnet26 and resnet26d: two Bottlenecks a stage.
        26 => Ok((BlockKind::Bottleneck, [2, 2, 2, 2])),
        34 => Ok((BlockKind::Basic, [3, 4, 6, 3])),
        50 => Ok((BlockKind::Bottleneck, [3, 4, 6, 3])),
        101 => Ok((BlockKind::Bottleneck, [3, 4, 23, 3])),
        152 => Ok((BlockKind::Bottleneck, [3, 8, 36, 3])),
        200 => Ok((BlockKind::Bottleneck, [3, 24, 36, 3])),
        other => Err(ModelError::UnknownDepth(other)),
    }
}

/// The networks kiln builds by name: torchvision's `resnet.py` and timm's ResNet-D.
pub const MODEL_NAMES: [&str; 19] = [
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnext50_32x4d",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "wide_resnet50_2",
    "wide_resnet101_2",
    "resnet18d",
    "resnet26d",
    "resnet34d",
    "resnet50d",
    "resnet101d",
    "resnet152d",
    "resnet200d",
    "resnet200",
    "resnet26",
];

#[derive(Config, Debug, PartialEq)]
pub struct ResNetConfig {
    /// 18, 26, 34, 50, 101, 152 or 200.
    pub depth: usize,
    #[config(default = 1000)]
    pub num_classes: usize,
    #[config(default = "Stem::Imagenet")]
    pub stem: Stem,
    /// Channels of the first stage; torchvision's 64. Smaller values give the same structure
    /// with fewer parameters (tests use 4 or 8).
    #[config(default = 64)]
    pub width: usize,
    /// torchvision's `groups`: the channel groups of each Bottleneck's 3x3 convolution
    /// (ResNeXt's cardinality, 32 or 64); 1 for ResNets. At a width below 64 the groups shrink
    /// with it, so that each group keeps its channels.
    #[config(default = 1)]
    pub groups: usize,
    /// torchvision's `width_per_group`: a Bottleneck's inner width is `planes * width_per_group
    /// / 64 * groups` (64 for ResNets, 128 for Wide ResNets, 4 or 8 for ResNeXt).
    #[config(default = 64)]
    pub width_per_group: usize,
    /// timm's `avg_down` (ResNet-D): a strided shortcut average-pools 2x2 before its 1x1
    /// convolution, instead of striding the convolution.
    #[config(default = false)]
    pub avg_down: bool,
    /// Start each residual branch's last batch norm at zero, so every block begins as the
    /// identity (torchvision's `zero_init_residual`).
    #[config(default = false)]
    pub zero_init_residual: bool,
    /// Batch norm with fixed running statistics (see [`BatchNorm2d::frozen`]).
    #[config(default = false)]
    pub freeze_batch_norm: bool,
}

impl ResNetConfig {
    /// The networks of [`MODEL_NAMES`]: `resnet50`, `resnext50_32x4d`, `wide_resnet50_2`,
    /// `resnet50d`, ... as torchvision and timm name them.
    pub fn from_name(name: &str) -> Result<Self, ModelError> {
        let unknown = || ModelError::UnknownModel(name.to_string());
        let depth_of = |digits: &str| {
            let depth = digits.parse::<usize>().ok()?;
            architecture(depth).ok().map(|_| depth)
        };
        let config = if let Some(rest) = name.strip_prefix("resnext") {
            // resnext50_32x4d: depth, groups, width per group.
            let (depth, shape) = rest.split_once('_').ok_or_else(unknown)?;
            let (groups, per_group) = shape
                .strip_suffix('d')
                .and_then(|s| s.split_once('x'))
                .ok_or_else(unknown)?;
            Self::new(depth_of(depth).ok_or_else(unknown)?)
                .with_groups(groups.parse().map_err(|_| unknown())?)
                .with_width_per_group(per_group.parse().map_err(|_| unknown())?)
        } else if let Some(rest) = name.strip_prefix("wide_resnet") {
            let (depth, factor) = rest.split_once('_').ok_or_else(unknown)?;
            let factor: usize = factor.parse().map_err(|_| unknown())?;
            Self::new(depth_of(depth).ok_or_else(unknown)?).with_width_per_group(64 * factor)
        } else if let Some(digits) = name
            .strip_prefix("resnet")
            .and_then(|r| r.strip_suffix('d'))
        {
            Self::new(depth_of(digits).ok_or_else(unknown)?)
                .with_stem(Stem::Deep)
                .with_avg_down(true)
        } else {
            let digits = name.strip_prefix("resnet").ok_or_else(unknown)?;
            Self::new(depth_of(digits).ok_or_else(unknown)?)
        };
        // Only the names of MODEL_NAMES: `resnext18_2x4d` parses but torchvision has none.
        if !MODEL_NAMES.contains(&config.name().as_str()) || config.name() != name {
            return Err(unknown());
        }
        Ok(config)
    }

    /// The network's name as torchvision or timm gives it (`resnet50`, `resnext50_32x4d`,
    /// `wide_resnet50_2`, `resnet50d`), whatever its width and class count.
    pub fn name(&self) -> String {
        let d = if self.stem == Stem::Deep && self.avg_down {
            "d"
        } else {
            ""
        };
        let depth = self.depth;
        if self.groups > 1 {
            format!(
                "resnext{depth}{d}_{}x{}d",
                self.groups, self.width_per_group
            )
        } else if self.width_per_group != 64 {
            format!("wide_resnet{depth}{d}_{}", self.width_per_group / 64)
        } else {
            format!("resnet{depth}{d}")
        }
    }

    /// The stem asked for by a command or a config, where `Imagenet` is the default: `Cifar`
    /// (or `Deep`) replaces the network's own stem, `Imagenet` keeps it (the 7x7 convolution,
    /// or ResNet-D's deep stem).
    pub fn with_input_stem(self, stem: Stem) -> Self {
        match stem {
            Stem::Imagenet => self,
            other => self.with_stem(other),
        }
    }

    /// The channel groups of the 3x3 convolutions at this width: torchvision's `groups` at 64,
    /// scaled with the width below it (each group keeps its `width_per_group` channels).
    pub fn groups_at_width(&self) -> usize {
        if self.groups == 1 {
            1
        } else {
            self.groups * self.width / 64
        }
    }

    /// A Bottleneck's inner width for `planes`: torchvision's `int(planes * (width_per_group /
    /// 64.)) * groups` at width 64.
    pub(crate) fn inner_width(&self, planes: usize) -> usize {
        planes * self.width_per_group * self.groups / 64
    }

    /// Why this config cannot be built, if it cannot.
    pub(crate) fn check(&self) -> Result<(BlockKind, [usize; 4]), ModelError> {
        let (kind, blocks) = architecture(self.depth)?;
        if self.num_classes == 0 || self.width == 0 {
            return Err(ModelError::ZeroSize {
                num_classes: self.num_classes,
                width: self.width,
            });
        }
        let invalid = |reason: String| {
            Err(ModelError::Invalid {
                model: self.name(),
                reason,
            })
        };
        if self.groups == 0 || self.width_per_group == 0 {
            return invalid("groups and width_per_group must be at least 1".into());
        }
        if kind == BlockKind::Basic && (self.groups != 1 || self.width_per_group != 64) {
            return invalid(
                "BasicBlock only supports groups = 1 and width_per_group = 64, as torchvision's"
                    .into(),
            );
        }
        if self.groups > 1 && !(self.width * self.groups).is_multiple_of(64) {
            return invalid(format!(
                "its {} groups scale with the width: choose a width that is a multiple of {}",
                self.groups,
                64 / gcd(64, self.groups)
            ));
        }
        if !(self.width * self.width_per_group * self.groups).is_multiple_of(64) {
            return invalid(format!(
                "width {} times width_per_group {} is no multiple of 64",
                self.width, self.width_per_group
            ));
        }
        if self.stem == Stem::Deep && !self.width.is_multiple_of(2) {
            return invalid(format!(
                "the deep stem starts at half the width: choose an even width (not {})",
                self.width
            ));
        }
        Ok((kind, blocks))
    }

    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<ResNet<B>, ModelError> {
        let (kind, blocks) = self.check()?;
        let width = self.width;
        let deep_stem = (self.stem == Stem::Deep).then(|| DeepStem::new(width, device));
        let conv1 = match self.stem {
            Stem::Imagenet => conv(3, width, 7, 2, 3, device),
            Stem::Cifar => conv(3, width, 3, 1, 1, device),
            Stem::Deep => conv(width / 2, width, 3, 1, 1, device),
        };
        let maxpool = (self.stem != Stem::Cifar).then(|| {
            MaxPool2dConfig::new([3, 3])
                .with_strides([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init()
        });

        let mut in_channels = width;
        let mut stage = |index: usize, stride: usize| {
            let planes = width << index;
            let layer = make_stage(
                kind,
                in_channels,
                planes,
                blocks[index],
                stride,
                self,
                device,
            );
            in_channels = planes * kind.expansion();
            layer
        };
        let layer1 = stage(0, 1);
        let layer2 = stage(1, 2);
        let layer3 = stage(2, 2);
        let layer4 = stage(3, 2);

        let model = ResNet {
            deep_stem,
            conv1,
            bn1: BatchNorm2d::new(width, false, device),
            maxpool,
            layer1,
            layer2,
            layer3,
            layer4,
            fc: LinearConfig::new(in_channels, self.num_classes).init(device),
            precision: Precision::F32,
        };
        Ok(if self.freeze_batch_norm {
            model.with_frozen_batch_norm()
        } else {
            model
        })
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// A bias-free convolution with torchvision's init: Kaiming normal, fan-out, ReLU gain.
fn conv<B: Backend>(
    in_channels: usize,
    out_channels: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    device: &B::Device,
) -> Conv2d<B> {
    grouped_conv(
        in_channels,
        out_channels,
        kernel,
        stride,
        padding,
        1,
        device,
    )
}

/// [`conv`] with `groups` channel groups. PyTorch's fan-out is the output channels times the
/// kernel's area whatever the groups (burn's divides by the groups), so the standard deviation
/// is given here, as burn's `KaimingNormal` computes it: `sqrt(2) * (1 / sqrt(fan_out))`.
fn grouped_conv<B: Backend>(
    in_channels: usize,
    out_channels: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    groups: usize,
    device: &B::Device,
) -> Conv2d<B> {
    let fan_out = (out_channels * kernel * kernel) as f64;
    Conv2dConfig::new([in_channels, out_channels], [kernel, kernel])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(
            padding, padding, padding, padding,
        ))
        .with_groups(groups)
        .with_bias(false)
        .with_initializer(Initializer::Normal {
            mean: 0.0,
            std: 2f64.sqrt() * (1.0 / fan_out.sqrt()),
        })
        .init(device)
}

/// timm's deep stem before the network's `conv1` (which is its last 3x3 convolution): two 3x3
/// convolutions of half the width, the first of stride 2, each with batch norm and ReLU. timm
/// names the three convolutions and two batch norms `conv1.0`, `conv1.1`, `conv1.3`, `conv1.4`,
/// `conv1.6` (an `nn.Sequential` with ReLUs between).
#[derive(Module, Debug)]
pub struct DeepStem<B: Backend> {
    pub conv1: Conv2d<B>,
    pub bn1: BatchNorm2d<B>,
    pub conv2: Conv2d<B>,
    pub bn2: BatchNorm2d<B>,
}

impl<B: Backend> DeepStem<B> {
    fn new(width: usize, device: &B::Device) -> Self {
        let half = width / 2;
        Self {
            conv1: conv(3, half, 3, 2, 1, device),
            bn1: BatchNorm2d::new(half, false, device),
            conv2: conv(half, half, 3, 1, 1, device),
            bn2: BatchNorm2d::new(half, false, device),
        }
    }

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let x = conv_bn(&self.conv1, &self.bn1, x, Then::Relu);
        conv_bn(&self.conv2, &self.bn2, x, Then::Relu)
    }
}

/// The strided 1x1 convolution and batch norm that match a block's shortcut to its output.
///
/// The stride is applied by taking every `stride`-th pixel before a stride-1 convolution, which
/// is the same function. burn 0.21's wgpu backend computes the input gradient of a strided 1x1
/// convolution wrongly for small channel counts (measured: 4 -> 8 channels on 8x8), and this
/// form is exact on every backend. With `avg_pool` (ResNet-D) the stride is a 2x2 average pool
/// instead (timm's `AvgPool2d(2, stride, ceil_mode=True, count_include_pad=False)`).
#[derive(Module, Debug)]
pub struct Downsample<B: Backend> {
    pub conv: Conv2d<B>,
    pub bn: BatchNorm2d<B>,
    pub stride: usize,
    pub avg_pool: bool,
}

impl<B: Backend> Downsample<B> {
    fn new(
        in_channels: usize,
        out_channels: usize,
        stride: usize,
        avg_pool: bool,
        device: &B::Device,
    ) -> Self {
        Self {
            conv: conv(in_channels, out_channels, 1, 1, 0, device),
            bn: BatchNorm2d::new(out_channels, false, device),
            stride,
            avg_pool,
        }
    }

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let x = match (self.stride, self.avg_pool) {
            (1, _) => x,
            (s, true) => avg_pool2d(x, [2, 2], [s, s], [0, 0], false, true),
            (s, false) => x.slice(s![.., .., ..;s as isize, ..;s as isize]),
        };
        conv_bn(&self.conv, &self.bn, x, Then::Nothing)
    }
}

/// What a block adds its residual to: the input, or its downsampled projection.
fn shortcut<B: Backend>(downsample: Option<&Downsample<B>>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    match downsample {
        Some(downsample) => downsample.forward(x),
        None => x,
    }
}

/// What follows a convolution and its batch norm in a ResNet.
pub(crate) enum Then<B: Backend> {
    Nothing,
    Relu,
    /// The block's residual added, then ReLU.
    AddRelu(Tensor<B, 4>),
}

/// `bn(conv(x))` and what follows it, as one pass over the output where kiln-kernels has a
/// kernel for it (inference on the CPU backend, batch norm folded into a scale and shift per
/// channel); burn's operations one after another elsewhere, training included.
pub(crate) fn conv_bn<B: Backend>(
    conv: &Conv2d<B>,
    bn: &BatchNorm2d<B>,
    x: Tensor<B, 4>,
    then: Then<B>,
) -> Tensor<B, 4> {
    if let (Some(options), None, Some((scale, shift))) =
        (kiln_options(conv), &conv.bias, bn.folded(&x.device()))
    {
        let (residual, relu) = match &then {
            Then::Nothing => (None, false),
            Then::Relu => (None, true),
            Then::AddRelu(residual) => (Some(residual.clone()), true),
        };
        let epilogue = kiln_kernels::Epilogue {
            scale,
            shift,
            residual,
            relu,
        };
        let weight = conv.weight.val();
        if let Some(y) = kiln_kernels::conv2d_epilogue(&x, &weight, &options, &epilogue) {
            return y;
        }
    }
    let y = convolve(conv, x);
    // In training on the GPU backends, batch norm and what follows as one operation each way.
    let (residual, relu_after) = match &then {
        Then::Nothing => (None, false),
        Then::Relu => (None, true),
        Then::AddRelu(residual) => (Some(residual), true),
    };
    if let Some(y) = bn.forward_fused(&y, residual, relu_after) {
        return y;
    }
    let y = bn.forward(y);
    match then {
        Then::Nothing => y,
        Then::Relu => relu(y),
        Then::AddRelu(residual) => relu(y + residual),
    }
}

/// Two 3x3 convolutions (ResNet-18 and 34).
#[derive(Module, Debug)]
pub struct BasicBlock<B: Backend> {
    pub conv1: Conv2d<B>,
    pub bn1: BatchNorm2d<B>,
    pub conv2: Conv2d<B>,
    pub bn2: BatchNorm2d<B>,
    pub downsample: Option<Downsample<B>>,
}

impl<B: Backend> BasicBlock<B> {
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let identity = shortcut(self.downsample.as_ref(), x.clone());
        let out = conv_bn(&self.conv1, &self.bn1, x, Then::Relu);
        conv_bn(&self.conv2, &self.bn2, out, Then::AddRelu(identity))
    }
}

/// 1x1 reduce, 3x3 (grouped in ResNeXt), 1x1 expand, with the stride on the 3x3 ("ResNet
/// v1.5", as torchvision).
#[derive(Module, Debug)]
pub struct Bottleneck<B: Backend> {
    pub conv1: Conv2d<B>,
    pub bn1: BatchNorm2d<B>,
    pub conv2: Conv2d<B>,
    pub bn2: BatchNorm2d<B>,
    pub conv3: Conv2d<B>,
    pub bn3: BatchNorm2d<B>,
    pub downsample: Option<Downsample<B>>,
}

impl<B: Backend> Bottleneck<B> {
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let identity = shortcut(self.downsample.as_ref(), x.clone());
        let out = conv_bn(&self.conv1, &self.bn1, x, Then::Relu);
        let out = conv_bn(&self.conv2, &self.bn2, out, Then::Relu);
        conv_bn(&self.conv3, &self.bn3, out, Then::AddRelu(identity))
    }
}

/// One residual block of either kind.
#[allow(clippy::large_enum_variant)] // a model holds a few dozen; boxing buys nothing
#[derive(Module, Debug)]
pub enum Block<B: Backend> {
    Basic(BasicBlock<B>),
    Bottleneck(Bottleneck<B>),
}

impl<B: Backend> Block<B> {
    fn new(
        kind: BlockKind,
        in_channels: usize,
        planes: usize,
        stride: usize,
        config: &ResNetConfig,
        device: &B::Device,
    ) -> Self {
        let out_channels = planes * kind.expansion();
        let downsample = (stride != 1 || in_channels != out_channels)
            .then(|| Downsample::new(in_channels, out_channels, stride, config.avg_down, device));
        let zero_init = config.zero_init_residual;
        let bn = |channels, last| BatchNorm2d::new(channels, last && zero_init, device);
        match kind {
            BlockKind::Basic => Block::Basic(BasicBlock {
                conv1: conv(in_channels, planes, 3, stride, 1, device),
                bn1: bn(planes, false),
                conv2: conv(planes, planes, 3, 1, 1, device),
                bn2: bn(planes, true),
                downsample,
            }),
            BlockKind::Bottleneck => {
                let inner = config.inner_width(planes);
                let groups = config.groups_at_width();
                Block::Bottleneck(Bottleneck {
                    conv1: conv(in_channels, inner, 1, 1, 0, device),
                    bn1: bn(inner, false),
                    conv2: grouped_conv(inner, inner, 3, stride, 1, groups, device),
                    bn2: bn(inner, false),
                    conv3: conv(inner, out_channels, 1, 1, 0, device),
                    bn3: bn(out_channels, true),
                    downsample,
                })
            }
        }
    }

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        match self {
            Block::Basic(block) => block.forward(x),
            Block::Bottleneck(block) => block.forward(x),
        }
    }

    /// The block's batch norms with their names inside it (`bn1`, ...; the shortcut's is
    /// `downsample.bn`, kiln's module path), and its shortcut.
    fn batch_norms_mut(&mut self) -> Vec<(&'static str, &mut BatchNorm2d<B>)> {
        let (mut norms, downsample) = match self {
            Block::Basic(b) => (
                vec![("bn1", &mut b.bn1), ("bn2", &mut b.bn2)],
                &mut b.downsample,
            ),
            Block::Bottleneck(b) => (
                vec![
                    ("bn1", &mut b.bn1),
                    ("bn2", &mut b.bn2),
                    ("bn3", &mut b.bn3),
                ],
                &mut b.downsample,
            ),
        };
        if let Some(downsample) = downsample {
            norms.push(("downsample.bn", &mut downsample.bn));
        }
        norms
    }
}

/// A stage (torchvision's `layerN`): the first block may stride and widen, the rest keep shape.
fn make_stage<B: Backend>(
    kind: BlockKind,
    in_channels: usize,
    planes: usize,
    blocks: usize,
    stride: usize,
    config: &ResNetConfig,
    device: &B::Device,
) -> Vec<Block<B>> {
    let out_channels = planes * kind.expansion();
    (0..blocks)
        .map(|i| {
            let (input, stride) = if i == 0 {
                (in_channels, stride)
            } else {
                (out_channels, 1)
            };
            Block::new(kind, input, planes, stride, config, device)
        })
        .collect()
}

fn forward_stage<B: Backend>(stage: &[Block<B>], x: Tensor<B, 4>) -> Tensor<B, 4> {
    stage.iter().fold(x, |x, block| block.forward(x))
}

#[derive(Module, Debug)]
pub struct ResNet<B: Backend> {
    /// The deep stem's first two convolutions (timm's ResNet-D); `conv1` is its third.
    pub deep_stem: Option<DeepStem<B>>,
    pub conv1: Conv2d<B>,
    pub bn1: BatchNorm2d<B>,
    /// Present with the ImageNet and deep stems.
    pub maxpool: Option<MaxPool2d>,
    pub layer1: Vec<Block<B>>,
    pub layer2: Vec<Block<B>>,
    pub layer3: Vec<Block<B>>,
    pub layer4: Vec<Block<B>>,
    pub fc: Linear<B>,
    /// The float type of the convolutions (see [`Precision`]); parameters stay f32.
    #[module(skip)]
    pub precision: Precision,
}

impl<B: Backend> ResNet<B> {
    /// Images `[N, 3, H, W]` to logits `[N, num_classes]`.
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.precision.cast(images);
        let x = match &self.deep_stem {
            Some(stem) => stem.forward(x),
            None => x,
        };
        let x = conv_bn(&self.conv1, &self.bn1, x, Then::Relu);
        let x = match &self.maxpool {
            Some(pool) => pool.forward(x),
            None => x,
        };
        let x = forward_stage(&self.layer1, x);
        let x = forward_stage(&self.layer2, x);
        let x = forward_stage(&self.layer3, x);
        let x = forward_stage(&self.layer4, x);
        // Global average pool: torchvision's AdaptiveAvgPool2d((1, 1)) and flatten, in f32.
        let [n, c, _, _] = x.dims();
        let pooled = to_f32(x).mean_dim(3).mean_dim(2).reshape([n, c]);
        // cuBLAS's product on CUDA, burn's `Linear` elsewhere.
        let bias = self.fc.bias.as_ref().map(|b| b.val());
        kiln_kernels::linear(&pooled, &self.fc.weight.val(), bias.as_ref())
            .unwrap_or_else(|| self.fc.forward(pooled))
    }

    pub fn num_classes(&self) -> usize {
        self.fc.weight.dims()[1]
    }

    /// Whether the shortcuts average-pool (ResNet-D), which changes their weights' names.
    pub fn avg_down(&self) -> bool {
        let stages = [&self.layer1, &self.layer2, &self.layer3, &self.layer4];
        stages.into_iter().flatten().any(|block| {
            let downsample = match block {
                Block::Basic(b) => &b.downsample,
                Block::Bottleneck(b) => &b.downsample,
            };
            downsample.as_ref().is_some_and(|d| d.avg_pool)
        })
    }

    /// Computes the convolutions in `precision` from now on (see [`Precision`]).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// Freezes every batch norm (see [`BatchNorm2d::frozen`]).
    pub fn with_frozen_batch_norm(mut self) -> Self {
        self.set_batch_norm_frozen(|_| true);
        self
    }

    /// Freezes the batch norms for which `frozen` (given the module's name in the weight files:
    /// `bn1`, `layer1.0.bn2`, `layer2.0.downsample.1`, timm's `conv1.1` and
    /// `layer2.0.downsample.2` in a ResNet-D) says so, and unfreezes the others.
    pub fn set_batch_norm_frozen(&mut self, frozen: impl Fn(&str) -> bool) {
        let names = crate::weights::Names::of(self);
        for (path, norm) in self.batch_norms_mut() {
            norm.frozen = frozen(&names.torch_module(&path));
        }
    }

    /// Every batch norm with its module path in kiln (`bn1`, `layer2.0.downsample.bn`,
    /// `deep_stem.bn1`).
    fn batch_norms_mut(&mut self) -> Vec<(String, &mut BatchNorm2d<B>)> {
        let mut norms = Vec::new();
        if let Some(stem) = &mut self.deep_stem {
            norms.push(("deep_stem.bn1".to_string(), &mut stem.bn1));
            norms.push(("deep_stem.bn2".to_string(), &mut stem.bn2));
        }
        norms.push(("bn1".to_string(), &mut self.bn1));
        let stages = [
            &mut self.layer1,
            &mut self.layer2,
            &mut self.layer3,
            &mut self.layer4,
        ];
        for (stage_index, stage) in stages.into_iter().enumerate() {
            for (index, block) in stage.iter_mut().enumerate() {
                for (name, norm) in block.batch_norms_mut() {
                    norms.push((format!("layer{}.{index}.{name}", stage_index + 1), norm));
                }
            }
        }
        norms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::Distribution;

    type B = Flex;

    #[test]
    fn every_depth_maps_images_to_logits() {
        let device = Default::default();
        for depth in [18, 34, 50, 101, 152] {
            for stem in [Stem::Imagenet, Stem::Cifar] {
                let model = ResNetConfig::new(depth)
                    .with_num_classes(7)
                    .with_width(2)
                    .with_stem(stem)
                    .init::<B>(&device)
                    .unwrap();
                let images = Tensor::<B, 4>::random([2, 3, 32, 32], Distribution::Default, &device);
                assert_eq!(
                    model.forward(images).dims(),
                    [2, 7],
                    "resnet{depth} {stem:?}"
                );
            }
        }
    }

    /// Inference on flex runs each convolution, its batch norm, the residual and ReLU as one
    /// operation (`conv_bn`); an autodiff model with frozen batch norm composes burn's operations
    /// for the same arithmetic. Running statistics moved off their defaults by two training
    /// passes, so that the fold is exercised; ResNet-50 at 64x64 reaches 1x1 convolutions on
    /// 16x16 maps (multiplied in place), ResNet-18's CIFAR stem the 3x3 ones on 32x32.
    #[test]
    fn inference_in_one_pass_matches_burns_operations() {
        use burn::backend::Autodiff;
        use burn::module::AutodiffModule;
        use burn::tensor::Tolerance;
        let device = Default::default();
        for (depth, stem, size) in [(50, Stem::Imagenet, 64), (18, Stem::Cifar, 32)] {
            let model = ResNetConfig::new(depth)
                .with_num_classes(5)
                .with_width(4)
                .with_stem(stem)
                .init::<Autodiff<B>>(&device)
                .unwrap();
            let images = |seed: u64| {
                <Autodiff<B> as Backend>::seed(&device, seed);
                Tensor::random([3, 3, size, size], Distribution::Default, &device)
            };
            for seed in [1, 2] {
                let _ = model.forward(images(seed));
            }
            let x = images(3);
            let fused = model.valid().forward(x.clone().inner());
            let composed = model.with_frozen_batch_norm().forward(x).inner();
            fused
                .into_data()
                .assert_approx_eq::<f32>(&composed.into_data(), Tolerance::rel_abs(1e-4, 1e-5));
        }
    }

    #[test]
    fn stems_shrink_inputs_as_torchvision() {
        let device = Default::default();
        let model = ResNetConfig::new(18)
            .with_width(4)
            .init::<B>(&device)
            .unwrap();
        assert!(model.maxpool.is_some());
        assert_eq!(model.conv1.weight.dims(), [4, 3, 7, 7]);
        let cifar = ResNetConfig::new(18)
            .with_width(4)
            .with_stem(Stem::Cifar)
            .init::<B>(&device)
            .unwrap();
        assert!(cifar.maxpool.is_none());
        assert_eq!(cifar.conv1.weight.dims(), [4, 3, 3, 3]);
    }

    #[test]
    fn zero_init_residual_zeroes_each_blocks_last_batch_norm() {
        let device = Default::default();
        let model = ResNetConfig::new(50)
            .with_width(2)
            .with_zero_init_residual(true)
            .init::<B>(&device)
            .unwrap();
        for block in model.layer1.iter().chain(&model.layer4) {
            let Block::Bottleneck(b) = block else {
                panic!("resnet50 has bottleneck blocks")
            };
            assert_eq!(b.bn3.weight.val().sum().into_scalar(), 0.0);
            assert_eq!(b.bn1.weight.val().min().into_scalar(), 1.0);
        }
    }

    #[test]
    fn convolutions_use_kaiming_normal_fan_out() {
        let device = Default::default();
        let model = ResNetConfig::new(18).init::<B>(&device).unwrap();
        let Block::Basic(block) = &model.layer3[1] else {
            panic!("resnet18 has basic blocks")
        };
        // 256 output channels * 3 * 3: std = sqrt(2 / 2304).
        let w = block.conv2.weight.val();
        let n = w.shape().num_elements() as f64;
        let mean = w.clone().sum().into_scalar() as f64 / n;
        let std = ((w.powi_scalar(2).sum().into_scalar() as f64 / n) - mean * mean).sqrt();
        let expected = (2.0f64 / 2304.0).sqrt();
        assert!(
            (std / expected - 1.0).abs() < 0.02,
            "std {std}, expected {expected}"
        );
    }

    /// Every name kiln builds resolves to a config that names itself so, and maps images to
    /// logits at a small width with every stem.
    #[test]
    fn the_family_resolves_by_name_and_runs() {
        let device = Default::default();
        for name in MODEL_NAMES {
            let config = ResNetConfig::from_name(name).unwrap();
            assert_eq!(config.name(), name);
            for stem in [Stem::Imagenet, Stem::Cifar] {
                let model = ResNetConfig::from_name(name)
                    .unwrap()
                    .with_num_classes(3)
                    .with_width(8)
                    .with_input_stem(stem)
                    .init::<B>(&device)
                    .unwrap();
                let images = Tensor::<B, 4>::random([2, 3, 32, 32], Distribution::Default, &device);
                assert_eq!(model.forward(images).dims(), [2, 3], "{name} {stem:?}");
            }
        }
        for name in [
            "resnext50_4x4d",
            "resnext18_32x4d",
            "wide_resnet34_2",
            "resnet20d",
            "resnet50x",
        ] {
            assert!(ResNetConfig::from_name(name).is_err(), "{name}");
        }
    }

    /// torchvision's ResNeXt and Wide ResNet Bottlenecks: inner widths and groups at full size,
    /// and the groups scaled with a narrower width.
    #[test]
    fn resnext_and_wide_resnet_have_torchvisions_blocks() {
        let device = Default::default();
        let bottleneck = |model: &ResNet<B>, stage: usize| match &[
            &model.layer1,
            &model.layer2,
            &model.layer3,
            &model.layer4,
        ][stage][0]
        {
            Block::Bottleneck(b) => (b.conv2.weight.dims(), b.conv2.groups, b.conv3.weight.dims()),
            Block::Basic(_) => panic!("bottleneck blocks"),
        };
        let model = ResNetConfig::from_name("resnext50_32x4d")
            .unwrap()
            .init::<B>(&device)
            .unwrap();
        assert_eq!(
            bottleneck(&model, 0),
            ([128, 4, 3, 3], 32, [256, 128, 1, 1])
        );
        assert_eq!(
            bottleneck(&model, 3),
            ([1024, 32, 3, 3], 32, [2048, 1024, 1, 1])
        );
        let wide = ResNetConfig::from_name("wide_resnet50_2")
            .unwrap()
            .with_width(8)
            .init::<B>(&device)
            .unwrap();
        assert_eq!(bottleneck(&wide, 0), ([16, 16, 3, 3], 1, [32, 16, 1, 1]));
        // Width 16: 8 groups of 4 channels in layer 1, as 32 groups of 4 at width 64.
        let narrow = ResNetConfig::from_name("resnext50_32x4d")
            .unwrap()
            .with_width(16)
            .init::<B>(&device)
            .unwrap();
        assert_eq!(bottleneck(&narrow, 0), ([32, 4, 3, 3], 8, [64, 32, 1, 1]));
        assert_eq!(
            bottleneck(&narrow, 3),
            ([256, 32, 3, 3], 8, [512, 256, 1, 1])
        );
    }

    /// timm's ResNet-D: the deep stem of half-width 3x3 convolutions, and shortcuts that
    /// average-pool before their stride-1 1x1 convolution.
    #[test]
    fn resnet_d_has_timms_stem_and_shortcuts() {
        let device = Default::default();
        let model = ResNetConfig::from_name("resnet50d")
            .unwrap()
            .init::<B>(&device)
            .unwrap();
        let stem = model.deep_stem.as_ref().expect("a deep stem");
        assert_eq!(stem.conv1.weight.dims(), [32, 3, 3, 3]);
        assert_eq!(stem.conv1.stride, [2, 2]);
        assert_eq!(stem.conv2.weight.dims(), [32, 32, 3, 3]);
        assert_eq!(model.conv1.weight.dims(), [64, 32, 3, 3]);
        assert!(model.maxpool.is_some() && model.avg_down());
        let Block::Bottleneck(block) = &model.layer2[0] else {
            panic!("bottleneck blocks")
        };
        let downsample = block.downsample.as_ref().unwrap();
        assert!(downsample.avg_pool && downsample.stride == 2);
        assert_eq!(downsample.conv.stride, [1, 1]);
        // An odd map pools to its half rounded up, as the strided 3x3 beside it.
        let images = Tensor::<B, 4>::random([1, 3, 97, 97], Distribution::Default, &device);
        let small = ResNetConfig::from_name("resnet18d")
            .unwrap()
            .with_width(4)
            .init::<B>(&device)
            .unwrap();
        assert_eq!(small.forward(images).dims(), [1, 1000]);
    }

    #[test]
    fn widths_the_family_cannot_take_are_refused_in_one_line() {
        let device = Default::default();
        let err = |name: &str, width: usize| {
            ResNetConfig::from_name(name)
                .unwrap()
                .with_width(width)
                .init::<B>(&device)
                .unwrap_err()
                .to_string()
        };
        let message = err("resnext50_32x4d", 3);
        assert!(
            message.contains("resnext50_32x4d") && message.contains("multiple of 2"),
            "{message}"
        );
        let message = err("resnet50d", 5);
        assert!(message.contains("even width"), "{message}");
        let basic = ResNetConfig::new(18).with_groups(2).init::<B>(&device);
        assert!(basic.unwrap_err().to_string().contains("BasicBlock"));
    }

    #[test]
    fn names_resolve_and_unknown_depths_are_refused() {
        assert_eq!(ResNetConfig::from_name("resnet101").unwrap().depth, 101);
        assert!(ResNetConfig::from_name("resnet19").is_err());
        assert!(ResNetConfig::from_name("vgg16").is_err());
        let err = ResNetConfig::new(20)
            .init::<B>(&Default::default())
            .unwrap_err();
        assert!(err.to_string().contains("18, 26, 34, 50, 101, 152 or 200"));
    }
}
