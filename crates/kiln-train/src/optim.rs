//! PyTorch's SGD, Adam and AdamW on burn's optimizers, with every default set explicitly
//! (burn's momentum dampening is 0.1, its Adam eps 1e-5, its AdamW weight decay 1e-4), and the
//! optimizer state saved and loaded with the checkpoint. The optimizer section's gradient
//! clipping rides along, so that every step function that holds an optimizer clips alike, and
//! so do the parameter groups (see [`crate::param_groups`]): one burn optimizer per group,
//! each stepping only its parameters' gradients, as PyTorch steps each group.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{
    Adam, AdamConfig, AdamW, AdamWConfig, GradientsParams, Optimizer, Sgd, SgdConfig,
    SimpleOptimizer,
};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder, RecorderError};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::clip::Clipping;
use crate::param_groups::ParamGroups;
use kiln_config::config::{OptimizerConfig, OptimizerName};

/// One of the three optimizers, chosen by the config at run time, one per parameter group,
/// and how the gradients it is given are clipped first (see [`crate::clip`]).
pub struct AnyOptimizer<M: AutodiffModule<B>, B: AutodiffBackend> {
    rule: Rule<M, B>,
    pub clipping: Clipping,
    /// The groups, where the config has more than PyTorch's one group of everything.
    groups: Option<Arc<ParamGroups>>,
    /// Each parameter's group while the model's ids are those last resolved; absent ones (the
    /// frozen) get no update.
    members: HashMap<ParamId, usize>,
    frozen: bool,
}

/// The update rule, one burn optimizer per group.
enum Rule<M: AutodiffModule<B>, B: AutodiffBackend> {
    Sgd(Vec<OptimizerAdaptor<Sgd<B::InnerBackend>, M, B>>),
    Adam(Vec<OptimizerAdaptor<Adam, M, B>>),
    AdamW(Vec<OptimizerAdaptor<AdamW, M, B>>),
}

fn named_mpk() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::new()
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> AnyOptimizer<M, B> {
    /// PyTorch's one group of every parameter.
    pub fn new(config: &OptimizerConfig) -> Self {
        let decay = config.weight_decay();
        Self {
            rule: Rule::new(config, &[decay]),
            clipping: Clipping::of(config),
            groups: None,
            members: HashMap::new(),
            frozen: false,
        }
    }

    /// One optimizer per group of `groups`; [`AnyOptimizer::resolve`] then says which
    /// parameter is which.
    pub fn with_groups(config: &OptimizerConfig, groups: Arc<ParamGroups>) -> Self {
        if groups.is_plain() {
            return Self::new(config);
        }
        let decays: Vec<f64> = groups.settings.iter().map(|s| s.weight_decay).collect();
        Self {
            rule: Rule::new(config, &decays),
            groups: Some(groups),
            ..Self::new(config)
        }
    }

    /// Learns the ids of the model's parameters (`params`: torchvision names and ids), and
    /// whether `model.freeze` holds now. A model's ids change when a checkpoint is loaded.
    pub fn resolve(&mut self, params: &[(String, ParamId)], frozen: bool) {
        if let Some(groups) = &self.groups {
            self.members = groups.by_id(params, frozen);
            self.frozen = frozen;
        }
    }

    /// The parameter groups, unless there is only PyTorch's one group of everything.
    pub fn groups(&self) -> Option<&Arc<ParamGroups>> {
        self.groups.as_ref()
    }

    /// The gradients of the parameters that train now: those of frozen ones dropped, as
    /// PyTorch never computes them (so clipping does not count them either).
    pub fn trainable(&self, module: &M, grads: GradientsParams) -> GradientsParams {
        match &self.groups {
            None => grads,
            Some(_) => self.split(module, grads, true).remove(0),
        }
    }

    /// The update, from gradients already clipped (`Replica::step` clips them): each group's
    /// optimizer steps its parameters at its share of `lr`.
    pub fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        let Some(groups) = self.groups.clone() else {
            return self.rule.step(0, lr, module, grads);
        };
        let parts = self.split(&module, grads, false);
        let mut module = module;
        for (index, part) in parts.into_iter().enumerate() {
            if !part.is_empty() {
                let lr = lr * groups.settings[index].lr_scale;
                module = self.rule.step(index, lr, module, part);
            }
        }
        module
    }

    /// `grads` shared out by group (or, `together`, all in one); those of parameters in no
    /// group are dropped.
    fn split(&self, module: &M, grads: GradientsParams, together: bool) -> Vec<GradientsParams> {
        let groups = match together {
            true => 1,
            false => self.groups.as_ref().map_or(1, |g| g.settings.len()),
        };
        let mut split = Split::<B> {
            grads,
            members: &self.members,
            parts: (0..groups).map(|_| GradientsParams::new()).collect(),
            together,
            backend: std::marker::PhantomData,
        };
        module.visit(&mut split);
        split.parts
    }

    /// Writes the optimizer state (momentum buffers, moments, step counts) of every group to
    /// `path` as one record (burn's named MessagePack; the extension is added by burn).
    pub fn save(&self, path: &Path) -> Result<(), RecorderError> {
        let path = path.to_path_buf();
        match &self.rule {
            Rule::Sgd(o) => named_mpk().record(merged(o), path),
            Rule::Adam(o) => named_mpk().record(merged(o), path),
            Rule::AdamW(o) => named_mpk().record(merged(o), path),
        }
    }

    /// Reads what [`AnyOptimizer::save`] wrote; each parameter's state goes to its group (call
    /// [`AnyOptimizer::resolve`] with the loaded model first).
    pub fn load(self, path: &Path, device: &B::Device) -> Result<Self, RecorderError> {
        let path = path.to_path_buf();
        let group = |id: &ParamId| self.members.get(id).copied().unwrap_or(0);
        let rule = match self.rule {
            Rule::Sgd(o) => Rule::Sgd(shared_out(o, named_mpk().load(path, device)?, group)),
            Rule::Adam(o) => Rule::Adam(shared_out(o, named_mpk().load(path, device)?, group)),
            Rule::AdamW(o) => Rule::AdamW(shared_out(o, named_mpk().load(path, device)?, group)),
        };
        Ok(Self { rule, ..self })
    }
}

type Record<O, M, B> = <OptimizerAdaptor<O, M, B> as Optimizer<M, B>>::Record;

/// The state of every group's parameters in one record (the groups share no parameter).
fn merged<O, M, B>(groups: &[OptimizerAdaptor<O, M, B>]) -> Record<O, M, B>
where
    O: SimpleOptimizer<B::InnerBackend>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    let mut all = Record::<O, M, B>::default();
    for group in groups {
        all.extend(group.to_record());
    }
    all
}

/// Each parameter's state to the optimizer of its group.
fn shared_out<O, M, B>(
    groups: Vec<OptimizerAdaptor<O, M, B>>,
    all: Record<O, M, B>,
    group_of: impl Fn(&ParamId) -> usize,
) -> Vec<OptimizerAdaptor<O, M, B>>
where
    O: SimpleOptimizer<B::InnerBackend>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    let mut parts: Vec<Record<O, M, B>> = groups.iter().map(|_| Default::default()).collect();
    let last = parts.len() - 1;
    for (id, state) in all {
        parts[group_of(&id).min(last)].insert(id, state);
    }
    groups
        .into_iter()
        .zip(parts)
        .map(|(group, part)| group.load_record(part))
        .collect()
}

/// Moves each gradient into its parameter's group.
struct Split<'a, B: AutodiffBackend> {
    grads: GradientsParams,
    members: &'a HashMap<ParamId, usize>,
    parts: Vec<GradientsParams>,
    together: bool,
    backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Split<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        if let Some(&group) = self.members.get(&param.id) {
            let part = if self.together { 0 } else { group };
            self.parts[part].register::<B::InnerBackend, D>(param.id, grad);
        }
    }
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> Rule<M, B> {
    /// One optimizer per group, each with its weight decay.
    fn new(config: &OptimizerConfig, decays: &[f64]) -> Self {
        let l2 = |decay: f64| (decay > 0.0).then(|| WeightDecayConfig::new(decay as f32));
        match config.name {
            OptimizerName::Sgd => {
                let momentum = (config.momentum > 0.0).then_some(MomentumConfig {
                    momentum: config.momentum,
                    dampening: config.dampening,
                    nesterov: config.nesterov,
                });
                Rule::Sgd(
                    decays
                        .iter()
                        .map(|&decay| {
                            SgdConfig::new()
                                .with_momentum(momentum.clone())
                                .with_weight_decay(l2(decay))
                                .init()
                        })
                        .collect(),
                )
            }
            OptimizerName::Adam => Rule::Adam(
                decays
                    .iter()
                    .map(|&decay| {
                        AdamConfig::new()
                            .with_beta_1(config.betas[0] as f32)
                            .with_beta_2(config.betas[1] as f32)
                            .with_epsilon(config.eps as f32)
                            .with_weight_decay(l2(decay))
                            .init()
                    })
                    .collect(),
            ),
            OptimizerName::Adamw => Rule::AdamW(
                decays
                    .iter()
                    .map(|&decay| {
                        AdamWConfig::new()
                            .with_beta_1(config.betas[0] as f32)
                            .with_beta_2(config.betas[1] as f32)
                            .with_epsilon(config.eps as f32)
                            .with_weight_decay(decay as f32)
                            .init()
                    })
                    .collect(),
            ),
        }
    }

    fn step(&mut self, group: usize, lr: f64, module: M, grads: GradientsParams) -> M {
        match self {
            Rule::Sgd(o) => o[group].step(lr, module, grads),
            Rule::Adam(o) => o[group].step(lr, module, grads),
            Rule::AdamW(o) => o[group].step(lr, module, grads),
        }
    }
}
