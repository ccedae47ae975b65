//! `kiln plan`: how much device memory a config's training takes, and what batch fits.

use std::path::PathBuf;

use clap::Args;
use kiln_config::TrainConfig;
use kiln_config::config::{BatchSize, MemorySize};
use kiln_config::plan::bytes;

use crate::train::ConfigOptions;

#[derive(Args)]
pub struct PlanArgs {
    /// The run's config (TOML).
    #[arg(long)]
    config: PathBuf,

    /// Plan for this much memory per device ("24GiB") instead of max_memory or what the
    /// device has free.
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,

    /// Also train a few steps on random images and report the measured peak.
    #[arg(long)]
    measure: bool,

    /// Print the report as JSON.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    options: ConfigOptions,
}

fn parse_size(text: &str) -> Result<u64, String> {
    let size: MemorySize = serde_json::from_value(serde_json::Value::String(text.into()))
        .map_err(|e| e.to_string().replace("max_memory", "--memory"))?;
    Ok(size.bytes())
}

pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let config = TrainConfig::load(&args.config, &args.options.overrides)?;
    let (backend, devices) = args.options.device_request(&config)?;
    let report = kiln::plan(&config, backend, &devices, args.memory, args.measure)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let plan = &report.plan;
    let devices = match plan.replicas {
        1 => format!("1 device ({})", report.backend),
        n => format!("{n} devices ({})", report.backend),
    };
    println!(
        "{}: {:.1} M parameters, {}x{} inputs, {} classes, on {devices}",
        plan.model,
        plan.parameters as f64 / 1e6,
        plan.input.0,
        plan.input.1,
        plan.classes
    );
    println!(
        "per device: weights {}, gradients {}, optimizer state {}, accumulated gradients {}, workspace {}, and {} per image",
        bytes(plan.weights_bytes),
        bytes(plan.gradient_bytes),
        bytes(plan.optimizer_bytes),
        bytes(plan.accumulated_gradient_bytes),
        bytes(plan.workspace_bytes),
        bytes(plan.bytes_per_image)
    );
    let batch = match config.batch_size {
        BatchSize::Fixed(n) => n.to_string(),
        BatchSize::Auto => format!(
            "\"auto\" ({})",
            report
                .auto_batch_size
                .map_or("nothing fits".into(), |n| n.to_string())
        ),
    };
    if let Some(estimate) = report.estimate_bytes {
        println!(
            "batch_size {batch}, accumulate {}: about {} per device",
            plan.accumulate,
            bytes(estimate)
        );
    }
    match report.budget {
        Some(budget) => println!(
            "{}{}: up to {} images per device; batch_size = \"auto\" would take {}",
            bytes(budget.bytes),
            budget.source,
            report
                .largest_per_device
                .map_or("no".into(), |n| n.to_string()),
            report
                .auto_batch_size
                .map_or("nothing".into(), |n| n.to_string())
        ),
        None => println!(
            "the device does not report its memory: give --memory (for example --memory 24GiB) to see what fits"
        ),
    }
    if let (Some(measured), Some(estimate)) = (&report.measured, report.estimate_bytes) {
        println!(
            "measured over 3 training steps: {} peak ({:+.0}% from the estimate), {:.2} s a step",
            bytes(measured.peak_bytes),
            (estimate as f64 / measured.peak_bytes as f64 - 1.0) * 100.0,
            measured.seconds_per_step
        );
    } else if args.measure {
        println!("this device cannot report memory use: nothing measured");
    }
    Ok(())
}
