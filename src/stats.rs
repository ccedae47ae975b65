//! `kiln stats`: a config's training set described (`kiln_data::stats`).

use std::path::PathBuf;

use clap::Args;
use kiln_config::TrainConfig;
use kiln_data::max_workers;
use kiln_data::stats::{DataStats, statistics};

#[derive(Args)]
pub struct StatsArgs {
    /// The config whose training set (and its transforms up to `normalize`) to describe.
    #[arg(long)]
    config: PathBuf,
    /// Override a config key, for example --set data.workers=8 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Print the statistics as JSON, for scripts.
    #[arg(long)]
    json: bool,
}

/// How much larger than the smallest class the largest may be before kiln warns.
const IMBALANCE_WARNING: f64 = 10.0;

pub fn run(args: StatsArgs) -> anyhow::Result<()> {
    let config = TrainConfig::load(&args.config, &args.overrides)?;
    let data = &config.data;
    let splits = data.source.open(config.seed, data.image_limits())?;
    let dataset = splits.train;
    let bar = indicatif::ProgressBar::new(dataset.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} images, {eta} left")
            .expect("a valid template"),
    );
    let workers = data.workers.clamp(1, max_workers());
    let stats = statistics(
        &dataset,
        &data.train_transforms,
        config.seed,
        workers,
        data.max_resize_pixels,
        &|| bar.inc(1),
    );
    bar.finish_and_clear();
    let stats = stats?;
    match args.json {
        true => println!("{}", serde_json::to_string_pretty(&stats)?),
        false => print!("{}", report(&stats)),
    }
    if let Some(ratio) = stats.imbalance().filter(|&r| r > IMBALANCE_WARNING) {
        eprintln!(
            "warning: the largest class has {ratio:.1}x the images of the smallest; consider loss.class_weights = \"balanced\""
        );
    }
    Ok(())
}

/// The statistics for people: the normalize line to paste first.
fn report(stats: &DataStats) -> String {
    let three = |v: [f64; 3]| format!("[{:.4}, {:.4}, {:.4}]", v[0], v[1], v[2]);
    let mut text = format!(
        "{} training images in {} classes{}\n",
        stats.images,
        stats.classes.len(),
        match stats.unreadable.len() {
            0 => String::new(),
            n => format!(" ({n} more could not be read)"),
        }
    );
    text += &format!(
        "per channel after the transforms before normalize: mean {}, std {}\n",
        three(stats.mean),
        three(stats.std)
    );
    text += &format!(
        "  {{ op = \"normalize\", mean = {}, std = {} }}\n",
        three(stats.mean),
        three(stats.std)
    );
    text += "images per class:\n";
    for (name, count) in &stats.classes {
        text += &format!("  {name}: {count}\n");
    }
    text += "sizes as stored (width x height):\n";
    for ((width, height), count) in stats.sizes.iter().take(10) {
        text += &format!("  {width}x{height}: {count}\n");
    }
    if stats.sizes.len() > 10 {
        let rest: usize = stats.sizes[10..].iter().map(|(_, n)| n).sum();
        text += &format!("  {} other sizes: {rest}\n", stats.sizes.len() - 10);
    }
    if !stats.unreadable.is_empty() {
        text += "could not be read:\n";
        for why in &stats.unreadable {
            text += &format!("  {why}\n");
        }
    }
    text
}
