//! Evaluation: a model over a loader's validation pass, with loss, top-1, top-5, the
//! confusion matrix and each image's prediction, read back from the device once.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{IndexingUpdateOp, Int, Tensor};
use kiln_data::{DataError, Loader};
use kiln_models::ResNet;

use crate::batch::Uploaded;
use crate::step::count_correct;
use kiln_config::config::Tta;
use kiln_records::confusion::Confusion;
use kiln_records::{Evaluation, ImagePrediction};

/// Evaluation's loss sum, top-1 and top-5 counts and confusion counts, on the device.
struct EvaluationSums<B: Backend> {
    loss: Tensor<B, 1>,
    top1: Tensor<B, 1, Int>,
    top5: Tensor<B, 1, Int>,
    /// Row-major `classes` x `classes`: true class, predicted class.
    confusion: Tensor<B, 1, Int>,
    /// Each batch's predicted classes and their probabilities, concatenated at the end.
    predicted: Vec<Tensor<B, 1, Int>>,
    probability: Vec<Tensor<B, 1>>,
}

/// Runs `model` over every batch of `loader` (epoch 0: the order, and any augmentation, of a
/// validation loader is fixed). With `Tta::Hflip`, each image's class probabilities are the
/// mean of its own and its mirror's softmax, and the loss is their negative log at the label.
pub fn evaluate<B: Backend>(
    model: &ResNet<B>,
    loader: &Loader,
    device: &B::Device,
    tta: Tta,
) -> Result<Evaluation, DataError> {
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    // Sums stay on the device until the end: one read for the whole pass.
    let mut sums: Option<EvaluationSums<B>> = None;
    let (mut images, mut skipped, mut classes) = (0, 0, 0);
    let mut indices = Vec::new();
    for batch in Uploaded::<B, _>::new(loader.epoch(0), device.clone()) {
        let batch = batch?;
        skipped += batch.skipped.len();
        if batch.is_empty() {
            continue;
        }
        let n = batch.len();
        indices.extend_from_slice(&batch.indices);
        let (logits, loss, probs) = match tta {
            Tta::None => {
                let logits = model.forward(batch.images);
                let loss = loss_fn.forward(logits.clone(), batch.labels.clone()) * n as f64;
                let probs = softmax(logits.clone(), 1);
                (logits, loss, probs)
            }
            Tta::Hflip => {
                let mirrored = model.forward(batch.images.clone().flip([3]));
                let logits = model.forward(batch.images);
                let probs = (softmax(logits, 1) + softmax(mirrored, 1)) / 2.0;
                let at_label = probs
                    .clone()
                    .gather(1, batch.labels.clone().unsqueeze_dim(1));
                (probs.clone(), at_label.log().sum().neg(), probs)
            }
        };
        classes = logits.dims()[1];
        sums = Some(add_batch(sums, logits, loss, probs, batch.labels, device));
        images += n;
    }
    let (loss, top1, top5, confusion, predictions) = match sums {
        Some(sums) => read_back(sums, classes, &indices, loader),
        None => (0.0, 0, 0, Confusion::from_counts(0, Vec::new()), Vec::new()),
    };
    let share = |count: usize| count as f64 / images.max(1) as f64;
    let names = loader.dataset().classes();
    let class_names = (0..confusion.classes())
        .map(|i| {
            names
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("class {i}"))
        })
        .collect();
    Ok(Evaluation {
        loss: loss / images.max(1) as f64,
        top1: share(top1),
        top5: share(top5),
        images,
        skipped,
        confusion,
        class_names,
        predictions,
    })
}

/// `sums` with one batch's loss sum, top-1 and top-5 counts, confusion counts, predicted
/// classes and their probabilities added, on the device.
fn add_batch<B: Backend>(
    sums: Option<EvaluationSums<B>>,
    logits: Tensor<B, 2>,
    loss: Tensor<B, 1>,
    probs: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
    device: &B::Device,
) -> EvaluationSums<B> {
    let [n, classes] = logits.dims();
    let k = 5.min(classes);
    let (_, best) = logits.clone().topk_with_indices(k, 1);
    let hits = best.equal(labels.clone().unsqueeze_dim::<2>(1).repeat_dim(1, k));
    let top5 = hits.int().sum();
    let predicted = logits.clone().argmax(1).reshape([n]);
    // Each image adds one at (label, prediction) of the flattened matrix.
    let cells = labels.clone() * classes as i64 + predicted.clone();
    let ones = Tensor::<B, 1, Int>::ones([n], device);
    let confusion = sums.as_ref().map_or_else(
        || Tensor::zeros([classes * classes], device),
        |s| s.confusion.clone(),
    );
    let confusion = confusion.scatter(0, cells, ones, IndexingUpdateOp::Add);
    let top1 = count_correct(logits, labels);
    let mut next = match sums {
        None => EvaluationSums {
            loss,
            top1,
            top5,
            confusion,
            predicted: Vec::new(),
            probability: Vec::new(),
        },
        Some(s) => EvaluationSums {
            loss: s.loss + loss,
            top1: s.top1 + top1,
            top5: s.top5 + top5,
            confusion,
            ..s
        },
    };
    next.predicted.push(predicted);
    next.probability.push(probs.max_dim(1).reshape([n]));
    next
}

/// Evaluation's figures from the device, in one read of the counts and the predicted classes
/// and one of the loss and the probabilities.
fn read_back<B: Backend>(
    sums: EvaluationSums<B>,
    classes: usize,
    indices: &[usize],
    loader: &Loader,
) -> (f64, usize, usize, Confusion, Vec<ImagePrediction>) {
    let cells = classes * classes;
    let mut counts = vec![sums.top1, sums.top5, sums.confusion];
    counts.extend(sums.predicted);
    let counts = Tensor::cat(counts, 0).into_data().convert::<i64>();
    let counts: Vec<u64> = (counts.to_vec::<i64>().expect("counts").into_iter())
        .map(|c| c as u64)
        .collect();
    let mut floats = vec![sums.loss];
    floats.extend(sums.probability);
    let floats = Tensor::cat(floats, 0).into_data().convert::<f64>();
    let floats: Vec<f64> = floats.to_vec().expect("a sum and probabilities");
    let confusion = Confusion::from_counts(classes, counts[2..2 + cells].to_vec());
    let dataset = loader.dataset();
    let predictions = (indices.iter().zip(&counts[2 + cells..]).zip(&floats[1..]))
        .map(|((&index, &predicted), &probability)| ImagePrediction {
            index,
            label: dataset.label(index),
            predicted: predicted as usize,
            probability: probability as f32,
        })
        .collect();
    let (top1, top5) = (counts[0] as usize, counts[1] as usize);
    (floats[0], top1, top5, confusion, predictions)
}
