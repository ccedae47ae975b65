//! The training step, and what it needs: the model, the loss, the count of correct predictions.
//! `kiln train` runs [`Replica::step`] on every device, and `kiln bench`, `kiln compare` and
//! `kiln plan --measure` time, check and measure that same function.
//!
//! A step leaves its loss and its count of correct predictions on the device: nothing is read
//! back between the forward pass and the optimizer's update, so a GPU's queue never runs dry
//! waiting for the host. [`Replica::take_stats`] reads the figures of every step since the
//! last read in one transfer, when the loop wants them (every `print_every` iterations and at
//! the end of an epoch).

use burn::collective::PeerId;
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use kiln_models::pretrained::Pretrained;
use kiln_models::weights;
use kiln_models::{Precision, ResNet};

use crate::batch::DeviceBatch;
use crate::clip::clip_gradients;
use crate::collective::{all_reduce_gradients, sum_over_peers};
use crate::ema::Ema;
use crate::error::{ParallelError, TrainError};
use crate::optim::AnyOptimizer;
use crate::scaler::LossScaler;
use kiln_config::config::{ModelConfig, TrainConfig};

/// The ResNet of the model section, with pretrained weights if asked for (torchvision's,
/// the Hub's or a file: `pretrained::Pretrained`). A pretrained classifier for another class
/// count is left out, so fine-tuning starts with a fresh `fc`.
pub fn build_model<B: Backend>(
    section: &ModelConfig,
    data_classes: usize,
    device: &B::Device,
) -> Result<ResNet<B>, TrainError> {
    let config = section.resnet(data_classes)?;
    let model = config.init::<B>(device)?;
    let Some(spec) = section.pretrained.as_deref() else {
        return Ok(model);
    };
    let fetched = Pretrained::parse(spec).fetch(&config.name(), true)?;
    fetched.check_model(&config)?;
    let (model, _report) = weights::load(model, &fetched.path)?;
    Ok(model)
}

/// Cross-entropy with the config's label smoothing and the class weights the training set gave
/// (see `ClassWeights::resolve`).
pub fn loss_function<B: Backend>(
    config: &TrainConfig,
    class_weights: Option<&[f32]>,
    device: &B::Device,
) -> CrossEntropyLoss<B> {
    let smoothing = config.loss.label_smoothing;
    CrossEntropyLossConfig::new()
        .with_smoothing((smoothing > 0.0).then_some(smoothing as f32))
        .with_weights(class_weights.map(<[f32]>::to_vec))
        .init(device)
}

/// Cross-entropy against soft targets (mixup's and CutMix's, smoothing included), averaged over
/// the batch: timm's `SoftTargetCrossEntropy`.
pub fn soft_cross_entropy<B: Backend>(logits: Tensor<B, 2>, targets: Tensor<B, 2>) -> Tensor<B, 1> {
    let per_image = (targets * log_softmax(logits, 1)).sum_dim(1).neg();
    per_image.mean()
}

/// How many rows of `logits` have their largest value at `labels`, on the device.
pub fn count_correct<B: Backend>(
    logits: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
) -> Tensor<B, 1, Int> {
    let predicted = logits.argmax(1).flatten::<1>(0, 1);
    predicted.equal(labels).int().sum()
}

/// How one step is shared out: the images of the step on all replicas of the run (each loss is
/// weighted by its share of them, so that the summed gradient is that of the mean loss), and
/// when there are other replicas, this one's peer and whether batch norm syncs with them.
#[derive(Debug, Clone)]
pub struct StepPlan {
    pub images: usize,
    /// What the step's losses are weighted by in all: its images on all replicas, or with class
    /// weights the sum of its labels' weights, so that the summed gradient is that of the
    /// step's (weighted) mean loss however the images are split.
    pub weight: f64,
    /// Per batch of this replica, its share of `weight` (empty: its image count).
    pub batch_weights: Vec<f64>,
    pub peer: Option<PeerId>,
    /// With `sync_bn`, per batch of the step: the batch's images on all replicas, when every
    /// replica has some (a sum over replicas waits for all of them); `None` runs it unsynced.
    pub sync_bn: Vec<Option<usize>>,
    /// Whether `model.freeze` holds in this step's epoch.
    pub frozen: bool,
}

impl StepPlan {
    /// A step on one device, alone.
    pub fn alone(images: usize) -> Self {
        Self {
            images,
            weight: images as f64,
            batch_weights: Vec::new(),
            peer: None,
            sync_bn: Vec::new(),
            frozen: false,
        }
    }
}

/// What the steps since the last read saw on this replica, read back to the host.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    /// The step's images on all replicas.
    pub images: usize,
    /// This replica's loss summed over its images.
    pub loss_sum: f64,
    /// This replica's correct predictions.
    pub correct: usize,
    /// The global L2 norm of the step's gradients before clipping, where clipping is on.
    pub grad_norm: Option<f64>,
}

/// One batch's loss and correct count, still on the device.
struct Pending<B: Backend> {
    images: usize,
    loss: Tensor<B, 1>,
    correct: Tensor<B, 1, Int>,
}

/// One step's figures, still on the device.
struct PendingStep<B: Backend> {
    /// The step's images on all replicas.
    images: usize,
    batches: Vec<Pending<B>>,
    grad_norm: Option<Tensor<B, 1>>,
}

/// One model on one device with its optimizer: what a training step changes.
pub struct Replica<B: AutodiffBackend> {
    model: Option<ResNet<B>>,
    pub optimizer: AnyOptimizer<ResNet<B>, B>,
    /// f16 training's loss scaling; every replica makes the same decisions, from the same
    /// all-reduced gradients.
    pub scaler: Option<LossScaler>,
    loss_fn: CrossEntropyLoss<B>,
    pub device: B::Device,
    /// The weights' moving average, where the run keeps one (on replica 0 only).
    pub ema: Option<Ema<B, ResNet<B>>>,
    /// Every step since the last read.
    pending: Vec<PendingStep<B::InnerBackend>>,
    /// Whether the model and optimizer hold `model.freeze` now.
    frozen: bool,
}

impl<B: AutodiffBackend> Replica<B> {
    pub fn new(
        model: ResNet<B>,
        optimizer: AnyOptimizer<ResNet<B>, B>,
        loss_fn: CrossEntropyLoss<B>,
        device: B::Device,
    ) -> Self {
        let mut replica = Self {
            scaler: (model.precision == Precision::F16).then(LossScaler::default),
            model: Some(model),
            optimizer,
            loss_fn,
            device,
            ema: None,
            pending: Vec::new(),
            frozen: false,
        };
        replica.set_frozen(false);
        replica
    }

    /// Holds `model.freeze` or lifts it: the frozen parameters' batch norms in eval mode or
    /// not, and the optimizer told which parameters (by their current ids) train.
    fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
        let Some(groups) = self.optimizer.groups().cloned() else {
            return;
        };
        let model = self.model.as_mut().expect("a replica holds its model");
        model.set_batch_norm_frozen(|module| groups.freezes_batch_norm(module, frozen));
        self.optimizer
            .resolve(&weights::torch_parameters(model), frozen);
    }

    pub fn model(&self) -> &ResNet<B> {
        self.model
            .as_ref()
            .expect("a replica holds its model between steps")
    }

    /// Replaces the model and optimizer state (a resumed checkpoint).
    pub fn replace(&mut self, model: ResNet<B>, optimizer: AnyOptimizer<ResNet<B>, B>) {
        self.model = Some(model);
        self.optimizer = optimizer;
        self.set_frozen(self.frozen);
    }

    /// Takes the model and optimizer out (to restore a checkpoint into them).
    pub fn take(
        &mut self,
        new_optimizer: AnyOptimizer<ResNet<B>, B>,
    ) -> (ResNet<B>, AnyOptimizer<ResNet<B>, B>) {
        let model = self.model.take().expect("a replica holds its model");
        (model, std::mem::replace(&mut self.optimizer, new_optimizer))
    }

    /// One optimizer step over `batches` (one, or `accumulate` of them), as torchvision's
    /// `train_one_epoch` takes one: forward, loss and backward for each batch, the gradients
    /// summed over the batches, reduced over the replicas, clipped, then the update. Reads
    /// nothing from the device (f16's overflow check, after the backward pass, aside).
    pub fn step(
        &mut self,
        batches: Vec<DeviceBatch<B>>,
        plan: &StepPlan,
        lr: f64,
    ) -> Result<(), ParallelError> {
        if plan.frozen != self.frozen {
            self.set_frozen(plan.frozen);
        }
        let model = (self.model.take()).expect("a replica holds its model between steps");
        let (grads, losses) = self.backward(&model, batches, plan);
        let grads = self.reduce(&model, grads, plan)?;
        let (grads, grad_norm) = self.clip(&model, grads);
        self.model = Some(match grads {
            Some(grads) if plan.images > 0 => self.optimizer.step(lr, model, grads),
            // No images this step, or f16 gradients that overflowed: no update.
            _ => model,
        });
        self.pending.push(PendingStep {
            images: plan.images,
            batches: losses,
            grad_norm,
        });
        Ok(())
    }

    /// Forward, loss and backward of each batch, its loss weighted by its share of the step's
    /// images (so that the summed gradient is the mean loss's); the gradients summed over the
    /// batches (only when there are several: `accumulate` > 1). Returns them with each batch's
    /// loss and correct count, on the device.
    fn backward(
        &self,
        model: &ResNet<B>,
        batches: Vec<DeviceBatch<B>>,
        plan: &StepPlan,
    ) -> (Option<GradientsParams>, Vec<Pending<B::InnerBackend>>) {
        let scale = self.scaler.as_ref().map_or(1.0, |s| s.scale);
        let mut grads: Option<GradientsParams> = None;
        let mut accumulator: Option<GradientsAccumulator<ResNet<B>>> = None;
        let mut pending = Vec::with_capacity(batches.len());
        for (index, batch) in batches.into_iter().enumerate() {
            let n = batch.len();
            if n == 0 {
                continue;
            }
            let synced = plan.peer.zip(plan.sync_bn.get(index).copied().flatten());
            let (loss, correct) = self.forward(model, batch, synced);
            pending.push(Pending {
                images: n,
                loss: loss.clone().inner(),
                correct,
            });
            let weight = plan.batch_weights.get(index).copied();
            let share = weight.unwrap_or(n as f64) / plan.weight;
            let batch_grads =
                GradientsParams::from_grads((loss * (share * scale)).backward(), model);
            match (grads.take(), accumulator.as_mut()) {
                (None, None) => grads = Some(batch_grads),
                (first, _) => {
                    let sum = accumulator.get_or_insert_with(GradientsAccumulator::new);
                    if let Some(first) = first {
                        sum.accumulate(model, first);
                    }
                    sum.accumulate(model, batch_grads);
                }
            }
        }
        match accumulator {
            Some(mut sum) => (Some(sum.grads()), pending),
            None => (grads, pending),
        }
    }

    /// One batch through the model (its batch norms summing statistics over the replicas where
    /// `synced` gives the peer and the batch's images on all of them): the loss, against mixup's
    /// soft targets or by the config's cross-entropy, and the count of correct predictions.
    fn forward(
        &self,
        model: &ResNet<B>,
        batch: DeviceBatch<B>,
        synced: Option<(PeerId, usize)>,
    ) -> (Tensor<B, 1>, Tensor<B::InnerBackend, 1, Int>) {
        let logits = match synced {
            Some((peer, images)) => kiln_models::synchronized(
                move |x: Tensor<B, 2>| sum_over_peers(x, peer),
                images,
                || model.forward(batch.images),
            ),
            None => model.forward(batch.images),
        };
        let correct = count_correct(logits.clone().inner(), batch.labels.clone().inner());
        let loss = match batch.targets {
            Some(targets) => soft_cross_entropy(logits, targets),
            None => self.loss_fn.forward(logits, batch.labels),
        };
        (loss, correct)
    }

    /// The step's gradients as the update takes them: summed over every replica and machine
    /// (a replica without images this step sends zeros, so every peer makes the same calls),
    /// f16's loss scale taken out (none where they overflowed), frozen parameters dropped
    /// (autodiff computed theirs all the same).
    fn reduce(
        &mut self,
        model: &ResNet<B>,
        mut grads: Option<GradientsParams>,
        plan: &StepPlan,
    ) -> Result<Option<GradientsParams>, ParallelError> {
        if let Some(peer) = plan.peer {
            let local = grads.unwrap_or_default();
            grads = Some(all_reduce_gradients(model, local, peer)?);
        }
        if let Some(scaler) = &mut self.scaler {
            grads = grads.and_then(|g| scaler.unscale(model, g));
        }
        Ok(grads.map(|g| self.optimizer.trainable(model, g)))
    }

    /// The gradients clipped as the optimizer section says (`clip_grad_norm` or
    /// `clip_grad_value`), with their norm before clipping, where clipping is on.
    fn clip(
        &self,
        model: &ResNet<B>,
        grads: Option<GradientsParams>,
    ) -> (Option<GradientsParams>, Option<Tensor<B::InnerBackend, 1>>) {
        match grads {
            Some(grads) if self.optimizer.clipping.is_on() => {
                let (clipped, norm) = clip_gradients(model, grads, self.optimizer.clipping);
                (Some(clipped), norm)
            }
            grads => (grads, None),
        }
    }

    /// Moves the weights' average towards the model (see [`Ema::update`]); in `warming_up`,
    /// the next update copies again.
    pub fn update_ema(&mut self, decay: f64, warming_up: bool) {
        let model = self.model.as_ref().expect("a replica holds its model");
        if let Some(ema) = &mut self.ema {
            ema.update(model, decay);
            if warming_up {
                ema.reset();
            }
        }
    }

    /// The figures of every step since the last call, in one read from the device.
    pub fn take_stats(&mut self) -> Vec<StepStats> {
        let steps = std::mem::take(&mut self.pending);
        let tensors: Vec<Tensor<B::InnerBackend, 1>> = steps
            .iter()
            .flat_map(|step| {
                let batches = step.batches.iter();
                batches
                    .flat_map(|b| [b.loss.clone(), b.correct.clone().float()])
                    .chain(step.grad_norm.clone())
            })
            .collect();
        let values: Vec<f32> = match tensors.is_empty() {
            true => Vec::new(),
            false => Tensor::cat(tensors, 0)
                .into_data()
                .convert::<f32>()
                .to_vec()
                .expect("an f32 vector"),
        };
        let mut values = values.into_iter().map(f64::from);
        let mut next = move || values.next().expect("a value per figure read");
        steps
            .into_iter()
            .map(|step| {
                let mut stats = StepStats {
                    images: step.images,
                    ..StepStats::default()
                };
                for batch in step.batches {
                    stats.loss_sum += next() * batch.images as f64;
                    stats.correct += next() as usize;
                }
                stats.grad_norm = step.grad_norm.map(|_| next());
                stats
            })
            .collect()
    }
}
