//! What a ResNet holds and computes, counted from its config without building it: the figures
//! that memory planning (`kiln plan`) multiplies by bytes per element and images per batch, and
//! the per-stage table of `kiln summary`.

use serde::Serialize;

use crate::ModelError;
use crate::resnet::{BlockKind, ResNetConfig, Stem};

/// Element counts of one network at one input size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Trainable parameters: what gradients and optimizer state are sized by.
    pub parameters: u64,
    /// Batch-norm running statistics.
    pub buffers: u64,
    /// Elements of every layer's output (convolution, batch norm, ReLU, max pool, residual sum)
    /// for one image: the activations that training keeps for the backward pass, give or take
    /// what a backend frees early.
    pub activations_per_image: u64,
}

/// A network stage by stage: the stem, `layer1` to `layer4`, and the head (pooling and the
/// classifier), as torchvision names them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub model: String,
    /// Channels, height, width.
    pub input: [usize; 3],
    pub stages: Vec<StageFootprint>,
    pub parameters: u64,
    pub buffers: u64,
    /// Multiply-adds of one image's forward pass (convolutions and the classifier), the figure
    /// torchvision publishes as its models' "GFLOPS".
    pub mult_adds: u64,
    pub activations_per_image: u64,
}

/// What one stage adds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StageFootprint {
    pub name: String,
    /// Channels, height, width of the stage's output.
    pub output: [usize; 3],
    pub parameters: u64,
    pub mult_adds: u64,
    pub activations_per_image: u64,
}

impl ResNetConfig {
    /// Counts the network for `height` x `width` inputs, layer by layer as `init` and `forward`
    /// build and run it.
    pub fn footprint(&self, height: usize, width: usize) -> Result<Footprint, ModelError> {
        let summary = self.summary(height, width)?;
        Ok(Footprint {
            parameters: summary.parameters,
            buffers: summary.buffers,
            activations_per_image: summary.activations_per_image,
        })
    }

    /// The network for `height` x `width` inputs, stage by stage.
    pub fn summary(&self, height: usize, width: usize) -> Result<Summary, ModelError> {
        // What `init` refuses is refused here too, before anything is counted.
        let (kind, blocks) = self.check()?;
        let mut walk = Walk {
            height,
            width,
            ..Walk::default()
        };
        let stem = self.width;
        match self.stem {
            Stem::Imagenet => walk.conv(3, stem, 7, 2, 3, 1),
            Stem::Cifar => walk.conv(3, stem, 3, 1, 1, 1),
            Stem::Deep => {
                let half = stem / 2;
                walk.conv(3, half, 3, 2, 1, 1);
                walk.batch_norm(half);
                walk.relu(half);
                walk.conv(half, half, 3, 1, 1, 1);
                walk.batch_norm(half);
                walk.relu(half);
                walk.conv(half, stem, 3, 1, 1, 1);
            }
        }
        walk.batch_norm(stem);
        walk.relu(stem);
        if self.stem != Stem::Cifar {
            walk.max_pool(stem);
        }
        walk.end_stage("stem", stem);
        let mut channels = stem;
        for (index, &count) in blocks.iter().enumerate() {
            let planes = stem << index;
            for block in 0..count {
                let stride = if index > 0 && block == 0 { 2 } else { 1 };
                channels = walk.block(self, kind, channels, planes, stride);
            }
            walk.end_stage(&format!("layer{}", index + 1), channels);
        }
        // Global average pool and the classifier.
        walk.parameters += (channels * self.num_classes + self.num_classes) as u64;
        walk.mult_adds += (channels * self.num_classes) as u64;
        walk.activations += (channels + self.num_classes) as u64;
        (walk.height, walk.width) = (1, 1);
        walk.end_stage("head", self.num_classes);
        Ok(Summary {
            model: self.name(),
            input: [3, height, width],
            stages: walk.stages,
            parameters: walk.parameters,
            buffers: walk.buffers,
            mult_adds: walk.mult_adds,
            activations_per_image: walk.activations,
        })
    }
}

/// The running totals, the current feature-map size and the stages counted so far.
#[derive(Default)]
struct Walk {
    height: usize,
    width: usize,
    parameters: u64,
    buffers: u64,
    mult_adds: u64,
    activations: u64,
    stages: Vec<StageFootprint>,
}

impl Walk {
    fn map(&self, channels: usize) -> u64 {
        (channels * self.height * self.width) as u64
    }

    fn conv(
        &mut self,
        input: usize,
        output: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        groups: usize,
    ) {
        let shrink = |side: usize| (side + 2 * padding - kernel) / stride + 1;
        self.height = shrink(self.height);
        self.width = shrink(self.width);
        let weights = (input / groups * output * kernel * kernel) as u64;
        self.parameters += weights;
        self.mult_adds += weights * (self.height * self.width) as u64;
        self.activations += self.map(output);
    }

    fn batch_norm(&mut self, channels: usize) {
        self.parameters += 2 * channels as u64;
        self.buffers += 2 * channels as u64 + 1;
        self.activations += self.map(channels);
    }

    fn relu(&mut self, channels: usize) {
        self.activations += self.map(channels);
    }

    /// 3x3, stride 2, padding 1.
    fn max_pool(&mut self, channels: usize) {
        self.height = (self.height - 1) / 2 + 1;
        self.width = (self.width - 1) / 2 + 1;
        self.activations += self.map(channels);
    }

    /// Closes a stage with `channels` outputs: what it added since the stage before.
    fn end_stage(&mut self, name: &str, channels: usize) {
        let before = |f: fn(&StageFootprint) -> u64| self.stages.iter().map(f).sum::<u64>();
        let stage = StageFootprint {
            name: name.to_string(),
            output: [channels, self.height, self.width],
            parameters: self.parameters - before(|s| s.parameters),
            mult_adds: self.mult_adds - before(|s| s.mult_adds),
            activations_per_image: self.activations - before(|s| s.activations_per_image),
        };
        self.stages.push(stage);
    }

    /// 2x2 average pool with `stride`, rounding up (ResNet-D's shortcut).
    fn avg_pool(&mut self, channels: usize, stride: usize) {
        self.height = self.height.saturating_sub(2).div_ceil(stride) + 1;
        self.width = self.width.saturating_sub(2).div_ceil(stride) + 1;
        self.activations += self.map(channels);
    }

    /// One residual block; returns its output channels.
    fn block(
        &mut self,
        config: &ResNetConfig,
        kind: BlockKind,
        input: usize,
        planes: usize,
        stride: usize,
    ) -> usize {
        let output = planes * kind.expansion();
        let (height, width) = (self.height, self.width);
        match kind {
            BlockKind::Basic => {
                self.conv(input, planes, 3, stride, 1, 1);
                self.batch_norm(planes);
                self.relu(planes);
                self.conv(planes, planes, 3, 1, 1, 1);
                self.batch_norm(planes);
            }
            BlockKind::Bottleneck => {
                let inner = config.inner_width(planes);
                self.conv(input, inner, 1, 1, 0, 1);
                self.batch_norm(inner);
                self.relu(inner);
                self.conv(inner, inner, 3, stride, 1, config.groups_at_width());
                self.batch_norm(inner);
                self.relu(inner);
                self.conv(inner, output, 1, 1, 0, 1);
                self.batch_norm(output);
            }
        }
        if stride != 1 || input != output {
            let (after_height, after_width) = (self.height, self.width);
            (self.height, self.width) = (height, width);
            if config.avg_down && stride != 1 {
                self.avg_pool(input, stride);
                self.conv(input, output, 1, 1, 0, 1);
            } else {
                self.conv(input, output, 1, stride, 0, 1);
            }
            self.batch_norm(output);
            (self.height, self.width) = (after_height, after_width);
        }
        // The residual sum and the last ReLU.
        self.activations += 2 * self.map(output);
        output
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::module::Module;

    #[test]
    fn parameters_and_buffers_are_those_of_the_built_network() {
        for depth in [18, 34, 50, 101, 152] {
            for stem in [Stem::Imagenet, Stem::Cifar] {
                let config = ResNetConfig::new(depth)
                    .with_width(8)
                    .with_num_classes(7)
                    .with_stem(stem);
                let model = config.init::<Flex>(&Default::default()).unwrap();
                let counted = config.footprint(32, 32).unwrap();
                // burn counts batch norm's running statistics as parameters too.
                assert_eq!(
                    counted.parameters + counted.buffers,
                    model.num_params() as u64,
                    "resnet{depth} {stem:?}"
                );
            }
        }
    }

    /// Every named network of the family, counted and built, at a small width and all stems.
    #[test]
    fn the_familys_counts_are_those_of_the_built_networks() {
        for name in crate::MODEL_NAMES {
            for stem in [Stem::Imagenet, Stem::Cifar] {
                let config = ResNetConfig::from_name(name)
                    .unwrap()
                    .with_width(8)
                    .with_num_classes(7)
                    .with_input_stem(stem);
                let model = config.init::<Flex>(&Default::default()).unwrap();
                let counted = config.footprint(32, 32).unwrap();
                assert_eq!(
                    counted.parameters + counted.buffers,
                    model.num_params() as u64,
                    "{name} {stem:?}"
                );
            }
        }
    }

    /// Parameters and multiply-adds of torchvision's `resnet.py` and timm's ResNet-D at full
    /// size, as PyTorch counts them (parameters; each convolution's output elements times its
    /// `in_channels / groups * kh * kw`, and the classifier's product, by forward hooks, torch
    /// 2.15, torchvision 0.29, timm 1.0.31). At 225 the ResNet-D's shortcuts pool odd maps,
    /// rounding up.
    #[test]
    fn the_family_has_torchvisions_and_timms_counts() {
        for (name, size, parameters, mult_adds) in [
            ("resnext50_32x4d", 224, 25_028_904, 4_230_479_872),
            ("resnext101_32x8d", 224, 88_791_336, 16_414_015_488),
            ("resnext101_64x4d", 224, 83_455_272, 15_460_270_080),
            ("wide_resnet50_2", 224, 68_883_240, 11_398_021_120),
            ("wide_resnet101_2", 224, 126_886_696, 22_753_050_624),
            ("resnet18d", 224, 11_708_744, 2_053_713_920),
            ("resnet18d", 225, 11_708_744, 2_293_322_592),
            ("resnet26", 224, 15_995_176, 2_342_256_640),
            ("resnet26d", 224, 16_014_408, 2_581_897_216),
            ("resnet26d", 225, 16_014_408, 2_888_020_832),
            ("resnet50d", 224, 25_576_264, 4_328_824_832),
            ("resnet50d", 225, 25_576_264, 4_870_652_768),
            ("resnet200d", 224, 64_693_064, 15_247_122_432),
            ("resnet200d", 225, 64_693_064, 17_075_749_728),
        ] {
            let summary = ResNetConfig::from_name(name)
                .unwrap()
                .summary(size, size)
                .unwrap();
            assert_eq!(summary.model, name);
            assert_eq!(
                (summary.parameters, summary.mult_adds),
                (parameters, mult_adds),
                "{name} at {size}"
            );
        }
        // timm's resnet200 (no pretrained weights, the 200-layer network without ResNet-D).
        let resnet200 = ResNetConfig::from_name("resnet200").unwrap();
        assert_eq!(resnet200.summary(224, 224).unwrap().parameters, 64_673_832);
    }

    #[test]
    fn full_size_networks_have_torchvisions_parameter_counts() {
        // torchvision: resnet18 11,689,512 and resnet50 25,557,032 parameters.
        let count = |depth| {
            ResNetConfig::new(depth)
                .footprint(224, 224)
                .unwrap()
                .parameters
        };
        assert_eq!(count(18), 11_689_512);
        assert_eq!(count(50), 25_557_032);
    }

    /// torchvision's parameter counts and its published "GFLOPS" (multiply-adds at 224, to two
    /// decimals) for the five depths; the stages add up to the totals.
    #[test]
    fn summaries_have_torchvisions_parameters_and_multiply_adds() {
        for (depth, parameters, giga_mult_adds) in [
            (18, 11_689_512, 1.81),
            (34, 21_797_672, 3.66),
            (50, 25_557_032, 4.09),
            (101, 44_549_160, 7.80),
            (152, 60_192_808, 11.51),
        ] {
            let summary = ResNetConfig::new(depth).summary(224, 224).unwrap();
            assert_eq!(summary.parameters, parameters, "resnet{depth}");
            let giga = summary.mult_adds as f64 / 1e9;
            assert!(
                (giga - giga_mult_adds).abs() < 0.005,
                "resnet{depth}: {giga}"
            );
            let names: Vec<&str> = summary.stages.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(
                names,
                ["stem", "layer1", "layer2", "layer3", "layer4", "head"]
            );
            let sum = |f: fn(&StageFootprint) -> u64| summary.stages.iter().map(f).sum::<u64>();
            assert_eq!(sum(|s| s.parameters), summary.parameters);
            assert_eq!(sum(|s| s.mult_adds), summary.mult_adds);
            assert_eq!(
                sum(|s| s.activations_per_image),
                summary.activations_per_image
            );
            let expansion = if depth >= 50 { 4 } else { 1 };
            assert_eq!(summary.stages[0].output, [64, 56, 56]);
            assert_eq!(summary.stages[4].output, [512 * expansion, 7, 7]);
            assert_eq!(summary.stages[5].output, [1000, 1, 1]);
        }
    }

    #[test]
    fn activations_are_the_layer_outputs_and_grow_with_the_image_area() {
        // ResNet-18, CIFAR stem, 32x32: three maps of 64x32x32 in the stem, seven per block
        // (conv, bn, relu, conv, bn, sum, relu) and two per downsample; each later stage has
        // half the elements per map of the one before; then the pooled features and the logits.
        let config = ResNetConfig::new(18)
            .with_stem(Stem::Cifar)
            .with_num_classes(10);
        let map = 64 * 32 * 32;
        let expected = 3 * map + 14 * map + 16 * (map / 2 + map / 4 + map / 8) + 512 + 10;
        let small = config.footprint(32, 32).unwrap().activations_per_image;
        assert_eq!(small, expected as u64);
        let large = config.footprint(64, 64).unwrap().activations_per_image;
        assert_eq!(large - (512 + 10), 4 * (small - (512 + 10)));
    }
}
