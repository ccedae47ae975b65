//! The backends kiln knows by name, and what this build has of them.

use std::fmt;

/// A concrete backend kiln can run on. `Vulkan` and `Metal` are burn's wgpu backend pinned to
/// that graphics API; `Wgpu` lets wgpu pick the platform's native API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Cuda,
    Wgpu,
    Vulkan,
    Metal,
    Flex,
    NdArray,
}

impl Backend {
    /// Every backend, in the order `auto` prefers them.
    pub const ALL: [Backend; 6] = [
        Backend::Cuda,
        Backend::Wgpu,
        Backend::Vulkan,
        Backend::Metal,
        Backend::Flex,
        Backend::NdArray,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Wgpu => "wgpu",
            Backend::Vulkan => "vulkan",
            Backend::Metal => "metal",
            Backend::Flex => "flex",
            Backend::NdArray => "ndarray",
        }
    }

    /// The Cargo feature of the `kiln` package that compiles this backend in.
    pub fn feature(self) -> &'static str {
        match self {
            Backend::Vulkan | Backend::Metal => "wgpu",
            other => other.name(),
        }
    }

    /// Whether this build of kiln contains the backend.
    pub fn is_compiled(self) -> bool {
        match self {
            Backend::Cuda => cfg!(feature = "cuda"),
            Backend::Wgpu | Backend::Vulkan | Backend::Metal => cfg!(feature = "wgpu"),
            Backend::Flex => cfg!(feature = "flex"),
            Backend::NdArray => cfg!(feature = "ndarray"),
        }
    }

    /// Whether kernels are compiled (and tuned) on the device's first use: cubecl's GPU
    /// backends, whose first step takes longer.
    pub fn compiles_kernels(self) -> bool {
        matches!(
            self,
            Backend::Cuda | Backend::Wgpu | Backend::Vulkan | Backend::Metal
        )
    }

    /// CPU backends have exactly one device and need no driver.
    pub fn is_cpu(self) -> bool {
        matches!(self, Backend::Flex | Backend::NdArray)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
