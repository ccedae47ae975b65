//! `cargo xtask bench data`: decode + resize + crop + normalize throughput on real JPEG
//! photographs at ImageNet-like sizes, kiln against torchvision in the same run.
//!
//! The images are cut from the photographs in `xtask/assets/photos` (shorter side 300 to 480
//! pixels, aspect 3:4 to 4:3, JPEG quality 90) into `target/bench/photos`, laid out as an
//! ImageFolder. Both sides run `Resize(256), CenterCrop(224), ToTensor, Normalize` on one
//! thread; kiln also runs with one worker per core, and reads the same photographs again from
//! WebDataset tar shards (`kiln shard`'s writer), which must keep up with the folder.

use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use image::codecs::jpeg::JpegEncoder;
use image::imageops::FilterType;
use kiln_data::shards::Shards;
use kiln_data::{Dataset, ImageFolder, ImageLimits, Loader, LoaderConfig, Pipeline, Transform};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

struct Options {
    count: usize,
    passes: usize,
}

fn parse(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        count: 256,
        passes: 3,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--count" => options.count = value.parse().context("--count takes a number")?,
            "--passes" => options.passes = value.parse().context("--passes takes a number")?,
            other => bail!("unknown option {other}; bench data takes --count N and --passes N"),
        }
    }
    Ok(options)
}

pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = parse(args)?;
    let photos = root.join("target/bench/photos");
    let (mean_width, mean_height) =
        make_photos(&root.join("xtask/assets/photos"), &photos, options.count)?;
    println!(
        "{} JPEG photographs, {mean_width:.0}x{mean_height:.0} on average, in {}",
        options.count,
        photos.display()
    );

    let folder: Arc<dyn Dataset> = Arc::new(ImageFolder::open(&photos, ImageLimits::default())?);
    let single = kiln_images_per_second(&folder, 0, options.passes)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let parallel = kiln_images_per_second(&folder, cores, options.passes)?;
    // The same photographs as WebDataset tar shards (`kiln shard`), read in place.
    let shard_dir = root.join("target/bench/photo-shards");
    let _ = std::fs::remove_dir_all(&shard_dir);
    let manifest = kiln_data::shards::write(&[("train", folder.as_ref())], &shard_dir, 16 << 20)?;
    let pattern = shard_dir.join(&manifest.splits["train"].pattern);
    let shards: Arc<dyn Dataset> = Arc::new(Shards::open(
        &pattern.to_string_lossy(),
        ImageLimits::default(),
    )?);
    let shards_single = kiln_images_per_second(&shards, 0, options.passes)?;
    let shards_parallel = kiln_images_per_second(&shards, cores, options.passes)?;
    let torchvision = torchvision_images_per_second(root, &photos, options.passes)?;

    println!();
    println!("| pipeline | threads | images/s | images/s per core | vs torchvision per core |");
    println!("|---|---|---|---|---|");
    let ratio = |per_core: f64| match torchvision {
        Some(reference) => format!("{:.2}x", per_core / reference),
        None => "-".into(),
    };
    if let Some(reference) = torchvision {
        println!("| torchvision (PIL) | 1 | {reference:.0} | {reference:.0} | 1.00x |");
    }
    println!(
        "| kiln | 1 | {single:.0} | {single:.0} | {} |",
        ratio(single)
    );
    let per_core = parallel / cores as f64;
    println!(
        "| kiln | {cores} workers | {parallel:.0} | {per_core:.0} | {} |",
        ratio(per_core)
    );
    println!(
        "| kiln, tar shards | 1 | {shards_single:.0} | {shards_single:.0} | {} |",
        ratio(shards_single)
    );
    let shards_per_core = shards_parallel / cores as f64;
    println!(
        "| kiln, tar shards | {cores} workers | {shards_parallel:.0} | {shards_per_core:.0} | {} |",
        ratio(shards_per_core)
    );
    if torchvision.is_none() {
        println!(
            "(torchvision not importable: run with a .venv holding torch and torchvision for the reference)"
        );
    }

    let report = serde_json::json!({
        "images": options.count,
        "mean_size": [mean_width, mean_height],
        "pipeline": "Resize(256), CenterCrop(224), ToTensor, Normalize",
        "kiln_images_per_s_1_thread": single,
        "kiln_images_per_s_all_cores": parallel,
        "kiln_shards_images_per_s_1_thread": shards_single,
        "kiln_shards_images_per_s_all_cores": shards_parallel,
        "shards": manifest.splits["train"].shards.len(),
        "cores": cores,
        "torchvision_images_per_s_1_thread": torchvision,
        "ratio_per_core": torchvision.map(|t| single / t),
    });
    let out = root.join("target/bench/data.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)?;
    println!("\nwritten to {}", out.display());
    Ok(())
}

/// Cuts `count` ImageNet-sized JPEGs out of the source photographs, in two class folders, the
/// same ones every time. Returns their mean size.
fn make_photos(sources: &Path, out: &Path, count: usize) -> anyhow::Result<(f64, f64)> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(sources)
        .with_context(|| format!("reading {}", sources.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    names.sort();
    let originals = names
        .iter()
        .map(|p| image::open(p).map(|i| i.to_rgb8()))
        .collect::<Result<Vec<_>, _>>()?;
    let _ = std::fs::remove_dir_all(out);
    let mut rng = Pcg64Mcg::seed_from_u64(2024);
    let (mut total_w, mut total_h) = (0.0, 0.0);
    for i in 0..count {
        let source = &originals[i % originals.len()];
        let (sw, sh) = source.dimensions();
        // A crop of 60-100% of the shorter side with an aspect of 3:4 to 4:3.
        let aspect: f64 = rng.random_range(0.75..=4.0 / 3.0);
        let side = rng.random_range(0.6..=1.0) * sw.min(sh) as f64;
        let (cw, ch) = if aspect >= 1.0 {
            ((side * aspect).min(sw as f64) as u32, side as u32)
        } else {
            (side as u32, (side / aspect).min(sh as f64) as u32)
        };
        let (x, y) = (rng.random_range(0..=sw - cw), rng.random_range(0..=sh - ch));
        let crop = image::imageops::crop_imm(source, x, y, cw, ch).to_image();
        let shorter: u32 = rng.random_range(300..=480);
        let scale = shorter as f64 / cw.min(ch) as f64;
        let (w, h) = ((cw as f64 * scale) as u32, (ch as f64 * scale) as u32);
        let resized = image::imageops::resize(&crop, w, h, FilterType::Triangle);
        let dir = out.join(if i % 2 == 0 { "even" } else { "odd" });
        std::fs::create_dir_all(&dir)?;
        let file = BufWriter::new(std::fs::File::create(dir.join(format!("{i:04}.jpg")))?);
        resized.write_with_encoder(JpegEncoder::new_with_quality(file, 90))?;
        total_w += w as f64;
        total_h += h as f64;
    }
    Ok((total_w / count as f64, total_h / count as f64))
}

/// Images per second through kiln's loader: one warm-up pass, then `passes` timed ones.
fn kiln_images_per_second(
    dataset: &Arc<dyn Dataset>,
    workers: usize,
    passes: usize,
) -> anyhow::Result<f64> {
    let pipeline = Pipeline::new(&[
        Transform::Resize {
            size: 256,
            interpolation: Default::default(),
        },
        Transform::CenterCrop { size: 224 },
        Transform::ToTensor,
        Transform::Normalize {
            mean: kiln_data::transforms::IMAGENET_MEAN,
            std: kiln_data::transforms::IMAGENET_STD,
        },
    ])?;
    let config = LoaderConfig {
        shuffle: false,
        workers,
        prefetch: 2 * workers,
        ..LoaderConfig::new(32, 0)
    };
    let loader = Loader::new(dataset.clone(), pipeline, config)?;
    let pass = |epoch: u64| -> anyhow::Result<usize> {
        let mut images = 0;
        for batch in loader.epoch(epoch) {
            images += batch?.labels.len();
        }
        Ok(images)
    };
    pass(0)?;
    let start = Instant::now();
    let mut images = 0;
    for epoch in 1..=passes as u64 {
        images += pass(epoch)?;
    }
    Ok(images as f64 / start.elapsed().as_secs_f64())
}

/// torchvision's images per second through the committed script, if torch is importable.
fn torchvision_images_per_second(
    root: &Path,
    photos: &Path,
    passes: usize,
) -> anyhow::Result<Option<f64>> {
    let python = crate::python(root);
    if !crate::torch_importable(&python) {
        return Ok(None);
    }
    let script = root.join("xtask/scripts/bench_torchvision_data.py");
    let output = Command::new(&python)
        .arg(&script)
        .arg(photos)
        .args(["--passes", &passes.to_string()])
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let line = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value = serde_json::from_str(line.trim())
        .with_context(|| format!("{} printed {line}", script.display()))?;
    Ok(report["images_per_s"].as_f64())
}
