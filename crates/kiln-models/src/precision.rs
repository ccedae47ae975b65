//! Mixed precision, as PyTorch's autocast does it for a ResNet: convolutions (the bulk of the
//! work and of the activations kept for the backward pass) in a 16-bit float type, while the
//! parameters (the master weights the optimizer updates), batch norm, the pooling into the
//! classifier, the classifier and the loss stay in f32. Gradients reach the f32 weights through
//! the casts, which burn's autodiff differentiates.

use burn::nn::PaddingConfig2d;
use burn::nn::conv::Conv2d;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, FloatDType, Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

/// The float type a network computes its convolutions in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    Bf16,
    F16,
}

impl Precision {
    /// `"f32"`, `"bf16"` or `"f16"`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "f32" => Some(Precision::F32),
            "bf16" => Some(Precision::Bf16),
            "f16" => Some(Precision::F16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    pub fn dtype(self) -> FloatDType {
        match self {
            Precision::F32 => FloatDType::F32,
            Precision::Bf16 => FloatDType::BF16,
            Precision::F16 => FloatDType::F16,
        }
    }

    /// `x` in this precision (unchanged in f32).
    pub fn cast<B: Backend, const D: usize>(self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Precision::F32 => x,
            low => x.cast(low.dtype()),
        }
    }
}

/// A convolution in its input's float type: f32 weights are cast to a 16-bit input's type, so
/// that the product runs in it. Bias-free convolutions (all of a ResNet's) go through
/// kiln-kernels, which computes them faster on the CPU backend; kiln's convolutions all have
/// explicit symmetric padding, anything else takes burn's `Conv2d`.
pub(crate) fn convolve<B: Backend>(conv: &Conv2d<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    let dtype = x.dtype();
    let Some(options) = kiln_options(conv) else {
        return conv.forward(x);
    };
    let weight = match dtype {
        DType::F32 => conv.weight.val(),
        _ => conv.weight.val().cast(FloatDType::from(dtype)),
    };
    match &conv.bias {
        None => kiln_kernels::conv2d(x, weight, options),
        Some(bias) => conv2d(
            x,
            weight,
            Some(bias.val().cast(FloatDType::from(dtype))),
            options,
        ),
    }
}

/// The options of kiln's convolution for `conv`, where its padding is explicit and symmetric.
pub(crate) fn kiln_options<B: Backend>(conv: &Conv2d<B>) -> Option<ConvOptions<2>> {
    let PaddingConfig2d::Explicit(top, left, bottom, right) = conv.padding else {
        return None;
    };
    ((top, left) == (bottom, right))
        .then(|| ConvOptions::new(conv.stride, [top, left], conv.dilation, conv.groups))
}

/// Runs `f` on `x` in f32 and returns its result in `x`'s float type (batch norm's statistics
/// and normalization need f32's range and precision).
pub(crate) fn in_f32<B: Backend>(
    x: Tensor<B, 4>,
    f: impl FnOnce(Tensor<B, 4>) -> Tensor<B, 4>,
) -> Tensor<B, 4> {
    match x.dtype() {
        DType::F32 => f(x),
        dtype => f(to_f32(x)).cast(FloatDType::from(dtype)),
    }
}

/// `x` in f32, whatever its float type.
pub(crate) fn to_f32<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    match x.dtype() {
        DType::F32 => x,
        _ => x.cast(FloatDType::F32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ResNet, ResNetConfig, Stem};
    use burn::backend::{Autodiff, Flex};
    use burn::module::AutodiffModule;
    use burn::tensor::TensorData;

    type B = Autodiff<Flex>;

    /// Logits and the first convolution's weight gradient of `model` in `precision`, on fixed
    /// images. (Nothing here draws from burn's random generator, which the tests running
    /// alongside share.)
    fn logits_and_gradient(model: &ResNet<B>, precision: Precision) -> (Vec<f32>, Vec<f32>, DType) {
        let device = Default::default();
        let model = model.clone().with_precision(precision);
        let wave = |len: usize, step: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * step % 1009) as f32 / 504.5 - 1.0) * 1.7)
                .collect()
        };
        let images = Tensor::<B, 4>::from_data(
            TensorData::new(wave(8 * 3 * 32 * 32, 389), [8, 3, 32, 32]),
            &device,
        );
        let logits = model.forward(images);
        // A fixed projection of the logits, so that batch norm does not cancel the gradient
        // the way it cancels a plain sum.
        let projection =
            Tensor::<B, 2>::from_data(TensorData::new(wave(8 * 5, 613), [8, 5]), &device);
        let grads = (logits.clone() * projection).sum().backward();
        let gradient = model.conv1.weight.grad(&grads).unwrap();
        let values = |t: Tensor<Flex, 4>| t.into_data().convert::<f32>().to_vec().unwrap();
        (
            logits.into_data().convert::<f32>().to_vec().unwrap(),
            values(gradient.clone()),
            gradient.dtype(),
        )
    }

    /// Replaces every weight that is not a constant (batch norm's ones and zeros, running
    /// statistics) with a fixed zero-mean wave of He initialization's spread (fan in).
    struct FixedWeights;

    impl burn::module::ModuleMapper<B> for FixedWeights {
        fn map_float<const D: usize>(
            &mut self,
            param: burn::module::Param<Tensor<B, D>>,
        ) -> burn::module::Param<Tensor<B, D>> {
            let (id, tensor, _) = param.consume();
            let shape = tensor.shape();
            let values: Vec<f32> = tensor.clone().into_data().to_vec().unwrap();
            let tensor = if values.iter().all(|v| *v == values[0]) {
                tensor
            } else {
                let fan_in = shape.num_elements() / shape[0];
                let scale = (2.0 / fan_in as f32).sqrt();
                let wave = (0..values.len())
                    .map(|i| ((i * 577 % 1013) as f32 / 506.5 - 1.0) * 1.7 * scale)
                    .collect::<Vec<_>>();
                Tensor::from_data(TensorData::new(wave, shape), &tensor.device()).require_grad()
            };
            burn::module::Param::initialized(id, tensor)
        }
    }

    fn norm(v: &[f32]) -> f32 {
        v.iter().map(|x| x * x).sum::<f32>().sqrt()
    }

    fn relative_error(a: &[f32], b: &[f32]) -> f32 {
        let diff: Vec<f32> = a.iter().zip(b).map(|(x, y)| x - y).collect();
        norm(&diff) / norm(b)
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>() / (norm(a) * norm(b))
    }

    #[test]
    fn sixteen_bit_convolutions_track_f32_and_keep_f32_gradients() {
        let model = ResNetConfig::new(18)
            .with_width(8)
            .with_num_classes(5)
            .with_stem(Stem::Cifar)
            .with_zero_init_residual(true)
            .init::<B>(&Default::default())
            .unwrap();
        // Fixed weights rather than random ones: burn's generator is shared with the tests
        // running alongside, and the 16-bit errors vary with the weights (f16's logits from
        // 0.05% to 0.24% over 24 random initializations). The round trip through the inner
        // backend also fixes burn's lazily initialized parameters, so every clone below agrees.
        let model =
            burn::module::Module::map(ResNet::<B>::from_inner(model.valid()), &mut FixedWeights);
        let (logits, gradient, dtype) = logits_and_gradient(&model, Precision::F32);
        assert_eq!(dtype, DType::F32);
        // Measured on flex with these fixed weights: logits within 0.75% (bf16) and 0.14% (f16)
        // of f32's; the first convolution's gradient, eighteen layers and seventeen batch norms
        // down, at cosine 0.926 and 0.986: each layer's rounding of the gradient adds up.
        for (precision, tolerance, cosine_floor) in
            [(Precision::Bf16, 1e-2, 0.9), (Precision::F16, 2e-3, 0.95)]
        {
            let (low_logits, low_gradient, low_dtype) = logits_and_gradient(&model, precision);
            // The master weights' gradients arrive in f32 through the casts.
            assert_eq!(low_dtype, DType::F32, "{precision:?}");
            let logit_error = relative_error(&low_logits, &logits);
            let agreement = cosine(&low_gradient, &gradient);
            assert!(
                logit_error < tolerance && agreement > cosine_floor,
                "{precision:?}: logits {logit_error}, gradient cosine {agreement}"
            );
            // And it is not f32 under another name.
            assert!(logit_error > 0.0, "{precision:?} computed exactly as f32");
        }
    }
}
