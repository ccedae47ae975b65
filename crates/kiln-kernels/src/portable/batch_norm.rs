//! Training batch norm, with the residual and ReLU that follow it in a ResNet, as one autodiff
//! operation on burn's cubecl backends under fusion (`Autodiff<Fusion<CubeBackend<R, ..>>>`:
//! `burn::backend::Wgpu`, and `Cuda`), each pass one custom operation in burn's fusion stream
//! whose two kernels (`kernels.rs`) run on the cubecl client of its inputs, in order with burn's
//! own kernels.
//!
//! The forward keeps the input, the output (ReLU's mask), the weight and the batch's statistics
//! per channel for the backward, as PyTorch's cuDNN batch norm keeps the input and statistics.
//! Outputs are written in the input's layout (a convolution's NHWC output stays NHWC), so the
//! next convolution reads them without a copy.

use std::marker::PhantomData;

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorMetadata, TensorPrimitive, backend::Backend};
use burn_cubecl::fusion::FusionCubeRuntime;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::ops::permute_nhwc_to_nchw;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use cubecl::prelude::*;

use super::kernels::{self, CUBE_UNITS};
use crate::{BatchNormEval, BatchNormStep, BatchNormStepped, same};

/// The backend under fusion, and the one the layers train on.
type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;
type Fused<R, BT> = Fusion<Cube<R, BT>>;
type Train<R, BT> = Autodiff<Fused<R, BT>>;
type Handles<R> = HandleContainer<<FusionCubeRuntime<R> as FusionRuntime>::FusionHandle>;

/// kiln's kernels when `B` is a cubecl backend this build has (wgpu; CUDA where kiln's kernels
/// are asked for there, cuDNN's otherwise) under autodiff and every tensor is f32; `None`
/// otherwise, for the caller's other paths.
pub(crate) fn batch_norm_train<B: Backend>(step: &BatchNormStep<B>) -> Option<BatchNormStepped<B>> {
    let tensors = [&step.x.dtype(), &step.weight.dtype(), &step.bias.dtype()];
    if tensors.into_iter().any(|d| *d != DType::F32)
        || step
            .residual
            .as_ref()
            .is_some_and(|r| r.dtype() != DType::F32 || r.dims() != step.x.dims())
    {
        return None;
    }
    #[cfg(feature = "wgpu")]
    if let Some(out) = on::<B, cubecl::wgpu::WgpuRuntime, u32>(step) {
        return Some(out);
    }
    #[cfg(feature = "cuda")]
    if crate::portable_batch_norm_on_cuda()
        && let Some(out) = on::<B, cubecl_cuda::CudaRuntime, u8>(step)
    {
        return Some(out);
    }
    None
}

/// kiln's eval kernel when `B` is a cubecl backend this build has, without autodiff (inference,
/// validation), every tensor f32; `None` otherwise.
pub(crate) fn batch_norm_eval<B: Backend>(eval: &BatchNormEval<B>) -> Option<Tensor<B, 4>> {
    let tensors = [
        &eval.x,
        &eval.residual.clone().unwrap_or_else(|| eval.x.clone()),
    ];
    if tensors.iter().any(|t| t.dtype() != DType::F32)
        || eval
            .residual
            .as_ref()
            .is_some_and(|r| r.dims() != eval.x.dims())
    {
        return None;
    }
    #[cfg(feature = "wgpu")]
    if let Some(y) = eval_on::<B, cubecl::wgpu::WgpuRuntime, u32>(eval) {
        return Some(y);
    }
    #[cfg(feature = "cuda")]
    if let Some(y) = eval_on::<B, cubecl_cuda::CudaRuntime, u8>(eval) {
        return Some(y);
    }
    None
}

fn eval_on<B: Backend, R: CubeRuntime, BT: BoolElement>(
    eval: &BatchNormEval<B>,
) -> Option<Tensor<B, 4>> {
    let four = |t: &Tensor<B, 4>| {
        same::<_, Tensor<Fused<R, BT>, 4>>(t.clone()).map(|t| t.into_primitive().tensor())
    };
    let one = |t: &Tensor<B, 1>| {
        let t = same::<_, Tensor<Fused<R, BT>, 1>>(t.clone())?;
        (t.dtype() == DType::F32).then(|| t.into_primitive().tensor())
    };
    let mut inputs = vec![
        four(&eval.x)?,
        one(&eval.running_mean)?,
        one(&eval.running_var)?,
        one(&eval.weight)?,
        one(&eval.bias)?,
    ];
    if let Some(residual) = &eval.residual {
        inputs.push(four(residual)?);
    }
    let settings = Settings {
        eps: eval.eps as f32,
        momentum: 0.0,
        relu: eval.relu,
        residual: eval.residual.is_some(),
    };
    let shape = vec![eval.x.dims().to_vec()];
    let y = register::<R, BT>(NormKernel::Eval, settings, inputs, shape).remove(0);
    same(Tensor::<Fused<R, BT>, 4>::from_primitive(
        TensorPrimitive::Float(y),
    ))
}

/// The operation when `B` is `Autodiff<Fused<R, BT>>`.
fn on<B: Backend, R: CubeRuntime, BT: BoolElement>(
    step: &BatchNormStep<B>,
) -> Option<BatchNormStepped<B>> {
    let take = |t: &Tensor<B, 1>| same::<_, Tensor<Train<R, BT>, 1>>(t.clone());
    let x = same::<_, Tensor<Train<R, BT>, 4>>(step.x.clone())?;
    let residual = match &step.residual {
        Some(r) => Some(same::<_, Tensor<Train<R, BT>, 4>>(r.clone())?),
        None => None,
    };
    let [weight, bias, mean, var, tracked] = [
        &step.weight,
        &step.bias,
        &step.running_mean,
        &step.running_var,
        &step.num_batches_tracked,
    ]
    .map(take);
    let settings = Settings {
        eps: step.eps as f32,
        momentum: step.momentum as f32,
        relu: step.relu,
        residual: residual.is_some(),
    };
    let running = [mean?, var?, tracked?].map(|t| t.inner().into_primitive().tensor());
    let out = train::<R, BT>(x, weight?, bias?, residual, running, settings);
    Some(BatchNormStepped {
        y: same(out.0)?,
        running_mean: same(out.1[0].clone())?,
        running_var: same(out.1[1].clone())?,
        num_batches_tracked: same(out.1[2].clone())?,
    })
}

/// What the kernels are told besides their tensors.
#[derive(Debug, Clone, Copy)]
struct Settings {
    eps: f32,
    momentum: f32,
    relu: bool,
    residual: bool,
}

/// The output and the moved running statistics (mean, variance, count of batches).
type Trained<R, BT> = (Tensor<Train<R, BT>, 4>, [Tensor<Train<R, BT>, 1>; 3]);

fn train<R: CubeRuntime, BT: BoolElement>(
    x: Tensor<Train<R, BT>, 4>,
    weight: Tensor<Train<R, BT>, 1>,
    bias: Tensor<Train<R, BT>, 1>,
    residual: Option<Tensor<Train<R, BT>, 4>>,
    running: [FloatTensor<Fused<R, BT>>; 3],
    settings: Settings,
) -> Trained<R, BT> {
    let [n, c, h, w] = x.dims();
    let x = x.into_primitive().tensor();
    let weight = weight.into_primitive().tensor();
    let bias = bias.into_primitive().tensor();
    let residual = residual.map(|r| r.into_primitive().tensor());
    let mut inputs = vec![
        x.primitive.clone(),
        weight.primitive.clone(),
        bias.primitive.clone(),
    ];
    inputs.extend(running);
    inputs.extend(residual.iter().map(|r| r.primitive.clone()));
    let shapes = vec![
        vec![n, c, h, w],
        vec![c],
        vec![c],
        vec![c],
        vec![c],
        vec![1],
    ];
    let outputs = register::<R, BT>(NormKernel::Forward, settings, inputs, shapes);
    let [y, mean, inv_std, new_mean, new_var, new_tracked]: [_; 6] =
        outputs.try_into().expect("six outputs");
    let mut saved = Saved {
        x: NodeId::new(),
        y: y.clone(),
        weight: weight.primitive.clone(),
        mean,
        inv_std,
        settings,
    };
    // Records `y` in the autodiff graph with its parents: input, weight, bias and the residual
    // where there is one.
    macro_rules! tracked {
        ($parents:literal, [$($parent:expr),*]) => {
            match NormBackward::<R, BT, $parents>(PhantomData)
                .prepare::<NoCheckpointing>([$($parent.node.clone()),*])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(mut prep) => {
                    saved.x = prep.checkpoint(&x);
                    prep.finish(saved, y)
                }
                OpsKind::UnTracked(prep) => prep.finish(y),
            }
        };
    }
    let y = match &residual {
        Some(residual) => tracked!(4, [x, weight, bias, residual]),
        None => tracked!(3, [x, weight, bias]),
    };
    let untracked = |t| {
        Tensor::<Train<R, BT>, 1>::from_inner(Tensor::from_primitive(TensorPrimitive::Float(t)))
    };
    (
        Tensor::from_primitive(TensorPrimitive::Float(y)),
        [
            untracked(new_mean),
            untracked(new_var),
            untracked(new_tracked),
        ],
    )
}

/// What the backward pass needs: the input, the output (ReLU's mask), the weight and the
/// forward's statistics.
#[derive(Debug, Clone)]
struct Saved<R: CubeRuntime, BT: BoolElement> {
    x: NodeId,
    y: FloatTensor<Fused<R, BT>>,
    weight: FloatTensor<Fused<R, BT>>,
    mean: FloatTensor<Fused<R, BT>>,
    inv_std: FloatTensor<Fused<R, BT>>,
    settings: Settings,
}

#[derive(Debug)]
struct NormBackward<R, BT, const N: usize>(PhantomData<(R, BT)>);

impl<R: CubeRuntime, BT: BoolElement, const N: usize> Backward<Fused<R, BT>, N>
    for NormBackward<R, BT, N>
{
    type State = Saved<R, BT>;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let dy = grads.consume::<Fused<R, BT>>(&ops.node);
        let saved = ops.state;
        let x = checkpointer.retrieve_node_output::<FloatTensor<Fused<R, BT>>>(saved.x);
        let dims: [usize; 4] = x.shape().dims();
        let c = dims[1];
        let inputs = vec![x, dy, saved.y, saved.mean, saved.inv_std, saved.weight];
        let mut shapes = vec![dims.to_vec(), vec![c], vec![c]];
        if saved.settings.residual {
            shapes.push(dims.to_vec());
        }
        let grads_out = register::<R, BT>(NormKernel::Backward, saved.settings, inputs, shapes);
        // In the order of the parents: input, weight, bias, residual.
        for (parent, grad) in ops.parents.into_iter().zip(grads_out) {
            if let Some(node) = parent {
                grads.register::<Fused<R, BT>>(node.id, grad);
            }
        }
    }
}

/// The passes. Inputs and outputs, in order: forward `[x, weight, bias, running mean, running
/// variance, batches tracked, (residual)]` to `[y, mean, inv_std, running mean, running
/// variance, batches tracked]`; backward `[x, dy, y, mean, inv_std, weight]` to `[dx, dweight,
/// dbias, (dresidual)]`; inference `[x, running mean, running variance, weight, bias,
/// (residual)]` to `[y]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NormKernel {
    Forward,
    Backward,
    Eval,
}

impl NormKernel {
    fn name(self) -> &'static str {
        match self {
            NormKernel::Forward => "kiln_batch_norm",
            NormKernel::Backward => "kiln_batch_norm_backward",
            NormKernel::Eval => "kiln_batch_norm_eval",
        }
    }
}

/// Registers `pass` in the inputs' fusion stream and returns its outputs, of `shapes`.
fn register<R: CubeRuntime, BT: BoolElement>(
    pass: NormKernel,
    settings: Settings,
    inputs: Vec<FloatTensor<Fused<R, BT>>>,
    shapes: Vec<Vec<usize>>,
) -> Vec<FloatTensor<Fused<R, BT>>> {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outputs: Vec<TensorIr> = shapes
        .into_iter()
        .map(|dims| TensorIr::uninit(client.create_empty_handle(), Shape::from(dims), DType::F32))
        .collect();
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(pass.name(), &inputs, &outputs);
    let op = NormOp::<R, BT> {
        desc: desc.clone(),
        pass,
        settings,
        _backend: PhantomData,
    };
    client.register(streams, OperationIr::Custom(desc), op)
}

#[derive(Debug)]
struct NormOp<R, BT> {
    desc: CustomOpIr,
    pass: NormKernel,
    settings: Settings,
    _backend: PhantomData<(R, BT)>,
}

impl<R, BT> Clone for NormOp<R, BT> {
    fn clone(&self) -> Self {
        Self {
            desc: self.desc.clone(),
            pass: self.pass,
            settings: self.settings,
            _backend: PhantomData,
        }
    }
}

impl<R: CubeRuntime, BT: BoolElement> Operation<FusionCubeRuntime<R>> for NormOp<R, BT> {
    fn execute(&self, handles: &mut Handles<R>) {
        let inputs: Vec<CubeTensor<R>> = self
            .desc
            .inputs
            .iter()
            .map(|t| handles.get_float_tensor::<Cube<R, BT>>(t))
            .collect();
        let outputs = match self.pass {
            NormKernel::Forward => forward(inputs, self.settings),
            NormKernel::Backward => backward(inputs, self.settings),
            NormKernel::Eval => vec![eval(inputs, self.settings)],
        };
        for (ir, tensor) in self.desc.outputs.iter().zip(outputs) {
            handles.register_float_tensor::<Cube<R, BT>>(&ir.id, tensor);
        }
    }
}

/// An uninitialised `[N, C, H, W]` tensor laid out as `like` is where that is channels-last
/// (NHWC: a convolution's output), packed NCHW otherwise.
fn empty_like<R: CubeRuntime>(like: &CubeTensor<R>) -> CubeTensor<R> {
    let [n, c, h, w] = like.meta.shape().dims();
    let channels_last = c > 1 && like.meta.strides()[1] == 1;
    let (client, device) = (like.client.clone(), like.device.clone());
    if channels_last {
        let nhwc =
            empty_device_contiguous_dtype(client, device, Shape::new([n, h, w, c]), DType::F32);
        permute_nhwc_to_nchw(nhwc)
    } else {
        empty_device_contiguous_dtype(client, device, Shape::new([n, c, h, w]), DType::F32)
    }
}

fn empty_vector<R: CubeRuntime>(like: &CubeTensor<R>, len: usize) -> CubeTensor<R> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::new([len]),
        DType::F32,
    )
}

/// One unit per value of `t`, in cubes of one size whatever the tensor's, so that each kernel
/// is one pipeline (a cube size is part of a kernel's identity: sized to each tensor, every
/// layer's shape cost another pipeline to create in every process).
fn elementwise<R: CubeRuntime>(t: &CubeTensor<R>) -> (CubeCount, CubeDim) {
    let count = t.meta.shape().num_elements();
    let dim = CubeDim::new_1d(CUBE_UNITS as u32);
    (
        cubecl::calculate_cube_count_elemwise(&t.client, count, dim),
        dim,
    )
}

/// One cube of [`CUBE_UNITS`] units per channel.
fn per_channel(channels: usize) -> (CubeCount, CubeDim) {
    (
        CubeCount::Static(channels as u32, 1, 1),
        CubeDim::new_1d(CUBE_UNITS as u32),
    )
}

fn forward<R: CubeRuntime>(inputs: Vec<CubeTensor<R>>, settings: Settings) -> Vec<CubeTensor<R>> {
    let mut inputs = inputs.into_iter();
    let mut next = || inputs.next().expect("the forward's inputs");
    let (x, weight, bias) = (next(), next(), next());
    let (running_mean, running_var, tracked) = (next(), next(), next());
    let residual = settings.residual.then(&mut next);
    let c = x.meta.shape()[1];
    let [mean, inv_std, new_mean, new_var] = [0; 4].map(|_| empty_vector(&x, c));
    let new_tracked = empty_vector(&x, 1);
    let y = empty_like(&x);
    let client = x.client.clone();
    let (count, dim) = per_channel(c);
    kernels::batch_norm_stats::launch::<R>(
        &client,
        count,
        dim,
        x.clone().into_tensor_arg(),
        running_mean.into_tensor_arg(),
        running_var.into_tensor_arg(),
        tracked.into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        inv_std.clone().into_tensor_arg(),
        new_mean.clone().into_tensor_arg(),
        new_var.clone().into_tensor_arg(),
        new_tracked.clone().into_tensor_arg(),
        settings.eps,
        settings.momentum,
        DType::F32.into(),
    );
    let (count, dim) = elementwise(&y);
    // Without a residual, one value is bound in its place and not read.
    let residual = residual.unwrap_or_else(|| empty_vector(&x, 1));
    kernels::batch_norm_apply::launch::<R>(
        &client,
        count,
        dim,
        x.into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        inv_std.clone().into_tensor_arg(),
        weight.into_tensor_arg(),
        bias.into_tensor_arg(),
        residual.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        settings.residual,
        settings.relu,
        DType::F32.into(),
    );
    vec![y, mean, inv_std, new_mean, new_var, new_tracked]
}

fn backward<R: CubeRuntime>(inputs: Vec<CubeTensor<R>>, settings: Settings) -> Vec<CubeTensor<R>> {
    let [x, dy, y, mean, inv_std, weight]: [CubeTensor<R>; 6] =
        inputs.try_into().expect("the backward's inputs");
    let c = x.meta.shape()[1];
    let (dweight, dbias) = (empty_vector(&x, c), empty_vector(&x, c));
    let client = x.client.clone();
    let (count, dim) = per_channel(c);
    kernels::batch_norm_backward_reduce::launch::<R>(
        &client,
        count,
        dim,
        x.clone().into_tensor_arg(),
        dy.clone().into_tensor_arg(),
        y.clone().into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        inv_std.clone().into_tensor_arg(),
        dweight.clone().into_tensor_arg(),
        dbias.clone().into_tensor_arg(),
        settings.relu,
        DType::F32.into(),
    );
    let dx = empty_like(&x);
    let x_layout = dx.clone();
    // The residual's gradient in `dx`'s layout; without a residual, one value is bound in its
    // place and not written.
    let dresidual = settings.residual.then(|| empty_like(&x));
    let (count, dim) = elementwise(&dx);
    kernels::batch_norm_backward_apply::launch::<R>(
        &client,
        count,
        dim,
        x.into_tensor_arg(),
        dy.into_tensor_arg(),
        y.into_tensor_arg(),
        mean.into_tensor_arg(),
        inv_std.into_tensor_arg(),
        weight.into_tensor_arg(),
        dweight.clone().into_tensor_arg(),
        dbias.clone().into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        dresidual
            .clone()
            .unwrap_or_else(|| empty_vector(&x_layout, 1))
            .into_tensor_arg(),
        settings.residual,
        settings.relu,
        DType::F32.into(),
    );
    let mut outputs = vec![dx, dweight, dbias];
    outputs.extend(dresidual);
    outputs
}

fn eval<R: CubeRuntime>(inputs: Vec<CubeTensor<R>>, settings: Settings) -> CubeTensor<R> {
    let mut inputs = inputs.into_iter();
    let mut next = || inputs.next().expect("the eval's inputs");
    let (x, running_mean, running_var, weight, bias) = (next(), next(), next(), next(), next());
    // Without a residual, one value is bound in its place and not read.
    let residual = match settings.residual {
        true => next(),
        false => empty_vector(&x, 1),
    };
    let y = empty_like(&x);
    let (count, dim) = elementwise(&y);
    kernels::batch_norm_eval::launch::<R>(
        &x.client.clone(),
        count,
        dim,
        x.into_tensor_arg(),
        running_mean.into_tensor_arg(),
        running_var.into_tensor_arg(),
        weight.into_tensor_arg(),
        bias.into_tensor_arg(),
        residual.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        settings.eps,
        settings.residual,
        settings.relu,
        DType::F32.into(),
    );
    y
}
