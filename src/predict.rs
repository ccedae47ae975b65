//! `kiln predict`: parse, pick the device, call `kiln::predict`.

use std::path::PathBuf;

use crate::parse_stem;
use clap::Args;
use kiln_backend::{probe, resolve};
use kiln_models::Stem;
use kiln_train::predict::{PredictRequest, PredictSetup};

use crate::DeviceArgs;

#[derive(Args)]
pub struct PredictArgs {
    /// Image files (JPEG, PNG, WebP, BMP, GIF, TIFF).
    #[arg(required = true)]
    images: Vec<PathBuf>,
    /// The network (resnet18 ... resnet152, resnext50_32x4d, wide_resnet50_2, resnet50d, ...);
    /// by default the one the weights name (a Hub model's config), else resnet50.
    #[arg(long)]
    model: Option<String>,
    /// `torchvision` (IMAGENET1K_V1), `torchvision:IMAGENET1K_V2` (or another of torchvision's
    /// weights, or DEFAULT), `hf-hub:timm/resnet50d.ra2_in1k`, or a weight file (.pth,
    /// .safetensors).
    #[arg(long, default_value = "torchvision")]
    pretrained: String,
    /// Never download; use cached weights only (HF_HUB_OFFLINE=1 does the same for the Hub).
    #[arg(long)]
    offline: bool,
    /// Classes of the model's classifier (by default the weights', else 1000).
    #[arg(long)]
    num_classes: Option<usize>,
    /// A file with one class name per line (ImageNet's names are built in).
    #[arg(long)]
    classes: Option<PathBuf>,
    /// Channels of the first stage, for networks trained narrower than torchvision's 64.
    #[arg(long, default_value_t = 64)]
    width: usize,
    /// `imagenet` (the network's own), `cifar` or `deep`.
    #[arg(long, default_value = "imagenet", value_parser = parse_stem)]
    stem: Stem,
    /// The shorter side after resizing (by default the weights' published transform's, else
    /// 256).
    #[arg(long)]
    resize: Option<u32>,
    /// The side of the center crop the model sees (by default the weights', else 224).
    #[arg(long)]
    crop: Option<u32>,
    /// How many classes to print for each image.
    #[arg(long, default_value_t = 5)]
    top: usize,
    #[command(flatten)]
    device: DeviceArgs,
}

pub fn run(args: PredictArgs) -> anyhow::Result<()> {
    let setup = PredictSetup {
        model: args.model,
        pretrained: args.pretrained,
        download: !args.offline,
        num_classes: args.num_classes,
        width: args.width,
        stem: args.stem,
        resize: args.resize,
        crop: args.crop,
    };
    let request = PredictRequest {
        setup,
        images: args.images,
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
