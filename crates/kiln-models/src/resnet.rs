//! ResNet as torchvision's `resnet.py` builds it: a block, a stage, a network.
//!
//! Field names are torchvision's (`conv1`, `bn1`, `layer1`, `downsample`, `fc`), so weight files
//! map onto the model by name.

use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Initializer, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::{Tensor, backend::Backend, s};
use serde::{Deserialize, Serialize};

use crate::ModelError;
use crate::batch_norm::BatchNorm2d;
use crate::precision::{Precision, convolve, kiln_options, to_f32};

/// The first layers: torchvision's ImageNet stem, or the CIFAR one for 32x32 inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Stem {
    /// 7x7 stride-2 convolution and a 3x3 stride-2 max-pool: inputs shrink 4x.
    #[default]
    Imagenet,
    /// 3x3 stride-1 convolution, no max-pool: the usual choice for 32x32 inputs.
    Cifar,
}

/// Which of torchvision's five ResNets.
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

/// The block type and blocks per stage of a depth, as torchvision defines them.
pub fn architecture(depth: usize) -> Result<(BlockKind, [usize; 4]), ModelError> {
    match depth {
        18 => Ok((BlockKind::Basic, [2, 2, 2, 2])),
        34 => Ok((BlockKind::Basic, [3, 4, 6, 3])),
        50 => Ok((BlockKind::Bottleneck, [3, 4, 6, 3])),
        101 => Ok((BlockKind::Bottleneck, [3, 4, 23, 3])),
        152 => Ok((BlockKind::Bottleneck, [3, 8, 36, 3])),
        other => Err(ModelError::UnknownDepth(other)),
    }
}

#[derive(Config, Debug, PartialEq)]
pub struct ResNetConfig {
    /// 18, 34, 50, 101 or 152.
    pub depth: usize,
    #[config(default = 1000)]
    pub num_classes: usize,
    #[config(default = "Stem::Imagenet")]
    pub stem: Stem,
    /// Channels of the first stage; torchvision's 64. Smaller values give the same structure
    /// with fewer parameters (tests use 4 or 8).
    #[config(default = 64)]
    pub width: usize,
    /// Start each residual branch's last batch norm at zero, so every block begins as the
    /// identity (torchvision's `zero_init_residual`).
    #[config(default = false)]
    pub zero_init_residual: bool,
    /// Batch norm with fixed running statistics (see [`BatchNorm2d::frozen`]).
    #[config(default = false)]
    pub freeze_batch_norm: bool,
}

impl ResNetConfig {
    /// `resnet18`, `resnet50`, ... as torchvision names them.
    pub fn from_name(name: &str) -> Result<Self, ModelError> {
        let depth = name
            .strip_prefix("resnet")
            .and_then(|d| d.parse::<usize>().ok())
            .ok_or_else(|| ModelError::UnknownModel(name.to_string()))?;
        architecture(depth).map_err(|_| ModelError::UnknownModel(name.to_string()))?;
        Ok(Self::new(depth))
    }

    pub fn name(&self) -> String {
        format!("resnet{}", self.depth)
    }

    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<ResNet<B>, ModelError> {
        let (kind, blocks) = architecture(self.depth)?;
        if self.num_classes == 0 || self.width == 0 {
            return Err(ModelError::ZeroSize {
                num_classes: self.num_classes,
                width: self.width,
            });
        }
        let width = self.width;
        let conv1 = match self.stem {
            Stem::Imagenet => conv(3, width, 7, 2, 3, device),
            Stem::Cifar => conv(3, width, 3, 1, 1, device),
        };
        let maxpool = (self.stem == Stem::Imagenet).then(|| {
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

/// A bias-free convolution with torchvision's init: Kaiming normal, fan-out, ReLU gain.
fn conv<B: Backend>(
    in_channels: usize,
    out_channels: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    device: &B::Device,
) -> Conv2d<B> {
    Conv2dConfig::new([in_channels, out_channels], [kernel, kernel])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(
            padding, padding, padding, padding,
        ))
        .with_bias(false)
        .with_initializer(Initializer::KaimingNormal {
            gain: 2f64.sqrt(),
            fan_out_only: true,
        })
        .init(device)
}

/// The strided 1x1 convolution and batch norm that match a block's shortcut to its output.
///
/// The stride is applied by taking every `stride`-th pixel before a stride-1 convolution, which
/// is the same function. burn 0.21's wgpu backend computes the input gradient of a strided 1x1
/// convolution wrongly for small channel counts (measured: 4 -> 8 channels on 8x8), and this
/// form is exact on every backend.
#[derive(Module, Debug)]
pub struct Downsample<B: Backend> {
    pub conv: Conv2d<B>,
    pub bn: BatchNorm2d<B>,
    pub stride: usize,
}

impl<B: Backend> Downsample<B> {
    fn new(in_channels: usize, out_channels: usize, stride: usize, device: &B::Device) -> Self {
        Self {
            conv: conv(in_channels, out_channels, 1, 1, 0, device),
            bn: BatchNorm2d::new(out_channels, false, device),
            stride,
        }
    }

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let x = match self.stride {
            1 => x,
            s => x.slice(s![.., .., ..;s as isize, ..;s as isize]),
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

/// 1x1 reduce, 3x3, 1x1 expand, with the stride on the 3x3 ("ResNet v1.5", as torchvision).
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
        zero_init_residual: bool,
        device: &B::Device,
    ) -> Self {
        let out_channels = planes * kind.expansion();
        let downsample = (stride != 1 || in_channels != out_channels)
            .then(|| Downsample::new(in_channels, out_channels, stride, device));
        let bn = |channels, last| BatchNorm2d::new(channels, last && zero_init_residual, device);
        match kind {
            BlockKind::Basic => Block::Basic(BasicBlock {
                conv1: conv(in_channels, planes, 3, stride, 1, device),
                bn1: bn(planes, false),
                conv2: conv(planes, planes, 3, 1, 1, device),
                bn2: bn(planes, true),
                downsample,
            }),
            BlockKind::Bottleneck => Block::Bottleneck(Bottleneck {
                conv1: conv(in_channels, planes, 1, 1, 0, device),
                bn1: bn(planes, false),
                conv2: conv(planes, planes, 3, stride, 1, device),
                bn2: bn(planes, false),
                conv3: conv(planes, out_channels, 1, 1, 0, device),
                bn3: bn(out_channels, true),
                downsample,
            }),
        }
    }

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        match self {
            Block::Basic(block) => block.forward(x),
            Block::Bottleneck(block) => block.forward(x),
        }
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
            Block::new(
                kind,
                input,
                planes,
                stride,
                config.zero_init_residual,
                device,
            )
        })
        .collect()
}

fn forward_stage<B: Backend>(stage: &[Block<B>], x: Tensor<B, 4>) -> Tensor<B, 4> {
    stage.iter().fold(x, |x, block| block.forward(x))
}

#[derive(Module, Debug)]
pub struct ResNet<B: Backend> {
    pub conv1: Conv2d<B>,
    pub bn1: BatchNorm2d<B>,
    /// Present with the ImageNet stem only.
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

    /// Freezes the batch norms for which `frozen` (given torchvision's module name: `bn1`,
    /// `layer1.0.bn2`, `layer2.0.downsample.1`) says so, and unfreezes the others.
    pub fn set_batch_norm_frozen(&mut self, frozen: impl Fn(&str) -> bool) {
        self.bn1.frozen = frozen("bn1");
        let stages = [
            &mut self.layer1,
            &mut self.layer2,
            &mut self.layer3,
            &mut self.layer4,
        ];
        for (stage_index, stage) in stages.into_iter().enumerate() {
            for (index, block) in stage.iter_mut().enumerate() {
                let prefix = format!("layer{}.{index}", stage_index + 1);
                let (norms, downsample) = match block {
                    Block::Basic(b) => (vec![&mut b.bn1, &mut b.bn2], &mut b.downsample),
                    Block::Bottleneck(b) => {
                        (vec![&mut b.bn1, &mut b.bn2, &mut b.bn3], &mut b.downsample)
                    }
                };
                for (i, norm) in norms.into_iter().enumerate() {
                    norm.frozen = frozen(&format!("{prefix}.bn{}", i + 1));
                }
                if let Some(downsample) = downsample {
                    downsample.bn.frozen = frozen(&format!("{prefix}.downsample.1"));
                }
            }
        }
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

    #[test]
    fn names_resolve_and_unknown_depths_are_refused() {
        assert_eq!(ResNetConfig::from_name("resnet101").unwrap().depth, 101);
        assert!(ResNetConfig::from_name("resnet19").is_err());
        assert!(ResNetConfig::from_name("vgg16").is_err());
        let err = ResNetConfig::new(20)
            .init::<B>(&Default::default())
            .unwrap_err();
        assert!(err.to_string().contains("18, 34, 50, 101 or 152"));
    }
}
