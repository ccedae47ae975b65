//! How much memory a run takes: the device's memory pool on GPUs (burn 0.21's `Backend` has no
//! memory query, so this asks the cubecl runtime under it), the process's resident set on the CPU.

use crate::{Backend, Resolved};

/// Tracks the peak memory of one device across a stretch of work (an epoch, a benchmark).
pub struct MemoryMeter {
    source: Source,
    peak: Option<u64>,
    /// The device's memory as the probe found it (GPUs that report it).
    total: Option<u64>,
}

#[derive(Clone)]
enum Source {
    None,
    /// Linux's high-water mark of the resident set (`VmHWM`), reset through `clear_refs`.
    Process,
    #[cfg(feature = "cuda")]
    Cuda(burn::backend::cuda::CudaDevice),
    #[cfg(feature = "wgpu")]
    Wgpu(burn::backend::wgpu::WgpuDevice),
}

impl MemoryMeter {
    /// A meter that measures nothing (tests, or where memory is not wanted).
    pub fn none() -> Self {
        Self {
            source: Source::None,
            peak: None,
            total: None,
        }
    }

    /// The process's resident set: what a CPU backend's tensors occupy, plus everything else.
    pub fn process() -> Self {
        Self {
            source: Source::Process,
            peak: None,
            total: None,
        }
    }

    /// Measures the first of the resolved devices. Call it before the run touches the device
    /// and sample only after, so that the device is set up the way the run wants it.
    pub fn for_device(resolved: &Resolved) -> Self {
        if resolved.devices.is_empty() {
            return Self::none();
        }
        let source = match resolved.backend {
            Backend::Flex | Backend::NdArray => Source::Process,
            #[cfg(feature = "cuda")]
            Backend::Cuda => Source::Cuda(crate::dispatch::cuda_device(&resolved.devices[0])),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu | Backend::Vulkan | Backend::Metal => {
                Source::Wgpu(crate::dispatch::wgpu_device(&resolved.devices[0]))
            }
            #[allow(unreachable_patterns)]
            _ => Source::None,
        };
        Self {
            source,
            peak: None,
            total: resolved.devices[0].memory_bytes,
        }
    }

    /// What the figures mean, for reports.
    pub fn describe(&self) -> &'static str {
        match self.source {
            Source::None => "not measured",
            Source::Process => "peak resident memory of the process",
            #[allow(unreachable_patterns)]
            _ => "peak of the device memory pool (reserved bytes)",
        }
    }

    /// Starts a new stretch: the peak from here on.
    pub fn reset_peak(&mut self) {
        self.peak = None;
        if let Source::Process = self.source {
            // Freed memory the allocator keeps for later steps would count in the new stretch.
            // SAFETY: `malloc_trim` only returns free memory to the system.
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            unsafe {
                libc::malloc_trim(0);
            }
            // Writing 5 resets VmHWM to the current resident set (Linux 4.0 and later).
            let _ = std::fs::write("/proc/self/clear_refs", "5");
        }
        self.sample();
    }

    /// Takes a reading; call it where memory is likely highest (after a step). The process
    /// meter needs no samples: the kernel keeps the high-water mark.
    pub fn sample(&mut self) {
        if let Source::Process = self.source {
            return;
        }
        if let Some(now) = self.current() {
            self.peak = Some(self.peak.map_or(now, |p| p.max(now)));
        }
    }

    /// The highest reading since the last reset, or `None` where this device cannot tell.
    pub fn peak_bytes(&mut self) -> Option<u64> {
        match self.source {
            Source::Process => process_status_bytes("VmHWM:"),
            _ => {
                self.sample();
                self.peak
            }
        }
    }

    /// Memory this job could still take: the system's available memory for the CPU, the
    /// device's memory less what this process's pool holds for a GPU that reports its size;
    /// `None` where the device does not say.
    pub fn available(&self) -> Option<u64> {
        match self.source {
            Source::None => None,
            Source::Process => meminfo_bytes("MemAvailable:"),
            #[allow(unreachable_patterns)]
            _ => Some(self.total?.saturating_sub(self.current().unwrap_or(0))),
        }
    }

    /// A reading of the device's memory pool that runs on another thread: cubecl keeps a pool
    /// per thread, so the thread that runs the work must read it. `None` for meters that need
    /// no samples (the process's peak is kept by the kernel).
    #[allow(clippy::type_complexity)]
    pub fn reader(&self) -> Option<Box<dyn Fn() -> Option<u64> + Send>> {
        match &self.source {
            Source::None | Source::Process => None,
            #[allow(unreachable_patterns)]
            source => {
                let meter = MemoryMeter {
                    source: source.clone(),
                    peak: None,
                    total: None,
                };
                Some(Box::new(move || meter.current()))
            }
        }
    }

    /// Takes a reading made elsewhere (by [`MemoryMeter::reader`]).
    pub fn record(&mut self, bytes: Option<u64>) {
        if let Some(now) = bytes {
            self.peak = Some(self.peak.map_or(now, |p| p.max(now)));
        }
    }

    /// Memory in use now.
    pub fn current(&self) -> Option<u64> {
        match &self.source {
            Source::None => None,
            Source::Process => process_status_bytes("VmRSS:"),
            #[cfg(feature = "cuda")]
            Source::Cuda(device) => {
                use burn::cubecl::Runtime;
                let client = burn::cubecl::cuda::CudaRuntime::client(device);
                client.memory_usage().ok().map(|usage| usage.bytes_reserved)
            }
            #[cfg(feature = "wgpu")]
            Source::Wgpu(device) => {
                use burn::cubecl::Runtime;
                let client = burn::backend::wgpu::WgpuRuntime::client(device);
                client.memory_usage().ok().map(|usage| usage.bytes_reserved)
            }
        }
    }
}

/// A `kB` field of `/proc/self/status`, in bytes; `None` off Linux.
fn process_status_bytes(field: &str) -> Option<u64> {
    kb_field("/proc/self/status", field)
}

/// A `kB` field of `/proc/meminfo`, in bytes; `None` off Linux.
fn meminfo_bytes(field: &str) -> Option<u64> {
    kb_field("/proc/meminfo", field)
}

fn kb_field(file: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(file).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn the_cpu_has_memory_available_and_a_meter_without_a_device_has_none() {
        let available = MemoryMeter::process().available().unwrap();
        assert!(available > 16 << 20, "{available} bytes available");
        assert_eq!(MemoryMeter::none().available(), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_process_meter_keeps_the_peak_of_a_freed_allocation() {
        let mut meter = MemoryMeter::process();
        meter.reset_peak();
        let before = meter.peak_bytes().unwrap();
        let block = vec![1u8; 256 << 20];
        std::hint::black_box(&block);
        drop(block);
        // Read after the work, as benchmarks and epochs do.
        let peak = meter.peak_bytes().unwrap();
        assert!(
            peak >= before + (200 << 20),
            "peak went from {before} to {peak} bytes around 256 MiB touched and freed"
        );
        meter.reset_peak();
        let fresh = meter.peak_bytes().unwrap();
        assert!(
            fresh < peak - (200 << 20),
            "a reset forgets the freed block: {fresh} after {peak}"
        );
    }
}
