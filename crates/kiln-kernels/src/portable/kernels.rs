//! Batch normalization in training as four CubeCL kernels, two each way, for every GPU cubecl
//! drives (wgpu's Vulkan, Metal and DX12, and CUDA):
//!
//! - forward: [`batch_norm_stats`] (one cube per channel: the batch's mean and variance in two
//!   passes over the channel, and the running statistics moved as PyTorch moves them) and
//!   [`batch_norm_apply`] (normalize, scale and shift, add the block's residual and apply ReLU
//!   where they follow, in one pass over the output);
//! - inference: [`batch_norm_eval`], the running statistics applied in the same one pass;
//! - backward: [`batch_norm_backward_reduce`] (one cube per channel: the sums of the output
//!   gradient and of its product with the normalized input, which are also the bias's and the
//!   weight's gradients; ReLU's mask applied) and [`batch_norm_backward_apply`] (the input's
//!   gradient, and the residual's).
//!
//! Tensors are read through their strides, so the input may come in any layout (a
//! convolution's NHWC output seen as NCHW, a broadcast gradient) without a copy, and outputs are
//! written in the layout chosen by the caller.

use cubecl::prelude::*;

/// The units of every cube of these kernels: Vulkan guarantees at least 128 invocations in a
/// workgroup.
pub(crate) const CUBE_UNITS: usize = 128;

/// The sum of every unit's `value`, in every unit.
#[cube]
fn cube_sum<F: Float>(shared: &mut SharedMemory<F>, value: F) -> F {
    let unit = UNIT_POS_X as usize;
    shared[unit] = value;
    sync_cube();
    // The cube's size read at run time: a constant cannot be updated in a loop.
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if unit < stride {
            let other = shared[unit + stride];
            shared[unit] += other;
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}

/// The offset in `t` (`[N, C, H, W]`, any strides) of the `i`th value of channel `c`, counting
/// over images, then rows, then columns.
#[cube]
fn channel_offset<F: Float>(t: &Tensor<F>, c: usize, i: usize) -> usize {
    let hw = t.shape(2) * t.shape(3);
    let n = i / hw;
    let s = i % hw;
    let h = s / t.shape(3);
    let w = s % t.shape(3);
    n * t.stride(0) + c * t.stride(1) + h * t.stride(2) + w * t.stride(3)
}

/// The coordinates `[n, c, h, w]` of the value at `position` in `t`'s memory, for a `t` whose
/// layout is a permutation of a packed one (NCHW, NHWC, ...).
#[cube]
fn coordinates<F: Float>(t: &Tensor<F>, position: usize) -> (usize, usize, usize, usize) {
    (
        (position / t.stride(0)) % t.shape(0),
        (position / t.stride(1)) % t.shape(1),
        (position / t.stride(2)) % t.shape(2),
        (position / t.stride(3)) % t.shape(3),
    )
}

/// The offset in `t` of the value at `[n, c, h, w]`.
#[cube]
fn offset<F: Float>(t: &Tensor<F>, n: usize, c: usize, h: usize, w: usize) -> usize {
    n * t.stride(0) + c * t.stride(1) + h * t.stride(2) + w * t.stride(3)
}

/// One cube per channel (`CUBE_POS_X`), [`CUBE_UNITS`] units: the batch's mean and `1 /
/// sqrt(var + eps)` (biased variance), and the running mean and variance moved by `momentum`
/// towards the batch's (the unbiased variance, as PyTorch), and the count of batches plus one.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_stats<F: Float>(
    x: &Tensor<F>,
    running_mean: &Tensor<F>,
    running_var: &Tensor<F>,
    tracked: &Tensor<F>,
    mean: &mut Tensor<F>,
    inv_std: &mut Tensor<F>,
    new_running_mean: &mut Tensor<F>,
    new_running_var: &mut Tensor<F>,
    new_tracked: &mut Tensor<F>,
    eps: f32,
    momentum: f32,
    #[define(F)] _dtype: StorageType,
) {
    let c = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let count = x.shape(0) * x.shape(2) * x.shape(3);
    let mut shared = SharedMemory::<F>::new(CUBE_UNITS);

    let mut sum = F::new(0.0);
    let mut i = unit;
    while i < count {
        sum += x[channel_offset(x, c, i)];
        i += CUBE_UNITS;
    }
    let batch_mean = cube_sum(&mut shared, sum) / F::cast_from(count);

    let mut squares = F::new(0.0);
    let mut j = unit;
    while j < count {
        let d = x[channel_offset(x, c, j)] - batch_mean;
        squares += d * d;
        j += CUBE_UNITS;
    }
    let var = cube_sum(&mut shared, squares) / F::cast_from(count);

    if unit == 0 {
        mean[c] = batch_mean;
        inv_std[c] = F::new(1.0) / F::sqrt(var + F::cast_from(eps));
        let m = F::cast_from(momentum);
        let kept = F::new(1.0) - m;
        let unbiased = select(
            count > 1,
            var * F::cast_from(count) / F::cast_from(count - 1),
            var,
        );
        new_running_mean[c] = running_mean[c] * kept + batch_mean * m;
        new_running_var[c] = running_var[c] * kept + unbiased * m;
        if c == 0 {
            new_tracked[0] = tracked[0] + F::new(1.0);
        }
    }
}

/// One unit per output value: `relu((x - mean) * inv_std * weight + bias + residual)`, the
/// residual and ReLU where asked (`residual` is not read without).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_apply<F: Float>(
    x: &Tensor<F>,
    mean: &Tensor<F>,
    inv_std: &Tensor<F>,
    weight: &Tensor<F>,
    bias: &Tensor<F>,
    residual: &Tensor<F>,
    y: &mut Tensor<F>,
    #[comptime] with_residual: bool,
    #[comptime] relu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let position = ABSOLUTE_POS;
    if position >= y.len() {
        terminate!();
    }
    let (n, c, h, w) = coordinates(y, position);
    let mut value = (x[offset(x, n, c, h, w)] - mean[c]) * inv_std[c] * weight[c] + bias[c];
    if with_residual {
        value += residual[offset(residual, n, c, h, w)];
    }
    if relu {
        value = max(value, F::new(0.0));
    }
    y[position] = value;
}

/// One unit per output value, in inference: `relu((x - running_mean) / sqrt(running_var + eps)
/// * weight + bias + residual)`, the residual and ReLU where asked.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_eval<F: Float>(
    x: &Tensor<F>,
    running_mean: &Tensor<F>,
    running_var: &Tensor<F>,
    weight: &Tensor<F>,
    bias: &Tensor<F>,
    residual: &Tensor<F>,
    y: &mut Tensor<F>,
    eps: f32,
    #[comptime] with_residual: bool,
    #[comptime] relu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let position = ABSOLUTE_POS;
    if position >= y.len() {
        terminate!();
    }
    let (n, c, h, w) = coordinates(y, position);
    let scale = weight[c] / F::sqrt(running_var[c] + F::cast_from(eps));
    let mut value = (x[offset(x, n, c, h, w)] - running_mean[c]) * scale + bias[c];
    if with_residual {
        value += residual[offset(residual, n, c, h, w)];
    }
    if relu {
        value = max(value, F::new(0.0));
    }
    y[position] = value;
}

/// One cube per channel, [`CUBE_UNITS`] units: with `dz` the output gradient (zero where ReLU
/// cut the output `y`), the bias's gradient `sum(dz)` and the weight's `sum(dz * x_hat)`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_backward_reduce<F: Float>(
    x: &Tensor<F>,
    dy: &Tensor<F>,
    y: &Tensor<F>,
    mean: &Tensor<F>,
    inv_std: &Tensor<F>,
    dweight: &mut Tensor<F>,
    dbias: &mut Tensor<F>,
    #[comptime] relu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let c = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let count = x.shape(0) * x.shape(2) * x.shape(3);
    let mut shared = SharedMemory::<F>::new(CUBE_UNITS);
    let channel_mean = mean[c];

    let mut sum_dz = F::new(0.0);
    let mut sum_dz_xmu = F::new(0.0);
    let mut i = unit;
    while i < count {
        let mut dz = dy[channel_offset(dy, c, i)];
        if relu && y[channel_offset(y, c, i)] <= F::new(0.0) {
            dz = F::new(0.0);
        }
        sum_dz += dz;
        sum_dz_xmu += dz * (x[channel_offset(x, c, i)] - channel_mean);
        i += CUBE_UNITS;
    }
    let total_dz = cube_sum(&mut shared, sum_dz);
    let total_dz_xmu = cube_sum(&mut shared, sum_dz_xmu);
    if unit == 0 {
        dbias[c] = total_dz;
        dweight[c] = total_dz_xmu * inv_std[c];
    }
}

/// One unit per input value: `dx = weight * inv_std * (dz - (dbias + x_hat * dweight) / M)`
/// over the `M` values of each channel, and the residual's gradient `dz` (where asked, in
/// `dx`'s layout).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_backward_apply<F: Float>(
    x: &Tensor<F>,
    dy: &Tensor<F>,
    y: &Tensor<F>,
    mean: &Tensor<F>,
    inv_std: &Tensor<F>,
    weight: &Tensor<F>,
    dweight: &Tensor<F>,
    dbias: &Tensor<F>,
    dx: &mut Tensor<F>,
    dresidual: &mut Tensor<F>,
    #[comptime] with_residual: bool,
    #[comptime] relu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let position = ABSOLUTE_POS;
    if position >= dx.len() {
        terminate!();
    }
    let (n, c, h, w) = coordinates(dx, position);
    let mut dz = dy[offset(dy, n, c, h, w)];
    if relu && y[offset(y, n, c, h, w)] <= F::new(0.0) {
        dz = F::new(0.0);
    }
    let count = F::cast_from(x.shape(0) * x.shape(2) * x.shape(3));
    let x_hat = (x[offset(x, n, c, h, w)] - mean[c]) * inv_std[c];
    dx[position] = weight[c] * inv_std[c] * (dz - (dbias[c] + x_hat * dweight[c]) / count);
    if with_residual {
        dresidual[position] = dz;
    }
}
