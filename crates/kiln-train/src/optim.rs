//! PyTorch's SGD, Adam and AdamW on burn's optimizers, with every default set explicitly
//! (burn's momentum dampening is 0.1, its Adam eps 1e-5, its AdamW weight decay 1e-4), and the
//! optimizer state saved and loaded with the checkpoint. The optimizer section's gradient
//! clipping rides along, so that every step function that holds an optimizer clips alike.

use std::path::Path;

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{
    Adam, AdamConfig, AdamW, AdamWConfig, GradientsParams, Optimizer, Sgd, SgdConfig,
};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder, RecorderError};
use burn::tensor::backend::AutodiffBackend;

use crate::clip::Clipping;
use crate::config::{OptimizerConfig, OptimizerName};

/// One of the three optimizers, chosen by the config at run time, and how the gradients it is
/// given are clipped first (see [`crate::clip`]).
pub struct AnyOptimizer<M: AutodiffModule<B>, B: AutodiffBackend> {
    rule: Rule<M, B>,
    pub clipping: Clipping,
}

#[allow(clippy::large_enum_variant)]
enum Rule<M: AutodiffModule<B>, B: AutodiffBackend> {
    Sgd(OptimizerAdaptor<Sgd<B::InnerBackend>, M, B>),
    Adam(OptimizerAdaptor<Adam, M, B>),
    AdamW(OptimizerAdaptor<AdamW, M, B>),
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::new()
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> AnyOptimizer<M, B> {
    pub fn new(config: &OptimizerConfig) -> Self {
        Self {
            rule: Rule::new(config),
            clipping: Clipping::of(config),
        }
    }

    /// The update, from gradients already clipped (`Replica::step` clips them).
    pub fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        match &mut self.rule {
            Rule::Sgd(o) => o.step(lr, module, grads),
            Rule::Adam(o) => o.step(lr, module, grads),
            Rule::AdamW(o) => o.step(lr, module, grads),
        }
    }

    /// Writes the optimizer state (momentum buffers, moments, step counts) to `path`
    /// (burn's named MessagePack; the extension is added by burn).
    pub fn save(&self, path: &Path) -> Result<(), RecorderError> {
        let path = path.to_path_buf();
        match &self.rule {
            Rule::Sgd(o) => recorder().record(o.to_record(), path),
            Rule::Adam(o) => recorder().record(o.to_record(), path),
            Rule::AdamW(o) => recorder().record(o.to_record(), path),
        }
    }

    pub fn load(self, path: &Path, device: &B::Device) -> Result<Self, RecorderError> {
        let path = path.to_path_buf();
        let rule = match self.rule {
            Rule::Sgd(o) => Rule::Sgd(o.load_record(recorder().load(path, device)?)),
            Rule::Adam(o) => Rule::Adam(o.load_record(recorder().load(path, device)?)),
            Rule::AdamW(o) => Rule::AdamW(o.load_record(recorder().load(path, device)?)),
        };
        Ok(Self {
            rule,
            clipping: self.clipping,
        })
    }
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> Rule<M, B> {
    fn new(config: &OptimizerConfig) -> Self {
        let decay = config.weight_decay();
        match config.name {
            OptimizerName::Sgd => {
                let momentum = (config.momentum > 0.0).then_some(MomentumConfig {
                    momentum: config.momentum,
                    dampening: config.dampening,
                    nesterov: config.nesterov,
                });
                let weight_decay = (decay > 0.0).then(|| WeightDecayConfig::new(decay as f32));
                Rule::Sgd(
                    SgdConfig::new()
                        .with_momentum(momentum)
                        .with_weight_decay(weight_decay)
                        .init(),
                )
            }
            OptimizerName::Adam => {
                let weight_decay = (decay > 0.0).then(|| WeightDecayConfig::new(decay as f32));
                Rule::Adam(
                    AdamConfig::new()
                        .with_beta_1(config.betas[0] as f32)
                        .with_beta_2(config.betas[1] as f32)
                        .with_epsilon(config.eps as f32)
                        .with_weight_decay(weight_decay)
                        .init(),
                )
            }
            OptimizerName::Adamw => Rule::AdamW(
                AdamWConfig::new()
                    .with_beta_1(config.betas[0] as f32)
                    .with_beta_2(config.betas[1] as f32)
                    .with_epsilon(config.eps as f32)
                    .with_weight_decay(decay as f32)
                    .init(),
            ),
        }
    }
}
