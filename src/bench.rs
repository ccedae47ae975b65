//! `kiln bench`: the flags, `kiln::check::bench`, each row's line as it is measured, and the
//! table beside PyTorch's figures.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use kiln::check::{self, BenchOptions, BenchProgress};
use kiln_backend::{Backend, BackendChoice};
use kiln_check::bench::{self, Budget, Mode, Workload};
use kiln_models::Precision;

#[derive(Args)]
pub struct BenchArgs {
    /// Backends to measure, comma-separated (default: CUDA and hardware GPUs through wgpu where
    /// present, and flex).
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,

    /// resnet18-cifar (32x32, CIFAR stem) and resnetNN (224x224), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "resnet18-cifar,resnet50")]
    models: Vec<String>,

    /// Batch sizes for every model (default: 32,128 at 32x32 and 16,64 at 224x224).
    #[arg(long, value_delimiter = ',')]
    batches: Vec<usize>,

    #[arg(long, value_delimiter = ',', default_value = "train,infer")]
    modes: Vec<String>,

    /// The convolutions' float types to measure, comma-separated: f32, bf16, f16 (as the
    /// config's `precision`; PyTorch's rows are eager f32 and channels-last with bf16 autocast).
    #[arg(long, value_delimiter = ',', default_value = "f32")]
    precision: Vec<String>,

    /// Untimed steps before measuring (kernel compilation, autotuning).
    #[arg(long, default_value_t = 2)]
    warmup: usize,

    /// Timed steps: at least this many ...
    #[arg(long, default_value_t = 3)]
    min_steps: usize,

    /// ... and at least this many seconds.
    #[arg(long, default_value_t = 3.0)]
    min_seconds: f64,

    /// Also time a training step's forward pass, backward pass and optimizer update apart.
    #[arg(long)]
    passes: bool,

    /// Also count the kernels a training step launches, by kind, with their device time, from
    /// cubecl's profiling (GPU backends; every launch then waits for the device, so the row's
    /// timings say where the time goes, not how fast kiln is).
    #[arg(long)]
    kernels: bool,

    /// PyTorch's figures (from xtask/scripts/bench_torch.py) to print beside kiln's.
    #[arg(long)]
    reference: Option<PathBuf>,

    /// Also write kiln's rows as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,

    /// Also write the table here.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let backends = match args.backends.is_empty() {
        true => Vec::new(),
        false => parse_backends(&args.backends)?,
    };
    let precisions = args
        .precision
        .iter()
        .map(|name| {
            Precision::from_name(name).with_context(|| {
                format!("unknown precision `{name}`: use f32, bf16 or f16 (comma-separated)")
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut workloads = Vec::new();
    for name in &args.models {
        let workload = Workload::parse(name).map_err(anyhow::Error::msg)?;
        workloads.extend(precisions.iter().map(|&p| workload.clone().in_precision(p)));
    }
    let modes = args
        .modes
        .iter()
        .map(|m| match m.as_str() {
            "train" => Ok(Mode::Train),
            "infer" => Ok(Mode::Infer),
            other => bail!("unknown mode `{other}`: use train, infer or both (train,infer)"),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pytorch = match &args.reference {
        Some(path) => check::read_pytorch_figures(path)?,
        None => Vec::new(),
    };
    let options = BenchOptions {
        backends,
        workloads,
        batches: args.batches.clone(),
        modes,
        budget: Budget {
            warmup: args.warmup,
            min_steps: args.min_steps.max(1),
            min_seconds: args.min_seconds,
            ..Budget::default()
        },
        passes: args.passes,
        kernels: args.kernels,
    };
    let rows = check::bench(&options, &mut print_progress);
    let table = bench::markdown(&rows, &pytorch);
    println!("{table}");
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, &table).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if rows.is_empty() {
        bail!("nothing was measured (see the messages above)");
    }
    Ok(())
}

/// Each row, skipped backend and failure on standard error as it happens; the table goes to
/// standard output at the end.
fn print_progress(progress: BenchProgress<'_>) {
    match progress {
        BenchProgress::Skipped { backend, why } => eprintln!("{backend}: skipped: {why}"),
        BenchProgress::Note { backend, note } => eprintln!("{backend}: note: {note}"),
        BenchProgress::Measured { label, row } => {
            eprintln!(
                "{label}: {:.1} img/s, {:.1} ms a step",
                row.images_per_s, row.step_ms
            );
            if let Some(p) = &row.passes {
                eprintln!(
                    "{label}: forward {:.1} ms, backward {:.1} ms, optimizer {:.1} ms",
                    p.forward_ms, p.backward_ms, p.optimizer_ms
                );
            }
        }
        BenchProgress::RowFailed { label, why } => eprintln!("{label}: FAILED: {why}"),
        BenchProgress::Failed { backend, why } => eprintln!("{backend}: FAILED: {why}"),
    }
}

/// A backend named on the command line; `auto` means nothing to a comparison or a benchmark.
pub fn parse_backend(name: &str) -> anyhow::Result<Backend> {
    match name.parse::<BackendChoice>()? {
        BackendChoice::Explicit(backend) => Ok(backend),
        BackendChoice::Auto => {
            bail!("name backends explicitly here (flex, ndarray, wgpu, cuda, ...), not auto")
        }
    }
}

pub fn parse_backends(names: &[String]) -> anyhow::Result<Vec<Backend>> {
    if names.is_empty() {
        bail!("--backends is empty");
    }
    names.iter().map(|n| parse_backend(n)).collect()
}
