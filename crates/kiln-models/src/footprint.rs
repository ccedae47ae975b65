//! What a ResNet holds in memory, counted from its config without building it: the figures
//! that memory planning (`kiln plan`) multiplies by bytes per element and images per batch.

use crate::ModelError;
use crate::resnet::{BlockKind, ResNetConfig, Stem, architecture};

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

impl ResNetConfig {
    /// Counts the network for `height` x `width` inputs, layer by layer as `init` and `forward`
    /// build and run it.
    pub fn footprint(&self, height: usize, width: usize) -> Result<Footprint, ModelError> {
        let (kind, blocks) = architecture(self.depth)?;
        let mut walk = Walk {
            height,
            width,
            parameters: 0,
            buffers: 0,
            activations: 0,
        };
        let stem = self.width;
        match self.stem {
            Stem::Imagenet => walk.conv(3, stem, 7, 2, 3),
            Stem::Cifar => walk.conv(3, stem, 3, 1, 1),
        }
        walk.batch_norm(stem);
        walk.relu(stem);
        if self.stem == Stem::Imagenet {
            walk.max_pool(stem);
        }
        let mut channels = stem;
        for (index, &count) in blocks.iter().enumerate() {
            let planes = stem << index;
            for block in 0..count {
                let stride = if index > 0 && block == 0 { 2 } else { 1 };
                channels = walk.block(kind, channels, planes, stride);
            }
        }
        // Global average pool and the classifier.
        walk.parameters += (channels * self.num_classes + self.num_classes) as u64;
        walk.activations += (channels + self.num_classes) as u64;
        Ok(Footprint {
            parameters: walk.parameters,
            buffers: walk.buffers,
            activations_per_image: walk.activations,
        })
    }
}

/// The running totals and the current feature-map size.
struct Walk {
    height: usize,
    width: usize,
    parameters: u64,
    buffers: u64,
    activations: u64,
}

impl Walk {
    fn map(&self, channels: usize) -> u64 {
        (channels * self.height * self.width) as u64
    }

    fn conv(&mut self, input: usize, output: usize, kernel: usize, stride: usize, padding: usize) {
        let shrink = |side: usize| (side + 2 * padding - kernel) / stride + 1;
        self.height = shrink(self.height);
        self.width = shrink(self.width);
        self.parameters += (input * output * kernel * kernel) as u64;
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

    /// One residual block; returns its output channels.
    fn block(&mut self, kind: BlockKind, input: usize, planes: usize, stride: usize) -> usize {
        let output = planes * kind.expansion();
        let (height, width) = (self.height, self.width);
        match kind {
            BlockKind::Basic => {
                self.conv(input, planes, 3, stride, 1);
                self.batch_norm(planes);
                self.relu(planes);
                self.conv(planes, planes, 3, 1, 1);
                self.batch_norm(planes);
            }
            BlockKind::Bottleneck => {
                self.conv(input, planes, 1, 1, 0);
                self.batch_norm(planes);
                self.relu(planes);
                self.conv(planes, planes, 3, stride, 1);
                self.batch_norm(planes);
                self.relu(planes);
                self.conv(planes, output, 1, 1, 0);
                self.batch_norm(output);
            }
        }
        if stride != 1 || input != output {
            let (after_height, after_width) = (self.height, self.width);
            (self.height, self.width) = (height, width);
            self.conv(input, output, 1, stride, 0);
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
