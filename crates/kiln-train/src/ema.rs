//! An exponential moving average of the weights, as torchvision's reference recipe keeps one
//! (`ExponentialMovingAverage`, an `AveragedModel` with an EMA update): every `every` steps
//! the average moves towards the model, `avg += (1 - decay) * (param - avg)` for trainable
//! parameters, while batch norm's buffers (running statistics, frozen parameters) are copied.
//! The first update after a reset copies everything, and during the warm-up epochs every
//! update resets, so the average starts from the weights at the end of the warm-up.
//!
//! The average lives on replica 0's device, without autodiff; it is validated each epoch,
//! checkpointed with the model and, with `ema.export`, exported instead of it.

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// The average of a model `M` on backend `B`.
#[derive(Debug, Clone)]
pub struct Ema<B: AutodiffBackend, M: AutodiffModule<B>> {
    pub model: M::InnerModule,
    /// Updates since the last reset (torchvision's `n_averaged`): at 0 the next update copies.
    pub averaged: usize,
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> Ema<B, M> {
    /// An average that the first update will set to the model's weights.
    pub fn new(model: &M) -> Self {
        Self {
            model: model.valid(),
            averaged: 0,
        }
    }

    /// Moves the average towards `model` (or copies it, right after a reset).
    pub fn update(&mut self, model: &M, decay: f64) {
        let mut collect = Collect::<B> { values: Vec::new() };
        model.visit(&mut collect);
        let weight = match self.averaged {
            0 => 1.0,
            _ => 1.0 - decay,
        };
        let mut mix = Mix::<B::InnerBackend> {
            values: collect.values.into_iter(),
            weight,
        };
        self.model = self.model.clone().map(&mut mix);
        assert!(
            mix.values.next().is_none(),
            "the average and the model list the same parameters"
        );
        self.averaged += 1;
    }

    /// Makes the next update copy the model (torchvision's warm-up: `n_averaged.fill_(0)`).
    pub fn reset(&mut self) {
        self.averaged = 0;
    }
}

/// A parameter's value and whether it trains (a buffer, or a frozen parameter, does not).
struct Value<B: Backend> {
    tensor: FloatTensor<B>,
    trains: bool,
}

/// The model's float parameters and buffers, in the order the module lists them.
struct Collect<B: AutodiffBackend> {
    values: Vec<Value<B::InnerBackend>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        self.values.push(Value {
            trains: value.is_require_grad(),
            tensor: value.inner().into_primitive().tensor(),
        });
    }
}

/// Moves each float of the average by `weight` of the way to the model's value; buffers all
/// the way.
struct Mix<B: Backend> {
    values: std::vec::IntoIter<Value<B>>,
    weight: f64,
}

impl<B: Backend> ModuleMapper<B> for Mix<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let value = self
            .values
            .next()
            .expect("the average and the model list the same parameters");
        let (id, average, mapper) = param.consume();
        let current = Tensor::<B, D>::from_primitive(TensorPrimitive::Float(value.tensor));
        let mixed = match value.trains && self.weight < 1.0 {
            true => average.clone() + (current - average) * self.weight,
            false => current,
        };
        Param::from_mapped_value(id, mixed, mapper)
    }
}
