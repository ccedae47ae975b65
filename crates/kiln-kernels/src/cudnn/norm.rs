//! Batch normalization in training through cuDNN on burn's CUDA backend: one custom autodiff
//! operation on `Autodiff<Cuda>` whose forward is `cudnnBatchNormalizationForwardTraining` and
//! whose backward is `cudnnBatchNormalizationBackward`, each a custom operation in burn's fusion
//! stream (as the convolutions in `op.rs`), on cubecl's stream.
//!
//! burn's operations take about ten kernels and graph nodes forward and twenty backward for a
//! batch norm, and autodiff keeps their intermediate tensors; here it is one kernel and node each
//! way, and the backward keeps the input and two per-channel vectors, as PyTorch's does.
//!
//! The first call of each shape waits for the CUDA thread, and where cuDNN fails the same pass
//! runs in burn's operations on cubecl's kernels (`norm_math.rs`, each distinct failure logged
//! once); later calls are queued without waiting (`policy`).

use std::sync::LazyLock;

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorMetadata, TensorPrimitive, backend::Backend};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_ir::{CustomOpIr, OperationIr, TensorIr};
use cubecl_cuda::{CudaRuntime, ExternalLaunch};

use super::ffi::{BATCHNORM_SPATIAL, Descriptor, check, handle_on, lib};
use super::norm_math;
use super::op::{Handles, Runtime, aligned, inputs, report};
use super::plan::DataType;
use super::policy::{CallOutcome, Failure, Keys, Route};
use super::{Cube, Cuda, Train, available};
use crate::same;

/// cuDNN's batch norm when `B` is CUDA under autodiff, every tensor is f32 and cuDNN is there;
/// `None` otherwise, for burn's operations.
pub(crate) fn batch_norm_train<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 1>,
    bias: &Tensor<B, 1>,
    eps: f64,
) -> Option<(Tensor<B, 4>, Tensor<B, 1>, Tensor<B, 1>)> {
    if [x.dtype(), weight.dtype(), bias.dtype()] != [DType::F32; 3] {
        return None;
    }
    let [n, _, h, w] = x.dims();
    // One value per channel has no unbiased variance (PyTorch refuses it); cuDNN's descriptors
    // take `int` sizes.
    if n * h * w < 2 || x.dims().iter().product::<usize>() > i32::MAX as usize {
        return None;
    }
    let x = same::<_, Tensor<Train, 4>>(x.clone())?;
    let weight = same::<_, Tensor<Train, 1>>(weight.clone())?;
    let bias = same::<_, Tensor<Train, 1>>(bias.clone())?;
    if !available() {
        return None;
    }
    let (y, mean, var) = train(x, weight, bias, eps);
    Some((same(y)?, same(mean)?, same(var)?))
}

/// The output, and the batch's mean and biased variance (`[C]`, untracked).
fn train(
    x: Tensor<Train, 4>,
    weight: Tensor<Train, 1>,
    bias: Tensor<Train, 1>,
    eps: f64,
) -> (Tensor<Train, 4>, Tensor<Train, 1>, Tensor<Train, 1>) {
    let [n, c, h, w] = x.dims();
    let count = (n * h * w) as f64;
    let x = x.into_primitive().tensor();
    let weight = weight.into_primitive().tensor();
    let bias = bias.into_primitive().tensor();
    let inputs = vec![
        x.primitive.clone(),
        weight.primitive.clone(),
        bias.primitive.clone(),
    ];
    let outputs = [vec![n, c, h, w], vec![c], vec![c], vec![c], vec![c]];
    let [y, mean, inv_std, batch_mean, unbiased_var] =
        register(NormPass::Forward, inputs, outputs, eps)
            .try_into()
            .expect("five outputs");
    let y = match BatchNormBackward
        .prepare::<NoCheckpointing>([x.node.clone(), weight.node.clone(), bias.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let state = Saved {
                x: prep.checkpoint(&x),
                weight: weight.primitive,
                mean,
                inv_std,
                eps,
            };
            prep.finish(state, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    let untracked = |t: FloatTensor<Cuda>| {
        Tensor::<Train, 1>::from_inner(Tensor::from_primitive(TensorPrimitive::Float(t)))
    };
    // cuDNN hands the unbiased variance (for running statistics); the caller takes the biased.
    let var = untracked(unbiased_var) * ((count - 1.0) / count);
    (
        Tensor::from_primitive(TensorPrimitive::Float(y)),
        untracked(batch_mean),
        var,
    )
}

/// What the backward pass needs: the input, the weight and the forward's statistics.
#[derive(Debug, Clone)]
struct Saved {
    x: NodeId,
    weight: FloatTensor<Cuda>,
    mean: FloatTensor<Cuda>,
    inv_std: FloatTensor<Cuda>,
    eps: f64,
}

#[derive(Debug)]
struct BatchNormBackward;

impl Backward<Cuda, 3> for BatchNormBackward {
    type State = Saved;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [x_node, weight_node, bias_node] = ops.parents;
        let dy = grads.consume::<Cuda>(&ops.node);
        let saved = ops.state;
        let x = checkpointer.retrieve_node_output::<FloatTensor<Cuda>>(saved.x);
        let dims: [usize; 4] = x.shape().dims();
        let c = dims[1];
        let inputs = vec![x, dy, saved.weight, saved.mean, saved.inv_std];
        let shapes = [dims.to_vec(), vec![c], vec![c]];
        let [dx, dweight, dbias] = register(NormPass::Backward, inputs, shapes, saved.eps)
            .try_into()
            .expect("three outputs");
        for (node, grad) in [(x_node, dx), (weight_node, dweight), (bias_node, dbias)] {
            if let Some(node) = node {
                grads.register::<Cuda>(node.id, grad);
            }
        }
    }
}

/// Batch norm's two passes. Inputs and outputs, in order: forward `[x, weight, bias]` to `[y,
/// mean, inv_std, batch mean, unbiased variance]`; backward `[x, dy, weight, mean, inv_std]` to
/// `[dx, dweight, dbias]`. Every tensor f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum NormPass {
    Forward,
    Backward,
}

impl NormPass {
    fn name(self) -> &'static str {
        match self {
            NormPass::Forward => "kiln_cudnn_batch_norm",
            NormPass::Backward => "kiln_cudnn_batch_norm_backward",
        }
    }
}

/// A batch norm call's key: the pass, the input's shape and whether its buffers are aligned.
type NormKey = (NormPass, [usize; 4], bool);

/// Every batch norm key met in this process.
fn keys() -> &'static Keys<NormKey, ()> {
    static KEYS: LazyLock<Keys<NormKey, ()>> = LazyLock::new(Keys::default);
    &KEYS
}

/// Registers `pass` in the inputs' fusion stream and returns its outputs, of `shapes`.
fn register<const N: usize>(
    pass: NormPass,
    inputs: Vec<FloatTensor<Cuda>>,
    shapes: [Vec<usize>; N],
    eps: f64,
) -> Vec<FloatTensor<Cuda>> {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outputs: Vec<TensorIr> = shapes
        .into_iter()
        .map(|dims| TensorIr::uninit(client.create_empty_handle(), Shape::from(dims), DType::F32))
        .collect();
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(pass.name(), &inputs, &outputs);
    let op = CudnnBatchNorm {
        desc: desc.clone(),
        pass,
        eps,
    };
    client.register(streams, OperationIr::Custom(desc), op)
}

#[derive(Debug, Clone)]
struct CudnnBatchNorm {
    desc: CustomOpIr,
    pass: NormPass,
    eps: f64,
}

impl Operation<Runtime> for CudnnBatchNorm {
    fn execute(&self, handles: &mut Handles) {
        let inputs = inputs(&self.desc, handles);
        let outputs = with_cudnn(self.pass, &inputs, self.eps)
            .unwrap_or_else(|| with_burn(self.pass, inputs, self.eps));
        for (ir, tensor) in self.desc.outputs.iter().zip(outputs) {
            handles.register_float_tensor::<Cube>(&ir.id, tensor);
        }
    }
}

/// The pass in burn's operations on cubecl's kernels.
fn with_burn(
    pass: NormPass,
    inputs: Vec<CubeTensor<CudaRuntime>>,
    eps: f64,
) -> Vec<CubeTensor<CudaRuntime>> {
    fn tensor<const D: usize>(t: CubeTensor<CudaRuntime>) -> Tensor<Cube, D> {
        Tensor::from_primitive(TensorPrimitive::Float(t))
    }
    fn primitive<const D: usize>(t: Tensor<Cube, D>) -> CubeTensor<CudaRuntime> {
        t.into_primitive().tensor()
    }
    let mut inputs = inputs.into_iter();
    let mut next = || inputs.next().expect("the pass's inputs");
    match pass {
        NormPass::Forward => {
            let (x, weight, bias) = (tensor(next()), tensor(next()), tensor(next()));
            let out = norm_math::forward(x, weight, bias, eps);
            vec![
                primitive(out.y),
                primitive(out.mean.clone()),
                primitive(out.inv_std),
                primitive(out.mean),
                primitive(out.unbiased_var),
            ]
        }
        NormPass::Backward => {
            let (x, dy) = (tensor(next()), tensor(next()));
            let (weight, mean, inv_std) = (tensor(next()), tensor(next()), tensor(next()));
            let (dx, dweight, dbias) = norm_math::backward(x, dy, weight, mean, inv_std);
            vec![primitive(dx), primitive(dweight), primitive(dbias)]
        }
    }
}

/// The pass through cuDNN on the stream of the current `StreamId`: its outputs, queued without
/// waiting for a shape that ran before; `None` where cuDNN does not run it (burn's operations
/// then do).
fn with_cudnn(
    pass: NormPass,
    inputs: &[CubeTensor<CudaRuntime>],
    eps: f64,
) -> Option<Vec<CubeTensor<CudaRuntime>>> {
    let shape = inputs[0].meta.shape();
    if inputs.iter().any(|t| t.dtype != DType::F32) || shape.num_dims() != 4 {
        report(
            pass.name(),
            &Failure::unsupported("a tensor is not f32 or x is not 4-D"),
        );
        return None;
    }
    let dims: [usize; 4] = shape.dims();
    let key = (pass, dims, inputs.iter().all(aligned));
    let wait = match keys().route(&key) {
        Route::Burn => return None,
        Route::Launch(()) => false,
        Route::Wait { .. } => true,
    };
    // cuDNN reads packed tensors: an output gradient can come broadcast (zero strides).
    let packed: Vec<CubeTensor<CudaRuntime>> =
        inputs.iter().map(|t| into_contiguous(t.clone())).collect();
    let x = &packed[0];
    let c = dims[1];
    let empty = |dims: Vec<usize>| {
        empty_device_contiguous_dtype(
            x.client.clone(),
            x.device.clone(),
            Shape::from(dims),
            DType::F32,
        )
    };
    let shapes = match pass {
        NormPass::Forward => vec![dims.to_vec(), vec![c], vec![c], vec![c], vec![c]],
        NormPass::Backward => vec![dims.to_vec(), vec![c], vec![c]],
    };
    let outputs: Vec<CubeTensor<CudaRuntime>> = shapes.into_iter().map(empty).collect();
    let bindings = packed
        .iter()
        .chain(&outputs)
        .map(|t| t.handle.clone().binding())
        .collect();
    let run = move |launch: &mut ExternalLaunch<'_>| match pass {
        NormPass::Forward => forward_training(launch, dims, eps),
        NormPass::Backward => backward(launch, dims, eps),
    };
    let (client, device) = (x.client.clone(), x.device.clone());
    if !wait {
        let failed = move |launch: &mut ExternalLaunch<'_>| {
            run(launch).map_err(|failure| {
                keys().launch_failed(&key, &failure);
                format!(
                    "kiln: cuDNN's batch norm of {dims:?} failed after it had run before: {}",
                    failure.why
                )
            })
        };
        cubecl_cuda::launch_external_async(&client, &device, pass.name(), bindings, failed);
        return Some(outputs);
    }
    let outcome = match cubecl_cuda::launch_external(&client, &device, pass.name(), bindings, run) {
        Ok(Ok(())) => CallOutcome::Ran {
            choice: (),
            searched: false,
            full_scratch: true,
        },
        Ok(Err(failure)) => CallOutcome::Failed(failure),
        Err(err) => CallOutcome::Failed(Failure::transient(format!("{err:?}"))),
    };
    keys().settle(&key, &outcome);
    match outcome {
        CallOutcome::Ran { .. } => Some(outputs),
        CallOutcome::Failed(failure) => {
            report(&format!("{} of {dims:?}", pass.name()), &failure);
            None
        }
    }
}

/// `x`'s descriptor and the per-channel one derived from it, for each shape.
type ShapeDescriptors =
    std::collections::HashMap<[usize; 4], std::rc::Rc<(Descriptor, Descriptor)>>;

thread_local! {
    /// The descriptors of each batch norm shape met on this (CUDA server) thread.
    static DESCRIPTORS: std::cell::RefCell<ShapeDescriptors> = Default::default();
}

/// This thread's descriptors for `dims`, made on first use.
fn descriptors(dims: [usize; 4]) -> Result<std::rc::Rc<(Descriptor, Descriptor)>, Failure> {
    if let Some(found) = DESCRIPTORS.with_borrow(|map| map.get(&dims).cloned()) {
        return Ok(found);
    }
    let lib = lib()?;
    let x = Descriptor::tensor(lib, DataType::F32, dims)?;
    let channel = Descriptor::batch_norm(lib, &x)?;
    let made = std::rc::Rc::new((x, channel));
    DESCRIPTORS.with_borrow_mut(|map| map.insert(dims, made.clone()));
    Ok(made)
}

/// Bindings `[x, weight, bias, y, mean, inv_std, batch mean, unbiased variance]`.
fn forward_training(
    launch: &ExternalLaunch<'_>,
    dims: [usize; 4],
    eps: f64,
) -> Result<(), Failure> {
    let lib = lib()?;
    let handle = handle_on(lib, launch)?;
    let desc = descriptors(dims)?;
    let (x_desc, channel) = (&desc.0, &desc.1);
    let [x, weight, bias, y, mean, inv_std, batch_mean, unbiased_var] =
        [0, 1, 2, 3, 4, 5, 6, 7].map(|i| launch.ptr(i) as *mut std::ffi::c_void);
    // cuDNN's "running" statistics with an average factor of 1 are the batch's own (the
    // variance unbiased), given finite values to start from: 0 * NaN would stay NaN.
    for i in [6, 7] {
        // SAFETY: the binding is a live device buffer of `size(i)` bytes; the memset is
        // enqueued on cubecl's stream, ordered before the call that reads it.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                launch.ptr(i),
                0,
                launch.size(i) as usize,
                launch.stream(),
            )
        }
        .map_err(|e| Failure::transient(format!("zeroing the batch statistics: {e:?}")))?;
    }
    let (one, zero) = (1.0f32, 0.0f32);
    // SAFETY: `handle` and the descriptors are live; the pointers are the bindings' device
    // buffers: `x` and `y` packed NCHW of `dims`, the rest `[C]` f32 (`with_cudnn`). The call
    // only enqueues work on the stream; the buffers outlive it (`launch_external`).
    let status = unsafe {
        (lib.cudnnBatchNormalizationForwardTraining)(
            handle,
            BATCHNORM_SPATIAL,
            (&one as *const f32).cast(),
            (&zero as *const f32).cast(),
            x_desc.raw,
            x,
            x_desc.raw,
            y,
            channel.raw,
            weight,
            bias,
            1.0,
            batch_mean,
            unbiased_var,
            eps,
            mean,
            inv_std,
        )
    };
    check(lib, status, "cudnnBatchNormalizationForwardTraining")
}

/// Bindings `[x, dy, weight, mean, inv_std, dx, dweight, dbias]`.
fn backward(launch: &ExternalLaunch<'_>, dims: [usize; 4], eps: f64) -> Result<(), Failure> {
    let lib = lib()?;
    let handle = handle_on(lib, launch)?;
    let desc = descriptors(dims)?;
    let (x_desc, channel) = (&desc.0, &desc.1);
    let [x, dy, weight, mean, inv_std, dx, dweight, dbias] =
        [0, 1, 2, 3, 4, 5, 6, 7].map(|i| launch.ptr(i) as *mut std::ffi::c_void);
    let (one, zero) = (1.0f32, 0.0f32);
    let (one, zero) = ((&one as *const f32).cast(), (&zero as *const f32).cast());
    // SAFETY: as in `forward_training`; `mean` and `inv_std` are the forward's.
    let status = unsafe {
        (lib.cudnnBatchNormalizationBackward)(
            handle,
            BATCHNORM_SPATIAL,
            one,
            zero,
            one,
            zero,
            x_desc.raw,
            x,
            x_desc.raw,
            dy,
            x_desc.raw,
            dx,
            channel.raw,
            weight,
            dweight,
            dbias,
            eps,
            mean,
            inv_std,
        )
    };
    check(lib, status, "cudnnBatchNormalizationBackward")
}
