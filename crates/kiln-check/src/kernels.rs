//! Kernels per training step, by kind, from cubecl's own profiling log: with profiling on
//! (`kiln bench --kernels`), cubecl writes one line per launch, `| <device time> | <kernel>`, in
//! launch order (kiln's cuDNN and cuBLAS calls on CUDA included, under their names). A count is
//! the lines written between two marks, divided by the steps run between them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// cubecl's profiling log of this process.
#[derive(Debug, Clone)]
pub struct KernelLog {
    path: PathBuf,
}

/// A place in the log: the launches logged before it.
#[derive(Debug, Clone, Copy)]
pub struct Mark(usize);

/// Launches per step, all together and by kind, with their device time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelCounts {
    pub per_step: f64,
    /// Most launches first.
    pub kinds: Vec<KernelKind>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelKind {
    pub kind: String,
    pub per_step: f64,
    /// Device time per step, as cubecl measured it (each launch timed alone: a sum of times the
    /// launches would overlap without profiling).
    pub device_ms: f64,
}

impl KernelLog {
    pub fn new(path: &Path) -> Self {
        Self { path: path.into() }
    }

    /// The launches logged so far, once cubecl's logger (a background task) has written them
    /// all: the device is synchronized before, so a log that stops growing is complete.
    pub fn mark(&self) -> Mark {
        Mark(self.settled().len())
    }

    /// Launches per step since `mark`, over `steps` steps.
    pub fn since(&self, mark: Mark, steps: usize) -> KernelCounts {
        let launches = self.settled();
        count(&launches[mark.0.min(launches.len())..], steps)
    }

    fn settled(&self) -> Vec<Launch> {
        let start = Instant::now();
        let mut last = self.read();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = self.read();
            if now.len() == last.len() || start.elapsed() > Duration::from_secs(10) {
                return now;
            }
            last = now;
        }
    }

    fn read(&self) -> Vec<Launch> {
        std::fs::read_to_string(&self.path)
            .map(|text| text.lines().filter_map(launch).collect())
            .unwrap_or_default()
    }
}

/// One launch as the log gives it.
#[derive(Debug, Clone, PartialEq)]
struct Launch {
    kind: String,
    device: Duration,
}

/// A launch line, `| 1.234ms    | ElemwiseFuse | WgpuRuntime`; `None` for anything else
/// (compilation logs, the summary tables' rows, which have four cells).
fn launch(line: &str) -> Option<Launch> {
    let rest = line.strip_prefix("| ")?;
    let (time, name) = rest.split_once(" | ")?;
    let device = duration(time.trim())?;
    Some(Launch {
        kind: kind(name),
        device,
    })
}

/// A duration as Rust's `Debug` writes it: `1.5ms`, `70.625µs`, `1.2s`, `900ns`.
fn duration(text: &str) -> Option<Duration> {
    let units = [("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)];
    let (number, scale) = units
        .iter()
        .find_map(|(unit, scale)| Some((text.strip_suffix(unit)?, *scale)))?;
    let value: f64 = number.parse().ok()?;
    Some(Duration::from_secs_f64(value * scale))
}

/// A kernel's kind: its name without the runtime, and with an operator's name where it has one
/// (`KernelBinop: MulOp`, written without the log's `|` so that it fits a markdown table's
/// cell); the long generic names of matmuls cut to their first part.
fn kind(name: &str) -> String {
    let parts: Vec<&str> = name
        .split(" | ")
        .map(str::trim)
        .filter(|p| !p.ends_with("Runtime"))
        .collect();
    match parts.as_slice() {
        [] => name.trim().to_string(),
        [first, second, ..] if second.ends_with("Op") || second.ends_with("Unary") => {
            format!("{first}: {second}")
        }
        [first, ..] => first.to_string(),
    }
}

fn count(launches: &[Launch], steps: usize) -> KernelCounts {
    let steps = steps.max(1) as f64;
    let mut kinds: BTreeMap<&str, (usize, Duration)> = BTreeMap::new();
    for launch in launches {
        let entry = kinds.entry(&launch.kind).or_default();
        entry.0 += 1;
        entry.1 += launch.device;
    }
    let mut kinds: Vec<KernelKind> = kinds
        .into_iter()
        .map(|(kind, (launches, device))| KernelKind {
            kind: kind.to_string(),
            per_step: launches as f64 / steps,
            device_ms: device.as_secs_f64() * 1000.0 / steps,
        })
        .collect();
    kinds.sort_by(|a, b| b.per_step.total_cmp(&a.per_step).then(a.kind.cmp(&b.kind)));
    KernelCounts {
        per_step: launches.len() as f64 / steps,
        kinds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as cubecl 0.10 writes them with `CUBECL_DEBUG_OPTION=profile`.
    const LOG: &str = "\
[START_KERNEL_COMPILATION]
name: burn_cubecl_fusion::optim::elemwise::optimization::elemwise_fuse::ElemwiseFuse<
| 204.465332ms | ElemwiseFuse | WgpuRuntime
| 70.625µs   | CopyKernel | WgpuRuntime
| 89.865624ms | DirectConv2dKernel | WgpuRuntime
| 1.5ms      | KernelBinop | MulOp | WgpuRuntime
| 2ms        | KernelBinop | MulOp | WgpuRuntime
| 900ns      | MatmulEntry | TensorArgs | DynamicScalar | __Lhs | WgpuRuntime
| 3ms        | kiln_cudnn_conv2d
| Name | Num Computed | Duration | Ratio |
| ElemwiseFuse | 1 | 204ms | 50% |
";

    #[test]
    fn launches_are_read_and_counted_by_kind() {
        let launches: Vec<Launch> = LOG.lines().filter_map(launch).collect();
        assert_eq!(launches.len(), 7, "{launches:?}");
        let counts = count(&launches, 2);
        assert_eq!(counts.per_step, 3.5);
        let find = |k: &str| counts.kinds.iter().find(|x| x.kind == k).unwrap().clone();
        let mul = find("KernelBinop: MulOp");
        assert_eq!(mul.per_step, 1.0);
        assert!((mul.device_ms - 1.75).abs() < 1e-9, "{mul:?}");
        assert_eq!(find("MatmulEntry").per_step, 0.5);
        assert_eq!(find("kiln_cudnn_conv2d").per_step, 0.5);
        assert_eq!(
            counts.kinds[0].kind, "KernelBinop: MulOp",
            "most launches first"
        );
    }

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(duration("1.5ms"), Some(Duration::from_micros(1500)));
        assert_eq!(duration("70.625µs"), Some(Duration::from_nanos(70625)));
        assert_eq!(duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(duration("900ns"), Some(Duration::from_nanos(900)));
        assert_eq!(duration("Duration"), None);
    }

    #[test]
    fn a_mark_counts_only_what_follows_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.log");
        std::fs::write(&path, "| 1ms | A | WgpuRuntime\n| 1ms | B | WgpuRuntime\n").unwrap();
        let log = KernelLog::new(&path);
        let mark = log.mark();
        let more = "| 1ms | A | WgpuRuntime\n| 1ms | A | WgpuRuntime\n| 1ms | C | WgpuRuntime\n";
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(more);
        std::fs::write(&path, text).unwrap();
        let counts = log.since(mark, 1);
        assert_eq!(counts.per_step, 3.0);
        assert_eq!(counts.kinds[0].kind, "A");
        assert_eq!(counts.kinds[0].per_step, 2.0);
    }
}
