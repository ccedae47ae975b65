//! A burn-dataset `InMemDataset` trained with kiln: a program that keeps its data as burn does
//! (items of a `burn_dataset::Dataset`) hands it to kiln through `kiln_data::FromBurn`, registers
//! it under a name, and trains on it with kiln's loader, step and run folder, as a config on disk
//! would (checkpoints, the report, `classes.txt`). The images are drawn here: stripes across,
//! stripes down and a checkerboard, in random colours and periods, some of them held as PNG bytes
//! (decoded by kiln's workers) and the rest as pixels.
//!
//!   cargo run --release --example burn_dataset
//!
//! A run of a registered data set is resumed by a program that registers it again first
//! (`Start::Resume`), as each machine of a multi-machine run does.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use image::{Rgb, RgbImage};
use kiln::{BackendChoice, Console, DeviceSelection, Start, TrainRequest};
use kiln_config::TrainConfig;
use kiln_config::config::OptimizerConfig;
use kiln_data::burn_dataset::InMemDataset;
use kiln_data::{FromBurn, ImageData, LabelledImage, SharedDataset, Source, Splits, Transform};
use kiln_models::Stem;

const CLASSES: [&str; 3] = ["across", "down", "checkerboard"];
const SIDE: u32 = 32;

/// SplitMix64: the example's only randomness, so that it needs no generator crate.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `count` images of the three classes, drawn from `seed`.
fn stripes(count: usize, seed: u64) -> InMemDataset<LabelledImage> {
    let items = (0..count as u64)
        .map(|i| {
            let draw = |k: u64| mix(mix(seed) ^ mix(i * 16 + k));
            let label = (draw(0) % 3) as usize;
            let period = 2 + (draw(1) % 5) as u32;
            let phase = (draw(2) % 8) as u32;
            let colour = |k: u64| Rgb([draw(k) as u8, (draw(k) >> 8) as u8, (draw(k) >> 16) as u8]);
            let (ink, paper) = (colour(3), colour(4));
            let pixels = RgbImage::from_fn(SIDE, SIDE, |x, y| {
                let (across, down) = (((y + phase) / period) % 2, ((x + phase) / period) % 2);
                let on = match label {
                    0 => across == 0,
                    1 => down == 0,
                    _ => across == down,
                };
                let noise = (mix(draw(5) ^ u64::from(y * SIDE + x)) % 41) as i16 - 20;
                let base = if on { ink } else { paper };
                Rgb(base.0.map(|c| (i16::from(c) + noise).clamp(0, 255) as u8))
            });
            // A quarter as encoded files, as a burn user may keep them.
            let image = if i % 4 == 0 {
                let mut png = Vec::new();
                pixels
                    .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
                    .expect("PNG encodes in memory");
                ImageData::Encoded(png.into())
            } else {
                ImageData::Pixels(pixels)
            };
            LabelledImage { image, label }
        })
        .collect();
    InMemDataset::new(items)
}

fn main() -> anyhow::Result<()> {
    let classes: Vec<String> = CLASSES.map(String::from).to_vec();
    let train: SharedDataset = Arc::new(FromBurn::new(stripes(768, 1), classes.clone())?);
    let val: SharedDataset = Arc::new(FromBurn::new(stripes(192, 2), classes)?);
    kiln_data::register(
        "stripes",
        Splits {
            train,
            val: Some(val),
        },
    );

    let source = Source::Registered {
        name: "stripes".into(),
    };
    let mut config = TrainConfig::new(source, OptimizerConfig::adam(4e-3), 3, 64);
    config.name = "burn-dataset-stripes".into();
    config.model.name = "resnet18".into();
    // For 32x32 images: a 3x3 first convolution without max pool, a quarter of the channels.
    config.model.stem = Stem::Cifar;
    config.model.width = 16;
    let normalize = Transform::Normalize {
        mean: [0.5; 3],
        std: [0.25; 3],
    };
    config.data.train_transforms = vec![
        Transform::RandomHorizontalFlip { p: 0.5 },
        Transform::ToTensor,
        normalize.clone(),
    ];
    config.data.val_transforms = vec![Transform::ToTensor, normalize];
    config.data.workers = 2;
    config.logging.print_every = 4;

    kiln::panics::install_hook();
    let request = TrainRequest {
        start: Start::Built { config: &config },
        overrides: &[],
        backend: Some(BackendChoice::Auto),
        devices: Some(DeviceSelection::default()),
        cluster: None,
        stop: Arc::new(AtomicBool::new(false)),
    };
    kiln::train(request, &mut Console::new())?;
    Ok(())
}
