//! `kiln compare`: the flags, `kiln::check::compare`, the tables as each backend's result
//! comes, and the verdict as the exit status.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use kiln::check::{self, BackendResult, CompareOptions, CompareProgress, Outcome, Verdict};
use kiln_check::compare::StageDiff;
use kiln_check::trajectory::RunDiff;

use crate::bench::parse_backends;

#[derive(Args)]
pub struct CompareArgs {
    /// Backends to compare, comma-separated. One that is not compiled in or has no device
    /// fails the comparison, unless --allow-missing is given.
    #[arg(long, value_delimiter = ',', default_value = "flex,ndarray,wgpu")]
    backends: Vec<String>,

    /// Report backends that are not compiled in or have no device as skipped, and pass.
    #[arg(long)]
    allow_missing: bool,

    /// The backend the others are compared with (default: the first of --backends).
    #[arg(long)]
    reference: Option<String>,

    /// resnet18 ... resnet152, resnext50_32x4d, wide_resnet50_2, resnet50d, ... (at --width).
    #[arg(long, default_value = "resnet18")]
    model: String,

    /// Channels of the first stage (torchvision's is 64); small widths keep the check fast.
    #[arg(long, default_value_t = 8)]
    width: usize,

    /// Input height and width; below 64 the network takes the CIFAR stem.
    #[arg(long, default_value_t = 16)]
    image_size: usize,

    #[arg(long, default_value_t = 4)]
    batch: usize,

    /// Optimizer steps before comparing the parameters.
    #[arg(long, default_value_t = 3)]
    steps: usize,

    #[arg(long, default_value_t = 10)]
    classes: usize,

    /// Start each residual branch's last batch norm at zero (`--zero-init-residual=false` to
    /// not). On by default for Bottleneck networks (resnet50 and deeper, ResNeXt, Wide ResNet,
    /// ResNet-D): at random initialisation their float32 gradients are ill-conditioned
    /// (rounding alone moves them by percents, flex against ndarray too), as their training
    /// recipes know; off for the others.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    zero_init_residual: Option<bool>,

    /// Also train PyTorch's reference runs on every backend and compare each step's loss and the
    /// parameters with PyTorch's: the folder `tests/fixtures/trajectory/make_trajectories.py`
    /// writes (`cargo xtask compare` passes it).
    #[arg(long, value_name = "DIR")]
    trajectories: Option<PathBuf>,

    /// Only these of the folder's runs, comma-separated (default: all of them).
    #[arg(long, value_delimiter = ',', requires = "trajectories")]
    runs: Vec<String>,

    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Whether `model` names a network of Bottleneck blocks (an unknown name is left to the
/// comparison to refuse).
fn bottleneck(model: &str) -> bool {
    kiln_models::ResNetConfig::from_name(model)
        .and_then(|config| kiln_models::architecture(config.depth))
        .is_ok_and(|(kind, _)| kind == kiln_models::BlockKind::Bottleneck)
}

pub fn run(args: CompareArgs) -> anyhow::Result<()> {
    let backends = parse_backends(&args.backends)?;
    let reference = match &args.reference {
        Some(name) => Some(crate::bench::parse_backend(name)?),
        None => None,
    };
    let zero_init_residual = (args.zero_init_residual).unwrap_or_else(|| bottleneck(&args.model));
    let options = CompareOptions {
        backends,
        reference,
        allow_missing: args.allow_missing,
        model: args.model,
        width: args.width,
        image_size: args.image_size,
        batch: args.batch,
        steps: args.steps,
        classes: args.classes,
        zero_init_residual,
        trajectories: args.trajectories,
        runs: args.runs,
    };
    let report = check::compare(&options, &mut print_progress)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    match report.verdict(options.allow_missing) {
        Verdict::Disagree => bail!("the backends disagree beyond tolerance (see the table above)"),
        Verdict::Strayed => bail!(
            "a backend strayed from PyTorch's training runs beyond their bounds (see the table above)"
        ),
        Verdict::Missing(missing) => bail!(
            "{} could not run here, so nothing was compared on {}; run where {} can, or pass --allow-missing to accept that",
            missing.join(", "),
            if missing.len() == 1 { "it" } else { "them" },
            if missing.len() == 1 { "it" } else { "they" }
        ),
        Verdict::Agree => {}
    }
    if !report.backends.is_empty() {
        println!(
            "all compared backends agree with {} within tolerance",
            report.reference
        );
    }
    if options.trajectories.is_some() {
        println!("and every backend followed PyTorch's training runs within bounds");
    }
    Ok(())
}

fn print_progress(progress: CompareProgress<'_>) {
    match progress {
        CompareProgress::Comparing { spec, reference } => println!(
            "comparing {} (width {}, {} stem, {} classes) on {} images of {}x{}, {} optimizer steps; reference {reference}",
            spec.model.name(),
            spec.model.width,
            format!("{:?}", spec.model.stem).to_lowercase(),
            spec.model.num_classes,
            spec.batch,
            spec.image_size,
            spec.image_size,
            spec.steps
        ),
        CompareProgress::Compared(result) => print_stages(result),
        CompareProgress::Following { runs } => println!(
            "following PyTorch's training runs ({}) on every backend; errors relative to PyTorch's float64 run, bounds twice its float32 runs' worst",
            runs.join(", ")
        ),
        CompareProgress::Followed(result) => print_trajectories(result),
    }
}

fn print_stages(result: &BackendResult<Vec<StageDiff>>) {
    let backend = result.backend.as_str();
    match &result.result {
        Outcome::Skipped(why) => println!("{backend:<8} skipped: {why}"),
        Outcome::Failed(why) => println!("{backend:<8} FAILED: {why}"),
        Outcome::Compared(diffs) => {
            println!(
                "{:<8} {:<18} {:>10} {:>10} {:>10}  {:<6} worst tensor",
                "backend", "stage", "max abs", "relative", "tolerance", "result"
            );
            for d in diffs {
                println!(
                    "{:<8} {:<18} {:>10.2e} {:>10.2e} {:>10.0e}  {:<6} {}",
                    backend,
                    d.stage.name(),
                    d.max_abs,
                    d.max_rel,
                    d.tolerance,
                    if d.passed { "ok" } else { "FAILED" },
                    d.worst
                );
            }
        }
    }
}

fn print_trajectories(result: &BackendResult<Vec<RunDiff>>) {
    let backend = result.backend.as_str();
    let diffs = match &result.result {
        Outcome::Skipped(why) => return println!("{backend:<8} skipped: {why}"),
        Outcome::Failed(why) => return println!("{backend:<8} FAILED: {why}"),
        Outcome::Compared(diffs) => diffs,
    };
    println!(
        "{:<8} {:<15} {:<26} {:>9} {:>9} {:>9}  {:<6} where",
        "backend", "run", "measure", "error", "bound", "pytorch", "result"
    );
    for diff in diffs {
        print_run(backend, diff);
    }
}

/// One run's rows: the losses, then each snapshot's parameters and buffers.
fn print_run(backend: &str, diff: &RunDiff) {
    let rows = std::iter::once(("losses (every step)".to_string(), &diff.losses))
        .chain(
            diff.parameters
                .iter()
                .map(|(s, w)| (format!("parameters at step {s}"), w)),
        )
        .chain(
            diff.buffers
                .iter()
                .map(|(s, w)| (format!("bn buffers at step {s}"), w)),
        );
    for (measure, worst) in rows {
        println!(
            "{:<8} {:<15} {:<26} {:>9.2e} {:>9.1e} {:>9.2e}  {:<6} {}",
            backend,
            diff.run,
            measure,
            worst.error,
            worst.bound,
            worst.pytorch,
            if worst.passed() { "ok" } else { "FAILED" },
            worst.at
        );
    }
    if diff.schedule > 1e-9 || !diff.counters_exact {
        println!(
            "{backend:<8} {:<15} FAILED: learning rates {:.1e} from PyTorch's, step counters {}",
            diff.run,
            diff.schedule,
            if diff.counters_exact {
                "exact"
            } else {
                "wrong"
            }
        );
    }
}
