//! `kiln export`: the flags, `kiln::export_model::export`, and the line saying what was written.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use kiln::export_model::{self, ExportOptions};
use kiln_models::Stem;
use kiln_models::onnx::DEFAULT_OPSET;

#[derive(Args)]
pub struct ExportArgs {
    /// A run directory: its final model, config and class names.
    #[arg(long, required_unless_present = "weights")]
    run: Option<PathBuf>,
    /// The weights to export: a kiln model.safetensors or a torchvision state dict (with --run,
    /// in place of the run's final model, e.g. `best/model.safetensors`).
    #[arg(long)]
    weights: Option<PathBuf>,
    /// `onnx`, or `safetensors` (torchvision's names and layout).
    #[arg(long, value_enum, default_value = "onnx")]
    format: Format,
    /// Where to write (default: model.onnx, or exported.safetensors, in the run directory; with
    /// --weights alone, model.onnx or model.safetensors here).
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// The ONNX opset (9 to 21).
    #[arg(long, default_value_t = DEFAULT_OPSET)]
    opset: i64,
    /// Keep batch norm as BatchNormalization nodes instead of folding it into the convolutions.
    #[arg(long)]
    no_fold: bool,
    /// The input's side, fixed in the ONNX graph (default: the run's evaluation size; 224 for
    /// --weights without --run). 0 leaves height and width dynamic.
    #[arg(long)]
    image_size: Option<usize>,
    /// Without --run: resnet18 ... resnet152, resnext50_32x4d, wide_resnet50_2, resnet50d, ...
    #[arg(long, default_value = "resnet50")]
    model: String,
    /// Without --run: the classifier's classes.
    #[arg(long, default_value_t = 1000)]
    num_classes: usize,
    /// Without --run: channels of the first stage (torchvision's 64).
    #[arg(long, default_value_t = 64)]
    width: usize,
    /// Without --run: `imagenet` or `cifar`.
    #[arg(long, default_value = "imagenet", value_parser = crate::parse_stem)]
    stem: Stem,
    /// A file with one class name per line, recorded in the ONNX metadata (a run's own names
    /// by default; ImageNet's for 1000 classes without --run).
    #[arg(long)]
    classes: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Onnx,
    Safetensors,
}

impl From<Format> for export_model::Format {
    fn from(format: Format) -> Self {
        match format {
            Format::Onnx => export_model::Format::Onnx,
            Format::Safetensors => export_model::Format::Safetensors,
        }
    }
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    let options = ExportOptions {
        run: args.run,
        weights: args.weights,
        format: args.format.into(),
        out: args.out,
        opset: args.opset,
        no_fold: args.no_fold,
        image_size: args.image_size,
        model: args.model,
        num_classes: args.num_classes,
        width: args.width,
        stem: args.stem,
        classes: args.classes,
    };
    let exported = export_model::export(&options)?;
    println!("wrote {}", exported.path.display());
    Ok(())
}
