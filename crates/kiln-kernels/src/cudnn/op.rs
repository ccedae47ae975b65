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
//! cubecl stream as burn's own kernels would.
//!
//! The first call of each shape waits for the CUDA thread (it searches cuDNN's algorithms, or
//! runs the choice kept in kiln's cache, and burn's kernel runs where that fails); from then on
//! a call is queued on the CUDA thread and the fusion thread goes on, as after one of cubecl's
//! kernels (`policy`). Nothing waits for the GPU but the one-off search.

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

use super::choices::{self, convolutions};
use super::ffi::{self, Job};
use super::plan::{self, AlgoKey, ConvDims, ConvPass, DataType};
use super::policy::{CallOutcome, Cause, Failure, Route};
use super::{Cube, Cuda};

/// Registers `pass` in `x`'s fusion stream and returns its output: forward from `[x, w]`,
/// the gradients from `[x, w, dy]` (burn's fallback kernels take `x` and `w` for both).
pub(crate) fn register(
    pass: ConvPass,
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

impl ConvPass {
    /// The two inputs cuDNN reads for this pass, of the registered `[x, w]` or `[x, w, dy]`.
    fn operands<T>(self, inputs: &[T]) -> [&T; 2] {
        match self {
            ConvPass::Forward => [&inputs[0], &inputs[1]],
            ConvPass::BackwardData => [&inputs[1], &inputs[2]],
            ConvPass::BackwardFilter => [&inputs[0], &inputs[2]],
        }
    }

    fn name(self) -> &'static str {
        match self {
            ConvPass::Forward => "kiln_cudnn_conv2d",
            ConvPass::BackwardData => "kiln_cudnn_conv2d_x_backward",
            ConvPass::BackwardFilter => "kiln_cudnn_conv2d_weight_backward",
        }
    }
}

#[derive(Debug, Clone)]
struct CudnnConv {
    desc: CustomOpIr,
    pass: ConvPass,
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

/// cuDNN's result, or burn's kernel's where cuDNN does not run (each distinct reason logged
/// once).
fn convolve(
    pass: ConvPass,
    inputs: Vec<CubeTensor<CudaRuntime>>,
    options: &ConvOptions<2>,
) -> CubeTensor<CudaRuntime> {
    let call = match Call::new(pass, &inputs, options) {
        Ok(call) => call,
        Err(why) => {
            report(pass.name(), &Failure::unsupported(why));
            return with_burn(pass, inputs, options);
        }
    };
    if !convolutions().knows(&call.key) {
        choices::read_kept(call.key.device);
    }
    match convolutions().route(&call.key) {
        Route::Burn => with_burn(pass, inputs, options),
        Route::Launch(choice) => call.launch(inputs, choice),
        Route::Wait { kept } => call
            .wait(inputs.clone(), kept)
            .unwrap_or_else(|| with_burn(pass, inputs, options)),
    }
}

/// Logs a failure once per distinct line, with what runs instead.
pub(crate) fn report(what: &str, failure: &Failure) {
    let instead = match failure.cause {
        Cause::Unsupported => "burn's kernel runs it",
        Cause::Transient => "burn's kernel runs it until a later try",
    };
    let line = format!("cuDNN did not run {what}: {}; {instead}", failure.why);
    if convolutions().first_report(&line) {
        log::warn!("{line}");
    }
}

fn with_burn(
    pass: ConvPass,
    inputs: Vec<CubeTensor<CudaRuntime>>,
    options: &ConvOptions<2>,
) -> CubeTensor<CudaRuntime> {
    let mut inputs = inputs.into_iter();
    let (x, w) = (inputs.next().unwrap(), inputs.next().unwrap());
    let options = options.clone();
    match (pass, inputs.next()) {
        (ConvPass::Forward, _) => Cube::conv2d(x, w, None, options),
        (ConvPass::BackwardData, Some(dy)) => Cube::conv2d_x_backward(x, w, dy, options),
        (ConvPass::BackwardFilter, Some(dy)) => Cube::conv2d_weight_backward(x, w, dy, options),
        (_, None) => unreachable!("a gradient is registered with its output gradient"),
    }
}

fn dims(tensor: &CubeTensor<CudaRuntime>) -> [usize; 4] {
    let shape = tensor.shape();
    let mut dims = [0; 4];
    dims.copy_from_slice(&shape[..4.min(shape.num_dims())]);
    dims
}

/// Whether cuDNN will see this tensor at a 16-byte aligned address: a packed copy is (cubecl
/// allocates at 512 bytes), a tensor already packed is where its offset is.
pub(crate) fn aligned(tensor: &CubeTensor<CudaRuntime>) -> bool {
    !tensor.is_contiguous() || plan::aligned_16(&[tensor.handle.offset_start.unwrap_or(0)])
}

/// One convolution cuDNN can take: its key and what the CUDA thread needs.
struct Call {
    key: AlgoKey,
    job: Job,
}

impl Call {
    /// The call of `pass` on `inputs`, or why cuDNN's path does not take it.
    fn new(
        pass: ConvPass,
        inputs: &[CubeTensor<CudaRuntime>],
        options: &ConvOptions<2>,
    ) -> Result<Self, String> {
        let expected = if pass == ConvPass::Forward { 2 } else { 3 };
        if inputs.len() != expected {
            return Err(format!("{} inputs, expected {expected}", inputs.len()));
        }
        if inputs.iter().any(|t| t.meta.shape().num_dims() != 4) {
            return Err("a tensor is not 4-D".into());
        }
        let dtype = inputs[0].dtype;
        if inputs.iter().any(|t| t.dtype != dtype) {
            let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype).collect();
            return Err(format!("mixed dtypes {dtypes:?}"));
        }
        let data = DataType::from_dtype(dtype).ok_or_else(|| format!("dtype {dtype:?}"))?;
        let geometry = ConvDims::new(dims(&inputs[0]), dims(&inputs[1]), options)?;
        if let Some(dy) = inputs.get(2)
            && dims(dy) != geometry.y
        {
            return Err(format!(
                "output gradient {:?}, expected {:?}",
                dims(dy),
                geometry.y
            ));
        }
        let job = Job {
            pass,
            data,
            geometry,
            tf32: crate::tf32(),
        };
        let key = AlgoKey {
            device: inputs[0].device.index,
            pass,
            data,
            geometry,
            tf32: job.tf32,
            aligned: pass.operands(inputs).iter().all(|t| aligned(t)),
        };
        Ok(Call { key, job })
    }

    /// The packed operands in the job's binding order, and the output they are written to.
    fn operands(
        &self,
        inputs: Vec<CubeTensor<CudaRuntime>>,
    ) -> (Vec<CubeTensor<CudaRuntime>>, CubeTensor<CudaRuntime>) {
        // cuDNN reads packed NCHW: gradients can come with broadcast (zero) strides, views with
        // others, and burn's allocator pitches rows (`into_contiguous` packs, on this stream).
        let packed: Vec<CubeTensor<CudaRuntime>> =
            inputs.into_iter().map(into_contiguous).collect();
        let x = &packed[0];
        let output = empty_device_contiguous_dtype(
            x.client.clone(),
            x.device.clone(),
            Shape::from(self.job.geometry.output(self.job.pass).to_vec()),
            x.dtype,
        );
        let operands = self.job.pass.operands(&packed).map(Clone::clone);
        (operands.to_vec(), output)
    }

    /// Queues the convolution with `choice` and returns its output at once.
    fn launch(
        &self,
        inputs: Vec<CubeTensor<CudaRuntime>>,
        choice: super::plan::Choice,
    ) -> CubeTensor<CudaRuntime> {
        let (operands, output) = self.operands(inputs);
        let (client, device) = (output.client.clone(), output.device.clone());
        let mut bindings: Vec<_> = operands
            .iter()
            .chain([&output])
            .map(|t| t.handle.clone().binding())
            .collect();
        if choice.workspace > 0 {
            bindings.push(client.empty(choice.workspace).binding());
        }
        let (key, job) = (self.key, self.job);
        let run = move |launch: &mut cubecl_cuda::ExternalLaunch<'_>| {
            ffi::launch(launch, &job, choice).map_err(|failure| {
                convolutions().launch_failed(&key, &failure);
                format!(
                    "kiln: cuDNN's {} of {:?} failed after it had run before: {}",
                    job.pass.name(),
                    job.geometry,
                    failure.why
                )
            })
        };
        cubecl_cuda::launch_external_async(&client, &device, self.job.pass.name(), bindings, run);
        output
    }

    /// Runs the convolution and waits for the CUDA thread's answer: its output, or `None` for
    /// burn's kernel.
    fn wait(
        &self,
        inputs: Vec<CubeTensor<CudaRuntime>>,
        kept: Option<super::plan::Choice>,
    ) -> Option<CubeTensor<CudaRuntime>> {
        let (operands, output) = self.operands(inputs);
        let (client, device) = (output.client.clone(), output.device.clone());
        let bindings = operands
            .iter()
            .chain([&output])
            .map(|t| t.handle.clone().binding())
            .collect();
        let job = self.job;
        let run = move |launch: &mut cubecl_cuda::ExternalLaunch<'_>| ffi::wait(launch, &job, kept);
        let outcome =
            cubecl_cuda::launch_external(&client, &device, job.pass.name(), bindings, run)
                .unwrap_or_else(|e| CallOutcome::Failed(Failure::transient(format!("{e:?}"))));
        if convolutions().settle(&self.key, &outcome)
            && let CallOutcome::Ran { choice, .. } = outcome
        {
            choices::keep(self.key, choice);
        }
        match outcome {
            CallOutcome::Ran { .. } => Some(output),
            CallOutcome::Failed(failure) => {
                let what = format!("{} of {:?} ({:?})", job.pass.name(), job.geometry, job.data);
                report(&what, &failure);
                None
            }
        }
    }
}
