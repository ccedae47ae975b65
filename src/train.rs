//! `kiln train`, `eval`, `lr-find` and `warmup`: their flags, the one library call each makes,
//! and what the binary prints of its answer.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use clap::Args;
use kiln::{BackendChoice, Console, DeviceSelection, Start, TrainRequest};
use kiln_config::TrainConfig;
use kiln_records::run_dir::{self, EvalSource};
use kiln_train::RunEnd;
use kiln_train::cluster::launch::Launch;

#[derive(Args)]
pub struct TrainArgs {
    /// The run's config (TOML); see configs/.
    #[arg(long, required_unless_present = "resume")]
    config: Option<PathBuf>,

    /// Continue the run in this run directory from its latest checkpoint.
    #[arg(long, conflicts_with = "config")]
    resume: Option<PathBuf>,

    #[command(flatten)]
    options: ConfigOptions,

    #[command(flatten)]
    cluster: ClusterOptions,
}

/// A run over several machines: start the same command on each, with its own --node-rank.
/// Under SLURM's srun or a torchrun-style launcher these come from the environment (see
/// `kiln_train::cluster::launch`); a flag given wins over it.
#[derive(Args)]
struct ClusterOptions {
    /// Machines in the run (each trains on its --devices; batch_size is split over all).
    /// Default: the launcher's process count, else 1.
    #[arg(long)]
    nodes: Option<usize>,

    /// This machine's number, 0 to nodes-1. Machine 0 runs the coordinator. Default: the
    /// launcher's rank, else 0.
    #[arg(long)]
    node_rank: Option<usize>,

    /// host:port of the coordinator on machine 0, reachable from every machine.
    #[arg(long)]
    coordinator: Option<String>,

    /// host:port where this machine serves gradients to the others (default: its address on
    /// the route to the coordinator, port = coordinator's + 1 + node rank).
    #[arg(long)]
    node_address: Option<String>,
}

impl ClusterOptions {
    /// The run's machines from the flags, each missing one from `launch`.
    fn cluster(&self, launch: Option<&Launch>) -> anyhow::Result<Option<kiln::Cluster>> {
        let nodes = self.nodes.or(launch.map(|l| l.processes)).unwrap_or(1);
        if nodes <= 1 {
            return Ok(None);
        }
        let rank = self.node_rank.or(launch.map(|l| l.rank)).unwrap_or(0);
        if rank >= nodes {
            bail!(
                "--node-rank {rank} is out of range for --nodes {nodes}: use 0 to {}",
                nodes - 1
            );
        }
        let coordinator = self
            .coordinator
            .clone()
            .or(launch.map(|l| l.coordinator.clone()));
        let Some(coordinator) = coordinator else {
            bail!("--nodes {nodes} needs --coordinator host:port (machine 0's address)");
        };
        Ok(Some(kiln::Cluster {
            nodes,
            rank,
            coordinator,
            node_address: self.node_address.clone(),
        }))
    }
}

/// What both `train` and `eval` take besides the config: overrides and where to run.
#[derive(Args)]
pub(crate) struct ConfigOptions {
    /// Override a config key, for example --set optimizer.lr=0.01 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) overrides: Vec<String>,

    /// auto, cuda, wgpu, vulkan, metal, flex or ndarray (default: the config's, else auto).
    #[arg(long)]
    backend: Option<String>,

    /// One device index, a list or `all` (default: the config's, else 0).
    #[arg(long)]
    devices: Option<String>,
}

#[derive(Args)]
pub struct EvalArgs {
    /// A run directory: its config and final model (or --weights).
    #[arg(long, required_unless_present = "config")]
    run: Option<PathBuf>,

    /// A config naming the data set and model, with --weights.
    #[arg(long, conflicts_with = "run", requires = "weights")]
    config: Option<PathBuf>,

    /// The weights to evaluate: a kiln model.safetensors or a torchvision state dict.
    #[arg(long)]
    weights: Option<PathBuf>,

    /// Test-time augmentation: `hflip` averages each image's softmax with its mirror's
    /// (as `--set eval.tta=\"hflip\"`).
    #[arg(long)]
    tta: Option<String>,

    /// Also write a page of the N most confident mistakes and the N least confident right
    /// answers, as thumbnails (into the run folder as mistakes.html, or --out).
    #[arg(long, value_name = "N")]
    mistakes: Option<usize>,

    /// Where --mistakes writes its page.
    #[arg(long, requires = "mistakes")]
    out: Option<PathBuf>,

    #[command(flatten)]
    options: ConfigOptions,
}

impl ConfigOptions {
    /// The backend and devices the command line gives, if it does.
    fn device_flags(&self) -> anyhow::Result<(Option<BackendChoice>, Option<DeviceSelection>)> {
        let backend = self.backend.as_deref().map(str::parse).transpose()?;
        let devices = self.devices.as_deref().map(str::parse).transpose()?;
        Ok((backend, devices))
    }

    /// The backend and devices: the command line's, else the config's.
    pub(crate) fn device_request(
        &self,
        config: &TrainConfig,
    ) -> anyhow::Result<(BackendChoice, DeviceSelection)> {
        let (backend, devices) = self.device_flags()?;
        let devices = match devices {
            Some(devices) => devices,
            None => config.device.devices.parse()?,
        };
        Ok((backend.unwrap_or(config.device.backend), devices))
    }
}

pub fn run_train(mut args: TrainArgs) -> anyhow::Result<()> {
    let flags = &args.cluster;
    // With every cluster flag given, the launcher's variables are neither needed nor read.
    let launch =
        match flags.nodes.is_some() && flags.node_rank.is_some() && flags.coordinator.is_some() {
            true => None,
            false => Launch::from_env(|key| std::env::var(key).ok())?,
        };
    if let Some(launch) = &launch {
        let flags = &args.cluster;
        let given =
            flags.nodes.is_some() || flags.node_rank.is_some() || flags.coordinator.is_some();
        let wins = match given || args.options.devices.is_some() {
            true => "; the flags given on the command line win over it",
            false => "",
        };
        eprintln!("{}{wins}", launch.describe());
        if args.options.devices.is_none() {
            args.options.devices = launch.local_device.map(|d| d.to_string());
        }
    }
    let cluster = args.cluster.cluster(launch.as_ref())?;
    let start = match (&args.config, &args.resume) {
        (_, Some(dir)) => Start::Resume { run: dir },
        (Some(path), None) => Start::New { config: path },
        (None, None) => bail!("give --config <file> or --resume <run directory>"),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // The first Ctrl-C finishes the step and checkpoints; a second one ends at once.
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\nstopping after this step (Ctrl-C again to quit at once)");
    })
    .context("installing the Ctrl-C handler")?;
    let (backend, devices) = args.options.device_flags()?;
    let request = TrainRequest {
        start,
        overrides: &args.options.overrides,
        backend,
        devices,
        cluster,
        stop,
    };
    if let RunEnd::Finished { last, .. } = kiln::train(request, &mut Console::new())?
        && let Some(top1) = last.and_then(|s| s.val_top1)
    {
        println!("validation top-1: {:.2}%", top1 * 100.0);
    }
    Ok(())
}

pub fn run_eval(mut args: EvalArgs) -> anyhow::Result<()> {
    if let Some(tta) = &args.tta {
        args.options.overrides.push(format!("eval.tta = {tta:?}"));
    }
    let source = match (&args.run, &args.config, &args.weights) {
        (Some(run), _, weights) => EvalSource::Run {
            run,
            weights: weights.as_deref(),
        },
        (None, Some(config), Some(weights)) => EvalSource::Config { config, weights },
        _ => bail!("give --run <run directory>, or --config <file> --weights <file>"),
    };
    let (config, weights) = run_dir::eval_inputs(source, &args.options.overrides)?;
    let (backend, devices) = args.options.device_request(&config)?;
    let result = kiln::evaluate(&config, weights.clone(), backend, &devices)?;
    let skipped = match result.skipped {
        0 => String::new(),
        n => format!(", {n} images skipped"),
    };
    println!(
        "{} images: loss {:.4}, top-1 {:.2}%, top-5 {:.2}%{skipped}{}",
        result.images,
        result.loss,
        result.top1 * 100.0,
        result.top5 * 100.0,
        match config.eval.tta {
            kiln_config::config::Tta::None => "",
            kiln_config::config::Tta::Hflip => " (each image averaged with its mirror)",
        }
    );
    print!("{}", result.confusion.report(&result.class_names));
    if let Some(count) = args.mistakes {
        let out = (args.out.clone())
            .or_else(|| args.run.as_ref().map(|run| run.join("mistakes.html")))
            .unwrap_or_else(|| PathBuf::from("mistakes.html"));
        let title = format!("kiln eval: mistakes of {}", weights.display());
        let page = kiln::mistakes_page(&config, &result, count, &title)?;
        std::fs::write(&out, page).with_context(|| format!("writing {}", out.display()))?;
        println!("wrote {}", out.display());
    }
    Ok(())
}

#[derive(Args)]
pub struct LrFindArgs {
    /// The config whose model, optimizer and training data to test.
    #[arg(long)]
    config: PathBuf,
    /// The first learning rate.
    #[arg(long, default_value_t = 1e-7)]
    start: f64,
    /// The last learning rate.
    #[arg(long, default_value_t = 10.0)]
    end: f64,
    /// Steps from the first rate to the last (fewer if the loss diverges).
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Where to write lr-find.csv and lr-find.svg.
    #[arg(long, default_value = ".")]
    out: PathBuf,

    #[command(flatten)]
    options: ConfigOptions,
}

pub fn run_lr_find(args: LrFindArgs) -> anyhow::Result<()> {
    let config = TrainConfig::load(&args.config, &args.options.overrides)?;
    let (backend, devices) = args.options.device_request(&config)?;
    let options = kiln::LrFindOptions {
        start: args.start,
        end: args.end,
        steps: args.steps,
        ..kiln::LrFindOptions::default()
    };
    let bar = indicatif::ProgressBar::new(args.steps as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .expect("a valid template"),
    );
    let result = kiln::lr_find(&config, backend, &devices, options, &mut |_, point| {
        bar.inc(1);
        bar.set_message(format!("lr {:.2e}, loss {:.4}", point.lr, point.smoothed));
    });
    bar.finish_and_clear();
    let result = result?;
    let [csv, svg] = kiln_train::lr_find::write_files(&result, &args.out)
        .with_context(|| format!("writing the results into {}", args.out.display()))?;
    let ending = match result.diverged {
        true => "the loss diverged, which ended the test",
        false => "the range ended without the loss diverging",
    };
    match result.suggestion {
        Some(lr) => println!(
            "suggested learning rate: {lr:.2e} (where the smoothed loss falls fastest); {} steps, {ending}",
            result.points.len()
        ),
        None => println!(
            "no suggestion: only {} steps before {ending}; try a lower --start",
            result.points.len()
        ),
    }
    println!("wrote {} and {}", csv.display(), svg.display());
    Ok(())
}

#[derive(Args)]
pub struct WarmupArgs {
    /// The config whose training kernels to compile and tune.
    #[arg(long)]
    config: PathBuf,

    #[command(flatten)]
    options: ConfigOptions,
}

pub fn run_warmup(args: WarmupArgs) -> anyhow::Result<()> {
    let config = TrainConfig::load(&args.config, &args.options.overrides)?;
    let (backend, devices) = args.options.device_request(&config)?;
    let start = std::time::Instant::now();
    let mut bar: Option<indicatif::ProgressBar> = None;
    // A stage counts as done once the next one begins.
    let mut started = false;
    let cache = kiln::warmup(&config, backend, &devices, &mut |progress| match progress {
        kiln::WarmUpProgress::Stages(stages) => bar = Some(warmup_bar(stages)),
        kiln::WarmUpProgress::Stage(stage) => {
            if let Some(bar) = &bar {
                if std::mem::replace(&mut started, true) {
                    bar.inc(1);
                }
                bar.set_message(stage.to_string());
            }
        }
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let cache = cache?;
    let seconds = start.elapsed().as_secs_f64();
    match cache {
        kiln::KernelCache::Kiln(folder) => println!(
            "warmed up in {seconds:.1} s; kernels and tuning kept in {}",
            folder.display()
        ),
        kiln::KernelCache::User(file) => println!(
            "warmed up in {seconds:.1} s; kernels are kept where {} says",
            file.display()
        ),
        kiln::KernelCache::None => {
            println!("nothing to warm up: this backend runs on the CPU and compiles no kernels")
        }
    }
    Ok(())
}

/// The bar of `kiln warmup`'s stages, ticking each second through a long compile.
fn warmup_bar(stages: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(stages as u64).with_style(
        indicatif::ProgressStyle::with_template(
            "warming up [{bar:30}] {pos}/{len} {msg} ({elapsed})",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(std::time::Duration::from_secs(1));
    bar
}
