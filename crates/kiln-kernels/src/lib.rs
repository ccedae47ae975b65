//! Kernels that make kiln's training step faster than burn 0.21 alone: on the CPU (flex, below)
//! and on CUDA, where convolutions and batch norm go through cuDNN (`cudnn/`) and the
//! classifier's product through cuBLAS (`cublas/`).
//!
//! burn 0.21 computes a convolution's weight gradient as another convolution whose kernel is the
//! whole output gradient, which flex runs at a fifth to a tenth of its matrix-product speed; on
//! ResNet-18 that was half the training step. Here the convolution and both its gradients are
//! matrix products over im2col matrices (`gemm_conv`) or, for 3x3 convolutions with stride 1,
//! Winograd's minimal filtering (`winograd`: F(2x2, 3x3) in training, 2.25x fewer multiply-adds;
//! F(4x4, 3x3), 4x fewer, in inference where it is the faster), installed as a custom autodiff
//! operation on `Autodiff<Flex>` (burn's backend-extension mechanism), not a fork of burn.
//!
//! Models stay generic over `Backend`: [`conv2d`] takes any backend and uses kiln's kernels only
//! where the backend is flex or CUDA (with or without autodiff) and the call is one they cover.
//! `docs/performance.md` has the measurements.

#[cfg(feature = "flex")]
mod batch_norm;
#[cfg(feature = "cuda")]
mod cublas;
#[cfg(feature = "cuda")]
mod cudnn;
// The pure half of the cuDNN and cuBLAS paths, tested on every build.
#[cfg(all(test, not(feature = "cuda")))]
#[allow(dead_code)]
mod cudnn {
    mod norm_math;
    mod plan;
    mod policy;
    mod store;
}
#[cfg(all(test, not(feature = "cuda")))]
#[allow(dead_code)]
mod cublas {
    mod gemm;
}
#[cfg(feature = "flex")]
mod epilogue;
#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
mod gemm_conv;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod portable;
#[cfg(feature = "flex")]
mod shifted_conv;
#[cfg(feature = "flex")]
mod uninit;
#[cfg(feature = "flex")]
mod winograd;

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::{Tensor, backend::Backend, module, ops::ConvOptions};

/// `torch.nn.functional.conv2d(x, weight)` without bias: burn's, or kiln's on the CPU backend.
pub fn conv2d<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    options: ConvOptions<2>,
) -> Tensor<B, 4> {
    #[cfg(feature = "flex")]
    if enabled()
        && let Some(y) = flex::conv2d(&x, &weight, &options)
    {
        return y;
    }
    #[cfg(feature = "cuda")]
    if enabled()
        && let Some(y) = cudnn::conv2d(&x, &weight, &options)
    {
        return y;
    }
    module::conv2d(x, weight, None, options)
}

/// Whether convolutions on burn's CUDA backend go through cuDNN: `Ok(cuDNN's version)`, or
/// `Err(why not)` (built without the `cuda` feature, `KILN_KERNELS=burn`, no libcudnn on the
/// library path, ...). Where `Err`, burn's own convolution kernels run.
pub fn cudnn_status() -> Result<String, String> {
    #[cfg(feature = "cuda")]
    return cudnn::status();
    #[cfg(not(feature = "cuda"))]
    Err("kiln was built without the `cuda` feature".into())
}

/// How many cuDNN algorithm searches this process has run (each waits for the GPU and times
/// every algorithm of a convolution pass, once per shape): for the GPU check's time limits.
pub fn cudnn_searches() -> usize {
    #[cfg(feature = "cuda")]
    return cudnn::searches();
    #[cfg(not(feature = "cuda"))]
    0
}

static TF32: AtomicBool = AtomicBool::new(true);

/// Whether cuDNN may compute f32 convolutions on TF32 tensor cores (10-bit mantissa products,
/// f32 sums), as PyTorch's `torch.backends.cudnn.allow_tf32`, which is on by default there and
/// here. Applies to convolutions whose algorithm is chosen after the call (the choice is
/// remembered per setting). 16-bit convolutions are unaffected.
pub fn set_tf32(allow: bool) {
    TF32.store(allow, Ordering::Relaxed);
}

/// The setting of [`set_tf32`].
pub fn tf32() -> bool {
    TF32.load(Ordering::Relaxed)
}

/// `value` as a `U` when `T` and `U` are the same type (how a generic caller reaches a
/// backend-specific path without a trait bound that every model would have to carry).
#[cfg(any(feature = "flex", feature = "cuda"))]
pub(crate) fn same<T: 'static, U: 'static>(value: T) -> Option<U> {
    let mut slot = Some(value);
    (&mut slot as &mut dyn std::any::Any)
        .downcast_mut::<Option<U>>()
        .and_then(Option::take)
}

/// What follows a convolution in a ResNet at inference: batch norm with its running statistics
/// folded into a `scale` and `shift` per output channel (`[C_out]`), then the block's
/// `residual` added (the output's shape) and ReLU, where given.
pub struct Epilogue<B: Backend> {
    pub scale: Tensor<B, 1>,
    pub shift: Tensor<B, 1>,
    pub residual: Option<Tensor<B, 4>>,
    pub relu: bool,
}

/// `relu(conv2d(x, weight) * scale + shift + residual)`, per output channel, as one pass over
/// the output where kiln has a kernel for it (flex without autodiff, f32: inference on the CPU);
/// `None` elsewhere, for the caller to compose from burn's operations.
pub fn conv2d_epilogue<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 4>,
    options: &ConvOptions<2>,
    epilogue: &Epilogue<B>,
) -> Option<Tensor<B, 4>> {
    #[cfg(feature = "flex")]
    if enabled() {
        return flex::conv2d_epilogue(x, weight, options, epilogue);
    }
    let _ = (x, weight, options, epilogue);
    None
}

/// Batch normalization in training (`torch.nn.functional.batch_norm(x, None, None, weight, bias,
/// training=True, eps=eps)`) as one operation where kiln has one (flex under autodiff, and
/// cuDNN's on CUDA under autodiff; f32): the output, and the batch's mean and biased variance
/// per channel (`[C]`, untracked, for the running statistics). `None` elsewhere, for the caller
/// to compose from burn's operations.
pub fn batch_norm_train<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 1>,
    bias: &Tensor<B, 1>,
    eps: f64,
) -> Option<(Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>)> {
    if !batch_norm_enabled() {
        return None;
    }
    #[cfg(feature = "flex")]
    if let Some(out) = batch_norm::batch_norm_train(x, weight, bias, eps) {
        return Some(out);
    }
    #[cfg(feature = "cuda")]
    if let Some(out) = cudnn::batch_norm_train(x, weight, bias, eps) {
        return Some(out);
    }
    let _ = (x, weight, bias, eps);
    None
}

/// One training step of a batch norm layer and what follows it in a ResNet:
/// `relu(batch_norm(x) + residual)`, the residual and ReLU where given, with the running
/// statistics moved as PyTorch moves them (`momentum`, the unbiased variance) and the count of
/// batches raised by one.
pub struct BatchNormStep<B: Backend> {
    pub x: Tensor<B, 4>,
    pub weight: Tensor<B, 1>,
    pub bias: Tensor<B, 1>,
    pub running_mean: Tensor<B, 1>,
    pub running_var: Tensor<B, 1>,
    pub num_batches_tracked: Tensor<B, 1>,
    pub momentum: f64,
    pub eps: f64,
    /// Added after the batch norm, before ReLU (a ResNet block's shortcut).
    pub residual: Option<Tensor<B, 4>>,
    pub relu: bool,
}

/// What [`batch_norm_step`] returns: the output and the new running statistics (untracked).
pub struct BatchNormStepped<B: Backend> {
    pub y: Tensor<B, 4>,
    pub running_mean: Tensor<B, 1>,
    pub running_var: Tensor<B, 1>,
    pub num_batches_tracked: Tensor<B, 1>,
}

/// [`BatchNormStep`] as one operation each way where kiln has one for the backend: its own
/// CubeCL kernels on wgpu (two launches each way, where burn's operations took about thirty
/// and their layout copies), and on CUDA where `KILN_KERNELS=portable-batch-norm` asks for them
/// instead of cuDNN's; f32, under autodiff. `None` elsewhere, for the caller to compose.
pub fn batch_norm_step<B: Backend>(step: &BatchNormStep<B>) -> Option<BatchNormStepped<B>> {
    if !batch_norm_enabled() {
        return None;
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(out) = portable::batch_norm_train(step) {
        return Some(out);
    }
    let _ = step;
    None
}

/// Batch norm in inference (the running statistics), with the residual and ReLU that follow it
/// in a ResNet: `relu((x - running_mean) / sqrt(running_var + eps) * weight + bias +
/// residual)`.
pub struct BatchNormEval<B: Backend> {
    pub x: Tensor<B, 4>,
    pub weight: Tensor<B, 1>,
    pub bias: Tensor<B, 1>,
    pub running_mean: Tensor<B, 1>,
    pub running_var: Tensor<B, 1>,
    pub eps: f64,
    pub residual: Option<Tensor<B, 4>>,
    pub relu: bool,
}

/// [`BatchNormEval`] as one kernel where kiln has one: its CubeCL kernel on wgpu and CUDA without
/// autodiff (validation, `kiln predict`), f32, reading any layout and keeping the input's.
/// `None` elsewhere, for the caller to compose.
pub fn batch_norm_eval<B: Backend>(eval: &BatchNormEval<B>) -> Option<Tensor<B, 4>> {
    if !batch_norm_enabled() {
        return None;
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(y) = portable::batch_norm_eval(eval) {
        return Some(y);
    }
    let _ = eval;
    None
}

/// Whether kiln's portable batch norm runs on CUDA instead of cuDNN's
/// (`KILN_KERNELS=portable-batch-norm`; which is faster is measured by the GPU check).
#[cfg(feature = "cuda")]
pub(crate) fn portable_batch_norm_on_cuda() -> bool {
    kernels_setting()
        .split(',')
        .any(|p| p.trim() == "portable-batch-norm")
}

/// `x` (`[batch, in]`) times `weight` (`[in, out]`, burn's `Linear` layout) plus `bias`, as
/// `torch.nn.functional.linear`, where kiln has a kernel for the product (cuBLAS on CUDA, with
/// or without autodiff; f32, bf16, f16); `None` elsewhere, for the caller's `Linear`.
pub fn linear<B: Backend>(
    x: &Tensor<B, 2>,
    weight: &Tensor<B, 2>,
    bias: Option<&Tensor<B, 1>>,
) -> Option<Tensor<B, 2>> {
    if !enabled() || leaves_to_burn("matmul") {
        return None;
    }
    #[cfg(feature = "cuda")]
    if let Some(y) = cublas::matmul(x, weight) {
        return Some(match bias {
            Some(bias) => y + bias.clone().unsqueeze(),
            None => y,
        });
    }
    let _ = (x, weight, bias);
    None
}

/// `KILN_KERNELS`: unset for kiln's kernels; `burn` for burn's operations everywhere (for
/// measuring against burn's or ruling kiln's out); or a comma-separated list of the parts left
/// to burn while kiln's convolutions run: `burn-batch-norm`, `burn-matmul`; and
/// `portable-batch-norm` for kiln's CubeCL batch norm on CUDA in place of cuDNN's (which is
/// faster on a GPU is measured, not assumed).
fn kernels_setting() -> &'static str {
    static SETTING: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SETTING.get_or_init(|| std::env::var("KILN_KERNELS").unwrap_or_default())
}

/// Whether `KILN_KERNELS` leaves `part` (`batch-norm`, `matmul`) to burn's operations.
fn leaves_to_burn(part: &str) -> bool {
    kernels_setting()
        .split(',')
        .any(|p| p.trim().strip_prefix("burn-") == Some(part))
}

fn batch_norm_enabled() -> bool {
    enabled() && !leaves_to_burn("batch-norm")
}

/// Whether kiln's kernels run (`KILN_KERNELS=burn` turns them off).
pub fn enabled() -> bool {
    kernels_setting() != "burn"
}
