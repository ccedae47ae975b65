//! The one place in kiln that names concrete burn backends.
//!
//! Everything else in kiln is generic over burn's `Backend`. This crate answers three questions:
//! what is compiled in and present ([`probe`]), which backend and devices a user's request means
//! ([`resolve`]), and how to call generic code on them ([`run_on`]). Adding a backend means adding
//! a variant to [`Backend`], a probe, and one line in [`run_on`].

use std::path::PathBuf;

mod backend;
mod choice;
pub mod cuda_setup;
pub mod cudnn_setup;
mod dispatch;
mod error;
pub mod kernel_cache;
mod memory;
mod probe;

pub use backend::Backend;
pub use choice::{BackendChoice, DeviceSelection};
pub use dispatch::{BackendTask, run_on};
pub use error::BackendError;
pub use kernel_cache::KernelCache;
pub use memory::MemoryMeter;
pub use probe::{
    BackendReport, DeviceInfo, DeviceKind, Probe, human_names, notices, probe,
    quiet_headless_vulkan,
};

/// A backend and the devices on it that a run will use.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub backend: Backend,
    pub devices: Vec<DeviceInfo>,
}

impl Resolved {
    /// The run's devices as people know them ("NVIDIA H200", "CPU: AMD EPYC 9R14, 2 threads").
    pub fn human_name(&self) -> String {
        human_names(&self.devices)
    }
}

/// Turns a user's request into concrete devices, or one clear error saying what is missing.
pub fn resolve(
    choice: BackendChoice,
    selection: &DeviceSelection,
    probe: &Probe,
) -> Result<Resolved, BackendError> {
    let (backend, candidates) = match choice {
        // `auto` never lands on a software adapter; asked for explicitly, one is fine.
        BackendChoice::Auto => (probe.auto_choice(), probe.auto_devices()),
        BackendChoice::Explicit(backend) => {
            (backend, probe.report(backend).devices()?.iter().collect())
        }
    };
    let devices = selection.pick(backend, &candidates)?;
    if backend == Backend::Cuda && devices.len() > 1 {
        probe::check_nccl()?;
    }
    Ok(Resolved {
        backend,
        devices: devices.into_iter().cloned().collect(),
    })
}

/// Points cubecl's kernel and autotune caches at `folder` for this process alone (the first
/// call in a process decides). `kiln compare` checks arithmetic with kernels tuned for its own
/// shapes only: autotune results cached by other runs have been seen to pick a kernel that is
/// wrong for a shape of the same tuning key (docs/checking.md, "Checking the backends agree").
pub fn configure_private_kernel_cache(folder: PathBuf) -> KernelCache {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    return kernel_cache::configure(folder);
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    KernelCache::Kiln(folder)
}

/// Points cubecl's kernel and autotune caches at kiln's cache folder for the resolved GPU
/// backend and device (see [`kernel_cache`]). Call it before the run touches the device.
pub fn configure_kernel_cache(resolved: &Resolved) -> KernelCache {
    if !resolved.backend.compiles_kernels() {
        return KernelCache::None;
    }
    let device = resolved
        .devices
        .first()
        .map_or("device", |d| d.name.as_str());
    let folder = kiln_download::kernel_folder(
        &kiln_download::cache_root(),
        resolved.backend.name(),
        device,
    );
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    return kernel_cache::configure(folder);
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    KernelCache::Kiln(folder)
}
