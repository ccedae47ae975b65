//! `kiln predict`: the top classes of a few image files, as torchvision would score them.

use std::path::{Path, PathBuf};

use burn::tensor::activation::softmax;
use burn::tensor::{Tensor, TensorData, backend::Backend};
use kiln_data::{DataError, EvalTransform, ImageLimits, load_rgb};
use kiln_models::eval_transform::EvalInterpolation;
use kiln_models::pretrained::{self, Pretrained, PretrainedError};
use kiln_models::weights::{self, WeightsError};
use kiln_models::{ModelError, ResNetConfig, Stem};

#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Pretrained(#[from] PretrainedError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("{} holds a classifier for another number of classes than the {num_classes} asked for: pass --num-classes with the count the model was trained on", path.display())]
    ClassCount { path: PathBuf, num_classes: usize },
    #[error("{} lists {found} class names, the model has {num_classes} classes", path.display())]
    ClassNames {
        path: PathBuf,
        found: usize,
        num_classes: usize,
    },
    #[error("cannot read class names from {}: {reason}", path.display())]
    ClassFile { path: PathBuf, reason: String },
}

/// `kiln predict`'s choices, before the weights are found: the weights (`torchvision`,
/// `torchvision:IMAGENET1K_V2`, `hf-hub:timm/resnet50d.ra2_in1k` or a file) may name the network
/// and their eval transform, which the choices left open take.
#[derive(Debug, Clone)]
pub struct PredictSetup {
    /// The network; `None` takes the one the weights name (the Hub's config), else resnet50.
    pub model: Option<String>,
    pub pretrained: String,
    pub download: bool,
    /// The classifier's classes; `None` takes the weights' (the Hub's config), else 1000.
    pub num_classes: Option<usize>,
    pub width: usize,
    pub stem: Stem,
    /// The shorter side after resizing and the crop; `None` takes the weights' published eval
    /// transform (torchvision's V2 resize 232; timm's `crop_pct`), else 256 and 224.
    pub resize: Option<u32>,
    pub crop: Option<u32>,
}

/// The network, its weights' file and the transform that a [`PredictSetup`] settles on.
#[derive(Debug, Clone)]
pub struct PredictPlan {
    pub model: ResNetConfig,
    pub weights: PathBuf,
    pub transform: EvalTransform,
    /// Where the weights came from, for messages.
    pub source: String,
}

/// Finds the weights `setup` asks for (verified, from a cache or downloaded where allowed) and
/// settles the network and the transform.
pub fn plan(setup: &PredictSetup) -> Result<PredictPlan, PredictError> {
    let pretrained = Pretrained::parse(&setup.pretrained);
    let asked = setup.model.as_deref().unwrap_or("resnet50");
    let fetched = pretrained.fetch(asked, setup.download)?;
    let model = match &fetched.model {
        Some(theirs) => {
            if let Some(asked) = &setup.model {
                fetched.check_model(&ResNetConfig::from_name(asked)?.with_width(theirs.width))?;
            }
            theirs
                .clone()
                .with_num_classes(setup.num_classes.unwrap_or(theirs.num_classes))
                .with_input_stem(setup.stem)
        }
        None => ResNetConfig::from_name(asked)?
            .with_num_classes(setup.num_classes.unwrap_or(1000))
            .with_width(setup.width)
            .with_input_stem(setup.stem),
    };
    let published = fetched.eval.as_ref();
    let defaults = EvalTransform::imagenet();
    let transform = EvalTransform {
        resize: setup
            .resize
            .or(published.map(|e| e.resize))
            .unwrap_or(defaults.resize),
        crop: setup
            .crop
            .or(published.map(|e| e.crop))
            .unwrap_or(defaults.crop),
        interpolation: match published.map(|e| e.interpolation) {
            Some(EvalInterpolation::Bicubic) => kiln_data::Resample::Bicubic,
            _ => kiln_data::Resample::Bilinear,
        },
        mean: published.map_or(defaults.mean, |e| e.mean),
        std: published.map_or(defaults.std, |e| e.std),
    };
    Ok(PredictPlan {
        model,
        weights: fetched.path,
        transform,
        source: fetched.source,
    })
}

/// `kiln predict`: which weights, and the images to classify.
#[derive(Debug, Clone)]
pub struct PredictRequest {
    pub setup: PredictSetup,
    pub images: Vec<PathBuf>,
    /// One name per line; `None` means ImageNet's for 1000 classes, else `class <i>`.
    pub class_names: Option<PathBuf>,
    pub top: usize,
}

/// One image's best classes, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub image: PathBuf,
    pub top: Vec<(String, f32)>,
}

/// Scores the images, a batch at a time, and returns each one's `top` classes with
/// probabilities.
pub fn predict<B: Backend>(
    request: &PredictRequest,
    plan: &PredictPlan,
    device: &B::Device,
) -> Result<Vec<Prediction>, PredictError> {
    let num_classes = plan.model.num_classes;
    let names = class_names(request.class_names.as_deref(), num_classes)?;
    let model = load_model::<B>(plan, device)?;

    let mut predictions = Vec::with_capacity(request.images.len());
    for chunk in request.images.chunks(BATCH) {
        let probabilities = score::<B>(&model, chunk, &plan.transform, device)?;
        for (image, row) in chunk.iter().zip(probabilities.chunks(num_classes)) {
            let top = top_k(row, request.top)
                .into_iter()
                .map(|(i, p)| (names[i].clone(), p))
                .collect();
            predictions.push(Prediction {
                image: image.clone(),
                top,
            });
        }
    }
    Ok(predictions)
}

/// Images scored at once: enough to keep a GPU busy, few enough to bound memory.
const BATCH: usize = 32;

/// Class probabilities of a batch of image files, row after row.
fn score<B: Backend>(
    model: &kiln_models::ResNet<B>,
    paths: &[PathBuf],
    transform: &EvalTransform,
    device: &B::Device,
) -> Result<Vec<f32>, PredictError> {
    let side = transform.crop as usize;
    let mut pixels = Vec::with_capacity(paths.len() * 3 * side * side);
    for path in paths {
        pixels.extend(transform.apply(&load_rgb(path, ImageLimits::default())?));
    }
    let batch = Tensor::<B, 4>::from_data(
        TensorData::new(pixels, [paths.len(), 3, side, side]),
        device,
    );
    Ok(softmax(model.forward(batch), 1)
        .into_data()
        .to_vec::<f32>()
        .expect("softmax of f32 logits is f32"))
}

fn load_model<B: Backend>(
    plan: &PredictPlan,
    device: &B::Device,
) -> Result<kiln_models::ResNet<B>, PredictError> {
    let (model, report) = weights::load(plan.model.init::<B>(device)?, &plan.weights)?;
    if !report.left_out.is_empty() {
        return Err(PredictError::ClassCount {
            path: plan.weights.clone(),
            num_classes: plan.model.num_classes,
        });
    }
    Ok(model)
}

fn class_names(file: Option<&Path>, num_classes: usize) -> Result<Vec<String>, PredictError> {
    let Some(path) = file else {
        return Ok(if num_classes == 1000 {
            pretrained::imagenet_classes()
                .into_iter()
                .map(String::from)
                .collect()
        } else {
            (0..num_classes).map(|i| format!("class {i}")).collect()
        });
    };
    let text = std::fs::read_to_string(path).map_err(|e| PredictError::ClassFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    if names.len() != num_classes {
        return Err(PredictError::ClassNames {
            path: path.to_path_buf(),
            found: names.len(),
            num_classes,
        });
    }
    Ok(names)
}

/// Indices and values of the `k` largest entries, largest first.
fn top_k(row: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut ranked: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(k);
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_ranks_largest_first() {
        assert_eq!(top_k(&[0.1, 0.5, 0.2, 0.2], 2), vec![(1, 0.5), (2, 0.2)]);
        assert_eq!(top_k(&[0.3], 5).len(), 1);
    }

    #[test]
    fn class_names_default_to_imagenet_or_indices() {
        assert_eq!(class_names(None, 1000).unwrap()[1], "goldfish");
        assert_eq!(
            class_names(None, 3).unwrap(),
            vec!["class 0", "class 1", "class 2"]
        );
    }
}
