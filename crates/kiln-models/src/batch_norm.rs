//! Batch normalization with PyTorch's semantics, laid out to be fast on every backend.
//!
//! Two differences from burn 0.21's `BatchNorm`:
//! - the running variance is updated with the unbiased batch variance (n / (n - 1)), as PyTorch
//!   does, so fine-tuning and imported statistics agree with it;
//! - every per-channel operation runs on the input viewed as `[N * C, H * W]`, so broadcasts run
//!   along the last dimension. On burn-flex, broadcasting a `[1, C, 1, 1]` tensor over NCHW is
//!   about 100x slower than the same arithmetic in this layout.
//!
//! As in burn, the mode follows the backend: on an autodiff backend the layer normalizes with
//! batch statistics and updates its running ones (PyTorch's `train()`); on a plain backend, for
//! example after `model.valid()`, it uses the running statistics (PyTorch's `eval()`).
//!
//! Inside [`synchronized`] (data-parallel training with `sync_bn`) the batch statistics are
//! those of every replica's images together, as PyTorch's `SyncBatchNorm` computes them.

use std::any::Any;
use std::cell::RefCell;
use std::rc::Rc;

use burn::module::{Module, Param};

use crate::buffer::Buffer;
use crate::precision::in_f32;
use burn::tensor::{Tensor, backend::Backend};

/// `torch.nn.BatchNorm2d(num_features, eps=1e-5, momentum=0.1)`, with torchvision's names.
#[derive(Module, Debug)]
pub struct BatchNorm2d<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub bias: Param<Tensor<B, 1>>,
    pub running_mean: Buffer<B>,
    pub running_var: Buffer<B>,
    /// Kept as a float of one element because burn's modules record float tensors; it is
    /// exported as PyTorch's int64 scalar.
    pub num_batches_tracked: Buffer<B>,
    pub momentum: f64,
    pub eps: f64,
    /// Normalize with the running statistics even while training, and leave them as they are
    /// (detectron2's `FrozenBatchNorm2d`, for fine-tuning with few images per device). The
    /// affine weight and bias still train.
    pub frozen: bool,
}

impl<B: Backend> BatchNorm2d<B> {
    /// Weight 1 and bias 0, as torchvision initializes it; `zero_weight` starts the layer at
    /// zero (torchvision's `zero_init_residual`).
    pub fn new(num_features: usize, zero_weight: bool, device: &B::Device) -> Self {
        let weight = if zero_weight {
            Tensor::zeros([num_features], device)
        } else {
            Tensor::ones([num_features], device)
        };
        Self {
            weight: Param::from_tensor(weight),
            bias: Param::from_tensor(Tensor::zeros([num_features], device)),
            running_mean: Buffer::new(Tensor::zeros([num_features], device)),
            running_var: Buffer::new(Tensor::ones([num_features], device)),
            num_batches_tracked: Buffer::new(Tensor::zeros([1], device)),
            momentum: 0.1,
            eps: 1e-5,
            frozen: false,
        }
    }

    /// Statistics and normalization run in f32 whatever the input's float type (mixed
    /// precision); the output has the input's type.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        in_f32(x, |x| match self.folded(&x.device()) {
            Some((scale, shift)) => per_channel_affine(x, scale, shift),
            None => self.forward_train(x),
        })
    }

    /// `relu(self.forward(x) + residual)` (the residual and ReLU where given) as one operation
    /// each way where kiln-kernels has one on this backend (its CubeCL kernels on the GPU
    /// backends, f32): in training, moving the running statistics as [`Self::forward`] does; in
    /// inference, with them. `None` where it has none, or frozen in training, or synchronized,
    /// for the caller to compose.
    pub fn forward_fused(
        &self,
        x: &Tensor<B, 4>,
        residual: Option<&Tensor<B, 4>>,
        relu: bool,
    ) -> Option<Tensor<B, 4>> {
        let device = x.device();
        if !B::ad_enabled(&device) {
            return kiln_kernels::batch_norm_eval(&kiln_kernels::BatchNormEval {
                x: x.clone(),
                weight: self.weight.val(),
                bias: self.bias.val(),
                running_mean: self.running_mean.value().to_device(&device),
                running_var: self.running_var.value().to_device(&device),
                eps: self.eps,
                residual: residual.cloned(),
                relu,
            });
        }
        if self.frozen || synced::<B>().is_some() {
            return None;
        }
        let running = |state: &Buffer<B>| state.value().to_device(&device);
        let step = kiln_kernels::BatchNormStep {
            x: x.clone(),
            weight: self.weight.val(),
            bias: self.bias.val(),
            running_mean: running(&self.running_mean),
            running_var: running(&self.running_var),
            num_batches_tracked: running(&self.num_batches_tracked),
            momentum: self.momentum,
            eps: self.eps,
            residual: residual.cloned(),
            relu,
        };
        let out = kiln_kernels::batch_norm_step(&step)?;
        for (state, value) in [
            (&self.running_mean, out.running_mean),
            (&self.running_var, out.running_var),
            (&self.num_batches_tracked, out.num_batches_tracked),
        ] {
            state.update(value);
        }
        Some(out.y)
    }

    /// Normalizes with the batch's statistics and folds them into the running ones.
    fn forward_train(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [n, c, h, w] = x.dims();
        // One fused operation where kiln has one (the CPU backend), unless synchronized.
        if synced::<B>().is_none()
            && let Some((y, mean, var)) =
                kiln_kernels::batch_norm_train(&x, &self.weight.val(), &self.bias.val(), self.eps)
        {
            self.update_running_stats(mean.reshape([1, c]), var.reshape([1, c]), n * h * w);
            return y;
        }
        let rows = x.reshape([n * c, h * w]);

        let (mean, centered, var, count) = match synced::<B>() {
            None => {
                let mean = per_channel_mean(rows.clone(), n, c);
                let centered = rows - per_row(mean.clone(), n);
                let var = per_channel_mean(centered.clone().square(), n, c);
                (mean, centered, var, n * h * w)
            }
            Some(Synced { sum, images }) => {
                // Sums, not means: replicas may hold different numbers of images.
                let count = images * h * w;
                let mean = sum(per_channel_sum(rows.clone(), n, c)) / count as f64;
                let centered = rows - per_row(mean.clone(), n);
                let var = sum(per_channel_sum(centered.clone().square(), n, c)) / count as f64;
                (mean, centered, var, count)
            }
        };

        self.update_running_stats(mean, var.clone(), count);

        // A division, not `recip()`: burn-ndarray 0.21's reciprocal is approximate (kiln patches
        // it, `patches/burn-ndarray`; the division stays right with the published crate too).
        let scale = self.weight.val().reshape([1, c]) / (var + self.eps).sqrt();
        let y = centered * per_row(scale, n) + per_row(self.bias.val().reshape([1, c]), n);
        y.reshape([n, c, h, w])
    }

    /// The scale and shift per channel (`[C]`) that normalize with the running statistics, where
    /// this layer normalizes so on `device` (inference, or frozen); `None` where it uses the
    /// batch's statistics.
    pub(crate) fn folded(&self, device: &B::Device) -> Option<(Tensor<B, 1>, Tensor<B, 1>)> {
        if B::ad_enabled(device) && !self.frozen {
            return None;
        }
        // Detached: statistics loaded from a record come back as tracked leaves, and a tracked
        // leaf kept across steps (frozen batch norm never replaces it) ties each step's graph
        // to the one before, so that from the second step on, gradients picked up old terms.
        let running_mean = self.running_mean.value().detach().to_device(device);
        let running_var = self.running_var.value().detach().to_device(device);

        let scale = self.weight.val() / (running_var + self.eps).sqrt();
        let shift = self.bias.val() - running_mean * scale.clone();
        Some((scale, shift))
    }

    /// PyTorch's update: the running variance takes the unbiased batch variance.
    fn update_running_stats(&self, mean: Tensor<B, 2>, var: Tensor<B, 2>, count: usize) {
        let device = mean.device();
        let m = self.momentum;
        let unbiased = var.detach() * (count as f64 / (count.max(2) - 1) as f64);
        let [_, c] = mean.dims();
        let update = |state: &Buffer<B>, batch: Tensor<B, 2>| {
            let running = state.value().to_device(&device);
            state.update((running * (1.0 - m) + batch.reshape([c]) * m).detach());
        };
        update(&self.running_mean, mean.detach());
        update(&self.running_var, unbiased);
        let tracked = self.num_batches_tracked.value().to_device(&device);
        self.num_batches_tracked.update(tracked + 1.0);
    }
}

/// Mean over batch and space of `[N * C, H * W]` rows, as `[1, C]`. Every channel averages the
/// same number of values per image, so the mean of per-image means is exact.
fn per_channel_mean<B: Backend>(rows: Tensor<B, 2>, n: usize, c: usize) -> Tensor<B, 2> {
    rows.mean_dim(1).reshape([n, c]).mean_dim(0)
}

/// Sum over batch and space of `[N * C, H * W]` rows, as `[1, C]`.
fn per_channel_sum<B: Backend>(rows: Tensor<B, 2>, n: usize, c: usize) -> Tensor<B, 2> {
    rows.sum_dim(1).reshape([n, c]).sum_dim(0)
}

/// What a replica's batch norm layers know of the others while [`synchronized`] runs.
struct Synced<B: Backend> {
    /// Adds a tensor up over every replica of a data-parallel run; its gradient is likewise the
    /// sum of the replicas' gradients (what an all-reduce's backward is).
    sum: Rc<dyn Fn(Tensor<B, 2>) -> Tensor<B, 2>>,
    /// The images of this forward pass on all replicas together.
    images: usize,
}

impl<B: Backend> Clone for Synced<B> {
    fn clone(&self) -> Self {
        Self {
            sum: self.sum.clone(),
            images: self.images,
        }
    }
}

thread_local! {
    /// The `Synced` of the replica training on this thread, while [`synchronized`] runs.
    static SYNCED: RefCell<Option<Rc<dyn Any>>> = const { RefCell::new(None) };
}

/// Runs `f` (a replica's forward pass over its part of a batch of `images` on all replicas)
/// with every batch norm layer on this thread normalizing with the statistics of all replicas'
/// images, which `sum` adds up over the replicas (PyTorch's `SyncBatchNorm`). Every replica
/// must run the same layers in the same order, as each sum waits for all of them. A
/// thread-local setting rather than a model field, so that the model and its checkpoints are
/// the same with and without it.
pub fn synchronized<B: Backend, T>(
    sum: impl Fn(Tensor<B, 2>) -> Tensor<B, 2> + 'static,
    images: usize,
    f: impl FnOnce() -> T,
) -> T {
    /// Puts the previous setting back, also when `f` panics.
    struct Restore(Option<Rc<dyn Any>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SYNCED.set(self.0.take());
        }
    }
    let synced = Synced::<B> {
        sum: Rc::new(sum),
        images,
    };
    let _restore = Restore(SYNCED.replace(Some(Rc::new(synced))));
    f()
}

fn synced<B: Backend>() -> Option<Synced<B>> {
    SYNCED.with_borrow(|synced| synced.as_ref()?.downcast_ref::<Synced<B>>().cloned())
}

/// A `[1, C]` per-channel value as a `[N * C, 1]` column that broadcasts along each row.
/// `x * scale + shift` per channel (`[C]` each): batch norm with its running statistics folded.
fn per_channel_affine<B: Backend>(
    x: Tensor<B, 4>,
    scale: Tensor<B, 1>,
    shift: Tensor<B, 1>,
) -> Tensor<B, 4> {
    let [n, c, h, w] = x.dims();
    let y = x.reshape([n * c, h * w]) * per_row(scale.reshape([1, c]), n)
        + per_row(shift.reshape([1, c]), n);
    y.reshape([n, c, h, w])
}

fn per_row<B: Backend>(per_channel: Tensor<B, 2>, n: usize) -> Tensor<B, 2> {
    let [_, c] = per_channel.dims();
    per_channel.expand([n, c]).reshape([n * c, 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, TensorData, Tolerance};

    type Inner = Flex;
    type Train = Autodiff<Flex>;

    fn input<B: Backend>(device: &B::Device) -> Tensor<B, 4> {
        let values: Vec<f32> = (0..2 * 3 * 4 * 5)
            .map(|i| ((i * 37 % 23) as f32 - 9.0) * 0.3 + (i % 3) as f32)
            .collect();
        Tensor::from_data(TensorData::new(values, [2, 3, 4, 5]), device)
    }

    /// Per channel: (mean, biased variance, unbiased variance) of an NCHW tensor.
    fn channel_stats(x: &Tensor<Inner, 4>) -> Vec<(f64, f64, f64)> {
        let [n, c, h, w] = x.dims();
        let v = x.to_data().to_vec::<f32>().unwrap();
        (0..c)
            .map(|ch| {
                let vals: Vec<f64> = (0..n)
                    .flat_map(|i| (0..h * w).map(move |j| (i * c + ch) * h * w + j))
                    .map(|k| v[k] as f64)
                    .collect();
                let count = vals.len() as f64;
                let mean = vals.iter().sum::<f64>() / count;
                let ss = vals.iter().map(|x| (x - mean).powi(2)).sum::<f64>();
                (mean, ss / count, ss / (count - 1.0))
            })
            .collect()
    }

    #[test]
    fn train_mode_normalizes_with_batch_statistics() {
        let device = Default::default();
        let bn = BatchNorm2d::<Train>::new(3, false, &device);
        let y: Tensor<Inner, 4> = bn.forward(input(&device)).inner();
        for (mean, var, _) in channel_stats(&y) {
            assert!(mean.abs() < 1e-5, "mean {mean}");
            assert!((var - 1.0).abs() < 1e-3, "var {var}");
        }
    }

    #[test]
    fn running_variance_is_unbiased_like_pytorch() {
        let device = Default::default();
        let bn = BatchNorm2d::<Train>::new(3, false, &device);
        let x = input::<Train>(&device);
        let stats = channel_stats(&x.clone().inner());
        let _ = bn.forward(x);
        let running_mean = bn.running_mean.value().into_data().to_vec::<f32>().unwrap();
        let running_var = bn.running_var.value().into_data().to_vec::<f32>().unwrap();
        for (c, (mean, _, unbiased)) in stats.into_iter().enumerate() {
            assert!((running_mean[c] as f64 - 0.1 * mean).abs() < 1e-5);
            assert!((running_var[c] as f64 - (0.9 + 0.1 * unbiased)).abs() < 1e-5);
        }
        let tracked = bn
            .num_batches_tracked
            .value()
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(tracked, vec![1.0]);
    }

    /// Two replicas with the same images: the statistics over both are each one's, but the
    /// running variance's unbiasing counts the images of both.
    #[test]
    fn synchronized_statistics_count_every_replicas_images() {
        let device = Default::default();
        let x = input::<Train>(&device);
        let alone = BatchNorm2d::<Train>::new(3, false, &device);
        let expected = alone.forward(x.clone()).inner();
        let synced = BatchNorm2d::<Train>::new(3, false, &device);
        let y = synchronized(
            |t: Tensor<Train, 2>| t * 2.0,
            4,
            || synced.forward(x.clone()),
        );
        y.inner()
            .into_data()
            .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::rel_abs(1e-5, 1e-5));
        let running_var = synced.running_var.value().into_data().to_vec::<f32>();
        let count = 2.0 * 2.0 * 4.0 * 5.0;
        for (c, (_, biased, _)) in channel_stats(&x.inner()).into_iter().enumerate() {
            let unbiased = biased * count / (count - 1.0);
            assert!(
                (running_var.as_ref().unwrap()[c] as f64 - (0.9 + 0.1 * unbiased)).abs() < 1e-5
            );
        }
        // Outside `synchronized`, layers normalize alone again.
        assert!(super::synced::<Train>().is_none());
    }

    #[test]
    fn eval_mode_uses_running_statistics() {
        let device = Default::default();
        let mut bn = BatchNorm2d::<Inner>::new(3, false, &device);
        let weight = Tensor::<Inner, 1>::from_floats([1.5, -0.5, 2.0], &device);
        let bias = Tensor::<Inner, 1>::from_floats([0.1, 0.2, -0.3], &device);
        let mean = Tensor::<Inner, 1>::from_floats([0.5, -1.0, 2.0], &device);
        let var = Tensor::<Inner, 1>::from_floats([4.0, 0.25, 1.0], &device);
        bn.weight = Param::from_tensor(weight.clone());
        bn.bias = Param::from_tensor(bias.clone());
        bn.running_mean = Buffer::new(mean.clone());
        bn.running_var = Buffer::new(var.clone());

        let x = Tensor::<Inner, 4>::random([2, 3, 4, 4], Distribution::Default, &device);
        let shape = [1, 3, 1, 1];
        let expected = (x.clone() - mean.reshape(shape)) / (var.reshape(shape) + 1e-5).sqrt()
            * weight.reshape(shape)
            + bias.reshape(shape);
        bn.forward(x)
            .into_data()
            .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::rel_abs(1e-5, 1e-5));
    }
}
