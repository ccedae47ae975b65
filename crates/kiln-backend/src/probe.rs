//! Finding out what is compiled in and what hardware is present, without constructing a burn
//! device: burn 0.21 panics on first use of a CUDA device without libcuda, and of a wgpu device
//! without an adapter.

use std::cell::OnceCell;
use std::fmt;

use crate::backend::Backend;
use crate::error::BackendError;

/// What kind of device this is. `auto` never picks a `Software` adapter (llvmpipe, lavapipe,
/// SwiftShader): it is far slower than the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceKind {
    Discrete,
    Integrated,
    Virtual,
    Software,
    Cpu,
    Other,
}

impl DeviceKind {
    pub fn is_hardware_gpu(self) -> bool {
        matches!(
            self,
            DeviceKind::Discrete | DeviceKind::Integrated | DeviceKind::Virtual
        )
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Discrete => "discrete",
            DeviceKind::Integrated => "integrated",
            DeviceKind::Virtual => "virtual",
            DeviceKind::Software => "software",
            DeviceKind::Cpu => "cpu",
            DeviceKind::Other => "other",
        })
    }
}

/// One device that a backend can run on.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub backend: Backend,
    /// The index `--devices` uses for this device on this backend.
    pub index: usize,
    pub name: String,
    pub kind: DeviceKind,
    pub memory_bytes: Option<u64>,
    /// Driver or graphics API details, for display.
    pub detail: String,
    /// The device's ordinal among devices of its kind, as burn numbers them.
    pub(crate) ordinal: usize,
}

impl DeviceInfo {
    /// The device as its user knows it, for a run's report and console (not burn's type
    /// names): the processor for the CPU ("CPU: AMD EPYC 9R14, 2 threads"), the adapter's name
    /// for a GPU ("NVIDIA H200"), and a software adapter marked as one ("llvmpipe (software
    /// Vulkan)"), since it is far slower than either.
    pub fn human_name(&self) -> String {
        match self.kind {
            DeviceKind::Cpu => cpu_name(cpu_model(), cpu_threads()),
            DeviceKind::Software => {
                // Mesa's names carry the LLVM version: "llvmpipe (LLVM 15.0.7, 256 bits)".
                let name = self.name.split(" (").next().unwrap_or(&self.name);
                format!("{name} (software {})", graphics_api(self.backend))
            }
            _ => self.name.clone(),
        }
    }
}

/// Several devices as people name them: "NVIDIA H200", "2 × NVIDIA H200", or each one's name
/// where they differ.
pub fn human_names(devices: &[DeviceInfo]) -> String {
    let names: Vec<String> = devices.iter().map(DeviceInfo::human_name).collect();
    match names.as_slice() {
        [] => "no device".to_string(),
        [one] => one.clone(),
        [first, rest @ ..] if rest.iter().all(|n| n == first) => {
            format!("{} × {first}", names.len())
        }
        _ => names.join(", "),
    }
}

fn cpu_name(model: Option<String>, threads: usize) -> String {
    let threads = match threads {
        1 => "1 thread".to_string(),
        n => format!("{n} threads"),
    };
    match model {
        Some(model) => format!("CPU: {model}, {threads}"),
        None => format!("CPU, {threads}"),
    }
}

/// The graphics API a wgpu-based backend drives (burn's `Wgpu` takes Metal on macOS, Vulkan
/// elsewhere).
fn graphics_api(backend: Backend) -> &'static str {
    match backend {
        Backend::Metal => "Metal",
        Backend::Wgpu if cfg!(target_os = "macos") => "Metal",
        Backend::Wgpu | Backend::Vulkan => "Vulkan",
        other => other.name(),
    }
}

/// One backend's entry in a probe: its devices, or why there are none.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendReport {
    pub backend: Backend,
    pub status: Result<Vec<DeviceInfo>, BackendError>,
}

impl BackendReport {
    pub fn devices(&self) -> Result<&[DeviceInfo], BackendError> {
        match &self.status {
            Ok(devices) if devices.is_empty() => Err(BackendError::NoDevice {
                backend: self.backend,
            }),
            Ok(devices) => Ok(devices),
            Err(e) => Err(e.clone()),
        }
    }
}

/// Every backend kiln knows, compiled in or not. Each backend is probed on first use, so that
/// asking about the CPU backend never loads a GPU driver.
#[derive(Debug, Default)]
pub struct Probe {
    reports: [OnceCell<BackendReport>; Backend::ALL.len()],
    wgpu_adapters: OnceCell<Vec<wgpu_probe::Adapter>>,
}

impl Probe {
    pub fn report(&self, backend: Backend) -> &BackendReport {
        let slot = Backend::ALL
            .iter()
            .position(|b| *b == backend)
            .unwrap_or_default();
        self.reports[slot].get_or_init(|| BackendReport {
            backend,
            status: self.probe_backend(backend),
        })
    }

    /// Every backend's report, probing those not yet probed.
    pub fn reports(&self) -> impl Iterator<Item = &BackendReport> {
        Backend::ALL.into_iter().map(|backend| self.report(backend))
    }

    fn probe_backend(&self, backend: Backend) -> Result<Vec<DeviceInfo>, BackendError> {
        if !backend.is_compiled() {
            return Err(BackendError::NotCompiled { backend });
        }
        match backend {
            Backend::Cuda => cuda_probe::devices(),
            Backend::Wgpu | Backend::Vulkan | Backend::Metal => {
                let adapters = self.wgpu_adapters.get_or_init(wgpu_probe::adapters);
                wgpu_probe::devices_for(backend, adapters)
            }
            Backend::Flex | Backend::NdArray => Ok(vec![cpu_device(backend)]),
        }
    }

    /// What `--backend auto` means on this machine: CUDA with a device, else a hardware wgpu
    /// adapter, else the CPU backend.
    pub fn auto_choice(&self) -> Backend {
        let has_device = |backend: Backend, accept: fn(DeviceKind) -> bool| {
            self.report(backend)
                .devices()
                .is_ok_and(|devices| devices.iter().any(|d| accept(d.kind)))
        };
        if has_device(Backend::Cuda, |_| true) {
            Backend::Cuda
        } else if has_device(Backend::Wgpu, DeviceKind::is_hardware_gpu) {
            Backend::Wgpu
        } else if Backend::Flex.is_compiled() || !Backend::NdArray.is_compiled() {
            Backend::Flex
        } else {
            Backend::NdArray
        }
    }

    /// The devices `auto` may use on its backend: never a software adapter.
    pub fn auto_devices(&self) -> Vec<&DeviceInfo> {
        let backend = self.auto_choice();
        self.report(backend)
            .devices()
            .map(|devices| {
                devices
                    .iter()
                    .filter(|d| backend != Backend::Wgpu || d.kind.is_hardware_gpu())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Whether several CUDA devices can exchange tensors (NCCL is there).
pub fn check_nccl() -> Result<(), BackendError> {
    cuda_probe::check_nccl()
}

/// What a run on `backend` should say before it starts: on CUDA without cuDNN, that its
/// convolutions run slower and how to install it.
pub fn notices(backend: Backend) -> Vec<String> {
    match backend {
        Backend::Cuda => cuda_probe::cudnn().err().into_iter().collect(),
        _ => Vec::new(),
    }
}

/// Keeps Mesa's Vulkan device-selection layer quiet on a machine without a display session.
///
/// The layer, loaded into every Vulkan instance, asks Wayland for the default GPU; without
/// `XDG_RUNTIME_DIR` libwayland prints "error: XDG_RUNTIME_DIR is invalid or not set" on each
/// instance, two lines before training starts on a headless machine. kiln orders devices
/// itself, so there the layer is switched off through its own `NODEVICE_SELECT`, unless the user
/// steers it (`MESA_VK_DEVICE_SELECT`, `DRI_PRIME`) or has set `NODEVICE_SELECT` already.
///
/// # Safety
/// It sets an environment variable: call it before any other thread starts.
pub unsafe fn quiet_headless_vulkan() {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let runtime_dir =
        std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|dir| std::path::Path::new(&dir).is_dir());
    if runtime_dir
        || ["NODEVICE_SELECT", "MESA_VK_DEVICE_SELECT", "DRI_PRIME"]
            .iter()
            .any(|v| set(v))
    {
        return;
    }
    // SAFETY: the caller guarantees no other thread runs yet.
    unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
}

/// A probe of this machine. Never panics and never constructs a burn device.
pub fn probe() -> Probe {
    // Before any backend is probed: wgpu's probe starts driver threads that read the
    // environment, which setting it must not race.
    cuda_probe::set_driver_cache();
    Probe::default()
}

/// The processor's name as Linux gives it (`/proc/cpuinfo`), so that every CPU figure says which
/// CPU it is: kiln's speed against PyTorch's differs between AMD and Intel parts.
fn cpu_model() -> Option<String> {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .filter(|name| !name.is_empty())
}

fn cpu_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn cpu_device(backend: Backend) -> DeviceInfo {
    let threads = cpu_threads();
    DeviceInfo {
        backend,
        index: 0,
        name: match cpu_model() {
            Some(model) => format!("CPU ({model}, {threads} threads)"),
            None => format!("CPU ({threads} threads)"),
        },
        kind: DeviceKind::Cpu,
        memory_bytes: None,
        detail: std::env::consts::ARCH.to_string(),
        ordinal: 0,
    }
}

#[cfg(feature = "cuda")]
mod cuda_probe {
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;

    use cudarc::driver::result;

    use super::{DeviceInfo, DeviceKind};
    use crate::cuda_setup::{self, Search};
    use crate::{Backend, BackendError, cudnn_setup, kernel_cache};

    /// The driver, NVRTC and headers, found and set up once per process.
    static SETUP: OnceLock<Result<String, BackendError>> = OnceLock::new();
    /// cuDNN's version and place, or the line that says it is missing; found once per process.
    static CUDNN: OnceLock<Result<String, String>> = OnceLock::new();

    pub fn devices() -> Result<Vec<DeviceInfo>, BackendError> {
        let backend = Backend::Cuda;
        set_driver_cache();
        // SAFETY: only tries to dlopen the library, as cudarc itself does on first use.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(BackendError::DriverMissing {
                backend,
                library: "libcuda (the NVIDIA driver)",
                fix: "install the NVIDIA driver, or run with --backend wgpu or --backend flex",
            });
        }
        let failed = |e: result::DriverError| BackendError::DriverFailed {
            backend,
            reason: e.to_string(),
        };
        result::init().map_err(failed)?;
        let compiler = SETUP.get_or_init(set_up_compiler).clone()?;
        let cudnn = match cudnn() {
            Ok(found) => found,
            Err(missing) => missing,
        };
        let runtime = format!("{compiler}; {cudnn}");
        let count = result::device::get_count().map_err(failed)?;
        (0..count)
            .map(|ordinal| {
                let device = result::device::get(ordinal).map_err(failed)?;
                let name = result::device::get_name(device).map_err(failed)?;
                // SAFETY: `device` is a valid handle returned by the driver above.
                let memory = unsafe { result::device::total_mem(device) }.map_err(failed)?;
                Ok(DeviceInfo {
                    backend,
                    index: ordinal as usize,
                    name,
                    kind: DeviceKind::Discrete,
                    memory_bytes: Some(memory as u64),
                    detail: runtime.clone(),
                    ordinal: ordinal as usize,
                })
            })
            .collect()
    }

    /// The CUDA version the driver supports, as `major * 1000 + minor * 10`.
    fn driver_version() -> Option<i32> {
        let mut version = 0;
        // SAFETY: writes one int; the driver library is loaded (checked by the caller).
        let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
        (status == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some(version)
    }

    fn nvrtc_version() -> Option<(i32, i32)> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints; NVRTC is loaded (checked by the caller).
        let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        (status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
    }

    /// Finds the headers and NVRTC that cubecl compiles kernels with, makes them the ones it
    /// uses, and describes them; or says in one line what is missing and how to install it.
    fn set_up_compiler() -> Result<String, BackendError> {
        let driver = driver_version();
        let install = cuda_setup::install_command(driver);
        let missing = |what: &str| BackendError::CudaSetup {
            what: what.to_string(),
            fix: format!(
                "install them with `{install}` (or a CUDA toolkit, and set CUDA_PATH), or run with --backend wgpu or --backend flex"
            ),
        };
        let search = Search::of_this_machine(&kiln_download::cache_root());
        let headers = cuda_setup::find(&search).map_err(|looked| {
            missing(&format!(
                "CUDA's headers (cuda_runtime.h, which every kernel is compiled against), and none are in {}",
                looked.join(", ")
            ))
        })?;
        if let Some(nvrtc) = &headers.nvrtc {
            // NVRTC is opened by name (by cudarc, and NVRTC opens its builtins by name): opening
            // these files first makes those names resolve to them.
            for library in cuda_setup::nvrtc_builtins(nvrtc).iter().chain([nvrtc]) {
                let _ = preload(library);
            }
        }
        // SAFETY: only tries to dlopen the library, as cudarc itself does on first use.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(missing(
                "libnvrtc (CUDA's runtime compiler), which is neither beside the headers nor on the library path",
            ));
        }
        let nvrtc = nvrtc_version();
        if let (Some((major, minor)), Some(driver)) = (nvrtc, driver)
            && major * 1000 + minor * 10 > driver
        {
            return Err(BackendError::CudaSetup {
                what: format!(
                    "an NVRTC no newer than the driver (NVRTC {major}.{minor}, driver's CUDA {})",
                    version(driver)
                ),
                fix: format!(
                    "update the NVIDIA driver, or install an older NVRTC (`{install}` with a version up to the driver's)"
                ),
            });
        }
        // SAFETY: this runs once, from the probe, before any CUDA device is created, so no
        // cubecl thread reads the environment yet; kiln's own threads never read it.
        unsafe { std::env::set_var("CUDA_PATH", &headers.cuda_path) };
        Ok(format!(
            "driver CUDA {}, NVRTC {} ({}), headers {} (from {})",
            driver.map_or("?".into(), version),
            nvrtc.map_or("?".into(), |(a, b)| format!("{a}.{b}")),
            headers
                .nvrtc
                .as_deref()
                .map_or("on the library path".into(), |p| p.display().to_string()),
            headers.cuda_path.join("include").display(),
            headers.origin
        ))
    }

    /// The NVIDIA driver's compiled-kernel cache at its largest in kiln's cache folder (unless
    /// the user set it), before the driver starts and reads it.
    pub fn set_driver_cache() {
        static DONE: OnceLock<()> = OnceLock::new();
        DONE.get_or_init(|| {
            let get = |key: &str| std::env::var_os(key);
            for (key, value) in
                kernel_cache::driver_cache_settings(get, &kiln_download::cache_root())
            {
                if key == "CUDA_CACHE_PATH" {
                    let _ = std::fs::create_dir_all(&value);
                }
                // SAFETY: `probe()` calls this first, before any backend is probed and so
                // before any driver or cubecl thread exists to read the environment; kiln's own
                // threads never read it.
                unsafe { std::env::set_var(key, value) };
            }
        });
    }

    /// cuDNN found, opened and described (`Ok`), or the line saying it is missing (`Err`).
    /// Opening it here, by path, is what lets cudarc's later open by name find a pip wheel's.
    pub fn cudnn() -> Result<String, String> {
        CUDNN.get_or_init(find_cudnn).clone()
    }

    fn find_cudnn() -> Result<String, String> {
        let search = Search::of_this_machine(&kiln_download::cache_root());
        let files = cudnn_setup::find(
            &cudnn_setup::library_path(),
            &search.toolkits,
            &search.site_packages,
        );
        if let Some(files) = &files {
            preload_in_any_order(&files.companions);
            preload(&files.library);
        }
        let version = cudnn_setup::version_name(cudnn_version()?);
        Ok(match files {
            Some(files) => format!(
                "cuDNN {version} ({}, from {})",
                files.library.display(),
                files.origin
            ),
            None => format!("cuDNN {version} (on the library path)"),
        })
    }

    /// The version of the cuDNN that kiln-kernels opens (by cuDNN 9's name, `libcudnn.so.9`,
    /// which finds the file preloaded above first), or the line saying what is missing or wrong.
    fn cudnn_version() -> Result<usize, String> {
        // SAFETY: cuDNN runs no initialisers with requirements on the caller.
        let library = unsafe { libloading::Library::new(cudnn_setup::SONAME) }
            .map_err(|_| cudnn_setup::missing_line(driver_version()))?;
        // SAFETY: `cudnnGetVersion` takes nothing and returns `size_t` in every cuDNN.
        let get = unsafe { library.get::<unsafe extern "C" fn() -> usize>(b"cudnnGetVersion\0") }
            .map_err(|e| format!("{} has no cudnnGetVersion: {e}", cudnn_setup::SONAME))?;
        // SAFETY: as above.
        let version = unsafe { get() };
        cudnn_setup::require_9(version)?;
        Ok(version)
    }

    /// Opens each library, retrying those whose dependencies among the others were not open
    /// yet (cuDNN's parts need each other), until a pass opens nothing more.
    fn preload_in_any_order(libraries: &[PathBuf]) {
        let mut left: Vec<&PathBuf> = libraries.iter().collect();
        while !left.is_empty() {
            let before = left.len();
            left.retain(|library| !preload(library));
            if left.len() == before {
                break;
            }
        }
    }

    /// Several CUDA devices exchange tensors through NCCL, which cudarc opens by the names
    /// `libnccl.so` or `libnccl.so.<CUDA major>`; NCCL's packages and wheels install only
    /// `libnccl.so.2`.
    pub fn check_nccl() -> Result<(), BackendError> {
        // SAFETY: only tries to dlopen the library, as cudarc itself does on first use.
        if unsafe { cudarc::nccl::sys::is_culib_present() } {
            return Ok(());
        }
        Err(BackendError::CudaSetup {
            what: "NCCL to train on several GPUs (cudarc opens it as libnccl.so), and none was found".into(),
            fix: "install it (`apt-get install libnccl-dev`, or `pip install nvidia-nccl-cu12` and link its lib/libnccl.so.2 as libnccl.so on LD_LIBRARY_PATH), or train on one device (--devices 0)".into(),
        })
    }

    fn version(v: i32) -> String {
        format!("{}.{}", v / 1000, (v % 1000) / 10)
    }

    /// Opens a library for the life of the process, its symbols global, so that later opens by
    /// its name find it; whether it opened.
    fn preload(path: &Path) -> bool {
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        // SAFETY: NVIDIA's libraries run no initialisers with requirements on the caller.
        match unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(library) => {
                std::mem::forget(library);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda_probe {
    use super::DeviceInfo;
    use crate::{Backend, BackendError};

    pub fn check_nccl() -> Result<(), BackendError> {
        Err(BackendError::NotCompiled {
            backend: Backend::Cuda,
        })
    }

    pub fn devices() -> Result<Vec<DeviceInfo>, BackendError> {
        Err(BackendError::NotCompiled {
            backend: Backend::Cuda,
        })
    }

    pub fn cudnn() -> Result<String, String> {
        Err("kiln was built without CUDA".into())
    }

    pub fn set_driver_cache() {}
}

#[cfg(feature = "wgpu")]
mod wgpu_probe {
    use super::{DeviceInfo, DeviceKind};
    use crate::{Backend, BackendError};

    /// An adapter as wgpu reports it, before it is numbered for a backend.
    #[derive(Debug, Clone)]
    pub struct Adapter {
        api: wgpu::Backend,
        name: String,
        kind: DeviceKind,
        driver: String,
    }

    /// Every Vulkan and Metal adapter, listed the way burn's wgpu runtime lists them.
    pub fn adapters() -> Vec<Adapter> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::VULKAN | wgpu::Backends::METAL,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        pollster::block_on(
            instance.enumerate_adapters(wgpu::Backends::VULKAN | wgpu::Backends::METAL),
        )
        .into_iter()
        .map(|adapter| {
            let info = adapter.get_info();
            Adapter {
                api: info.backend,
                name: info.name,
                kind: match info.device_type {
                    wgpu::DeviceType::DiscreteGpu => DeviceKind::Discrete,
                    wgpu::DeviceType::IntegratedGpu => DeviceKind::Integrated,
                    wgpu::DeviceType::VirtualGpu => DeviceKind::Virtual,
                    wgpu::DeviceType::Cpu => DeviceKind::Software,
                    wgpu::DeviceType::Other => DeviceKind::Other,
                },
                driver: [info.driver, info.driver_info]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" "),
            }
        })
        .collect()
    }

    /// The graphics API each wgpu-based backend uses: burn's `Wgpu` picks Metal on macOS and
    /// Vulkan elsewhere.
    pub fn api_of(backend: Backend) -> wgpu::Backend {
        match backend {
            Backend::Metal => wgpu::Backend::Metal,
            Backend::Vulkan => wgpu::Backend::Vulkan,
            _ if cfg!(target_os = "macos") => wgpu::Backend::Metal,
            _ => wgpu::Backend::Vulkan,
        }
    }

    /// The adapters one backend can use, best first: discrete, integrated, virtual, software.
    /// `ordinal` numbers adapters within their kind, as burn's `WgpuDevice` does.
    pub fn devices_for(
        backend: Backend,
        adapters: &[Adapter],
    ) -> Result<Vec<DeviceInfo>, BackendError> {
        let api = api_of(backend);
        let mut devices: Vec<DeviceInfo> = Vec::new();
        for adapter in adapters
            .iter()
            .filter(|a| a.api == api && a.kind != DeviceKind::Other)
        {
            let ordinal = devices.iter().filter(|d| d.kind == adapter.kind).count();
            devices.push(DeviceInfo {
                backend,
                index: 0,
                name: adapter.name.clone(),
                kind: adapter.kind,
                memory_bytes: None,
                detail: format!("{:?} {}", adapter.api, adapter.driver)
                    .trim()
                    .to_string(),
                ordinal,
            });
        }
        // burn selects the software adapter as `WgpuDevice::Cpu`, which has no index.
        let mut seen_software = false;
        devices.retain(|d| {
            d.kind != DeviceKind::Software || !std::mem::replace(&mut seen_software, true)
        });
        devices.sort_by_key(|d| (d.kind, d.ordinal));
        for (index, device) in devices.iter_mut().enumerate() {
            device.index = index;
        }
        if devices.is_empty() {
            return Err(BackendError::NoDevice { backend });
        }
        Ok(devices)
    }
}

#[cfg(not(feature = "wgpu"))]
mod wgpu_probe {
    use super::DeviceInfo;
    use crate::{Backend, BackendError};

    #[derive(Debug, Clone)]
    pub struct Adapter;

    pub fn adapters() -> Vec<Adapter> {
        Vec::new()
    }

    pub fn devices_for(backend: Backend, _: &[Adapter]) -> Result<Vec<DeviceInfo>, BackendError> {
        Err(BackendError::NotCompiled { backend })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Benchmarks and `kiln devices` name the processor, as Linux gives it.
    #[test]
    fn the_cpu_device_names_the_processor() {
        let name = cpu_device(Backend::Flex).name;
        let listed = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|line| Some(line.strip_prefix("model name")?.split_once(':')?.1.trim()))
            .map(str::to_string);
        assert!(name.starts_with("CPU ("), "{name}");
        if let Some(model) = listed.filter(|m| !m.is_empty()) {
            assert!(name.starts_with(&format!("CPU ({model}, ")), "{name}");
        }
        assert!(name.ends_with(" threads)"), "{name}");
    }

    /// Reports and consoles name devices as their users know them.
    #[test]
    fn devices_have_the_names_people_know_them_by() {
        let device = |backend, name: &str, kind| DeviceInfo {
            backend,
            index: 0,
            name: name.to_string(),
            kind,
            memory_bytes: None,
            detail: String::new(),
            ordinal: 0,
        };
        assert_eq!(
            cpu_name(Some("AMD EPYC 9R14".into()), 2),
            "CPU: AMD EPYC 9R14, 2 threads"
        );
        assert_eq!(cpu_name(None, 1), "CPU, 1 thread");
        assert!(
            (device(Backend::Flex, "CPU (x, 2 threads)", DeviceKind::Cpu).human_name())
                .starts_with("CPU")
        );
        let h200 = device(Backend::Cuda, "NVIDIA H200", DeviceKind::Discrete);
        assert_eq!(h200.human_name(), "NVIDIA H200");
        let llvmpipe = device(
            Backend::Vulkan,
            "llvmpipe (LLVM 15.0.7, 256 bits)",
            DeviceKind::Software,
        );
        assert_eq!(llvmpipe.human_name(), "llvmpipe (software Vulkan)");
        assert_eq!(
            human_names(&[h200.clone(), h200.clone()]),
            "2 × NVIDIA H200"
        );
        assert_eq!(
            human_names(&[h200, llvmpipe]),
            "NVIDIA H200, llvmpipe (software Vulkan)"
        );
    }
}
