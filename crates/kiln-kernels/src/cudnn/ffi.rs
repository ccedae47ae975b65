//! The cuDNN calls, through cudarc's raw bindings (`cudarc::cudnn::sys`: the measured algorithm
//! search, `cudnnFind*AlgorithmEx`, is only there). Everything here runs on the CUDA server thread
//! of one device, inside [`cubecl_cuda::launch_external`], on the stream cubecl launches the
//! caller's kernels on.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cubecl_cuda::ExternalLaunch;
use cudarc::cudnn::sys;

use super::plan::{self, AlgoKey, DataType, Geometry, MathType, Pass};
use super::store::{Saved, Store};

/// One convolution for cuDNN. The bindings given to `launch_external` are, in order:
/// forward `[x, w, y]`, backward data `[w, dy, dx]`, backward filter `[x, dy, dw]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Job {
    pub device: usize,
    pub pass: Pass,
    pub data: DataType,
    pub geometry: Geometry,
    pub tf32: bool,
}

/// The most scratch memory an algorithm search offers the candidates (those that need more are
/// not measured), and the most a chosen algorithm may take.
const WORKSPACE_CAP: usize = 1 << 30;

/// An algorithm of one pass.
#[derive(Debug, Clone, Copy)]
enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    BackwardData(sys::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

impl Algo {
    /// The value of cuDNN's enum, as kept on disk.
    fn code(self) -> u32 {
        match self {
            Algo::Forward(algo) => algo as u32,
            Algo::BackwardData(algo) => algo as u32,
            Algo::BackwardFilter(algo) => algo as u32,
        }
    }

    /// The algorithm of `pass` whose enum value is `code`, if this cuDNN has one.
    fn from_code(pass: Pass, code: u32) -> Option<Self> {
        match pass {
            Pass::Forward => FORWARD_ALGOS
                .into_iter()
                .find(|&a| a as u32 == code)
                .map(Algo::Forward),
            Pass::BackwardData => BACKWARD_DATA_ALGOS
                .into_iter()
                .find(|&a| a as u32 == code)
                .map(Algo::BackwardData),
            Pass::BackwardFilter => BACKWARD_FILTER_ALGOS
                .into_iter()
                .find(|&a| a as u32 == code)
                .map(Algo::BackwardFilter),
        }
    }
}

/// What the search chose for a key, or that cuDNN has nothing for it (then burn's kernel runs,
/// without searching again).
#[derive(Debug, Clone, Copy)]
enum Choice {
    Run {
        algo: Algo,
        math: MathType,
        workspace: usize,
        /// Read from kiln's cache, not measured by this process: searched again if it fails.
        kept: bool,
    },
    Unsupported,
}

/// Algorithm choices, one per key, for the life of the process. The lock is held only to read or
/// insert, never across a cuDNN call.
fn choices() -> &'static Mutex<HashMap<AlgoKey, Choice>> {
    static CHOICES: OnceLock<Mutex<HashMap<AlgoKey, Choice>>> = OnceLock::new();
    CHOICES.get_or_init(Default::default)
}

fn cached(key: &AlgoKey) -> Option<Choice> {
    let map = choices().lock().unwrap_or_else(|e| e.into_inner());
    map.get(key).copied()
}

fn remember(key: AlgoKey, choice: Choice) {
    let mut map = choices().lock().unwrap_or_else(|e| e.into_inner());
    map.insert(key, choice);
}

/// The file of `device`'s choices, its choices remembered on the first call for the device;
/// `None` where the GPU's name or cuDNN's version cannot be read (choices then last the process).
fn kept(device: usize) -> Option<Arc<Store>> {
    static KEPT: OnceLock<Mutex<HashMap<usize, Option<Arc<Store>>>>> = OnceLock::new();
    let mut files = KEPT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    files
        .entry(device)
        .or_insert_with(|| open_kept(device).map(Arc::new))
        .clone()
}

fn open_kept(device: usize) -> Option<Store> {
    use cudarc::driver::result::device as cu_device;
    let gpu = cu_device::get(device as i32)
        .and_then(cu_device::get_name)
        .ok()?;
    let cudnn = plan::version_name(*super::version().as_ref().ok()?);
    let store = Store::new(&kiln_download::cache_root(), &gpu, &cudnn);
    match store.load() {
        Ok(saved) => {
            for (key, saved) in saved {
                if let Some(algo) = Algo::from_code(key.pass, saved.algo) {
                    let choice = Choice::Run {
                        algo,
                        math: saved.math,
                        workspace: saved.workspace,
                        kept: true,
                    };
                    remember(AlgoKey { device, ..key }, choice);
                }
            }
        }
        Err(why) => {
            log::warn!("cuDNN's algorithm choices were not read, they are measured again: {why}")
        }
    }
    Some(store)
}

/// Writes a measured choice into the device's file (a failed write is logged: the choice still
/// holds for this process).
fn keep(device: usize, key: AlgoKey, algo: Algo, math: MathType, workspace: usize) {
    let Some(store) = kept(device) else { return };
    let saved = Saved {
        algo: algo.code(),
        math,
        workspace,
    };
    if let Err(why) = store.save(key, saved) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !WARNED.swap(true, Ordering::Relaxed) {
            log::warn!("cuDNN's algorithm choices could not be kept (logged once): {why}");
        }
    }
}

thread_local! {
    /// The cuDNN handle of this thread: each device's CUDA server runs on a thread of its own
    /// with the device's primary context current (cubecl-cuda `CudaServer::command`), so this is
    /// one handle per device. Never destroyed: it lives as long as the server thread.
    static HANDLE: RefCell<Option<sys::cudnnHandle_t>> = const { RefCell::new(None) };
}

/// Set once a cuDNN handle could not be created (a library that loads but cannot start, such as
/// cuDNN 9 without its `libcudnn_cnn`): burn's convolution runs from then on, without trying.
static FAILED_TO_START: AtomicBool = AtomicBool::new(false);

pub(crate) fn failed_to_start() -> bool {
    FAILED_TO_START.load(Ordering::Relaxed)
}

fn handle() -> Result<sys::cudnnHandle_t, String> {
    HANDLE.with_borrow_mut(|slot| {
        if let Some(handle) = *slot {
            return Ok(handle);
        }
        let mut handle = MaybeUninit::uninit();
        // SAFETY: `handle` is a valid out-pointer; the calling thread has the device's context
        // current (the CUDA server sets it before every command).
        check(
            unsafe { sys::cudnnCreate(handle.as_mut_ptr()) },
            "cudnnCreate",
        )
        .inspect_err(|_| FAILED_TO_START.store(true, Ordering::Relaxed))?;
        // SAFETY: initialized by the successful `cudnnCreate`.
        let handle = unsafe { handle.assume_init() };
        *slot = Some(handle);
        Ok(handle)
    })
}

/// This thread's cuDNN handle, set to enqueue on the launch's stream (cubecl's).
pub(super) fn handle_on(launch: &ExternalLaunch<'_>) -> Result<sys::cudnnHandle_t, String> {
    let handle = handle()?;
    // SAFETY: `handle` is live; the stream is cubecl's, alive as long as its server.
    check(
        unsafe { sys::cudnnSetStream(handle, launch.stream() as sys::cudaStream_t) },
        "cudnnSetStream",
    )?;
    Ok(handle)
}

pub(super) fn check(status: sys::cudnnStatus_t, call: &str) -> Result<(), String> {
    match status {
        sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS => Ok(()),
        status => Err(format!("{call} failed: {status:?}")),
    }
}

pub(crate) fn data_type(data: DataType) -> sys::cudnnDataType_t {
    match data {
        DataType::F32 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        DataType::F16 => sys::cudnnDataType_t::CUDNN_DATA_HALF,
        DataType::Bf16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
    }
}

pub(crate) fn math_type(math: MathType) -> sys::cudnnMathType_t {
    match math {
        MathType::Default => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        MathType::TensorOp => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        MathType::TensorOpAllowConversion => {
            sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
        }
        MathType::Fma => sys::cudnnMathType_t::CUDNN_FMA_MATH,
    }
}

fn from_math_type(math: sys::cudnnMathType_t) -> MathType {
    MathType::from_cudnn_code(math as u32).unwrap_or(MathType::Default)
}

/// A tensor descriptor, destroyed on drop.
pub(super) struct TensorDesc(pub(super) sys::cudnnTensorDescriptor_t);

impl TensorDesc {
    fn create() -> Result<Self, String> {
        let mut raw = MaybeUninit::uninit();
        // SAFETY: valid out-pointer.
        check(
            unsafe { sys::cudnnCreateTensorDescriptor(raw.as_mut_ptr()) },
            "cudnnCreateTensorDescriptor",
        )?;
        // SAFETY: initialized by the successful call; owned from here, so dropped once.
        Ok(TensorDesc(unsafe { raw.assume_init() }))
    }

    /// A packed NCHW tensor of `dims`.
    pub(super) fn new(data: DataType, dims: [usize; 4]) -> Result<Self, String> {
        let desc = Self::create()?;
        let (dims, strides) = plan::nchw_descriptor(dims);
        // SAFETY: `desc.0` is a live descriptor; `dims` and `strides` hold the 4 ints read.
        check(
            unsafe {
                sys::cudnnSetTensorNdDescriptor(
                    desc.0,
                    data_type(data),
                    4,
                    dims.as_ptr(),
                    strides.as_ptr(),
                )
            },
            "cudnnSetTensorNdDescriptor",
        )?;
        Ok(desc)
    }

    /// The per-channel tensor (`[1, C, 1, 1]`) of batch norm's weight, bias and statistics over
    /// `x`, in the type cuDNN wants for them (f32 for every data type kiln uses).
    pub(super) fn batch_norm(x: &TensorDesc) -> Result<Self, String> {
        let desc = Self::create()?;
        // SAFETY: both descriptors are live; `x` is set.
        check(
            unsafe {
                sys::cudnnDeriveBNTensorDescriptor(
                    desc.0,
                    x.0,
                    sys::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
                )
            },
            "cudnnDeriveBNTensorDescriptor",
        )?;
        Ok(desc)
    }
}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreateTensorDescriptor`, destroyed only here.
        unsafe { sys::cudnnDestroyTensorDescriptor(self.0) };
    }
}

/// A KCRS filter descriptor, destroyed on drop.
struct FilterDesc(sys::cudnnFilterDescriptor_t);

impl FilterDesc {
    fn new(data: DataType, [k, c, r, s]: [usize; 4]) -> Result<Self, String> {
        let mut raw = MaybeUninit::uninit();
        // SAFETY: valid out-pointer.
        check(
            unsafe { sys::cudnnCreateFilterDescriptor(raw.as_mut_ptr()) },
            "cudnnCreateFilterDescriptor",
        )?;
        // SAFETY: initialized by the successful call; owned from here.
        let desc = FilterDesc(unsafe { raw.assume_init() });
        // SAFETY: `desc.0` is a live descriptor; the dims fit `int` (`Geometry::new`).
        check(
            unsafe {
                sys::cudnnSetFilter4dDescriptor(
                    desc.0,
                    data_type(data),
                    sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                    k as i32,
                    c as i32,
                    r as i32,
                    s as i32,
                )
            },
            "cudnnSetFilter4dDescriptor",
        )?;
        Ok(desc)
    }
}

impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreateFilterDescriptor`, destroyed only here.
        unsafe { sys::cudnnDestroyFilterDescriptor(self.0) };
    }
}

/// A cross-correlation (PyTorch's and burn's "convolution") descriptor, destroyed on drop.
struct ConvDesc(sys::cudnnConvolutionDescriptor_t);

impl ConvDesc {
    fn new(data: DataType, geometry: &Geometry) -> Result<Self, String> {
        let mut raw = MaybeUninit::uninit();
        // SAFETY: valid out-pointer.
        check(
            unsafe { sys::cudnnCreateConvolutionDescriptor(raw.as_mut_ptr()) },
            "cudnnCreateConvolutionDescriptor",
        )?;
        // SAFETY: initialized by the successful call; owned from here.
        let desc = ConvDesc(unsafe { raw.assume_init() });
        let [pad_h, pad_w, u, v, dil_h, dil_w] = geometry.conv_params();
        let compute = match data.compute_code() {
            0 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            code => return Err(format!("unexpected compute type {code}")),
        };
        // SAFETY: `desc.0` is a live descriptor.
        check(
            unsafe {
                sys::cudnnSetConvolution2dDescriptor(
                    desc.0,
                    pad_h,
                    pad_w,
                    u,
                    v,
                    dil_h,
                    dil_w,
                    sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    compute,
                )
            },
            "cudnnSetConvolution2dDescriptor",
        )?;
        // SAFETY: `desc.0` is a live descriptor; the filter descriptor is `[K, C / groups, R, S]`.
        check(
            unsafe { sys::cudnnSetConvolutionGroupCount(desc.0, geometry.groups as i32) },
            "cudnnSetConvolutionGroupCount",
        )?;
        Ok(desc)
    }

    fn set_math(&self, math: MathType) -> Result<(), String> {
        // SAFETY: `self.0` is a live descriptor.
        check(
            unsafe { sys::cudnnSetConvolutionMathType(self.0, math_type(math)) },
            "cudnnSetConvolutionMathType",
        )
    }
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreateConvolutionDescriptor`, destroyed only here.
        unsafe { sys::cudnnDestroyConvolutionDescriptor(self.0) };
    }
}

/// The descriptors of one job: `x`, `w` and `y` whatever the pass (cuDNN's backward calls
/// take `dx` and `dy` with the descriptors of `x` and `y`).
struct Descriptors {
    x: TensorDesc,
    w: FilterDesc,
    y: TensorDesc,
    conv: ConvDesc,
}

impl Descriptors {
    fn new(job: &Job) -> Result<Self, String> {
        Ok(Descriptors {
            x: TensorDesc::new(job.data, job.geometry.x)?,
            w: FilterDesc::new(job.data, job.geometry.w)?,
            y: TensorDesc::new(job.data, job.geometry.y)?,
            conv: ConvDesc::new(job.data, &job.geometry)?,
        })
    }
}

/// Runs `job` on the launch's stream. `Err` says why cuDNN did not (the caller then runs
/// burn's kernel); nothing was written to the output then that the fallback does not overwrite.
pub(crate) fn run(launch: &mut ExternalLaunch<'_>, job: &Job) -> Result<(), String> {
    let handle = handle_on(launch)?;
    let desc = Descriptors::new(job)?;
    let ptrs = [0, 1, 2].map(|i| launch.ptr(i));
    let key = AlgoKey {
        device: job.device,
        pass: job.pass,
        data: job.data,
        geometry: job.geometry,
        tf32: job.tf32,
        aligned: plan::aligned_16(&ptrs),
    };
    // A key not seen yet may be in the device's file, read on its first miss.
    let known = cached(&key).or_else(|| kept(job.device).and_then(|_| cached(&key)));
    match known {
        Some(choice @ Choice::Run { kept: true, .. })
            if execute(launch, handle, &desc, job, choice, ptrs).is_ok() =>
        {
            return Ok(());
        }
        // A kept choice that failed (a driver or library changed under the same names) is
        // measured again, as a key never seen.
        Some(Choice::Run { kept: true, .. }) | None => {}
        Some(choice) => return execute(launch, handle, &desc, job, choice, ptrs),
    }
    // A failed search is remembered as "unsupported" too: searching again would cost a stream
    // sync on every call (with cuDNN 9 missing its `libcudnn_cnn`, say).
    let searched = search(launch, handle, &desc, job, ptrs);
    remember(key, *searched.as_ref().unwrap_or(&Choice::Unsupported));
    if let Ok(Choice::Run {
        algo,
        math,
        workspace,
        ..
    }) = searched
    {
        keep(job.device, key, algo, math, workspace);
    }
    execute(launch, handle, &desc, job, searched?, ptrs)
}

/// Enqueues `choice`'s algorithm with its math type and workspace.
fn execute(
    launch: &mut ExternalLaunch<'_>,
    handle: sys::cudnnHandle_t,
    desc: &Descriptors,
    job: &Job,
    choice: Choice,
    ptrs: [u64; 3],
) -> Result<(), String> {
    let Choice::Run {
        algo,
        math,
        workspace,
        ..
    } = choice
    else {
        return Err(format!("cuDNN has no algorithm for {:?} {job:?}", job.pass));
    };
    desc.conv.set_math(math)?;
    let workspace_ptr = match workspace {
        0 => 0,
        bytes => launch
            .scratch(bytes as u64)
            .map_err(|e| format!("no workspace of {bytes} bytes: {e:?}"))?,
    };
    launch_algo(handle, desc, algo, ptrs, workspace_ptr, workspace)
}

/// Measures the algorithms of the job's pass (`cudnnFind*AlgorithmEx`, on the real buffers) and
/// keeps the fastest whose math type the dtype and TF32 setting allow.
fn search(
    launch: &mut ExternalLaunch<'_>,
    handle: sys::cudnnHandle_t,
    desc: &Descriptors,
    job: &Job,
    ptrs: [u64; 3],
) -> Result<Choice, String> {
    desc.conv
        .set_math(MathType::for_search(job.data, job.tf32))?;
    let limit = plan::search_workspace(workspace_sizes(handle, desc, job.pass), WORKSPACE_CAP);
    let (ws_ptr, ws_size) = match launch.scratch(limit as u64) {
        Ok(ptr) => (ptr, limit),
        Err(_) => (0, 0),
    };
    // The search times the algorithms with host-side waits; the inputs it reads are ordered
    // before it on this stream, and this makes sure nothing else of the stream is in flight
    // while it measures. Once per key.
    // SAFETY: the stream is cubecl's, alive as long as its server.
    unsafe { cudarc::driver::result::stream::synchronize(launch.stream()) }
        .map_err(|e| format!("stream synchronize before the algorithm search: {e:?}"))?;
    let found = find(handle, desc, job.pass, ptrs, ws_ptr, ws_size)?;
    let picked = plan::choose(&found, job.data, job.tf32);
    Ok(match picked {
        Some((algo, found_math, memory)) => Choice::Run {
            algo,
            math: MathType::for_run(job.data, job.tf32, found_math),
            workspace: memory,
            kept: false,
        },
        None => Choice::Unsupported,
    })
}

const FORWARD_ALGOS: [sys::cudnnConvolutionFwdAlgo_t; 8] = {
    use sys::cudnnConvolutionFwdAlgo_t::*;
    [
        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
    ]
};

const BACKWARD_DATA_ALGOS: [sys::cudnnConvolutionBwdDataAlgo_t; 6] = {
    use sys::cudnnConvolutionBwdDataAlgo_t::*;
    [
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
    ]
};

const BACKWARD_FILTER_ALGOS: [sys::cudnnConvolutionBwdFilterAlgo_t; 7] = {
    use sys::cudnnConvolutionBwdFilterAlgo_t::*;
    [
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
    ]
};

/// The workspace each algorithm of the pass asks for, those cuDNN supports for the job only.
fn workspace_sizes(handle: sys::cudnnHandle_t, desc: &Descriptors, pass: Pass) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut push = |status: sys::cudnnStatus_t, size: usize| {
        if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
            sizes.push(size);
        }
    };
    // SAFETY (all three arms): `handle` and the descriptors are live; `size` is a valid
    // out-pointer.
    match pass {
        Pass::Forward => {
            for algo in FORWARD_ALGOS {
                let mut size = 0usize;
                let status = unsafe {
                    sys::cudnnGetConvolutionForwardWorkspaceSize(
                        handle,
                        desc.x.0,
                        desc.w.0,
                        desc.conv.0,
                        desc.y.0,
                        algo,
                        &mut size,
                    )
                };
                push(status, size);
            }
        }
        Pass::BackwardData => {
            for algo in BACKWARD_DATA_ALGOS {
                let mut size = 0usize;
                let status = unsafe {
                    sys::cudnnGetConvolutionBackwardDataWorkspaceSize(
                        handle,
                        desc.w.0,
                        desc.y.0,
                        desc.conv.0,
                        desc.x.0,
                        algo,
                        &mut size,
                    )
                };
                push(status, size);
            }
        }
        Pass::BackwardFilter => {
            for algo in BACKWARD_FILTER_ALGOS {
                let mut size = 0usize;
                let status = unsafe {
                    sys::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                        handle,
                        desc.x.0,
                        desc.y.0,
                        desc.conv.0,
                        desc.w.0,
                        algo,
                        &mut size,
                    )
                };
                push(status, size);
            }
        }
    }
    sizes
}

/// The successful results of `cudnnFind*AlgorithmEx`, fastest first: `(algorithm, math type,
/// workspace bytes)`.
fn find(
    handle: sys::cudnnHandle_t,
    desc: &Descriptors,
    pass: Pass,
    [a, b, out]: [u64; 3],
    ws_ptr: u64,
    ws_size: usize,
) -> Result<Vec<(Algo, MathType, usize)>, String> {
    let (a, b, out) = (a as *const c_void, b as *const c_void, out as *mut c_void);
    let ws = ws_ptr as *mut c_void;
    let mut returned = 0i32;
    let success = sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS;
    // SAFETY (all three arms): `handle` and the descriptors are live; `a`, `b` and `out` are
    // device buffers of the descriptors' sizes (bindings resolved by `launch_external`, packed
    // NCHW), `ws` holds `ws_size` bytes (or is null with 0); `results` has room for the
    // `requested` entries cuDNN may write, and only the `returned` first are read. All-zero
    // results are valid values of the C structs (algorithm 0, success, default math).
    // One search: `$find` with the descriptors in its order, results of type `$perf`, at most
    // `$count`, each algorithm wrapped as `$algo`.
    macro_rules! search {
        ($find:ident, $perf:ty, $count:expr, $algo:path, [$d1:expr, $d2:expr, $d3:expr, $d4:expr]) => {{
            let mut results = [unsafe { MaybeUninit::<$perf>::zeroed().assume_init() }; $count];
            check(
                unsafe {
                    sys::$find(
                        handle,
                        $d1,
                        a,
                        $d2,
                        b,
                        $d3,
                        $d4,
                        out,
                        results.len() as i32,
                        &mut returned,
                        results.as_mut_ptr(),
                        ws,
                        ws_size,
                    )
                },
                stringify!($find),
            )?;
            results[..returned.clamp(0, results.len() as i32) as usize]
                .iter()
                .filter(|r| r.status == success)
                .map(|r| ($algo(r.algo), from_math_type(r.mathType), r.memory))
                .collect()
        }};
    }
    let found = match pass {
        Pass::Forward => search!(
            cudnnFindConvolutionForwardAlgorithmEx,
            sys::cudnnConvolutionFwdAlgoPerf_t,
            FORWARD_ALGOS.len(),
            Algo::Forward,
            [desc.x.0, desc.w.0, desc.conv.0, desc.y.0]
        ),
        Pass::BackwardData => search!(
            cudnnFindConvolutionBackwardDataAlgorithmEx,
            sys::cudnnConvolutionBwdDataAlgoPerf_t,
            BACKWARD_DATA_ALGOS.len(),
            Algo::BackwardData,
            [desc.w.0, desc.y.0, desc.conv.0, desc.x.0]
        ),
        Pass::BackwardFilter => search!(
            cudnnFindConvolutionBackwardFilterAlgorithmEx,
            sys::cudnnConvolutionBwdFilterAlgoPerf_t,
            BACKWARD_FILTER_ALGOS.len(),
            Algo::BackwardFilter,
            [desc.x.0, desc.y.0, desc.conv.0, desc.w.0]
        ),
    };
    Ok(found)
}

/// Enqueues the convolution on the handle's stream: `out = op(a, b)` with alpha 1, beta 0
/// (alpha and beta are f32 for f32 compute, whatever the data type).
fn launch_algo(
    handle: sys::cudnnHandle_t,
    desc: &Descriptors,
    algo: Algo,
    [a, b, out]: [u64; 3],
    ws_ptr: u64,
    ws_size: usize,
) -> Result<(), String> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let alpha = &alpha as *const f32 as *const c_void;
    let beta = &beta as *const f32 as *const c_void;
    let (a, b, out) = (a as *const c_void, b as *const c_void, out as *mut c_void);
    let ws = ws_ptr as *mut c_void;
    // SAFETY (all three arms): as in `find`; `algo` came from a successful search for these
    // descriptors and `ws` holds the `ws_size` bytes it asked for. The call only enqueues work
    // on the stream; the buffers stay alive (and unreused) until the stream has passed it
    // (`launch_external`).
    let status = match algo {
        Algo::Forward(algo) => unsafe {
            sys::cudnnConvolutionForward(
                handle,
                alpha,
                desc.x.0,
                a,
                desc.w.0,
                b,
                desc.conv.0,
                algo,
                ws,
                ws_size,
                beta,
                desc.y.0,
                out,
            )
        },
        Algo::BackwardData(algo) => unsafe {
            sys::cudnnConvolutionBackwardData(
                handle,
                alpha,
                desc.w.0,
                a,
                desc.y.0,
                b,
                desc.conv.0,
                algo,
                ws,
                ws_size,
                beta,
                desc.x.0,
                out,
            )
        },
        Algo::BackwardFilter(algo) => unsafe {
            sys::cudnnConvolutionBackwardFilter(
                handle,
                alpha,
                desc.x.0,
                a,
                desc.y.0,
                b,
                desc.conv.0,
                algo,
                ws,
                ws_size,
                beta,
                desc.w.0,
                out,
            )
        },
    };
    check(status, "the cuDNN convolution")
}

/// The version of the cuDNN library loaded, or why there is none. Probes for the library before
/// calling into it (cudarc panics on a missing library).
pub(crate) fn version() -> Result<usize, String> {
    // SAFETY: only tries to open the library.
    if !unsafe { sys::is_culib_present() } {
        return Err("libcudnn (cuDNN 8 or 9) not found on the library path".into());
    }
    // SAFETY: the library is present; `cudnnGetVersion` takes no arguments.
    let version = unsafe { sys::cudnnGetVersion() };
    if version < 8000 {
        return Err(format!(
            "cuDNN {} is older than 8",
            plan::version_name(version)
        ));
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pure module's codes are cuDNN's (cudarc's enums are the C header's values).
    #[test]
    fn codes_match_cudarcs_enums() {
        for data in [DataType::F32, DataType::F16, DataType::Bf16] {
            assert_eq!(data_type(data) as u32, data.cudnn_code());
        }
        for math in [
            MathType::Default,
            MathType::TensorOp,
            MathType::TensorOpAllowConversion,
            MathType::Fma,
        ] {
            assert_eq!(math_type(math) as u32, math.cudnn_code());
            assert_eq!(from_math_type(math_type(math)), math);
        }
    }

    /// Kept choices name algorithms by their enum's value; each comes back as itself, and a
    /// value this cuDNN does not have as none.
    #[test]
    fn algorithms_come_back_from_their_codes() {
        let all = FORWARD_ALGOS
            .map(Algo::Forward)
            .into_iter()
            .map(|a| (Pass::Forward, a))
            .chain(BACKWARD_DATA_ALGOS.map(|a| (Pass::BackwardData, Algo::BackwardData(a))))
            .chain(BACKWARD_FILTER_ALGOS.map(|a| (Pass::BackwardFilter, Algo::BackwardFilter(a))));
        for (pass, algo) in all {
            let back = Algo::from_code(pass, algo.code()).expect("known code");
            assert_eq!(format!("{back:?}"), format!("{algo:?}"));
        }
        assert!(Algo::from_code(Pass::Forward, 8).is_none());
        assert!(Algo::from_code(Pass::BackwardData, 6).is_none());
        assert!(Algo::from_code(Pass::BackwardFilter, 7).is_none());
    }
}
