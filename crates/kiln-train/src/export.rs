//! `kiln export` as a library function: a run's model (or a weight file) as ONNX for inference
//! elsewhere, or as torchvision-compatible safetensors. It returns what it wrote; the binary
//! says so.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use kiln_backend::{Backend, BackendChoice, BackendTask, DeviceSelection, probe, resolve, run_on};
use kiln_config::TrainConfig;
use kiln_data::transforms::{IMAGENET_MEAN, IMAGENET_STD};
use kiln_data::{Pipeline, Transform};
use kiln_models::onnx::{DEFAULT_OPSET, OPSETS, OnnxOptions, save_onnx};
use kiln_models::weights::{self, save_safetensors};
use kiln_models::{ResNetConfig, Stem};
use kiln_records::RunDir;

/// What `kiln export` writes: a run's model or a weight file (with the architecture given
/// here), as ONNX or torchvision-compatible safetensors. Plain data: the binary's flags fill it.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// A run directory: its final model, config and class names.
    pub run: Option<PathBuf>,
    /// The weights to export (with `run`, in place of the run's final model).
    pub weights: Option<PathBuf>,
    pub format: Format,
    /// Where to write (default: model.onnx, or exported.safetensors, in the run directory;
    /// with `weights` alone, model.onnx or model.safetensors here).
    pub out: Option<PathBuf>,
    /// The ONNX opset (one of [`OPSETS`]).
    pub opset: i64,
    /// Keep batch norm as BatchNormalization nodes instead of folding it into the convolutions.
    pub no_fold: bool,
    /// The input's side, fixed in the ONNX graph (default: the run's evaluation size; 224
    /// without a run). 0 leaves height and width dynamic.
    pub image_size: Option<usize>,
    /// Without a run: the network's name, classes, width and stem.
    pub model: String,
    pub num_classes: usize,
    pub width: usize,
    pub stem: Stem,
    /// A file with one class name per line, recorded in the ONNX metadata.
    pub classes: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Onnx,
    Safetensors,
}

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    pub path: PathBuf,
    pub format: Format,
}

/// What to export and how: the model to build, its weights, and the ONNX file's metadata.
struct Export {
    model: ResNetConfig,
    weights: PathBuf,
    out: PathBuf,
    format: Format,
    options: OnnxOptions,
}

/// Exports as `args` says, on a CPU backend.
pub fn export(args: &ExportOptions) -> anyhow::Result<Exported> {
    if args.format == Format::Onnx && !OPSETS.contains(&args.opset) {
        bail!(
            "--opset {} is not one kiln writes: choose {} to {} (default {DEFAULT_OPSET})",
            args.opset,
            OPSETS.start(),
            OPSETS.end()
        );
    }
    let export = match &args.run {
        Some(dir) => from_run(args, dir)?,
        None => from_weights(args)?,
    };
    // The export reads and writes weights: the CPU does that at once, with no kernels to
    // compile or devices to wake.
    let cpu = Backend::ALL
        .into_iter()
        .find(|b| b.is_cpu() && b.is_compiled())
        .map_or(BackendChoice::Auto, BackendChoice::Explicit);
    let resolved = resolve(cpu, &DeviceSelection::default(), &probe())?;
    let exported = Exported {
        path: export.out.clone(),
        format: export.format,
    };
    run_on(&resolved, export)??;
    Ok(exported)
}

/// A run's model: its config says the architecture, its data the classes and preprocessing.
fn from_run(args: &ExportOptions, dir: &Path) -> anyhow::Result<Export> {
    let run = RunDir::open(dir);
    if !run.config_path().is_file() {
        bail!(
            "{} is not a kiln run directory (it has no config.toml): give the directory `kiln train` printed",
            dir.display()
        );
    }
    let config = TrainConfig::load(&run.config_path(), &[])?;
    let weights = args.weights.clone().unwrap_or_else(|| run.model_path());
    if !weights.is_file() {
        bail!(
            "{} has no model yet (it is written at the end of training): give --weights <file>, for example {}",
            weights.display(),
            run.path.join("best/model.safetensors").display()
        );
    }
    let classes = match &args.classes {
        Some(file) => read_classes(file)?,
        None => run.classes().with_context(|| {
            format!(
                "{} has no classes.txt (older runs did not write one): give --classes <file>, one name per line",
                dir.display()
            )
        })?,
    };
    let model = config.model.resnet(classes.len())?;
    let transforms = &config.data.val_transforms;
    let size = Pipeline::new(transforms)?
        .output_size(config.data.source.image_size())
        .map(|(w, h)| [h as usize, w as usize]);
    let image_size = match args.image_size {
        Some(0) => None,
        Some(side) => Some([side, side]),
        None => size,
    };
    let format_out = |name: &str| run.path.join(name);
    Ok(Export {
        out: args.out.clone().unwrap_or_else(|| match args.format {
            Format::Onnx => format_out("model.onnx"),
            Format::Safetensors => format_out("exported.safetensors"),
        }),
        options: onnx_options(args, &model, image_size, transforms, &classes, &weights),
        model,
        weights,
        format: args.format,
    })
}

/// A weight file with the architecture from the command line, preprocessed as torchvision's
/// ImageNet models are (as `kiln predict` does).
fn from_weights(args: &ExportOptions) -> anyhow::Result<Export> {
    let weights = args
        .weights
        .clone()
        .context("give a run directory or a weight file to export")?;
    let model = ResNetConfig::from_name(&args.model)?
        .with_num_classes(args.num_classes)
        .with_width(args.width)
        .with_input_stem(args.stem);
    let classes = match &args.classes {
        Some(file) => read_classes(file)?,
        None if args.num_classes == 1000 => (kiln_models::pretrained::imagenet_classes())
            .into_iter()
            .map(String::from)
            .collect(),
        None => (0..args.num_classes)
            .map(|i| format!("class {i}"))
            .collect(),
    };
    if classes.len() != args.num_classes {
        bail!(
            "--classes lists {} names for --num-classes {}",
            classes.len(),
            args.num_classes
        );
    }
    let image_size = match args.image_size.unwrap_or(224) {
        0 => None,
        side => Some([side, side]),
    };
    let transforms = [
        Transform::Resize {
            size: 256,
            interpolation: Default::default(),
        },
        Transform::CenterCrop { size: 224 },
        Transform::ToTensor,
        Transform::Normalize {
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        },
    ];
    Ok(Export {
        out: args.out.clone().unwrap_or_else(|| match args.format {
            Format::Onnx => PathBuf::from("model.onnx"),
            Format::Safetensors => PathBuf::from("model.safetensors"),
        }),
        options: onnx_options(args, &model, image_size, &transforms, &classes, &weights),
        model,
        weights,
        format: args.format,
    })
}

/// The ONNX options, with the metadata a user of the file needs: the preprocessing the model
/// expects (the evaluation transforms, as the config spells them, and the normalization on
/// pixels scaled to 0-1), the class names in output order, and where the weights came from.
fn onnx_options(
    args: &ExportOptions,
    model: &ResNetConfig,
    image_size: Option<[usize; 2]>,
    transforms: &[Transform],
    classes: &[String],
    weights: &Path,
) -> OnnxOptions {
    let (mean, std) = transforms
        .iter()
        .find_map(|t| match t {
            Transform::Normalize { mean, std } => Some((*mean, *std)),
            _ => None,
        })
        .unwrap_or(([0.0; 3], [1.0; 3]));
    let json = |value: serde_json::Value| value.to_string();
    // As the config spells them (0.485, not 0.48500001430511475).
    let decimal = |values: [f32; 3]| values.map(|v| v.to_string().parse::<f64>().unwrap_or(0.0));
    let (mean, std) = (decimal(mean), decimal(std));
    let metadata = vec![
        (
            "model".into(),
            format!(
                "{} ({} stem, width {}, {} classes)",
                model.name(),
                model.stem.name(),
                model.width,
                model.num_classes
            ),
        ),
        ("classes".into(), json(serde_json::json!(classes))),
        (
            "normalize".into(),
            json(
                serde_json::json!({ "mean": mean, "std": std, "input": "RGB, NCHW, pixels / 255" }),
            ),
        ),
        (
            "preprocessing".into(),
            serde_json::to_string(transforms).unwrap_or_default(),
        ),
        (
            "batch_norm".into(),
            if args.no_fold { "kept" } else { "folded" }.into(),
        ),
        ("weights".into(), weights.display().to_string()),
    ];
    OnnxOptions {
        opset: args.opset,
        fold_batch_norm: !args.no_fold,
        image_size,
        metadata,
    }
}

fn read_classes(file: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read class names from {}", file.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

impl BackendTask for Export {
    type Output = anyhow::Result<()>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Self::Output {
        let model = self.model.init::<B::InnerBackend>(&devices[0])?;
        let (model, report) = weights::load(model, &self.weights)?;
        if !report.left_out.is_empty() {
            bail!(
                "{} holds a classifier for another number of classes than {}: pass --num-classes with the count the model was trained on",
                self.weights.display(),
                self.model.num_classes
            );
        }
        match self.format {
            Format::Onnx => save_onnx(&model, &self.out, &self.options)?,
            Format::Safetensors => save_safetensors(&model, &self.out)?,
        }
        Ok(())
    }
}
