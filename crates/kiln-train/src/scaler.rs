//! Dynamic loss scaling for f16 training, as PyTorch's `GradScaler`: the loss is multiplied by a
//! large factor before the backward pass, so that small gradients survive f16's narrow range,
//! and the gradients are divided by it before the optimizer sees them. A step whose gradients
//! overflowed is skipped and the factor halved; after `GROWTH_INTERVAL` good steps in a row it
//! doubles.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use kiln_models::ResNet;
use serde::{Deserialize, Serialize};

/// PyTorch's defaults: `init_scale = 2**16`, `growth_interval = 2000`, factors 2 and 0.5.
const INITIAL_SCALE: f64 = 65_536.0;
const GROWTH_INTERVAL: usize = 2000;

/// Checkpointed with the run's position, so that a resumed run scales as the uninterrupted one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    pub scale: f64,
    good_steps: usize,
}

impl Default for LossScaler {
    fn default() -> Self {
        Self {
            scale: INITIAL_SCALE,
            good_steps: 0,
        }
    }
}

impl LossScaler {
    /// Divides `grads` by the scale; `None` (and a smaller scale) when any of them is not
    /// finite, so that the step must be skipped.
    pub fn unscale<B: AutodiffBackend>(
        &mut self,
        model: &ResNet<B>,
        grads: GradientsParams,
    ) -> Option<GradientsParams> {
        let mut unscale = Unscale::<B> {
            grads,
            factor: 1.0 / self.scale,
            total: None,
        };
        model.visit(&mut unscale);
        let finite = unscale
            .total
            .map(|total| total.into_scalar().elem::<f64>().is_finite())
            .unwrap_or(true);
        if finite {
            self.good_steps += 1;
            if self.good_steps == GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
            Some(unscale.grads)
        } else {
            self.scale /= 2.0;
            self.good_steps = 0;
            None
        }
    }
}

/// Multiplies every gradient by `factor` and sums them all into one number, which is finite
/// exactly when every gradient is (one read from the device instead of one per tensor).
struct Unscale<B: AutodiffBackend> {
    grads: GradientsParams,
    factor: f64,
    total: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unscale<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let grad = grad * self.factor;
        let sum = grad.clone().sum();
        self.total = Some(match self.total.take() {
            Some(total) => total + sum,
            None => sum,
        });
        self.grads.register::<B::InnerBackend, D>(param.id, grad);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use kiln_models::{ResNetConfig, Stem};

    type B = Autodiff<Flex>;

    fn model_and_grads(poison: bool) -> (ResNet<B>, GradientsParams) {
        let device = Default::default();
        let model = ResNetConfig::new(18)
            .with_width(2)
            .with_num_classes(3)
            .with_stem(Stem::Cifar)
            .init::<B>(&device)
            .unwrap();
        let images = Tensor::<B, 4>::ones([2, 3, 8, 8], &device);
        let mut loss = model.forward(images).sum() * 1024.0;
        if poison {
            loss = loss * f32::INFINITY;
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        (model, grads)
    }

    #[test]
    fn gradients_are_divided_by_the_scale_and_overflow_skips_and_halves() {
        let (model, grads) = model_and_grads(false);
        let before: Tensor<Flex, 2> = grads.get(model.fc.weight.id).unwrap();
        let mut scaler = LossScaler {
            scale: 1024.0,
            good_steps: 0,
        };
        let unscaled = scaler.unscale(&model, grads).expect("finite gradients");
        let after: Tensor<Flex, 2> = unscaled.get(model.fc.weight.id).unwrap();
        let ratio: f32 = (before / 1024.0 - after).abs().max().into_scalar();
        assert!(ratio < 1e-6, "{ratio}");
        assert_eq!(scaler.scale, 1024.0);

        let (model, grads) = model_and_grads(true);
        assert!(scaler.unscale(&model, grads).is_none());
        assert_eq!(scaler.scale, 512.0);
    }

    #[test]
    fn the_scale_grows_after_a_run_of_good_steps() {
        let mut scaler = LossScaler::default();
        let (model, grads) = model_and_grads(false);
        scaler.good_steps = GROWTH_INTERVAL - 1;
        scaler.unscale(&model, grads).unwrap();
        assert_eq!(scaler.scale, 2.0 * INITIAL_SCALE);
    }
}
