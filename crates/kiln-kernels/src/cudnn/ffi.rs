//! The cuDNN calls of a convolution, through kiln's table of cuDNN 9's functions
//! (`library.rs`). Everything here runs on the CUDA server thread of one device, inside
//! `cubecl_cuda::launch_external` or `launch_external_async`, on the stream cubecl launches the
//! caller's kernels on. Descriptors are made once per shape and thread (each device's server
//! runs on a thread of its own) and kept.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use cubecl_cuda::ExternalLaunch;

use super::library::{self, AlgoPerf, Desc, Handle, Library, Status};
use super::plan::{self, Choice, ConvDims, ConvPass, DataType, MathType};
use super::policy::{CallOutcome, Failure, cudnn_cause};

/// One convolution for cuDNN. Its bindings are, in order: forward `[x, w, y]`, backward data
/// `[w, dy, dx]`, backward filter `[x, dy, dw]`; then, for a launch without waiting whose choice
/// has one, its workspace.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Job {
    pub pass: ConvPass,
    pub data: DataType,
    pub geometry: ConvDims,
    pub tf32: bool,
}

/// The most scratch memory an algorithm search offers the candidates (those that need more are
/// not measured), and the most a chosen algorithm may take.
const WORKSPACE_CAP: usize = 1 << 30;

/// `CUDNN_TENSOR_NCHW`, `CUDNN_CROSS_CORRELATION` (PyTorch's and burn's "convolution"),
/// `CUDNN_BATCHNORM_SPATIAL`: values of cuDNN 9's enums.
const NCHW: c_int = 0;
const CROSS_CORRELATION: c_int = 1;
pub(super) const BATCHNORM_SPATIAL: c_int = 1;

/// cuDNN, or why not (checked before any call is routed here; this guards the thread).
pub(super) fn lib() -> Result<&'static Library, Failure> {
    library::library().map_err(Failure::unsupported)
}

/// `Ok` for a successful status; otherwise the failure, its cause read from the status.
pub(super) fn check(lib: &Library, status: Status, call: &str) -> Result<(), Failure> {
    if status == 0 {
        return Ok(());
    }
    Err(Failure {
        cause: cudnn_cause(status as u32),
        why: format!("{call} failed: {}", lib.describe(status)),
    })
}

thread_local! {
    /// The cuDNN handle of this thread: each device's CUDA server runs on a thread of its own
    /// with the device's primary context current (cubecl-cuda `CudaServer::command`), so this is
    /// one handle per device. Never destroyed: it lives as long as the server thread.
    static HANDLE: RefCell<Option<Handle>> = const { RefCell::new(None) };
    /// The descriptors of each convolution shape met on this thread.
    static DESCRIPTORS: RefCell<HashMap<(DataType, ConvDims), Rc<Descriptors>>> =
        RefCell::new(HashMap::new());
}

/// Set once a cuDNN handle could not be created (a library that loads but cannot start, such as
/// cuDNN 9 without its `libcudnn_cnn`): burn's kernels run from then on, without trying.
static FAILED_TO_START: AtomicBool = AtomicBool::new(false);

pub(crate) fn failed_to_start() -> bool {
    FAILED_TO_START.load(Ordering::Relaxed)
}

/// This thread's cuDNN handle, set to enqueue on the launch's stream (cubecl's).
pub(super) fn handle_on(lib: &Library, launch: &ExternalLaunch<'_>) -> Result<Handle, Failure> {
    let handle = HANDLE.with_borrow_mut(|slot| {
        if let Some(handle) = *slot {
            return Ok(handle);
        }
        let mut handle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; the calling thread has the device's context
        // current (the CUDA server sets it before every command).
        let status = unsafe { (lib.cudnnCreate)(&mut handle) };
        check(lib, status, "cudnnCreate").map_err(|failure| {
            FAILED_TO_START.store(true, Ordering::Relaxed);
            Failure::unsupported(failure.why)
        })?;
        *slot = Some(handle);
        Ok(handle)
    })?;
    // SAFETY: `handle` is live; the stream is cubecl's, alive as long as its server.
    let status = unsafe { (lib.cudnnSetStream)(handle, launch.stream() as *mut c_void) };
    check(lib, status, "cudnnSetStream")?;
    Ok(handle)
}

/// A descriptor of one of cuDNN's kinds, destroyed on drop.
pub(super) struct Descriptor {
    pub raw: Desc,
    destroy: unsafe extern "C" fn(Desc) -> Status,
}

impl Descriptor {
    fn create(
        lib: &Library,
        create: unsafe extern "C" fn(*mut Desc) -> Status,
        destroy: unsafe extern "C" fn(Desc) -> Status,
        name: &str,
    ) -> Result<Self, Failure> {
        let mut raw = MaybeUninit::uninit();
        // SAFETY: valid out-pointer.
        check(lib, unsafe { create(raw.as_mut_ptr()) }, name)?;
        // SAFETY: initialized by the successful call; owned from here, so destroyed once.
        let raw = unsafe { raw.assume_init() };
        Ok(Descriptor { raw, destroy })
    }

    /// A packed NCHW tensor of `dims`.
    pub(super) fn tensor(lib: &Library, data: DataType, dims: [usize; 4]) -> Result<Self, Failure> {
        let desc = Self::create(
            lib,
            lib.cudnnCreateTensorDescriptor,
            lib.cudnnDestroyTensorDescriptor,
            "cudnnCreateTensorDescriptor",
        )?;
        let (dims, strides) = plan::nchw_descriptor(dims);
        // SAFETY: `desc` is live; `dims` and `strides` hold the 4 ints read.
        let status = unsafe {
            (lib.cudnnSetTensorNdDescriptor)(
                desc.raw,
                data.cudnn_code() as c_int,
                4,
                dims.as_ptr(),
                strides.as_ptr(),
            )
        };
        check(lib, status, "cudnnSetTensorNdDescriptor")?;
        Ok(desc)
    }

    /// The per-channel tensor (`[1, C, 1, 1]`) of batch norm's weight, bias and statistics over
    /// `x`, in the type cuDNN wants for them (f32 for every data type kiln uses).
    pub(super) fn batch_norm(lib: &Library, x: &Descriptor) -> Result<Self, Failure> {
        let desc = Self::create(
            lib,
            lib.cudnnCreateTensorDescriptor,
            lib.cudnnDestroyTensorDescriptor,
            "cudnnCreateTensorDescriptor",
        )?;
        // SAFETY: both descriptors are live; `x` is set.
        let status =
            unsafe { (lib.cudnnDeriveBNTensorDescriptor)(desc.raw, x.raw, BATCHNORM_SPATIAL) };
        check(lib, status, "cudnnDeriveBNTensorDescriptor")?;
        Ok(desc)
    }

    /// A KCRS filter.
    fn filter(lib: &Library, data: DataType, [k, c, r, s]: [usize; 4]) -> Result<Self, Failure> {
        let desc = Self::create(
            lib,
            lib.cudnnCreateFilterDescriptor,
            lib.cudnnDestroyFilterDescriptor,
            "cudnnCreateFilterDescriptor",
        )?;
        // SAFETY: `desc` is live; the dims fit `int` (`ConvDims::new`).
        let status = unsafe {
            (lib.cudnnSetFilter4dDescriptor)(
                desc.raw,
                data.cudnn_code() as c_int,
                NCHW,
                k as c_int,
                c as c_int,
                r as c_int,
                s as c_int,
            )
        };
        check(lib, status, "cudnnSetFilter4dDescriptor")?;
        Ok(desc)
    }

    /// A cross-correlation, computed in f32 whatever the data type.
    fn convolution(lib: &Library, data: DataType, geometry: &ConvDims) -> Result<Self, Failure> {
        let desc = Self::create(
            lib,
            lib.cudnnCreateConvolutionDescriptor,
            lib.cudnnDestroyConvolutionDescriptor,
            "cudnnCreateConvolutionDescriptor",
        )?;
        let [pad_h, pad_w, u, v, dil_h, dil_w] = geometry.conv_params();
        // SAFETY: `desc` is live.
        let status = unsafe {
            (lib.cudnnSetConvolution2dDescriptor)(
                desc.raw,
                pad_h,
                pad_w,
                u,
                v,
                dil_h,
                dil_w,
                CROSS_CORRELATION,
                data.compute_code() as c_int,
            )
        };
        check(lib, status, "cudnnSetConvolution2dDescriptor")?;
        // SAFETY: `desc` is live; the filter descriptor is `[K, C / groups, R, S]`.
        let status =
            unsafe { (lib.cudnnSetConvolutionGroupCount)(desc.raw, geometry.groups as c_int) };
        check(lib, status, "cudnnSetConvolutionGroupCount")?;
        Ok(desc)
    }
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: created by its kind's create function, destroyed only here.
        unsafe { (self.destroy)(self.raw) };
    }
}

/// The descriptors of one convolution shape: `x`, `w` and `y` whatever the pass (cuDNN's
/// backward calls take `dx` and `dy` with the descriptors of `x` and `y`).
struct Descriptors {
    x: Descriptor,
    w: Descriptor,
    y: Descriptor,
    conv: Descriptor,
}

impl Descriptors {
    /// This thread's descriptors for the job's shape, made on first use.
    fn of(lib: &Library, job: &Job) -> Result<Rc<Self>, Failure> {
        let shape = (job.data, job.geometry);
        if let Some(found) = DESCRIPTORS.with_borrow(|map| map.get(&shape).cloned()) {
            return Ok(found);
        }
        let made = Rc::new(Descriptors {
            x: Descriptor::tensor(lib, job.data, job.geometry.x)?,
            w: Descriptor::filter(lib, job.data, job.geometry.w)?,
            y: Descriptor::tensor(lib, job.data, job.geometry.y)?,
            conv: Descriptor::convolution(lib, job.data, &job.geometry)?,
        });
        DESCRIPTORS.with_borrow_mut(|map| map.insert(shape, made.clone()));
        Ok(made)
    }

    fn set_math(&self, lib: &Library, math: MathType) -> Result<(), Failure> {
        // SAFETY: `conv` is live.
        let status =
            unsafe { (lib.cudnnSetConvolutionMathType)(self.conv.raw, math.cudnn_code() as c_int) };
        check(lib, status, "cudnnSetConvolutionMathType")
    }
}

/// The device addresses of the three operands, in the job's binding order.
fn operands(launch: &ExternalLaunch<'_>) -> [u64; 3] {
    [0, 1, 2].map(|i| launch.ptr(i))
}

/// Enqueues `choice` for `job`, its workspace the fourth binding (a launch without waiting).
pub(crate) fn launch(
    launch: &mut ExternalLaunch<'_>,
    job: &Job,
    choice: Choice,
) -> Result<(), Failure> {
    let lib = lib()?;
    let handle = handle_on(lib, launch)?;
    let desc = Descriptors::of(lib, job)?;
    desc.set_math(lib, choice.math)?;
    let workspace = match choice.workspace {
        0 => 0,
        _ if launch.bindings() > 3 => launch.ptr(3),
        bytes => {
            return Err(Failure::transient(format!(
                "no workspace of {bytes} bytes bound"
            )));
        }
    };
    let algo = choice.algo as c_int;
    launch_algo(
        lib,
        handle,
        &desc,
        job.pass,
        algo,
        operands(launch),
        workspace,
        choice.workspace,
    )
}

/// Runs `job` and waits for the answer: the kept choice if there is one and it runs, else the
/// algorithm a search measures fastest (the first call of a key in the process).
pub(crate) fn wait(
    launch: &mut ExternalLaunch<'_>,
    job: &Job,
    kept: Option<Choice>,
) -> CallOutcome<Choice> {
    let run = |launch: &mut ExternalLaunch<'_>| -> Result<CallOutcome<Choice>, Failure> {
        let lib = lib()?;
        let handle = handle_on(lib, launch)?;
        let desc = Descriptors::of(lib, job)?;
        // A kept choice that fails (a driver or library changed under the same names) is
        // measured again, as a key never seen.
        if let Some(choice) = kept
            && execute(lib, launch, handle, &desc, job, choice).is_ok()
        {
            let (searched, full_scratch) = (false, true);
            return Ok(CallOutcome::Ran {
                choice,
                searched,
                full_scratch,
            });
        }
        let (choice, full_scratch) = search(lib, launch, handle, &desc, job)?;
        execute(lib, launch, handle, &desc, job, choice)?;
        Ok(CallOutcome::Ran {
            choice,
            searched: true,
            full_scratch,
        })
    };
    run(launch).unwrap_or_else(CallOutcome::Failed)
}

/// Enqueues `choice`'s algorithm with its math type and a workspace from the stream's pool.
fn execute(
    lib: &Library,
    launch: &mut ExternalLaunch<'_>,
    handle: Handle,
    desc: &Descriptors,
    job: &Job,
    choice: Choice,
) -> Result<(), Failure> {
    desc.set_math(lib, choice.math)?;
    let workspace = match choice.workspace {
        0 => 0,
        bytes => launch
            .scratch(bytes as u64)
            .map_err(|e| Failure::transient(format!("no workspace of {bytes} bytes: {e:?}")))?,
    };
    let ptrs = operands(launch);
    let algo = choice.algo as c_int;
    let done = launch_algo(
        lib,
        handle,
        desc,
        job.pass,
        algo,
        ptrs,
        workspace,
        choice.workspace,
    );
    launch.release_scratch();
    done
}

/// The algorithm searches this process has run (each waits for the stream and times every
/// algorithm of its pass).
pub(crate) static SEARCHES: AtomicUsize = AtomicUsize::new(0);

/// Measures the algorithms of the job's pass (`cudnnFind*AlgorithmEx`, on the real buffers) and
/// chooses the fastest whose math type the dtype and TF32 setting allow; and whether the search
/// had all the scratch memory it asked for.
fn search(
    lib: &Library,
    launch: &mut ExternalLaunch<'_>,
    handle: Handle,
    desc: &Descriptors,
    job: &Job,
) -> Result<(Choice, bool), Failure> {
    desc.set_math(lib, MathType::for_search(job.data, job.tf32))?;
    let limit = plan::search_workspace(workspace_sizes(lib, handle, desc, job.pass), WORKSPACE_CAP);
    // Near a full memory the search runs without scratch (algorithms that need some are not
    // measured): its choice is used, but not kept for later processes.
    let (scratch, scratch_size, full_scratch) = match launch.scratch(limit as u64) {
        Ok(ptr) => (ptr, limit, true),
        Err(_) => (0, 0, limit == 0),
    };
    // The search times the algorithms with host-side waits; the inputs it reads are ordered
    // before it on this stream, and this makes sure nothing else of the stream is in flight
    // while it measures. Once per key.
    // SAFETY: the stream is cubecl's, alive as long as its server.
    unsafe { cudarc::driver::result::stream::synchronize(launch.stream()) }.map_err(|e| {
        Failure::transient(format!(
            "stream synchronize before the algorithm search: {e:?}"
        ))
    })?;
    SEARCHES.fetch_add(1, Ordering::Relaxed);
    let found = find(
        lib,
        handle,
        desc,
        job.pass,
        operands(launch),
        scratch,
        scratch_size,
    );
    // The scratch goes back to the pool before the chosen algorithm takes its workspace, so
    // that the two are never held at once.
    launch.release_scratch();
    let (algo, math, workspace) = plan::choose(&found?, job.data, job.tf32).ok_or_else(|| {
        Failure::unsupported(format!(
            "no algorithm computes {:?} with the math allowed (TF32 {})",
            job.data,
            if job.tf32 { "on" } else { "off" }
        ))
    })?;
    let math = MathType::for_run(job.data, job.tf32, math);
    Ok((
        Choice {
            algo,
            math,
            workspace,
        },
        full_scratch,
    ))
}

/// The workspace each algorithm of the pass asks for, those cuDNN supports for the job only.
fn workspace_sizes(
    lib: &Library,
    handle: Handle,
    desc: &Descriptors,
    pass: ConvPass,
) -> Vec<usize> {
    let (get, [a, b, c, d]) = match pass {
        ConvPass::Forward => (
            lib.cudnnGetConvolutionForwardWorkspaceSize,
            [desc.x.raw, desc.w.raw, desc.conv.raw, desc.y.raw],
        ),
        ConvPass::BackwardData => (
            lib.cudnnGetConvolutionBackwardDataWorkspaceSize,
            [desc.w.raw, desc.y.raw, desc.conv.raw, desc.x.raw],
        ),
        ConvPass::BackwardFilter => (
            lib.cudnnGetConvolutionBackwardFilterWorkspaceSize,
            [desc.x.raw, desc.y.raw, desc.conv.raw, desc.w.raw],
        ),
    };
    (0..plan::algo_count(pass) as c_int)
        .filter_map(|algo| {
            let mut size = 0usize;
            // SAFETY: `handle` and the descriptors are live, in the pass's argument order;
            // `size` is a valid out-pointer. An algorithm the shape does not take answers with
            // a status, not a size.
            let status = unsafe { get(handle, a, b, c, d, algo, &mut size) };
            (status == 0).then_some(size)
        })
        .collect()
}

/// The successful results of `cudnnFind*AlgorithmEx`, fastest first: `(algorithm, math type,
/// workspace bytes)`.
fn find(
    lib: &Library,
    handle: Handle,
    desc: &Descriptors,
    pass: ConvPass,
    [a, b, out]: [u64; 3],
    scratch: u64,
    scratch_size: usize,
) -> Result<Vec<(u32, MathType, usize)>, Failure> {
    let (find, name, [da, db, dconv, dout]) = match pass {
        ConvPass::Forward => (
            lib.cudnnFindConvolutionForwardAlgorithmEx,
            "cudnnFindConvolutionForwardAlgorithmEx",
            [desc.x.raw, desc.w.raw, desc.conv.raw, desc.y.raw],
        ),
        ConvPass::BackwardData => (
            lib.cudnnFindConvolutionBackwardDataAlgorithmEx,
            "cudnnFindConvolutionBackwardDataAlgorithmEx",
            [desc.w.raw, desc.y.raw, desc.conv.raw, desc.x.raw],
        ),
        ConvPass::BackwardFilter => (
            lib.cudnnFindConvolutionBackwardFilterAlgorithmEx,
            "cudnnFindConvolutionBackwardFilterAlgorithmEx",
            [desc.x.raw, desc.y.raw, desc.conv.raw, desc.w.raw],
        ),
    };
    let mut results = [AlgoPerf::default(); 8];
    let requested = plan::algo_count(pass) as c_int;
    let mut returned: c_int = 0;
    // SAFETY: `handle` and the descriptors are live, in the pass's argument order; `a`, `b` and
    // `out` are device buffers of the descriptors' sizes (bindings resolved by the launch,
    // packed NCHW); the scratch holds `scratch_size` bytes (or is null with 0); `results` has
    // room for the `requested` entries cuDNN may write (at most 8), and only the `returned`
    // first are read. Every field is a plain number, so any value cuDNN writes is valid.
    let status = unsafe {
        find(
            handle,
            da,
            a as *const c_void,
            db,
            b as *const c_void,
            dconv,
            dout,
            out as *mut c_void,
            requested,
            &mut returned,
            results.as_mut_ptr(),
            scratch as *mut c_void,
            scratch_size,
        )
    };
    check(lib, status, name)?;
    let count = plan::algo_count(pass);
    Ok(results[..returned.clamp(0, requested) as usize]
        .iter()
        .filter(|r| r.status == 0 && (r.algo as u32) < count)
        .filter_map(|r| {
            let math = MathType::from_cudnn_code(r.math_type as u32)?;
            Some((r.algo as u32, math, r.memory))
        })
        .collect())
}

/// Enqueues the convolution on the handle's stream: `out = op(a, b)` with alpha 1, beta 0
/// (alpha and beta are f32 for f32 compute, whatever the data type).
#[allow(clippy::too_many_arguments)]
fn launch_algo(
    lib: &Library,
    handle: Handle,
    desc: &Descriptors,
    pass: ConvPass,
    algo: c_int,
    [a, b, out]: [u64; 3],
    workspace: u64,
    workspace_size: usize,
) -> Result<(), Failure> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let alpha = &alpha as *const f32 as *const c_void;
    let beta = &beta as *const f32 as *const c_void;
    let (call, name, [da, db, dout]) = match pass {
        ConvPass::Forward => (
            lib.cudnnConvolutionForward,
            "cudnnConvolutionForward",
            [desc.x.raw, desc.w.raw, desc.y.raw],
        ),
        ConvPass::BackwardData => (
            lib.cudnnConvolutionBackwardData,
            "cudnnConvolutionBackwardData",
            [desc.w.raw, desc.y.raw, desc.x.raw],
        ),
        ConvPass::BackwardFilter => (
            lib.cudnnConvolutionBackwardFilter,
            "cudnnConvolutionBackwardFilter",
            [desc.x.raw, desc.y.raw, desc.w.raw],
        ),
    };
    // SAFETY: as in `find`; `algo` is one cuDNN supports for these descriptors (searched, or
    // kept and checked against cuDNN's count; a wrong one is refused with a status) and the
    // workspace holds the `workspace_size` bytes it asked for. The call only enqueues work on
    // the stream; the buffers stay alive (and unreused) until the stream has passed it.
    let status = unsafe {
        call(
            handle,
            alpha,
            da,
            a as *const c_void,
            db,
            b as *const c_void,
            desc.conv.raw,
            algo,
            workspace as *mut c_void,
            workspace_size,
            beta,
            dout,
            out as *mut c_void,
        )
    };
    check(lib, status, name)
}
