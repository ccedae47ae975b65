//! kiln: work that is not a cubecl kernel (cuDNN) launched on cubecl's own CUDA stream.
//!
//! [`launch_external`] runs a closure on the device's CUDA server thread, with the `CUstream`
//! that cubecl uses for the caller's [`StreamId`] and the device pointers of the given bindings.
//! The bindings are resolved exactly as a kernel launch resolves its buffers
//! (`CudaServer::command`): where one was written on another stream, this stream first waits on
//! that stream's event, and the memory is kept from reuse until this stream has passed the work
//! the closure enqueued. Whatever the closure enqueues on the stream is therefore ordered after
//! the writes of its inputs and before every later kernel of the stream, with no host sync.
//! See `KILN.md`.

use super::{command::Command, server::CudaServer, storage::gpu::GpuResource};
use crate::CudaDevice;
use cubecl_common::{backtrace::BackTrace, device::Device, stream_id::StreamId};
use cubecl_core::server::{Binding, Handle, ServerError};
use cubecl_common::device_handle::DeviceHandle;
use cudarc::driver::sys::{CUdeviceptr, CUstream};

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

    /// `bytes` of device memory from this stream's pool, for work enqueued on [`Self::stream`]
    /// only. It goes back to the pool when the closure returns: reuse is ordered after that
    /// work because the pool belongs to this stream alone.
    pub fn scratch(&mut self, bytes: u64) -> Result<CUdeviceptr, ServerError> {
        let handle = self.command.empty(bytes.max(1))?;
        let resource = self.command.resource(handle.clone().binding())?;
        self.scratch.push(handle);
        Ok(resource.ptr)
    }
}

/// Runs `task` on `device`'s CUDA server thread, with the stream of the caller's
/// [`StreamId::current`] and the device pointers of `bindings` (see the module's
/// documentation). Blocks until `task` returns (not until the GPU work it enqueued is done).
///
/// `task` must not call back into cubecl's client for this device (it runs on the server
/// thread) and must not panic: a panic is caught by the server thread and reported here as an
/// error.
pub fn launch_external<R, F>(
    device: &CudaDevice,
    bindings: Vec<Binding>,
    task: F,
) -> Result<R, ServerError>
where
    R: Send,
    F: FnOnce(&mut ExternalLaunch<'_>) -> R + Send,
{
    let stream_id = StreamId::current();
    DeviceHandle::<CudaServer>::new(device.to_id())
        .submit_blocking(move |server| server.launch_external(stream_id, bindings, task))
        .map_err(|_| ServerError::Generic {
            reason: "the external launch failed on the CUDA server thread (it panicked)".into(),
            backtrace: BackTrace::capture(),
        })?
}
