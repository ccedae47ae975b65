//! Evaluation: a model over a loader's validation pass, with loss, top-1, top-5 and the
//! confusion matrix, read back from the device once.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{IndexingUpdateOp, Int, Tensor};
use kiln_data::{DataError, Loader};
use kiln_models::ResNet;

use crate::batch::Uploaded;
use crate::config::Tta;
use crate::confusion::Confusion;
use crate::step::count_correct;

/// Validation loss, top-1 and top-5 accuracy, and the confusion matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub loss: f64,
    pub top1: f64,
    pub top5: f64,
    pub images: usize,
    pub skipped: usize,
    pub confusion: Confusion,
    /// The name of each of the model's classes (`class <i>` beyond the data set's).
    pub class_names: Vec<String>,
}

/// Evaluation's loss sum, top-1 and top-5 counts and confusion counts, on the device.
struct EvaluationSums<B: Backend> {
    loss: Tensor<B, 1>,
    top1: Tensor<B, 1, Int>,
    top5: Tensor<B, 1, Int>,
    /// Row-major `classes` x `classes`: true class, predicted class.
    confusion: Tensor<B, 1, Int>,
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
    for batch in Uploaded::<B, _>::new(loader.epoch(0), device.clone()) {
        let batch = batch?;
        skipped += batch.skipped.len();
        if batch.is_empty() {
            continue;
        }
        let n = batch.len();
        let (logits, loss) = match tta {
            Tta::None => {
                let logits = model.forward(batch.images);
                let loss = loss_fn.forward(logits.clone(), batch.labels.clone()) * n as f64;
                (logits, loss)
            }
            Tta::Hflip => {
                let mirrored = model.forward(batch.images.clone().flip([3]));
                let logits = model.forward(batch.images);
                let probs = (softmax(logits, 1) + softmax(mirrored, 1)) / 2.0;
                let at_label = probs
                    .clone()
                    .gather(1, batch.labels.clone().unsqueeze_dim(1));
                (probs, at_label.log().sum().neg())
            }
        };
        classes = logits.dims()[1];
        let k = 5.min(classes);
        let (_, best) = logits.clone().topk_with_indices(k, 1);
        let hits = best.equal(batch.labels.clone().unsqueeze_dim::<2>(1).repeat_dim(1, k));
        let top5 = hits.int().sum();
        // Each image adds one at (label, prediction) of the flattened matrix.
        let cells = batch.labels.clone() * classes as i64 + logits.clone().argmax(1).reshape([n]);
        let ones = Tensor::<B, 1, Int>::ones([n], device);
        let confusion = sums.as_ref().map_or_else(
            || Tensor::zeros([classes * classes], device),
            |s| s.confusion.clone(),
        );
        let confusion = confusion.scatter(0, cells, ones, IndexingUpdateOp::Add);
        let top1 = count_correct(logits, batch.labels);
        sums = Some(match sums {
            None => EvaluationSums {
                loss,
                top1,
                top5,
                confusion,
            },
            Some(s) => EvaluationSums {
                loss: s.loss + loss,
                top1: s.top1 + top1,
                top5: s.top5 + top5,
                confusion,
            },
        });
        images += n;
    }
    let (loss, top1, top5, confusion) = match sums {
        Some(sums) => {
            let counts = Tensor::cat(vec![sums.top1, sums.top5, sums.confusion], 0)
                .into_data()
                .convert::<i64>();
            let counts: Vec<u64> = (counts.to_vec::<i64>().expect("counts").into_iter())
                .map(|c| c as u64)
                .collect();
            let loss: Vec<f64> = (sums.loss.into_data().convert::<f64>().to_vec()).expect("a sum");
            let confusion = Confusion::from_counts(classes, counts[2..].to_vec());
            (loss[0], counts[0] as usize, counts[1] as usize, confusion)
        }
        None => (0.0, 0, 0, Confusion::from_counts(0, Vec::new())),
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
    })
}
