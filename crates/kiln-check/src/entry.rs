//! The entry points of `kiln compare` and `kiln bench`: this crate's generic checks, run on
//! each backend in turn through kiln-backend, returning what they found (the binary prints
//! it). What counts as agreeing is `verdict`'s (`Tolerances`, `CompareReport::verdict`).
//! Instantiated here once for every backend, as kiln-train's entry points are.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use crate::CheckError;
use crate::bench::{self, Budget, Measurement, Mode, Target, Workload};
use crate::compare::{self, Capture, CompareSpec, StageDiff, Tolerances};
use crate::parity::{self, Parity};
use crate::trajectory::{self, Fixture, RunDiff, Setup, Trajectory};
pub use crate::verdict::{BackendResult, CompareReport, Outcome, Verdict};
use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use kiln_backend::{
    Backend, BackendChoice, BackendTask, DeviceKind, DeviceSelection, MemoryMeter, Probe, Resolved,
    probe, resolve, run_on,
};
use kiln_models::{ResNetConfig, Stem};

/// What `kiln compare` compares: the backends, the network and its batch, and PyTorch's runs.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Backends to compare; the first is the reference unless `reference` names one.
    pub backends: Vec<Backend>,
    pub reference: Option<Backend>,
    /// Report backends that cannot run here as skipped instead of refusing to start.
    pub allow_missing: bool,
    /// resnet18 to resnet152.
    pub model: String,
    pub width: usize,
    /// Below 64 the network takes the CIFAR stem.
    pub image_size: usize,
    pub batch: usize,
    /// Optimizer steps before comparing the parameters.
    pub steps: usize,
    pub classes: usize,
    pub zero_init_residual: bool,
    /// PyTorch's training runs to follow on every backend (`make_trajectories.py`'s folder) ...
    pub trajectories: Option<PathBuf>,
    /// ... only these of them (all when empty).
    pub runs: Vec<String>,
}

/// What a comparison has got to, as it goes: each backend's result as soon as it has one, so
/// that a long comparison on GPUs shows its progress.
pub enum CompareProgress<'a> {
    /// The one-step comparison with the reference begins.
    Comparing {
        spec: &'a CompareSpec,
        reference: Backend,
    },
    Compared(&'a BackendResult<Vec<StageDiff>>),
    /// Following PyTorch's training runs begins.
    Following {
        runs: &'a [String],
    },
    Followed(&'a BackendResult<Vec<RunDiff>>),
}

/// Compares the backends of `options` with the reference, one training step stage by stage,
/// and follows PyTorch's training runs on each. An error is a comparison that could not start
/// (a reference that cannot run, a folder that is not a fixture); disagreement is in the
/// report's verdict.
pub fn compare(
    options: &CompareOptions,
    progress: &mut dyn FnMut(CompareProgress<'_>),
) -> anyhow::Result<CompareReport> {
    let spec = compare_spec(options)?;
    let Some(&first) = options.backends.first() else {
        bail!("--backends is empty");
    };
    // Kernels tuned for this comparison's shapes only, in a cache that goes with the process.
    let kernels = std::env::temp_dir().join(format!("kiln-compare-kernels-{}", std::process::id()));
    kiln_backend::configure_private_kernel_cache(kernels.clone());
    let reference = options.reference.unwrap_or(first);
    let probe = probe();
    let resolved = resolve(
        BackendChoice::Explicit(reference),
        &DeviceSelection::default(),
        &probe,
    )
    .with_context(|| format!("the reference backend {reference} cannot run"))?;
    if !options.allow_missing {
        for backend in &options.backends {
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
    let trajectories = match &options.trajectories {
        Some(dir) => Some((dir, trajectory_runs(dir, &options.runs)?)),
        None => None,
    };
    let others: Vec<Backend> = (options.backends.iter().copied())
        .filter(|b| *b != reference)
        .collect();
    if others.is_empty() && trajectories.is_none() {
        bail!(
            "nothing to compare: --backends names only the reference, {reference}; name another backend, or pass --trajectories to follow PyTorch's training runs"
        );
    }
    let mut report = CompareReport {
        reference: reference.name().to_string(),
        backends: Vec::new(),
        trajectories: Vec::new(),
    };
    // The reference's step is captured only for backends to compare with it.
    if !others.is_empty() {
        progress(CompareProgress::Comparing {
            spec: &spec,
            reference,
        });
        let save = SaveAndCapture {
            spec: spec.clone(),
            weights: shared_weights(),
            save: true,
        };
        let expected = run_on(&resolved, save)??;
        for &backend in &others {
            let result = compare_with(&expected, backend, &probe, &spec);
            progress(CompareProgress::Compared(&result));
            report.backends.push(result);
        }
        let _ = std::fs::remove_file(shared_weights());
    }
    if let Some((dir, runs)) = &trajectories {
        progress(CompareProgress::Following { runs });
        let missing = report.missing();
        for &backend in (options.backends.iter()).filter(|b| !missing.iter().any(|m| m == b.name()))
        {
            let result = BackendResult {
                backend: backend.name().to_string(),
                result: follow_on(backend, &probe, dir, runs),
            };
            progress(CompareProgress::Followed(&result));
            report.trajectories.push(result);
        }
    }
    let _ = std::fs::remove_dir_all(&kernels);
    Ok(report)
}

/// The network and batch of the one-step comparison.
fn compare_spec(options: &CompareOptions) -> anyhow::Result<CompareSpec> {
    let mut model = ResNetConfig::from_name(&options.model)?
        .with_width(options.width)
        .with_num_classes(options.classes)
        .with_zero_init_residual(options.zero_init_residual);
    if options.image_size < 64 {
        model = model.with_stem(Stem::Cifar);
    }
    Ok(CompareSpec {
        model,
        image_size: options.image_size,
        batch: options.batch,
        steps: options.steps,
        seed: 7,
    })
}

/// `backend`'s step from the reference's weights, against the reference's `expected` capture
/// within the backend's tolerances.
fn compare_with(
    expected: &Capture,
    backend: Backend,
    probe: &Probe,
    spec: &CompareSpec,
) -> BackendResult<Vec<StageDiff>> {
    let result = capture_on(backend, probe, spec, &shared_weights(), false)
        .map(|actual| compare::diff(expected, &actual, &Tolerances::for_backend(backend)));
    BackendResult {
        backend: backend.name().to_string(),
        result,
    }
}

/// Where the reference writes the weights that every backend starts from, for this process.
fn shared_weights() -> PathBuf {
    std::env::temp_dir().join(format!("kiln-compare-{}.safetensors", std::process::id()))
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
/// on `backend`, against PyTorch's float64 answer (`crate::parity`).
pub fn parity_on(
    backend: Backend,
    probe: &Probe,
    dir: &Path,
    name: &str,
    depth: usize,
) -> Outcome<Parity> {
    let model = parity::fixture_model(depth);
    parity_model_on(backend, probe, dir, name, &model)
}

/// [`parity_on`] for a fixture of any network of the family (`model`: its config, at the
/// fixture's width and class count).
pub fn parity_model_on(
    backend: Backend,
    probe: &Probe,
    dir: &Path,
    name: &str,
    model: &ResNetConfig,
) -> Outcome<Parity> {
    attempt(backend, probe, OneStep { dir, name, model })
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
    model: &'a ResNetConfig,
}

impl BackendTask for OneStep<'_> {
    type Output = Result<Parity, CheckError>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        parity::check_model::<B>(self.dir, self.name, self.model, &devices[0])
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

/// What `kiln bench` measures.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Backends to measure; empty: CUDA and hardware GPUs where present, and flex.
    pub backends: Vec<Backend>,
    /// Every network in every precision asked for.
    pub workloads: Vec<Workload>,
    /// Batch sizes for every workload; empty: each workload's own.
    pub batches: Vec<usize>,
    pub modes: Vec<Mode>,
    pub budget: Budget,
    /// Also time a training step's forward pass, backward pass and optimizer update apart.
    pub passes: bool,
    /// Also count a training step's kernels by kind, from cubecl's profiling (which makes every
    /// launch wait for the device: timings are then for where the time goes, not for speed).
    pub kernels: bool,
}

/// What a benchmark has got to, as it goes: rows take seconds to minutes each.
pub enum BenchProgress<'a> {
    /// A backend that cannot run here, or could not start.
    Skipped { backend: Backend, why: &'a str },
    /// Something about the device that bears on its figures (no cuDNN on CUDA, ...).
    Note { backend: Backend, note: &'a str },
    /// One row measured; `label` names its backend, workload, batch and mode.
    Measured {
        label: &'a str,
        row: &'a Measurement,
    },
    /// One row that failed (out of memory, say); the rest go on.
    RowFailed { label: &'a str, why: &'a str },
    /// A backend that failed as a whole (a panic deep inside burn).
    Failed { backend: Backend, why: &'a str },
}

/// Measures every workload, batch size and mode of `options` on each backend; a backend or row
/// that fails is reported through `progress` and the rest go on. The rows measured.
pub fn bench(
    options: &BenchOptions,
    progress: &mut dyn FnMut(BenchProgress<'_>),
) -> Vec<Measurement> {
    let probe = probe();
    let backends = match options.backends.is_empty() {
        true => default_bench_backends(&probe),
        false => options.backends.clone(),
    };
    let kernels = options.kernels.then(|| {
        let log = std::env::temp_dir().join(format!("kiln-kernels-{}.log", std::process::id()));
        kiln_backend::kernel_cache::profile_kernels_to(log.clone());
        crate::kernels::KernelLog::new(&log)
    });
    let extras = bench::Extras {
        passes: options.passes,
        kernels,
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
                let why = why.to_string();
                progress(BenchProgress::Skipped { backend, why: &why });
                continue;
            }
        };
        kiln_backend::configure_kernel_cache(&resolved);
        for note in kiln_backend::notices(backend) {
            progress(BenchProgress::Note {
                backend,
                note: &note,
            });
        }
        let task = Measure {
            backend,
            options,
            extras: &extras,
            memory: MemoryMeter::for_device(&resolved),
            device: resolved.devices[0].name.clone(),
            device_class: device_class(&resolved),
            progress: &mut *progress,
        };
        match guarded(|| run_on(&resolved, task)) {
            Ok(Ok(measured)) => rows.extend(measured),
            Ok(Err(why)) => {
                let why = why.to_string();
                progress(BenchProgress::Skipped { backend, why: &why });
            }
            Err(why) => progress(BenchProgress::Failed { backend, why: &why }),
        }
    }
    rows
}

/// PyTorch's figures as `xtask/scripts/bench_torch.py` writes them, to print beside kiln's.
pub fn read_pytorch_figures(path: &Path) -> anyhow::Result<Vec<Measurement>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read PyTorch's figures from {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a list of measurements as bench_torch.py writes them",
            path.display()
        )
    })
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
/// reported and the rest go on. `progress` is a trait object so that the binary's printing
/// does not instantiate the measurement for every backend again.
struct Measure<'a> {
    backend: Backend,
    options: &'a BenchOptions,
    extras: &'a bench::Extras,
    memory: MemoryMeter,
    device: String,
    device_class: String,
    progress: &'a mut dyn FnMut(BenchProgress<'_>),
}

impl BackendTask for Measure<'_> {
    type Output = Vec<Measurement>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        let Measure {
            backend,
            options,
            extras,
            mut memory,
            device: name,
            device_class,
            progress,
        } = self;
        let device = &devices[0];
        let target = Target {
            backend: backend.name(),
            device: &name,
            device_class: &device_class,
        };
        let mut rows = Vec::new();
        for workload in &options.workloads {
            let batches = match options.batches.is_empty() {
                true => workload.default_batches(),
                false => options.batches.clone(),
            };
            for &batch in &batches {
                for &mode in &options.modes {
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
                            options.budget,
                            extras,
                            &target,
                            device,
                            &mut memory,
                        )
                    });
                    let why = match measured {
                        Ok(Ok(row)) => {
                            progress(BenchProgress::Measured {
                                label: &label,
                                row: &row,
                            });
                            rows.push(row);
                            continue;
                        }
                        Ok(Err(e)) => e.to_string(),
                        Err(panic) => panic,
                    };
                    progress(BenchProgress::RowFailed {
                        label: &label,
                        why: &why,
                    });
                }
            }
        }
        rows
    }
}

/// Runs `f`, turning a panic (a backend that fails deep inside burn) into its message.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f))
        .map_err(|payload| kiln_train::panics::first_line(payload.as_ref()))
}
