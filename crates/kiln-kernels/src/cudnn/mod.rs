//! Convolutions and both their gradients, and batch norm in training (`norm.rs`), through cuDNN
//! on burn's CUDA backend. A convolution is a custom autodiff operation on `Autodiff<Cuda>`
//! (training) and the plain forward on `Cuda` (inference), each pass a custom operation in
//! burn's fusion stream (`op.rs`) that calls cuDNN on cubecl's own stream (`ffi.rs`, through
//! kiln's patched cubecl-cuda: `launch_external`).
//!
//! cuDNN 9 is loaded at run time (`library.rs`). Where it is missing, not 9 or fails to start,
//! [`conv2d`] returns `None` and burn's convolution runs; where a call fails, burn's kernel runs
//! it instead, for good or until a later try (`policy.rs`; each distinct failure logged once).
//! Batch norm likewise.

mod choices;
mod ffi;
mod library;
mod norm;
mod norm_math;
pub(crate) mod op;
mod plan;
pub(crate) mod policy;
mod store;

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Cuda};
use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive, backend::Backend};
use burn_cubecl::CubeBackend;
use cubecl_cuda::CudaRuntime;

use crate::same;
pub(crate) use norm::batch_norm_train;
use plan::{ConvDims, ConvPass, DataType};

/// The backend under burn's fusion on CUDA (`Cuda` is `Fusion<Cube>`).
type Cube = CubeBackend<CudaRuntime, f32, i32, u8>;
/// The training backend this path serves: CUDA under burn's default (no checkpointing) autodiff.
type Train = Autodiff<Cuda>;

/// The loaded cuDNN's version, or why convolutions do not go through cuDNN.
pub(crate) fn status() -> Result<String, String> {
    if !crate::enabled() {
        return Err("KILN_KERNELS=burn".into());
    }
    let library = library::library().map_err(str::to_string)?;
    // SAFETY: takes no arguments.
    Ok(plan::version_name(unsafe { (library.cudnnGetVersion)() }))
}

/// The algorithm searches run so far in this process.
pub(crate) fn searches() -> usize {
    ffi::SEARCHES.load(std::sync::atomic::Ordering::Relaxed)
}

fn available() -> bool {
    library::library().is_ok() && !ffi::failed_to_start()
}

/// cuDNN's convolution when `B` is CUDA (with or without autodiff) and cuDNN is there; `None`
/// otherwise, for burn's.
pub(crate) fn conv2d<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 4>,
    options: &ConvOptions<2>,
) -> Option<Tensor<B, 4>> {
    DataType::from_dtype(x.dtype())?;
    if weight.dtype() != x.dtype() {
        return None;
    }
    let geometry = ConvDims::new(x.dims(), weight.dims(), options).ok()?;
    // The type checks first: they cost nothing, and backends other than CUDA never probe for
    // cuDNN.
    if let (Some(x), Some(weight)) = (
        same::<_, Tensor<Cuda, 4>>(x.clone()),
        same::<_, Tensor<Cuda, 4>>(weight.clone()),
    ) {
        if !available() {
            return None;
        }
        let y = op::register(
            ConvPass::Forward,
            vec![
                x.into_primitive().tensor(),
                weight.into_primitive().tensor(),
            ],
            geometry.y,
            options,
        );
        return same(Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(y)));
    }
    let x = same::<_, Tensor<Train, 4>>(x.clone())?;
    let weight = same::<_, Tensor<Train, 4>>(weight.clone())?;
    if !available() {
        return None;
    }
    same(train_conv2d(x, weight, geometry, options.clone()))
}

fn train_conv2d(
    x: Tensor<Train, 4>,
    weight: Tensor<Train, 4>,
    geometry: ConvDims,
    options: ConvOptions<2>,
) -> Tensor<Train, 4> {
    let x = x.into_primitive().tensor();
    let weight = weight.into_primitive().tensor();
    let forward = |x: FloatTensor<Cuda>, weight: FloatTensor<Cuda>| {
        op::register(ConvPass::Forward, vec![x, weight], geometry.y, &options)
    };
    let y = match Conv2dBackward
        .prepare::<NoCheckpointing>([x.node.clone(), weight.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let x_state = prep.checkpoint(&x);
            let weight_state = prep.checkpoint(&weight);
            let state = (x_state, weight_state, options.clone());
            prep.finish(state, forward(x.primitive, weight.primitive))
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(x.primitive, weight.primitive)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

#[derive(Debug)]
struct Conv2dBackward;

impl Backward<Cuda, 2> for Conv2dBackward {
    type State = (NodeId, NodeId, ConvOptions<2>);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [x_node, weight_node] = ops.parents;
        let grad = grads.consume::<Cuda>(&ops.node);
        let (x_state, weight_state, options) = ops.state;
        let x = checkpointer.retrieve_node_output::<FloatTensor<Cuda>>(x_state);
        let weight = checkpointer.retrieve_node_output::<FloatTensor<Cuda>>(weight_state);
        let grad = op::grad_in(grad, x.dtype());
        let x_dims: [usize; 4] = x.shape().dims();
        let w_dims: [usize; 4] = weight.shape().dims();
        if let Some(node) = weight_node {
            let dw = op::register(
                ConvPass::BackwardFilter,
                vec![x.clone(), weight.clone(), grad.clone()],
                w_dims,
                &options,
            );
            grads.register::<Cuda>(node.id, dw);
        }
        if let Some(node) = x_node {
            let dx = op::register(
                ConvPass::BackwardData,
                vec![x, weight, grad],
                x_dims,
                &options,
            );
            grads.register::<Cuda>(node.id, dx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a GPU nothing of the CUDA path runs, but the status must answer, not panic.
    #[test]
    fn status_answers_without_a_device() {
        match status() {
            Ok(version) => assert!(version.split('.').count() == 3, "{version}"),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
