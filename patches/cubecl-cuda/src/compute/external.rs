//! kiln: work that is not a cubecl kernel (cuDNN, cuBLAS) launched on cubecl's own CUDA stream.
//!
//! [`launch_external`] and [`launch_external_async`] run a closure on the device's CUDA server
//! thread, with the `CUstream` that cubecl uses for the caller's [`StreamId`] and the device
//! pointers of the given bindings. The bindings are resolved exactly as a kernel launch resolves
//! its buffers (`CudaServer::command`): where one was written on another stream, this stream
//! first waits on that stream's event, and the memory is kept from reuse until this stream has
//! passed the work the closure enqueued. Whatever the closure enqueues on the stream is
//! therefore ordered after the writes of its inputs and before every later kernel of the stream,
//! with no host sync.
//!
//! [`launch_external_async`] is queued as [`ComputeClient::launch`] queues a kernel: the caller
//! does not wait for the server thread, and a failure is recorded on the stream, where the next
//! sync or read reports it, as a failed kernel launch is. Both are profiled as kernels are when
//! cubecl's profiling is on (`CUBECL_DEBUG_OPTION=profile`), under the name given. See
//! `KILN.md`.

use super::{command::Command, server::CudaServer, storage::gpu::GpuResource};
use crate::{CudaDevice, CudaRuntime};
use cubecl_common::config::RuntimeConfig;
use cubecl_common::device_handle::DeviceHandle;
use cubecl_common::{backtrace::BackTrace, device::Device, stream_id::StreamId};
use cubecl_core::server::{Binding, Handle, ServerError};
use cubecl_runtime::client::ComputeClient;
use cubecl_runtime::config::{CubeClRuntimeConfig, profiling::ProfilingLogLevel};
use cudarc::driver::sys::{CUdeviceptr, CUstream};
use std::sync::OnceLock;

/// What a closure given to [`launch_external`] may use, valid only while it runs.
pub struct ExternalLaunch<'a> {
    command: Command<'a>,
    stream: CUstream,
    resources: Vec<GpuResource>,
    scratch: Vec<Handle>,
}

impl<'a> ExternalLaunch<'a> {
    pub(crate) fn new(command: Command<'a>, resources: Vec<GpuResource>) -> Self {
        let mut command = command;
        let stream = command.streams.current().sys;
        Self {
            command,
            stream,
            resources,
            scratch: Vec::new(),
        }
    }

    /// The stream cubecl launches the caller's kernels on. Work enqueued on it runs in order
    /// with them.
    pub fn stream(&self) -> CUstream {
        self.stream
    }

    /// The device address of the `index`th binding given to [`launch_external`], its offset
    /// included.
    pub fn ptr(&self, index: usize) -> CUdeviceptr {
        self.resources[index].ptr
    }

    /// The size in bytes of the `index`th binding given to [`launch_external`].
    pub fn size(&self, index: usize) -> u64 {
        self.resources[index].size
    }

    /// The number of bindings given.
    pub fn bindings(&self) -> usize {
        self.resources.len()
    }

    /// `bytes` of device memory from this stream's pool, for work enqueued on [`Self::stream`]
    /// only. It goes back to the pool at [`Self::release_scratch`] or when the closure returns:
    /// reuse is ordered after that work because the pool belongs to this stream alone.
    pub fn scratch(&mut self, bytes: u64) -> Result<CUdeviceptr, ServerError> {
        let handle = self.command.empty(bytes.max(1))?;
        let resource = self.command.resource(handle.clone().binding())?;
        self.scratch.push(handle);
        Ok(resource.ptr)
    }

    /// Gives every scratch buffer back to the stream's pool, so that the next [`Self::scratch`]
    /// (or a later kernel of this stream) can use its memory; work already enqueued that reads
    /// it runs first, as the stream is in order.
    pub fn release_scratch(&mut self) {
        self.scratch.clear();
    }
}

/// Runs `task` on `client`'s device's CUDA server thread, with the stream of the caller's
/// [`StreamId::current`] and the device pointers of `bindings` (see the module's
/// documentation), and waits until `task` returns (not until the GPU work it enqueued is done).
///
/// `task` must not call back into cubecl's client for this device (it runs on the server
/// thread) and must not panic: a panic is caught by the server thread and reported here as an
/// error.
pub fn launch_external<R, F>(
    client: &ComputeClient<CudaRuntime>,
    device: &CudaDevice,
    name: &str,
    bindings: Vec<Binding>,
    task: F,
) -> Result<R, ServerError>
where
    R: Send + 'static,
    F: FnOnce(&mut ExternalLaunch<'_>) -> R + Send,
{
    let stream_id = StreamId::current();
    let handle = DeviceHandle::<CudaServer>::new(device.to_id());
    let run = {
        let handle = handle.clone();
        move || {
            handle
                .submit_blocking(move |server| server.launch_external(stream_id, bindings, task))
                .unwrap_or_else(|_| {
                    Err(ServerError::Generic {
                        reason: "the external launch panicked on the CUDA server thread".into(),
                        backtrace: BackTrace::capture(),
                    })
                })
        }
    };
    match profiling() {
        ProfilingLogLevel::Disabled => run(),
        ProfilingLogLevel::Minimal => {
            let result = run();
            let name = name.to_string();
            handle.submit(move |server| server.utilities().logger.register_execution(name));
            result
        }
        _ => profiled(client, &handle, name, run),
    }
}

/// Queues `task` on `client`'s device's CUDA server thread as [`launch_external`] runs it, and
/// returns at once. Where `task` returns `Err` (or its bindings cannot be resolved), the error
/// is recorded on the stream: the next sync or read of the stream reports it, as it reports a
/// kernel that failed to launch.
pub fn launch_external_async<F>(
    client: &ComputeClient<CudaRuntime>,
    device: &CudaDevice,
    name: &str,
    bindings: Vec<Binding>,
    task: F,
) where
    F: FnOnce(&mut ExternalLaunch<'_>) -> Result<(), String> + Send + 'static,
{
    let stream_id = StreamId::current();
    let handle = DeviceHandle::<CudaServer>::new(device.to_id());
    let run_and_record = move |server: &mut CudaServer| {
        let error = match server.launch_external(stream_id, bindings, task) {
            Ok(Ok(())) => return,
            Ok(Err(reason)) => ServerError::Generic {
                reason,
                backtrace: BackTrace::capture(),
            },
            Err(error) => error,
        };
        server.record_error(stream_id, error);
    };
    match profiling() {
        ProfilingLogLevel::Disabled => handle.submit(run_and_record),
        ProfilingLogLevel::Minimal => {
            let name = name.to_string();
            handle.submit(move |server| {
                run_and_record(server);
                server.utilities().logger.register_execution(name);
            });
        }
        _ => {
            let task_handle = handle.clone();
            let run = move || {
                task_handle
                    .submit_blocking(run_and_record)
                    .map_err(|_| ServerError::Generic {
                        reason: "the external launch panicked on the CUDA server thread".into(),
                        backtrace: BackTrace::capture(),
                    })
            };
            if let Err(error) = profiled(client, &handle, name, run) {
                handle.submit(move |server| server.record_error(stream_id, error));
            }
        }
    }
}

/// cubecl's profiling level, read once as cubecl's server logger reads it.
fn profiling() -> ProfilingLogLevel {
    static LEVEL: OnceLock<ProfilingLogLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| CubeClRuntimeConfig::get().profiling.logger.level)
}

/// `run` timed on the device as cubecl times a kernel (`ComputeClient::profile`), the time
/// logged under `name` with the kernels'.
fn profiled<R: Send + 'static>(
    client: &ComputeClient<CudaRuntime>,
    handle: &DeviceHandle<CudaServer>,
    name: &str,
    run: impl FnOnce() -> Result<R, ServerError> + Send,
) -> Result<R, ServerError> {
    let (result, duration) = client
        .profile(run, name)
        .map_err(|error| ServerError::Generic {
            reason: format!("profiling {name}: {error:?}"),
            backtrace: BackTrace::capture(),
        })?;
    let name = name.to_string();
    handle.submit(move |server| server.utilities().logger.register_profiled(name, duration));
    result
}
