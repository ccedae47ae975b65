//! `kiln compare` and `kiln bench`: kiln-check's generic checks, run on each backend in turn.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use kiln_backend::{
    Backend, BackendChoice, BackendTask, DeviceKind, DeviceSelection, MemoryMeter, Probe, Resolved,
    probe, resolve, run_on,
};
use kiln_check::CheckError;
use kiln_check::bench::{self, Budget, Measurement, Mode, Target, Workload};
use kiln_check::compare::{self, Capture, CompareSpec, StageDiff, Tolerances};
use kiln_check::parity::{self, Parity};
use kiln_check::trajectory::{self, Fixture, RunDiff, Setup, Trajectory};
use kiln_models::{Precision, ResNetConfig, Stem};

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

    /// resnet18, resnet34, resnet50, resnet101 or resnet152.
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

    /// Start each residual branch's last batch norm at zero. Bottleneck networks (resnet50 and
    /// deeper) need it: at random initialisation their float32 gradients are ill-conditioned
    /// (rounding alone moves them by percents), as their training recipes know.
    #[arg(long)]
    zero_init_residual: bool,

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

pub fn run_compare(args: CompareArgs) -> anyhow::Result<()> {
    let mut model = ResNetConfig::from_name(&args.model)?
        .with_width(args.width)
        .with_num_classes(args.classes)
        .with_zero_init_residual(args.zero_init_residual);
    if args.image_size < 64 {
        model = model.with_stem(Stem::Cifar);
    }
    let spec = CompareSpec {
        model,
        image_size: args.image_size,
        batch: args.batch,
        steps: args.steps,
        seed: 7,
    };
    let backends = parse_backends(&args.backends)?;
    // Kernels tuned for this comparison's shapes only, in a cache that goes with the process.
    let kernels = std::env::temp_dir().join(format!("kiln-compare-kernels-{}", std::process::id()));
    kiln_backend::configure_private_kernel_cache(kernels.clone());
    let reference = match &args.reference {
        Some(name) => parse_backend(name)?,
        None => backends[0],
    };
    let probe = probe();
    let resolved = resolve(
        BackendChoice::Explicit(reference),
        &DeviceSelection::default(),
        &probe,
    )
    .with_context(|| format!("the reference backend {reference} cannot run"))?;
    if !args.allow_missing {
        for backend in &backends {
            resolve(
                BackendChoice::Explicit(*backend),
                &DeviceSelection::default(),
                &probe,
            )
            .with_context(|| {
                format!("{backend} cannot run here, so it cannot be compared (pass --allow-missing to compare the others)")
            })?;
        }
    }

    // Fails here, before any training, if the folder is not a fixture or lacks a run asked for.
    let trajectories = match &args.trajectories {
        Some(dir) => Some((dir, trajectory_runs(dir, &args.runs)?)),
        None => None,
    };
    let others: Vec<Backend> = backends
        .iter()
        .copied()
        .filter(|b| *b != reference)
        .collect();
    if others.is_empty() && trajectories.is_none() {
        bail!(
            "nothing to compare: --backends names only the reference, {reference}; name another backend, or pass --trajectories to follow PyTorch's training runs"
        );
    }

    let mut results = Vec::new();
    let mut failed = false;
    let mut missing = Vec::new();
    // The reference's step is captured only for backends to compare with it.
    let weights =
        std::env::temp_dir().join(format!("kiln-compare-{}.safetensors", std::process::id()));
    if !others.is_empty() {
        println!(
            "comparing {} (width {}, {} stem, {} classes) on {} images of {}x{}, {} optimizer steps; reference {reference}",
            spec.model.name(),
            spec.model.width,
            format!("{:?}", spec.model.stem).to_lowercase(),
            spec.model.num_classes,
            spec.batch,
            spec.image_size,
            spec.image_size,
            spec.steps
        );
        let save = SaveAndCapture {
            spec: spec.clone(),
            weights: weights.clone(),
            save: true,
        };
        let expected = run_on(&resolved, save)??;
        for &backend in &others {
            let outcome = capture_on(backend, &probe, &spec, &weights, false).map(|actual| {
                let tolerances = if backend == Backend::Cuda {
                    Tolerances::tensor_cores()
                } else {
                    Tolerances::float32()
                };
                compare::diff(&expected, &actual, &tolerances)
            });
            print_outcome(backend.name(), &outcome);
            failed |= match &outcome {
                Outcome::Compared(diffs) => diffs.iter().any(|d| !d.passed),
                Outcome::Failed(_) => true,
                Outcome::Skipped(_) => {
                    missing.push(backend.name());
                    false
                }
            };
            results.push(serde_json::json!({ "backend": backend.name(), "result": outcome }));
        }
    }
    let _ = std::fs::remove_file(&weights);
    let mut followed = Vec::new();
    let mut strayed = false;
    if let Some((dir, runs)) = &trajectories {
        println!(
            "following PyTorch's training runs ({}) on every backend; errors relative to PyTorch's float64 run, bounds twice its float32 runs' worst",
            runs.join(", ")
        );
        for &backend in backends.iter().filter(|b| !missing.contains(&b.name())) {
            let outcome = follow_on(backend, &probe, dir, runs);
            print_trajectories(backend.name(), &outcome);
            strayed |= match &outcome {
                Outcome::Compared(diffs) => diffs.iter().any(|d| !d.passed()),
                Outcome::Failed(_) => true,
                Outcome::Skipped(_) => false,
            };
            followed.push(serde_json::json!({ "backend": backend.name(), "result": outcome }));
        }
    }
    let _ = std::fs::remove_dir_all(&kernels);
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "reference": reference.name(),
            "backends": results,
            "trajectories": followed,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if failed {
        bail!("the backends disagree beyond tolerance (see the table above)");
    }
    if strayed {
        bail!(
            "a backend strayed from PyTorch's training runs beyond their bounds (see the table above)"
        );
    }
    if !missing.is_empty() && !args.allow_missing {
        bail!(
            "{} could not run here, so nothing was compared on {}; run where {} can, or pass --allow-missing to accept that",
            missing.join(", "),
            if missing.len() == 1 { "it" } else { "them" },
            if missing.len() == 1 { "it" } else { "they" }
        );
    }
    if !others.is_empty() {
        println!("all compared backends agree with {reference} within tolerance");
    }
    if trajectories.is_some() {
        println!("and every backend followed PyTorch's training runs within bounds");
    }
    Ok(())
}

/// The runs of the fixture in `dir` to follow: those asked for, or all of them.
fn trajectory_runs(dir: &Path, asked: &[String]) -> anyhow::Result<Vec<String>> {
    let fixture = Fixture::load(dir)?;
    let known: Vec<&str> = fixture.runs().map(|(name, _)| name).collect();
    if let Some(unknown) = asked.iter().find(|r| !known.contains(&r.as_str())) {
        bail!(
            "{} has no run `{unknown}`; it has {}",
            dir.display(),
            known.join(", ")
        );
    }
    Ok(match asked.is_empty() {
        true => known.iter().map(|r| r.to_string()).collect(),
        false => asked.to_vec(),
    })
}

/// What happened to one backend.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome<T> {
    Compared(T),
    /// Not compiled in, or no device: a failure unless `--allow-missing`.
    Skipped(String),
    /// The backend started and then failed.
    Failed(String),
}

impl<T> Outcome<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Compared(t) => Outcome::Compared(f(t)),
            Outcome::Skipped(why) => Outcome::Skipped(why),
            Outcome::Failed(why) => Outcome::Failed(why),
        }
    }
}

/// Every stage of `spec` on `backend`, from the weights in `weights` (first initialised and
/// written there with `save`).
pub fn capture_on(
    backend: Backend,
    probe: &Probe,
    spec: &CompareSpec,
    weights: &Path,
    save: bool,
) -> Outcome<Capture> {
    let task = SaveAndCapture {
        spec: spec.clone(),
        weights: weights.to_path_buf(),
        save,
    };
    attempt(backend, probe, task)
}

/// One training step of PyTorch's fixture `name` (a width-4 ResNet of `depth` layers, in `dir`)
/// on `backend`, against PyTorch's float64 answer (`kiln_check::parity`).
pub fn parity_on(
    backend: Backend,
    probe: &Probe,
    dir: &Path,
    name: &str,
    depth: usize,
) -> Outcome<Parity> {
    attempt(backend, probe, OneStep { dir, name, depth })
}

/// PyTorch's training run `run` of `fixture`, set up as `setup` says (a mutation test changes
/// it), trained on `backend` through the trainer's step function.
pub fn trajectory_on(
    backend: Backend,
    probe: &Probe,
    fixture: &Fixture,
    run: &str,
    setup: &Setup,
) -> Outcome<Trajectory> {
    let task = Follow {
        fixture,
        run,
        setup,
    };
    attempt(backend, probe, task)
}

/// Runs `task` on `backend`: skipped where the backend cannot run here, failed where it starts
/// and then fails or panics.
fn attempt<R, T>(backend: Backend, probe: &Probe, task: T) -> Outcome<R>
where
    T: BackendTask<Output = Result<R, CheckError>>,
{
    let resolved = match resolve(
        BackendChoice::Explicit(backend),
        &DeviceSelection::default(),
        probe,
    ) {
        Ok(resolved) => resolved,
        Err(why) => return Outcome::Skipped(why.to_string()),
    };
    match guarded(|| run_on(&resolved, task)) {
        Ok(Ok(Ok(result))) => Outcome::Compared(result),
        Ok(Ok(Err(e))) => Outcome::Failed(e.to_string()),
        Ok(Err(e)) => Outcome::Skipped(e.to_string()),
        Err(panic) => Outcome::Failed(panic),
    }
}

fn print_outcome(backend: &str, outcome: &Outcome<Vec<StageDiff>>) {
    match outcome {
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

fn follow_on(
    backend: Backend,
    probe: &Probe,
    dir: &Path,
    runs: &[String],
) -> Outcome<Vec<RunDiff>> {
    let task = FollowPyTorch {
        dir: dir.to_path_buf(),
        runs: runs.to_vec(),
    };
    attempt(backend, probe, task)
}

fn print_trajectories(backend: &str, outcome: &Outcome<Vec<RunDiff>>) {
    let diffs = match outcome {
        Outcome::Skipped(why) => return println!("{backend:<8} skipped: {why}"),
        Outcome::Failed(why) => return println!("{backend:<8} FAILED: {why}"),
        Outcome::Compared(diffs) => diffs,
    };
    println!(
        "{:<8} {:<15} {:<26} {:>9} {:>9} {:>9}  {:<6} where",
        "backend", "run", "measure", "error", "bound", "pytorch", "result"
    );
    for diff in diffs {
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
}

/// Trains each of PyTorch's reference runs and compares it with PyTorch's.
struct FollowPyTorch {
    dir: PathBuf,
    runs: Vec<String>,
}

impl BackendTask for FollowPyTorch {
    type Output = Result<Vec<RunDiff>, CheckError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        let fixture = Fixture::load(&self.dir)?;
        (self.runs.iter())
            .map(|run| {
                let setup = fixture.setup(run)?;
                let trained = trajectory::train::<B>(&fixture, run, &setup, &devices[0])?;
                trajectory::diff(&fixture, run, &setup, &trained)
            })
            .collect()
    }
}

struct OneStep<'a> {
    dir: &'a Path,
    name: &'a str,
    depth: usize,
}

impl BackendTask for OneStep<'_> {
    type Output = Result<Parity, CheckError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        parity::check::<B>(self.dir, self.name, self.depth, &devices[0])
    }
}

struct Follow<'a> {
    fixture: &'a Fixture,
    run: &'a str,
    setup: &'a Setup,
}

impl BackendTask for Follow<'_> {
    type Output = Result<Trajectory, CheckError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        trajectory::train::<B>(self.fixture, self.run, self.setup, &devices[0])
    }
}

/// On the reference backend: initialise and save the weights first. Everywhere: load them and
/// capture every stage.
struct SaveAndCapture {
    spec: CompareSpec,
    weights: PathBuf,
    save: bool,
}

impl BackendTask for SaveAndCapture {
    type Output = Result<Capture, CheckError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        let device = &devices[0];
        if self.save {
            compare::save_initial_weights::<B>(&self.spec, device, &self.weights)?;
        }
        compare::capture::<B>(&self.spec, &self.weights, device)
    }
}

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

pub fn run_bench(args: BenchArgs) -> anyhow::Result<()> {
    let probe = probe();
    let backends = if args.backends.is_empty() {
        default_bench_backends(&probe)
    } else {
        parse_backends(&args.backends)?
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
    let pytorch: Vec<Measurement> = match &args.reference {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!("cannot read PyTorch's figures from {}", path.display())
            })?;
            serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not a list of measurements as bench_torch.py writes them",
                    path.display()
                )
            })?
        }
        None => Vec::new(),
    };
    let budget = Budget {
        warmup: args.warmup,
        min_steps: args.min_steps.max(1),
        min_seconds: args.min_seconds,
        ..Budget::default()
    };

    let mut rows = Vec::new();
    for backend in backends {
        let resolved = match resolve(
            BackendChoice::Explicit(backend),
            &DeviceSelection::default(),
            &probe,
        ) {
            Ok(resolved) => resolved,
            Err(why) => {
                eprintln!("{backend}: skipped: {why}");
                continue;
            }
        };
        kiln_backend::configure_kernel_cache(&resolved);
        for note in kiln_backend::notices(backend) {
            eprintln!("{backend}: note: {note}");
        }
        let task = Measure {
            backend,
            workloads: workloads.clone(),
            batches: args.batches.clone(),
            modes: modes.clone(),
            budget,
            passes: args.passes,
            memory: MemoryMeter::for_device(&resolved),
            device: resolved.devices[0].name.clone(),
            device_class: device_class(&resolved),
        };
        match guarded(|| run_on(&resolved, task)) {
            Ok(Ok(measured)) => rows.extend(measured),
            Ok(Err(why)) => eprintln!("{backend}: skipped: {why}"),
            Err(panic) => eprintln!("{backend}: FAILED: {panic}"),
        }
    }
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

/// CUDA and hardware GPUs where present, and flex: what a user of this machine would train on.
fn default_bench_backends(probe: &Probe) -> Vec<Backend> {
    [Backend::Cuda, Backend::Wgpu, Backend::Flex]
        .into_iter()
        .filter(|&backend| match probe.report(backend).devices() {
            Ok(devices) => {
                backend.is_cpu() || devices.iter().any(|d| d.kind != DeviceKind::Software)
            }
            Err(_) => false,
        })
        .collect()
}

fn device_class(resolved: &Resolved) -> String {
    match resolved.devices[0].kind {
        DeviceKind::Cpu | DeviceKind::Software => "cpu".into(),
        _ => "gpu".into(),
    }
}

/// Every workload, batch size and mode on one backend; a failed row (out of memory, say) is
/// reported and the rest go on.
struct Measure {
    backend: Backend,
    workloads: Vec<Workload>,
    batches: Vec<usize>,
    modes: Vec<Mode>,
    budget: Budget,
    passes: bool,
    memory: MemoryMeter,
    device: String,
    device_class: String,
}

impl BackendTask for Measure {
    type Output = Vec<Measurement>;

    fn run<B: AutodiffBackend>(mut self, devices: Vec<B::Device>) -> Self::Output {
        let device = &devices[0];
        let target = Target {
            backend: self.backend.name(),
            device: &self.device,
            device_class: &self.device_class,
        };
        let mut rows = Vec::new();
        for workload in &self.workloads {
            let batches = if self.batches.is_empty() {
                workload.default_batches()
            } else {
                self.batches.clone()
            };
            for &batch in &batches {
                for &mode in &self.modes {
                    let label = format!(
                        "{} {} batch {batch} {}",
                        workload.variant(target.backend),
                        workload.name,
                        mode.name()
                    );
                    let measured = guarded(|| {
                        bench::measure::<B>(
                            workload,
                            batch,
                            mode,
                            self.budget,
                            self.passes,
                            &target,
                            device,
                            &mut self.memory,
                        )
                    });
                    match measured {
                        Ok(Ok(row)) => {
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
                            rows.push(row);
                        }
                        Ok(Err(e)) => eprintln!("{label}: FAILED: {e}"),
                        Err(panic) => eprintln!("{label}: FAILED: {panic}"),
                    }
                }
            }
        }
        rows
    }
}

fn parse_backend(name: &str) -> anyhow::Result<Backend> {
    match name.parse::<BackendChoice>()? {
        BackendChoice::Explicit(backend) => Ok(backend),
        BackendChoice::Auto => {
            bail!("name backends explicitly here (flex, ndarray, wgpu, cuda, ...), not auto")
        }
    }
}

fn parse_backends(names: &[String]) -> anyhow::Result<Vec<Backend>> {
    if names.is_empty() {
        bail!("--backends is empty");
    }
    names.iter().map(|n| parse_backend(n)).collect()
}

/// Runs `f`, turning a panic (a backend that fails deep inside burn) into its message.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| crate::panic_message(payload.as_ref()))
}
