//! The `kiln` command line: parse, pick the backend, call one library function.

mod bench;
mod compare;
mod cpu;
mod devices;
mod export;
mod plan;
mod predict;
mod report;
mod shard;
mod stats;
mod summary;
mod train;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use kiln_backend::{BackendChoice, DeviceSelection};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Train ResNet image classifiers on CUDA, wgpu or the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the compiled backends, the devices each one sees, and what `auto` would choose.
    #[command(
        after_help = "Examples:\n  kiln devices\n  kiln devices --backend cuda --devices all"
    )]
    Devices(DeviceArgs),

    /// Classify image files with a ResNet and print each one's top classes.
    #[command(
        after_help = "Examples:\n  kiln predict cat.jpg dog.png --model resnet50 --pretrained torchvision\n  kiln predict cat.jpg --model resnext50_32x4d --pretrained torchvision:IMAGENET1K_V2\n  kiln predict cat.jpg --pretrained hf-hub:timm/resnet50d.ra2_in1k\n  kiln predict img.png --model resnet18 --pretrained runs/x/model.safetensors --num-classes 10 --classes names.txt"
    )]
    Predict(predict::PredictArgs),

    /// Train a ResNet as a config describes, or resume a stopped run.
    #[command(
        after_help = "Examples:\n  kiln train --config configs/quickstart.toml\n  kiln train --config configs/cifar10-resnet18-sgd.toml --set epochs=50 --backend cuda --devices 0\n  kiln train --config configs/imagefolder-resnet50.toml --devices all --set accumulate=2\n  kiln train --resume runs/quickstart-20261130-120000"
    )]
    Train(train::TrainArgs),

    /// Compile and tune the GPU kernels a config's training uses, ahead of the run (kept in
    /// kiln's cache, so the run and every later one start at full speed).
    #[command(
        after_help = "Examples:\n  kiln warmup --config configs/quickstart.toml --backend wgpu\n  kiln warmup --config configs/imagefolder-resnet50.toml --backend cuda"
    )]
    Warmup(train::WarmupArgs),

    /// Find a learning rate: Leslie Smith's range test on a fresh copy of a config's model.
    #[command(
        name = "lr-find",
        after_help = "Examples:\n  kiln lr-find --config configs/quickstart.toml\n  kiln lr-find --config configs/cifar10-resnet18-sgd.toml --start 1e-5 --end 1 --steps 200 --out lr"
    )]
    LrFind(train::LrFindArgs),

    /// Describe a config's training set: per-channel mean and std for `normalize`, images per
    /// class, image sizes, unreadable files.
    #[command(
        after_help = "Examples:\n  kiln stats --config configs/imagefolder-resnet50.toml\n  kiln stats --config configs/quickstart.toml --json"
    )]
    Stats(stats::StatsArgs),

    /// Estimate the device memory a config's training takes and the batch that fits.
    #[command(
        after_help = "Examples:\n  kiln plan --config configs/imagefolder-resnet50.toml\n  kiln plan --config configs/cifar10-resnet18-sgd.toml --set batch_size=512 --memory 8GiB\n  kiln plan --config configs/quickstart.toml --measure"
    )]
    Plan(plan::PlanArgs),

    /// Write a config's data set (training and validation parts) as WebDataset tar shards.
    #[command(
        after_help = "Examples:\n  kiln shard --config configs/quickstart.toml --out data/digits-shards\n  kiln shard --config configs/imagefolder-resnet50.toml --out /data/shards --size 1GB"
    )]
    Shard(shard::ShardArgs),

    /// A ResNet stage by stage: output shapes, parameters, multiply-adds and training memory.
    #[command(
        after_help = "Examples:\n  kiln summary --model resnet50\n  kiln summary --model resnet18 --stem cifar --image-size 32 --num-classes 10 --json"
    )]
    Summary(summary::SummaryArgs),

    /// Evaluate a trained model on its data set's validation part.
    #[command(
        after_help = "Examples:\n  kiln eval --run runs/quickstart-20261130-120000\n  kiln eval --run runs/quickstart-20261130-120000 --mistakes 24\n  kiln eval --config configs/imagefolder-resnet50.toml --weights resnet50.pth"
    )]
    Eval(train::EvalArgs),

    /// Compare runs on one page: their curves overlaid, final and best figures, and the config
    /// keys they differ in.
    #[command(
        after_help = "Examples:\n  kiln report runs/quickstart-20261130-120000 runs/quickstart-20261130-130000\n  kiln report runs/* --out compare.html"
    )]
    Report(report::ReportArgs),

    /// Export a trained model for inference elsewhere: ONNX (batch norm folded, dynamic batch,
    /// the preprocessing and class names in its metadata) or torchvision-compatible safetensors.
    #[command(
        after_help = "Examples:\n  kiln export --run runs/quickstart-20261130-120000\n  kiln export --run runs/x --weights runs/x/best/model.safetensors --opset 13 --out best.onnx\n  kiln export --weights resnet50.pth --model resnet50 --num-classes 1000 --out resnet50.onnx"
    )]
    Export(export::ExportArgs),

    /// Check that backends agree: the same weights and batch on each, every stage of a training
    /// step compared with a reference backend.
    #[command(
        after_help = "Examples:\n  kiln compare --backends flex,ndarray,wgpu\n  kiln compare --backends cuda,flex --reference flex --model resnet50 --width 64 --image-size 64"
    )]
    Compare(compare::CompareArgs),

    /// Measure training and inference throughput, step time and peak memory.
    #[command(
        after_help = "Examples:\n  kiln bench\n  kiln bench --backends cuda --models resnet50 --batches 64,256 --reference torch.json\n\nFor PyTorch's figures beside kiln's, run `cargo xtask bench`."
    )]
    Bench(bench::BenchArgs),
}

/// Where to run: shared by every command that touches a device.
#[derive(Args, Clone)]
pub struct DeviceArgs {
    /// auto, cuda, wgpu, vulkan, metal, flex or ndarray. `auto` takes CUDA if present, else a
    /// hardware GPU through wgpu, else the CPU (flex).
    #[arg(long, default_value = "auto", value_parser = parse::<BackendChoice>)]
    pub backend: BackendChoice,

    /// One device index (0), a list (0,1,3) or `all`, numbered as `kiln devices` lists them.
    #[arg(long, default_value = "0", value_parser = parse::<DeviceSelection>)]
    pub devices: DeviceSelection,
}

fn parse<T: std::str::FromStr<Err = kiln_backend::BackendError>>(s: &str) -> Result<T, String> {
    s.parse()
        .map_err(|e: kiln_backend::BackendError| e.to_string())
}

fn main() -> ExitCode {
    // SAFETY: the first thing kiln does, before any thread starts.
    unsafe { kiln_backend::quiet_headless_vulkan() };
    install_logger();
    kiln_train::panics::install_hook();
    cpu::keep_freed_memory();
    cpu::join_compute_pool();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(args) => devices::run(args.backend, &args.devices),
        Command::Predict(args) => predict::run(args),
        Command::Train(args) => train::run_train(args),
        Command::Eval(args) => train::run_eval(args),
        Command::Report(args) => report::run(args),
        Command::Export(args) => export::run(args),
        Command::Warmup(args) => train::run_warmup(args),
        Command::Plan(args) => plan::run(args),
        Command::Stats(args) => stats::run(args),
        Command::Shard(args) => shard::run(args),
        Command::LrFind(args) => train::run_lr_find(args),
        Command::Summary(args) => summary::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, outermost first.
fn one_line(error: &anyhow::Error) -> String {
    error
        .chain()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// burn's and cubecl's warnings (and errors) reach the user; `RUST_LOG` says otherwise. wgpu's
/// own chatter about the platform stays at errors; the multi-machine network's is off, as kiln
/// reports a lost machine itself.
fn install_logger() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(
        "warn,wgpu_hal=error,wgpu_core=error,naga=error,burn_communication=off,burn_collective=off",
    ))
    .format_timestamp(None)
    .init();
}

/// `--stem imagenet|cifar|deep`, for the commands that take a network without a config.
pub(crate) fn parse_stem(s: &str) -> Result<kiln_models::Stem, String> {
    match s {
        "imagenet" => Ok(kiln_models::Stem::Imagenet),
        "cifar" => Ok(kiln_models::Stem::Cifar),
        "deep" => Ok(kiln_models::Stem::Deep),
        other => Err(format!(
            "unknown stem `{other}`: choose imagenet (the network's own), cifar or deep"
        )),
    }
}
