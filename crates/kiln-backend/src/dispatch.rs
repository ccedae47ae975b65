//! Calling generic kiln code on a concrete backend. This is the only `match` over backends.

use burn::tensor::backend::AutodiffBackend;

use crate::{Backend, BackendError, DeviceInfo, Resolved};

/// A piece of generic work, run on whichever backend the user chose. A trait rather than a
/// closure because the method is generic over the backend.
pub trait BackendTask {
    type Output;

    /// Runs on `devices` (at least one), all of backend `B`.
    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output;
}

/// Runs `task` on the resolved backend and devices, with f32 tensors.
pub fn run_on<T: BackendTask>(resolved: &Resolved, task: T) -> Result<T::Output, BackendError> {
    use burn::backend::Autodiff;
    let devices = &resolved.devices;
    match resolved.backend {
        #[cfg(feature = "cuda")]
        Backend::Cuda => Ok(task.run::<Autodiff<burn::backend::Cuda>>(map(devices, cuda_device))),
        #[cfg(feature = "wgpu")]
        Backend::Wgpu | Backend::Vulkan | Backend::Metal => {
            let devices = map(devices, wgpu_device);
            init_graphics_api(resolved.backend, &devices);
            Ok(task.run::<Autodiff<burn::backend::Wgpu>>(devices))
        }
        #[cfg(feature = "flex")]
        Backend::Flex => {
            Ok(task.run::<Autodiff<burn::backend::Flex>>(map(devices, |_| Default::default())))
        }
        #[cfg(feature = "ndarray")]
        Backend::NdArray => {
            Ok(task.run::<Autodiff<burn::backend::NdArray>>(map(devices, |_| Default::default())))
        }
        #[allow(unreachable_patterns)]
        backend => Err(BackendError::NotCompiled { backend }),
    }
}

fn map<D>(devices: &[DeviceInfo], f: impl Fn(&DeviceInfo) -> D) -> Vec<D> {
    devices.iter().map(f).collect()
}

#[cfg(feature = "cuda")]
pub(crate) fn cuda_device(info: &DeviceInfo) -> burn::backend::cuda::CudaDevice {
    burn::backend::cuda::CudaDevice::new(info.ordinal)
}

#[cfg(feature = "wgpu")]
pub(crate) fn wgpu_device(info: &DeviceInfo) -> burn::backend::wgpu::WgpuDevice {
    use crate::DeviceKind;
    use burn::backend::wgpu::WgpuDevice;
    match info.kind {
        DeviceKind::Discrete => WgpuDevice::DiscreteGpu(info.ordinal),
        DeviceKind::Integrated => WgpuDevice::IntegratedGpu(info.ordinal),
        DeviceKind::Virtual => WgpuDevice::VirtualGpu(info.ordinal),
        DeviceKind::Software | DeviceKind::Cpu | DeviceKind::Other => WgpuDevice::Cpu,
    }
}

/// `vulkan` and `metal` pin the graphics API before burn first touches the device; `wgpu`
/// leaves burn's choice (Metal on macOS, Vulkan elsewhere). Once per device and process: cubecl
/// panics on a second setup of a device ("Service already initialized"), which `kiln compare`
/// with `--trajectories` would ask for, running on each backend twice.
#[cfg(feature = "wgpu")]
fn init_graphics_api(backend: Backend, devices: &[burn::backend::wgpu::WgpuDevice]) {
    use burn::backend::wgpu::{RuntimeOptions, graphics, init_setup};
    static DONE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    for device in devices {
        let key = format!("{device:?}");
        if done.contains(&key) {
            continue;
        }
        done.push(key);
        match backend {
            Backend::Vulkan => {
                init_setup::<graphics::Vulkan>(device, RuntimeOptions::default());
            }
            Backend::Metal => {
                init_setup::<graphics::Metal>(device, RuntimeOptions::default());
            }
            _ => {}
        }
    }
}
