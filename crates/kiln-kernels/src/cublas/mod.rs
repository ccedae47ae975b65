//! The classifier's matrix product through cuBLAS on burn's CUDA backend: a custom autodiff
//! operation on `Autodiff<Cuda>` (and the plain product on `Cuda`) whose three products (the
//! forward, and the input's and the weight's gradients) are custom operations in burn's fusion
//! stream calling `cublasGemmEx` on cubecl's stream.
//!
//! Why: with convolutions and batch norm on cuDNN, burn's matmul autotune (about twenty
//! candidate kernels compiled and timed for each new shape) was most of what a cold start still
//! compiles; and cuBLAS multiplies f32 in f32, as PyTorch's default
//! (`torch.backends.cuda.matmul.allow_tf32 = False`), where cubek's accelerated candidates use
//! TF32.
//!
//! cuBLAS is loaded at run time; without it, or where a call fails, burn's matmul runs (each
//! distinct failure logged once). As cuDNN's calls, the first call of a shape waits for the CUDA
//! thread and later ones are queued without waiting (`cudnn::policy`).

mod gemm;

use std::cell::RefCell;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, OnceLock};

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Cuda};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorMetadata, TensorPrimitive, backend::Backend};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_ir::{CustomOpIr, OperationIr, TensorIr};
use cubecl_cuda::{CudaRuntime, ExternalLaunch};
use cudarc::cublas::sys;

use crate::cudnn::op::{Handles, Runtime, grad_in, inputs, report};
use crate::cudnn::policy::{CallOutcome, Cause, Failure, Keys, Route};
use crate::same;
use gemm::Product;

type Cube = CubeBackend<CudaRuntime, f32, i32, u8>;
type Train = Autodiff<Cuda>;

/// `x` (`[batch, in]`) times `weight` (`[in, out]`, burn's layout) through cuBLAS when `B` is
/// CUDA (with or without autodiff) and cuBLAS is there; `None` otherwise, for burn's.
pub(crate) fn matmul<B: Backend>(x: &Tensor<B, 2>, weight: &Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    data_type(x.dtype())?;
    if weight.dtype() != x.dtype() {
        return None;
    }
    let product = Product::new(x.dims(), false, weight.dims(), false).ok()?;
    if let (Some(x), Some(weight)) = (
        same::<_, Tensor<Cuda, 2>>(x.clone()),
        same::<_, Tensor<Cuda, 2>>(weight.clone()),
    ) {
        if !available() {
            return None;
        }
        let inputs = vec![
            x.into_primitive().tensor(),
            weight.into_primitive().tensor(),
        ];
        let y = register(product, inputs);
        return same(Tensor::<Cuda, 2>::from_primitive(TensorPrimitive::Float(y)));
    }
    let x = same::<_, Tensor<Train, 2>>(x.clone())?;
    let weight = same::<_, Tensor<Train, 2>>(weight.clone())?;
    if !available() {
        return None;
    }
    same(train_matmul(x, weight, product))
}

fn train_matmul(
    x: Tensor<Train, 2>,
    weight: Tensor<Train, 2>,
    product: Product,
) -> Tensor<Train, 2> {
    let x = x.into_primitive().tensor();
    let weight = weight.into_primitive().tensor();
    let forward = register(product, vec![x.primitive.clone(), weight.primitive.clone()]);
    let y = match MatmulBackward
        .prepare::<NoCheckpointing>([x.node.clone(), weight.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let state = (prep.checkpoint(&x), prep.checkpoint(&weight));
            prep.finish(state, forward)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward),
    };
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

#[derive(Debug)]
struct MatmulBackward;

impl Backward<Cuda, 2> for MatmulBackward {
    type State = (NodeId, NodeId);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [x_node, weight_node] = ops.parents;
        let dy = grads.consume::<Cuda>(&ops.node);
        let (x_state, weight_state) = ops.state;
        let x = checkpointer.retrieve_node_output::<FloatTensor<Cuda>>(x_state);
        let weight = checkpointer.retrieve_node_output::<FloatTensor<Cuda>>(weight_state);
        let dims = |t: &FloatTensor<Cuda>| -> [usize; 2] { t.shape().dims() };
        let (x_dims, w_dims, dy_dims) = (dims(&x), dims(&weight), dims(&dy));
        let dy = grad_in(dy, x.dtype());
        // dx = dy weight^T, dweight = x^T dy.
        if let Some(node) = x_node {
            let product = Product::new(dy_dims, false, w_dims, true).expect("dy times weight^T");
            grads.register::<Cuda>(node.id, register(product, vec![dy.clone(), weight]));
        }
        if let Some(node) = weight_node {
            let product = Product::new(x_dims, true, dy_dims, false).expect("x^T times dy");
            grads.register::<Cuda>(node.id, register(product, vec![x, dy]));
        }
    }
}

/// Registers `product` of `[a, b]` in their fusion stream and returns its output.
fn register(product: Product, inputs: Vec<FloatTensor<Cuda>>) -> FloatTensor<Cuda> {
    let client = inputs[0].client.clone();
    let dtype = inputs[0].dtype;
    let streams = OperationStreams::with_inputs(inputs.iter());
    let out = TensorIr::uninit(
        client.create_empty_handle(),
        Shape::from(product.output().to_vec()),
        dtype,
    );
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new("kiln_cublas_matmul", &inputs, &[out]);
    let op = CublasMatmul {
        desc: desc.clone(),
        product,
    };
    client
        .register(streams, OperationIr::Custom(desc), op)
        .remove(0)
}

#[derive(Debug, Clone)]
struct CublasMatmul {
    desc: CustomOpIr,
    product: Product,
}

impl Operation<Runtime> for CublasMatmul {
    fn execute(&self, handles: &mut Handles) {
        let inputs = inputs(&self.desc, handles);
        let output =
            with_cublas(self.product, &inputs).unwrap_or_else(|| with_burn(self.product, inputs));
        handles.register_float_tensor::<Cube>(&self.desc.outputs[0].id, output);
    }
}

/// A product's key: its shapes and transpositions, and the data type.
type ProductKey = (Product, DType);

/// Every product key met in this process.
fn keys() -> &'static Keys<ProductKey, ()> {
    static KEYS: LazyLock<Keys<ProductKey, ()>> = LazyLock::new(Keys::default);
    &KEYS
}

fn with_burn(product: Product, inputs: Vec<CubeTensor<CudaRuntime>>) -> CubeTensor<CudaRuntime> {
    let mut inputs = inputs.into_iter();
    let mut operand = |transposed: bool| {
        let t = Tensor::<Cube, 2>::from_primitive(TensorPrimitive::Float(inputs.next().unwrap()));
        if transposed { t.transpose() } else { t }
    };
    let a = operand(product.a_transposed);
    let b = operand(product.b_transposed);
    a.matmul(b).into_primitive().tensor()
}

/// The product through cuBLAS on the stream of the current `StreamId`, queued without waiting
/// for a shape that ran before; `None` where cuBLAS does not run it (burn's matmul then does).
fn with_cublas(
    product: Product,
    inputs: &[CubeTensor<CudaRuntime>],
) -> Option<CubeTensor<CudaRuntime>> {
    let checked = check_operands(product, inputs);
    let data = match checked {
        Ok(data) => data,
        Err(why) => {
            report("kiln_cublas_matmul", &Failure::unsupported(why));
            return None;
        }
    };
    let key = (product, inputs[0].dtype);
    let wait = match keys().route(&key) {
        Route::Burn => return None,
        Route::Launch(()) => false,
        Route::Wait { .. } => true,
    };
    // cuBLAS reads packed rows: an output gradient can come broadcast (zero strides).
    let packed: Vec<CubeTensor<CudaRuntime>> =
        inputs.iter().map(|t| into_contiguous(t.clone())).collect();
    let a = &packed[0];
    let output = empty_device_contiguous_dtype(
        a.client.clone(),
        a.device.clone(),
        Shape::from(product.output().to_vec()),
        a.dtype,
    );
    let bindings = [&packed[0], &packed[1], &output]
        .iter()
        .map(|t| t.handle.clone().binding())
        .collect();
    let (client, device) = (a.client.clone(), a.device.clone());
    let name = "kiln_cublas_matmul";
    let run = move |launch: &mut ExternalLaunch<'_>| gemm(launch, product, data);
    if !wait {
        let failed = move |launch: &mut ExternalLaunch<'_>| {
            run(launch).map_err(|failure| {
                keys().launch_failed(&key, &failure);
                format!(
                    "kiln: cuBLAS's product {product:?} failed after it had run before: {}",
                    failure.why
                )
            })
        };
        cubecl_cuda::launch_external_async(&client, &device, name, bindings, failed);
        return Some(output);
    }
    let outcome = match cubecl_cuda::launch_external(&client, &device, name, bindings, run) {
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
        CallOutcome::Ran { .. } => Some(output),
        CallOutcome::Failed(failure) => {
            report(&format!("{name} {product:?}"), &failure);
            None
        }
    }
}

/// The operands' cuBLAS data type, or why they do not fit the product.
fn check_operands(
    product: Product,
    inputs: &[CubeTensor<CudaRuntime>],
) -> Result<sys::cudaDataType, String> {
    let dtype = inputs[0].dtype;
    if inputs[1].dtype != dtype {
        return Err(format!("mixed dtypes {dtype:?} and {:?}", inputs[1].dtype));
    }
    let data = data_type(dtype).ok_or_else(|| format!("dtype {dtype:?}"))?;
    for (t, dims) in inputs.iter().zip([product.a, product.b]) {
        if t.meta.shape().num_dims() != 2 || t.meta.shape().dims::<2>() != dims {
            return Err(format!(
                "an operand is {:?}, expected {dims:?}",
                t.meta.shape()
            ));
        }
    }
    Ok(data)
}

fn data_type(dtype: DType) -> Option<sys::cudaDataType> {
    match dtype {
        DType::F32 => Some(sys::cudaDataType::CUDA_R_32F),
        DType::F16 => Some(sys::cudaDataType::CUDA_R_16F),
        DType::BF16 => Some(sys::cudaDataType::CUDA_R_16BF),
        _ => None,
    }
}

/// Bindings `[a, b, c]`: `c = op(a) op(b)`, row-major, in f32 arithmetic whatever the data type.
fn gemm(
    launch: &ExternalLaunch<'_>,
    product: Product,
    data: sys::cudaDataType,
) -> Result<(), Failure> {
    let handle = handle()?;
    // SAFETY: `handle` is live; the stream is cubecl's, alive as long as its server.
    check(
        unsafe { sys::cublasSetStream_v2(handle, launch.stream() as sys::cudaStream_t) },
        "cublasSetStream",
    )?;
    let g = product.gemm();
    let op = |t: bool| match t {
        true => sys::cublasOperation_t::CUBLAS_OP_T,
        false => sys::cublasOperation_t::CUBLAS_OP_N,
    };
    let [a, b, c] = [0, 1, 2].map(|i| launch.ptr(i) as *mut c_void);
    let (one, zero) = (1.0f32, 0.0f32);
    // SAFETY: `handle` is live; `a`, `b` and `c` are the bindings' device buffers, packed
    // row-major of the product's shapes (`with_cublas`), which `Product::gemm` turns into these
    // sizes and leading dimensions; alpha and beta are f32 for f32 compute. The call only
    // enqueues work on the stream; the buffers outlive it (`launch_external`).
    check(
        unsafe {
            sys::cublasGemmEx(
                handle,
                op(g.first_transposed),
                op(g.second_transposed),
                g.m,
                g.n,
                g.k,
                (&one as *const f32).cast(),
                b,
                data,
                g.ld_first,
                a,
                data,
                g.ld_second,
                (&zero as *const f32).cast(),
                c,
                data,
                g.ldc,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        },
        "cublasGemmEx",
    )
}

thread_local! {
    /// The cuBLAS handle of this thread: one per device, as each device's CUDA server runs on a
    /// thread of its own with the device's context current. Never destroyed.
    static HANDLE: RefCell<Option<sys::cublasHandle_t>> = const { RefCell::new(None) };
}

/// Set once a cuBLAS handle could not be created: burn's matmul runs from then on.
static FAILED_TO_START: AtomicBool = AtomicBool::new(false);

fn handle() -> Result<sys::cublasHandle_t, Failure> {
    HANDLE.with_borrow_mut(|slot| {
        if let Some(handle) = *slot {
            return Ok(handle);
        }
        let mut handle = MaybeUninit::uninit();
        // SAFETY: valid out-pointer; the device's context is current on this thread.
        check(
            unsafe { sys::cublasCreate_v2(handle.as_mut_ptr()) },
            "cublasCreate",
        )
        .map_err(|failure| {
            FAILED_TO_START.store(true, Ordering::Relaxed);
            Failure::unsupported(failure.why)
        })?;
        // SAFETY: initialized by the successful call.
        let handle = unsafe { handle.assume_init() };
        *slot = Some(handle);
        Ok(handle)
    })
}

fn check(status: sys::cublasStatus_t, call: &str) -> Result<(), Failure> {
    use sys::cublasStatus_t::*;
    let cause = match status {
        CUBLAS_STATUS_SUCCESS => return Ok(()),
        // Allocation, a failed launch or an internal error: it may pass.
        CUBLAS_STATUS_ALLOC_FAILED
        | CUBLAS_STATUS_EXECUTION_FAILED
        | CUBLAS_STATUS_INTERNAL_ERROR
        | CUBLAS_STATUS_MAPPING_ERROR => Cause::Transient,
        _ => Cause::Unsupported,
    };
    Err(Failure {
        cause,
        why: format!("{call} failed: {status:?}"),
    })
}

/// Whether cuBLAS is on the library path and started (probed once: cudarc panics on a missing
/// library).
fn available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
        && !FAILED_TO_START.load(Ordering::Relaxed)
}
