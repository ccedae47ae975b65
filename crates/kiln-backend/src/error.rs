use crate::backend::Backend;

/// Why a backend or device cannot be used. Each message names what is missing and the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    #[error("unknown backend `{0}`: choose one of auto, cuda, wgpu, vulkan, metal, flex, ndarray")]
    UnknownBackend(String),

    #[error("`{0}` is not a device list: give one index (0), a list (0,1,3) or `all`")]
    BadDeviceList(String),

    #[error(
        "the {backend} backend is not compiled into this kiln: rebuild with `cargo build --release --features {feature}`, or run with --backend flex",
        feature = backend.feature()
    )]
    NotCompiled { backend: Backend },

    #[error("the {backend} backend needs {library}, which this machine does not have: {fix}")]
    DriverMissing {
        backend: Backend,
        library: &'static str,
        fix: &'static str,
    },

    #[error("the cuda backend needs {what}: {fix}")]
    CudaSetup { what: String, fix: String },

    #[error(
        "the {backend} driver failed to start ({reason}): check the driver installation, or run with --backend flex"
    )]
    DriverFailed { backend: Backend, reason: String },

    #[error("the {backend} backend found no usable device{hint}", hint = no_device_hint(*backend))]
    NoDevice { backend: Backend },

    #[error("there is no {backend} device {index}: this machine has {count} (see `kiln devices`)")]
    NoSuchDevice {
        backend: Backend,
        index: usize,
        count: usize,
    },
}

fn no_device_hint(backend: Backend) -> &'static str {
    match backend {
        Backend::Cuda => {
            ": no NVIDIA GPU is visible (check `nvidia-smi` and CUDA_VISIBLE_DEVICES), or run with --backend wgpu or --backend flex"
        }
        Backend::Metal => {
            ": Metal needs an Apple GPU on macOS; run with --backend wgpu or --backend flex"
        }
        Backend::Wgpu | Backend::Vulkan => {
            ": install a Vulkan driver for your GPU (on Linux without a GPU, Debian's mesa-vulkan-drivers gives a software one), or run with --backend flex"
        }
        Backend::Flex | Backend::NdArray => "",
    }
}
