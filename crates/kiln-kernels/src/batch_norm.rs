//! Batch normalization in training as one operation on `Autodiff<Flex>`: two passes over the
//! input forward (the statistics, then the output) and two backward (the sums, then the input's
//! gradient), where burn's operations take about a dozen forward and twice that backward, each
//! allocating its result and recording a graph node. On the quickstart's small maps the cost per
//! operation, not the arithmetic, is what the step spends.
//!
//! Per-channel sums accumulate in f64, so the statistics are those of the exact arithmetic to
//! f32's precision whatever the batch and map size.

use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive, backend::Backend};
use rayon::prelude::*;

use crate::flex::{Train, dims, primitive, same, values};

/// Elements a parallel task gets at least: below this, handing work to another thread costs
/// more than it saves.
const MIN_TASK: usize = 1 << 14;

/// kiln's batch norm in training when `B` is flex under autodiff and every tensor is f32.
pub(crate) fn batch_norm_train<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 1>,
    bias: &Tensor<B, 1>,
    eps: f64,
) -> Option<(Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>)> {
    if [x.dtype(), weight.dtype(), bias.dtype()] != [DType::F32; 3] {
        return None;
    }
    let x = same::<_, Tensor<Train, 4>>(x.clone())?;
    let weight = same::<_, Tensor<Train, 1>>(weight.clone())?;
    let bias = same::<_, Tensor<Train, 1>>(bias.clone())?;
    let device = x.device();
    let (y, mean, var) = train(x, weight, bias, eps);
    let stat = |values: Vec<f32>| {
        let len = values.len();
        same(Tensor::<Train, 1>::from_data(
            TensorData::new(values, [len]),
            &device,
        ))
    };
    Some((same(y)?, stat(mean)?, stat(var)?))
}

/// Training-mode batch norm of `x` (`[N, C, H, W]`) with `weight` and `bias` (`[C]`); returns
/// the output and the batch's mean and biased variance per channel (`[C]`, untracked).
pub(crate) fn train(
    x: Tensor<Train, 4>,
    weight: Tensor<Train, 1>,
    bias: Tensor<Train, 1>,
    eps: f64,
) -> (Tensor<Train, 4>, Vec<f32>, Vec<f32>) {
    let x = x.into_primitive().tensor();
    let weight = weight.into_primitive().tensor();
    let bias = bias.into_primitive().tensor();
    let shape = dims(&x.primitive);
    let input = values(&x.primitive);
    let stats = Stats::new(&input, shape, eps);
    let gamma = values(&weight.primitive).into_owned();
    let beta = values(&bias.primitive);
    let y = primitive(stats.normalize(&input, &gamma, &beta), shape);
    let (mean, var) = (stats.mean_f32(), stats.var_f32());
    let y = match BatchNormBackward
        .prepare::<NoCheckpointing>([x.node.clone(), weight.node.clone(), bias.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let x_state = prep.checkpoint(&x);
            prep.finish((x_state, stats, gamma), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    (Tensor::from_primitive(TensorPrimitive::Float(y)), mean, var)
}

/// The batch's statistics per channel, and the shape they were taken over.
#[derive(Clone, Debug)]
struct Stats {
    shape: [usize; 4],
    mean: Vec<f64>,
    var: Vec<f64>,
    /// `1 / sqrt(var + eps)`.
    inv_std: Vec<f64>,
}

impl Stats {
    /// Mean, then the mean squared distance from it (two passes: no cancellation).
    fn new(x: &[f32], shape: [usize; 4], eps: f64) -> Self {
        let [n, c, h, w] = shape;
        let count = (n * h * w).max(1) as f64;
        let per_channel = |f: &(dyn Fn(usize) -> f64 + Sync)| -> Vec<f64> {
            (0..c)
                .into_par_iter()
                .with_min_len(tasks_of(n * h * w))
                .map(f)
                .collect()
        };
        let mean = per_channel(&|ch| {
            planes(x, shape, ch)
                .map(|p| Lanes::sum(p, |v| v))
                .sum::<f64>()
                / count
        });
        let var = per_channel(&|ch| {
            let m = mean[ch];
            planes(x, shape, ch)
                .map(|p| Lanes::sum(p, |v| (v - m).powi(2)))
                .sum::<f64>()
                / count
        });
        let inv_std = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        Self {
            shape,
            mean,
            var,
            inv_std,
        }
    }

    fn mean_f32(&self) -> Vec<f32> {
        self.mean.iter().map(|&v| v as f32).collect()
    }

    fn var_f32(&self) -> Vec<f32> {
        self.var.iter().map(|&v| v as f32).collect()
    }

    /// `(x - mean) * (weight / sqrt(var + eps)) + bias`.
    fn normalize(&self, x: &[f32], weight: &[f32], bias: &[f32]) -> Vec<f32> {
        let [_, c, h, w] = self.shape;
        let scale: Vec<f32> = (0..c)
            .map(|ch| (f64::from(weight[ch]) * self.inv_std[ch]) as f32)
            .collect();
        let write = |index: usize, out: &mut [MaybeUninit<f32>]| {
            let ch = index % c;
            let (m, s, b) = (self.mean[ch] as f32, scale[ch], bias[ch]);
            let input = &x[index * h * w..][..h * w];
            for (o, &v) in out.iter_mut().zip(input) {
                o.write((v - m) * s + b);
            }
        };
        // SAFETY: each plane of `out` is as long as the input's, so the loop writes all of it.
        unsafe { planes_written(x.len(), h * w, write) }
    }
}

/// Sums in f64 over [`Lanes::WIDTH`] independent partial sums: one running sum makes each
/// addition wait for the one before (four cycles an element, the larger part of batch norm's
/// time in a ResNet-18 step); independent ones pipeline and vectorize.
struct Lanes;

impl Lanes {
    const WIDTH: usize = 8;

    /// `Σ f(v)` over `values`.
    fn sum(values: &[f32], f: impl Fn(f64) -> f64) -> f64 {
        let (chunks, rest) = values.as_chunks::<{ Self::WIDTH }>();
        let mut lanes = [0.0f64; Self::WIDTH];
        for chunk in chunks {
            for (lane, &v) in lanes.iter_mut().zip(chunk) {
                *lane += f(f64::from(v));
            }
        }
        lanes.iter().sum::<f64>() + rest.iter().map(|&v| f(f64::from(v))).sum::<f64>()
    }

    /// `(Σ g, Σ g (x - mean) inv_std)` over the pairs of `x` and `dy`.
    fn sum_and_dot(x: &[f32], dy: &[f32], mean: f64, inv_std: f64) -> (f64, f64) {
        let (xs, x_rest) = x.as_chunks::<{ Self::WIDTH }>();
        let (gs, g_rest) = dy.as_chunks::<{ Self::WIDTH }>();
        let (mut sum, mut dot) = ([0.0f64; Self::WIDTH], [0.0f64; Self::WIDTH]);
        for (xs, gs) in xs.iter().zip(gs) {
            for l in 0..Self::WIDTH {
                let g = f64::from(gs[l]);
                sum[l] += g;
                dot[l] += g * (f64::from(xs[l]) - mean) * inv_std;
            }
        }
        let (mut sum, mut dot) = (sum.iter().sum::<f64>(), dot.iter().sum::<f64>());
        for (&v, &g) in x_rest.iter().zip(g_rest) {
            let g = f64::from(g);
            sum += g;
            dot += g * (f64::from(v) - mean) * inv_std;
        }
        (sum, dot)
    }
}

/// Channel `ch`'s plane of every image.
fn planes(x: &[f32], [n, c, h, w]: [usize; 4], ch: usize) -> impl Iterator<Item = &[f32]> {
    (0..n).map(move |k| &x[(k * c + ch) * h * w..][..h * w])
}

/// `len` values written by `f(index, plane)` over their `[N * C]` planes of `plane` elements
/// (handed over uninitialized: zeroing them first would be a pass over memory of its own), in
/// parallel where there is enough work.
///
/// # Safety
///
/// `f` writes every value of each plane it is handed.
unsafe fn planes_written(
    len: usize,
    plane: usize,
    f: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    if plane > 0 {
        out.spare_capacity_mut()[..len]
            .par_chunks_mut(plane)
            .with_min_len(tasks_of(plane))
            .enumerate()
            .for_each(|(index, chunk)| f(index, chunk));
    }
    // SAFETY: the planes cover all `len` values (none when `plane` is 0, and then `len` is 0),
    // and the caller's `f` wrote each.
    unsafe { out.set_len(len) };
    out
}

/// How many items of `size` elements make a task of at least [`MIN_TASK`].
fn tasks_of(size: usize) -> usize {
    (MIN_TASK / size.max(1)).max(1)
}

#[derive(Debug)]
struct BatchNormBackward;

impl Backward<Flex, 3> for BatchNormBackward {
    /// The input's checkpoint, the statistics and the weight's values.
    type State = (NodeId, Stats, Vec<f32>);

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [x_node, weight_node, bias_node] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let (x_state, stats, weight) = ops.state;
        let x = checkpointer.retrieve_node_output::<FloatTensor<Flex>>(x_state);
        let (x, dy) = (values(&x), values(&dy));
        let [n, c, h, w] = stats.shape;
        let count = (n * h * w).max(1) as f64;

        // Per channel: the sum of dy, and of dy times the normalized input.
        let sums: Vec<(f64, f64)> = (0..c)
            .into_par_iter()
            .with_min_len(tasks_of(n * h * w))
            .map(|ch| {
                let (m, s) = (stats.mean[ch], stats.inv_std[ch]);
                planes(&x, stats.shape, ch)
                    .zip(planes(&dy, stats.shape, ch))
                    .fold((0.0, 0.0), |(sum, dot), (xs, dys)| {
                        let (plane_sum, plane_dot) = Lanes::sum_and_dot(xs, dys, m, s);
                        (sum + plane_sum, dot + plane_dot)
                    })
            })
            .collect();

        if let Some(node) = x_node {
            // dx = weight * inv_std * (dy - mean(dy) - x_hat * mean(dy * x_hat)).
            let write = |index: usize, out: &mut [MaybeUninit<f32>]| {
                let ch = index % c;
                let (m, s) = (stats.mean[ch] as f32, stats.inv_std[ch] as f32);
                let a = (f64::from(weight[ch]) * stats.inv_std[ch]) as f32;
                let mean_dy = (sums[ch].0 / count) as f32;
                let mean_dot = (sums[ch].1 / count) as f32;
                let input = &x[index * h * w..][..h * w];
                let grad = &dy[index * h * w..][..h * w];
                for ((o, &v), &g) in out.iter_mut().zip(input).zip(grad) {
                    o.write(a * (g - mean_dy - (v - m) * s * mean_dot));
                }
            };
            // SAFETY: each plane of `out` is as long as the input's, so the loop writes all of it.
            let dx = unsafe { planes_written(x.len(), h * w, write) };
            grads.register::<Flex>(node.id, primitive(dx, stats.shape));
        }
        let per_channel = |pick: fn(&(f64, f64)) -> f64| -> FloatTensor<Flex> {
            let values: Vec<f32> = sums.iter().map(|s| pick(s) as f32).collect();
            Tensor::<Flex, 1>::from_data(TensorData::new(values, [c]), &Default::default())
                .into_primitive()
                .tensor()
        };
        if let Some(node) = weight_node {
            grads.register::<Flex>(node.id, per_channel(|s| s.1));
        }
        if let Some(node) = bias_node {
            grads.register::<Flex>(node.id, per_channel(|s| s.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Tensor, TensorData, Tolerance};

    use super::{Lanes, Train};

    /// The partial sums add up to the one running sum, tail included: on values whose sums are
    /// exact in f64 (multiples of 1/8), equal to the last bit.
    #[test]
    fn lanes_sum_every_value_once() {
        let x: Vec<f32> = (0..1003).map(|i| (i % 37) as f32 / 8.0 - 2.0).collect();
        let dy: Vec<f32> = (0..1003).map(|i| (i % 11) as f32 / 4.0 - 1.0).collect();
        let (mean, inv_std) = (0.5, 2.0);
        let square = |v: f64| (v - mean) * (v - mean);
        let serial = x.iter().map(|&v| square(f64::from(v))).sum::<f64>();
        assert_eq!(Lanes::sum(&x, square), serial);
        let (sum, dot) = x.iter().zip(&dy).fold((0.0, 0.0), |(sum, dot), (&v, &g)| {
            let g = f64::from(g);
            (sum + g, dot + g * (f64::from(v) - mean) * inv_std)
        });
        assert_eq!(Lanes::sum_and_dot(&x, &dy, mean, inv_std), (sum, dot));
        assert_eq!(
            Lanes::sum(&x[..5], |v| v),
            x[..5].iter().map(|&v| f64::from(v)).sum::<f64>()
        );
    }

    /// The output, statistics and all three gradients against burn's operations composed as
    /// kiln-models composed them before: 1x1 maps, a batch of one, channel counts that are not
    /// a multiple of the vector width, and maps large enough to split over threads.
    #[test]
    fn batch_norm_matches_burns_operations() {
        let eps = 1e-5;
        for shape in [
            [2, 3, 1, 1],
            [1, 5, 3, 3],
            [4, 17, 5, 7],
            [8, 16, 8, 8],
            [3, 20, 41, 40],
        ] {
            let [_, c, _, _] = shape;
            let x = fixed(shape, 1, 0.5);
            let weight: Tensor<Train, 1> = fixed([c], 2, 1.0);
            let bias: Tensor<Train, 1> = fixed([c], 3, 0.0);
            let loss_weights: Tensor<Train, 4> = fixed(shape, 4, 0.0);
            let run = |ours: bool| {
                let (x, weight, bias) = (
                    x.clone().require_grad(),
                    weight.clone().require_grad(),
                    bias.clone().require_grad(),
                );
                let (y, mean, var) = if ours {
                    let (y, mean, var) = super::train(x.clone(), weight.clone(), bias.clone(), eps);
                    let stat = |v: Vec<f32>| TensorData::new(v, [c]);
                    (y, stat(mean), stat(var))
                } else {
                    let per_channel = |t: Tensor<Train, 4>| t.mean_dim(0).mean_dim(2).mean_dim(3);
                    let mean = per_channel(x.clone());
                    let centered = x.clone() - mean.clone();
                    let var = per_channel(centered.clone().square());
                    let y = centered / (var.clone() + eps).sqrt()
                        * weight.clone().reshape([1, c, 1, 1])
                        + bias.clone().reshape([1, c, 1, 1]);
                    let stat = |t: Tensor<Train, 4>| t.reshape([c]).into_data();
                    (y, stat(mean), stat(var))
                };
                let grads = (y.clone() * loss_weights.clone()).sum().backward();
                [
                    y.into_data(),
                    mean,
                    var,
                    x.grad(&grads).unwrap().into_data(),
                    weight.grad(&grads).unwrap().into_data(),
                    bias.grad(&grads).unwrap().into_data(),
                ]
            };
            let names = ["output", "mean", "variance", "dx", "dweight", "dbias"];
            let tolerance = Tolerance::<f32>::rel_abs(1e-4, 1e-4);
            for ((ours, reference), name) in run(true).iter().zip(run(false)).zip(names) {
                println!("{shape:?} {name}");
                ours.assert_approx_eq(&reference, tolerance);
            }
        }
    }

    /// A batch norm whose input needs no gradient still gives the weight's and bias's.
    #[test]
    fn an_untracked_input_still_trains_the_affine_weights() {
        let x: Tensor<Train, 4> = fixed([2, 3, 4, 4], 5, 0.0);
        let weight = fixed::<1>([3], 6, 1.0).require_grad();
        let bias = fixed::<1>([3], 7, 0.0).require_grad();
        let (y, _, _) = super::train(x, weight.clone(), bias.clone(), 1e-5);
        let grads = (y.clone() * y).sum().backward();
        assert!(weight.grad(&grads).is_some());
        assert!(bias.grad(&grads).is_some());
    }

    /// Deterministic values in `[offset - 1, offset + 1)`, different for each `seed`.
    fn fixed<const D: usize>(shape: [usize; D], seed: u64, offset: f32) -> Tensor<Train, D> {
        let count = shape.iter().product::<usize>();
        let values: Vec<f32> = (0..count as u64)
            .map(|i| {
                let v = (i + 1)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03));
                (v >> 40) as f32 / (1u64 << 23) as f32 - 1.0 + offset
            })
            .collect();
        Tensor::from_data(TensorData::new(values, shape), &Default::default())
    }
}
