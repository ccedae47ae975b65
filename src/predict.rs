//! `kiln predict`: parse, pick the device, call `kiln::predict`.

use std::path::PathBuf;

use crate::parse_stem;
use clap::Args;
use kiln_backend::{probe, resolve};
use kiln_data::EvalTransform;
use kiln_models::{ResNetConfig, Stem};
use kiln_train::predict::{PredictRequest, Weights};

use crate::DeviceArgs;

#[derive(Args)]
pub struct PredictArgs {
    /// Image files (JPEG, PNG, WebP, BMP, GIF, TIFF).
    #[arg(required = true)]
    images: Vec<PathBuf>,
    /// resnet18, resnet34, resnet50, resnet101 or resnet152.
    #[arg(long, default_value = "resnet50")]
    model: String,
    /// `torchvision` for torchvision's ImageNet weights, or a weight file (.pth, .safetensors).
    #[arg(long, default_value = "torchvision")]
    pretrained: String,
    /// Never download; use cached weights only.
    #[arg(long)]
    offline: bool,
    /// Classes of the model's classifier.
    #[arg(long, default_value_t = 1000)]
    num_classes: usize,
    /// A file with one class name per line (ImageNet's names are built in).
    #[arg(long)]
    classes: Option<PathBuf>,
    /// Channels of the first stage, for networks trained narrower than torchvision's 64.
    #[arg(long, default_value_t = 64)]
    width: usize,
    /// `imagenet` or `cifar`.
    #[arg(long, default_value = "imagenet", value_parser = parse_stem)]
    stem: Stem,
    /// The shorter side after resizing (torchvision's `Resize`).
    #[arg(long, default_value_t = 256)]
    resize: u32,
    /// The side of the center crop the model sees (torchvision's `CenterCrop`).
    #[arg(long, default_value_t = 224)]
    crop: u32,
    /// How many classes to print for each image.
    #[arg(long, default_value_t = 5)]
    top: usize,
    #[command(flatten)]
    device: DeviceArgs,
}

pub fn run(args: PredictArgs) -> anyhow::Result<()> {
    let model = ResNetConfig::from_name(&args.model)?
        .with_num_classes(args.num_classes)
        .with_width(args.width)
        .with_stem(args.stem);
    let request = PredictRequest {
        model,
        weights: Weights::parse(&args.pretrained, !args.offline),
        images: args.images,
        transform: EvalTransform {
            resize: args.resize,
            crop: args.crop,
            ..EvalTransform::imagenet()
        },
        class_names: args.classes,
        top: args.top,
    };
    let resolved = resolve(args.device.backend, &args.device.devices, &probe())?;
    let predictions = kiln::predict(&resolved, request)?;
    for prediction in predictions {
        println!("{}", prediction.image.display());
        for (name, probability) in prediction.top {
            println!("  {:6.2}%  {name}", probability * 100.0);
        }
    }
    Ok(())
}
