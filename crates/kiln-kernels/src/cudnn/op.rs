//! cuDNN's convolutions as custom operations in burn's fusion stream (`Fusion<CubeBackend>`,
//! which is `burn::backend::Cuda`).
//!
//! Why a custom operation rather than resolving the tensors (`client.resolve_tensor_float`)
//! and registering the result back: resolving drains the tensor's fusion stream at once, cutting
//! every fusion in flight at each convolution, and it runs on the caller's thread while the
//! stream's work runs on the fusion thread. A custom operation (`OperationIr::Custom`, as
//! burn-vision 0.21 registers its kernels) is queued like burn's own convolution: the fusion
//! server runs it in order, with its inputs computed, on its thread and under the registering
//! thread's `StreamId` (burn-fusion `UnfusedOp::execute`), so the CUDA work lands on the same
//! cubecl stream as burn's own kernels would. Nothing waits for the GPU (except the one-off
//! algorithm search of a new shape).

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::ops::{ConvOptions, FloatTensor, FloatTensorOps, ModuleOps};
use burn::tensor::{DType, FloatDType, Shape, TensorMetadata};
use burn_cubecl::fusion::FusionCubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::FusionRuntime;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, OperationOutput, TensorIr};
use cubecl_cuda::CudaRuntime;

use super::ffi::{self, Job};
use super::plan::{DataType, Geometry, Pass};
use super::{Cube, Cuda};

/// Registers `pass` in `x`'s fusion stream and returns its output: forward from `[x, w]`,
/// the gradients from `[x, w, dy]` (burn's fallback kernels take `x` and `w` for both).
pub(crate) fn register(
    pass: Pass,
    inputs: Vec<FloatTensor<Cuda>>,
    out_shape: [usize; 4],
    options: &ConvOptions<2>,
) -> FloatTensor<Cuda> {
    let client = inputs[0].client.clone();
    let dtype = inputs[0].dtype;
    let streams = OperationStreams::with_inputs(inputs.iter());
    let out = TensorIr::uninit(
        client.create_empty_handle(),
        Shape::from(out_shape.to_vec()),
        dtype,
    );
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(pass.name(), &inputs, &[out]);
    let op = CudnnConv {
        desc: desc.clone(),
        pass,
        options: options.clone(),
    };
    client
        .register(streams, OperationIr::Custom(desc), op)
        .output()
}

impl Pass {
    fn name(self) -> &'static str {
        match self {
            Pass::Forward => "kiln_cudnn_conv2d",
            Pass::BackwardData => "kiln_cudnn_conv2d_x_backward",
            Pass::BackwardFilter => "kiln_cudnn_conv2d_weight_backward",
        }
    }
}

#[derive(Debug, Clone)]
struct CudnnConv {
    desc: CustomOpIr,
    pass: Pass,
    options: ConvOptions<2>,
}

/// An output gradient in its operation's dtype: a loss in f32 behind a 16-bit operation may
/// hand back f32.
pub(crate) fn grad_in(grad: FloatTensor<Cuda>, dtype: DType) -> FloatTensor<Cuda> {
    if grad.dtype() == dtype {
        grad
    } else {
        <Cuda as FloatTensorOps<Cuda>>::float_cast(grad, FloatDType::from(dtype))
    }
}

pub(crate) type Runtime = FusionCubeRuntime<CudaRuntime>;
pub(crate) type Handles = HandleContainer<<Runtime as FusionRuntime>::FusionHandle>;

/// A custom operation's inputs, computed by the stream before it.
pub(crate) fn inputs(desc: &CustomOpIr, handles: &mut Handles) -> Vec<CubeTensor<CudaRuntime>> {
    desc.inputs
        .iter()
        .map(|t| handles.get_float_tensor::<Cube>(t))
        .collect()
}

impl Operation<Runtime> for CudnnConv {
    fn execute(&self, handles: &mut Handles) {
        let inputs = inputs(&self.desc, handles);
        let output = convolve(self.pass, inputs, &self.options);
        handles.register_float_tensor::<Cube>(&self.desc.outputs[0].id, output);
    }
}

/// cuDNN's result, or burn's kernel's where cuDNN does not run (logged once).
fn convolve(
    pass: Pass,
    inputs: Vec<CubeTensor<CudaRuntime>>,
    options: &ConvOptions<2>,
) -> CubeTensor<CudaRuntime> {
    match with_cudnn(pass, &inputs, options) {
        Ok(output) => output,
        Err(why) => {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "cuDNN did not run a convolution, burn's kernel did (logged once): {why}"
                );
            }
            with_burn(pass, inputs, options)
        }
    }
}

fn with_burn(
    pass: Pass,
    inputs: Vec<CubeTensor<CudaRuntime>>,
    options: &ConvOptions<2>,
) -> CubeTensor<CudaRuntime> {
    let mut inputs = inputs.into_iter();
    let (x, w) = (inputs.next().unwrap(), inputs.next().unwrap());
    let options = options.clone();
    match (pass, inputs.next()) {
        (Pass::Forward, _) => Cube::conv2d(x, w, None, options),
        (Pass::BackwardData, Some(dy)) => Cube::conv2d_x_backward(x, w, dy, options),
        (Pass::BackwardFilter, Some(dy)) => Cube::conv2d_weight_backward(x, w, dy, options),
        (_, None) => unreachable!("a gradient is registered with its output gradient"),
    }
}

fn dims(tensor: &CubeTensor<CudaRuntime>) -> [usize; 4] {
    let shape = tensor.shape();
    let mut dims = [0; 4];
    dims.copy_from_slice(&shape[..4.min(shape.num_dims())]);
    dims
}

/// The convolution through cuDNN on the stream of the current `StreamId`, or why not.
fn with_cudnn(
    pass: Pass,
    inputs: &[CubeTensor<CudaRuntime>],
    options: &ConvOptions<2>,
) -> Result<CubeTensor<CudaRuntime>, String> {
    if inputs.iter().any(|t| t.meta.shape().num_dims() != 4) {
        return Err("a tensor is not 4-D".into());
    }
    let dtype = inputs[0].dtype;
    if inputs.iter().any(|t| t.dtype != dtype) {
        let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype).collect();
        return Err(format!("mixed dtypes {dtypes:?}"));
    }
    let data = DataType::from_dtype(dtype).ok_or_else(|| format!("dtype {dtype:?}"))?;
    let geometry = Geometry::new(dims(&inputs[0]), dims(&inputs[1]), options)?;
    if let Some(dy) = inputs.get(2)
        && dims(dy) != geometry.y
    {
        return Err(format!(
            "output gradient {:?}, expected {:?}",
            dims(dy),
            geometry.y
        ));
    }
    // cuDNN reads packed NCHW: gradients can come with broadcast (zero) strides, views with
    // others, and burn's allocator pitches rows (`into_contiguous` packs, on this stream).
    let packed: Vec<CubeTensor<CudaRuntime>> =
        inputs.iter().map(|t| into_contiguous(t.clone())).collect();
    let (x, w) = (&packed[0], &packed[1]);
    let output = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::from(geometry.output(pass).to_vec()),
        dtype,
    );
    let operands = match pass {
        Pass::Forward => [x, w, &output],
        Pass::BackwardData => [w, &packed[2], &output],
        Pass::BackwardFilter => [x, &packed[2], &output],
    };
    let bindings = operands
        .iter()
        .map(|t| t.handle.clone().binding())
        .collect();
    let job = Job {
        device: x.device.index,
        pass,
        data,
        geometry,
        tf32: crate::tf32(),
    };
    match cubecl_cuda::launch_external(&x.device, bindings, move |launch| ffi::run(launch, &job)) {
        Ok(Ok(())) => Ok(output),
        Ok(Err(why)) => Err(why),
        Err(err) => Err(format!("{err:?}")),
    }
}
