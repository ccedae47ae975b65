//! Gradient clipping with PyTorch's arithmetic (`torch.nn.utils.clip_grad_norm_` and
//! `clip_grad_value_`), applied to a step's final gradients: summed over every replica and
//! machine, f16's loss scale taken out. All on the device: clipping reads nothing back, and the
//! norm it measured is read with the step's loss.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use kiln_config::config::OptimizerConfig;

/// `clip_grad_norm_`'s guard against a zero norm.
const EPS: f64 = 1e-6;

/// How a step's gradients are clipped (the optimizer section's `clip_grad_norm` and
/// `clip_grad_value`; the config allows one of them, as timm's `--clip-mode` does).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Clipping {
    /// Scale all gradients down together so that their global L2 norm is at most this.
    pub max_norm: Option<f64>,
    /// Clamp every gradient value into `[-max_value, max_value]`.
    pub max_value: Option<f64>,
}

impl Clipping {
    pub fn of(config: &OptimizerConfig) -> Self {
        Self {
            max_norm: config.clip_grad_norm,
            max_value: config.clip_grad_value,
        }
    }

    pub fn is_on(&self) -> bool {
        self.max_norm.is_some() || self.max_value.is_some()
    }
}

/// Clips the gradients of `module`'s trainable parameters as `clipping` says and returns them
/// with their global L2 norm before clipping (one value, on the device; `None` when no
/// parameter has a gradient). The norm is that of all gradients as one vector, as
/// `clip_grad_norm_` computes it.
pub fn clip_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: GradientsParams,
    clipping: Clipping,
) -> (GradientsParams, Option<Tensor<B::InnerBackend, 1>>) {
    let mut visit = Visit::<B> {
        grads,
        action: Action::SumSquares,
        squares: Vec::new(),
    };
    module.visit(&mut visit);
    let squares = std::mem::take(&mut visit.squares);
    if squares.is_empty() {
        return (visit.grads, None);
    }
    let norm = Tensor::cat(squares, 0).sum().sqrt();
    visit.action = match (clipping.max_norm, clipping.max_value) {
        (Some(max_norm), _) => {
            // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1.
            Action::Scale((norm.clone().add_scalar(EPS).recip() * max_norm).clamp_max(1.0))
        }
        (None, Some(max_value)) => Action::Clamp(max_value),
        (None, None) => return (visit.grads, Some(norm)),
    };
    module.visit(&mut visit);
    (visit.grads, Some(norm))
}

enum Action<B: AutodiffBackend> {
    /// Collect each gradient's sum of squares.
    SumSquares,
    /// Multiply every gradient by this one value.
    Scale(Tensor<B::InnerBackend, 1>),
    /// Clamp every value into [-v, v].
    Clamp(f64),
}

struct Visit<B: AutodiffBackend> {
    grads: GradientsParams,
    action: Action<B>,
    squares: Vec<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Visit<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let grad = match &self.action {
            Action::SumSquares => {
                self.squares.push(grad.clone().square().sum());
                grad
            }
            Action::Scale(factor) => grad * factor.clone().reshape([1; D]),
            Action::Clamp(max) => grad.clamp(-max, *max),
        };
        self.grads.register::<B::InnerBackend, D>(param.id, grad);
    }
}
