//! What a validation pass found: loss, top-1 and top-5, the confusion matrix and every
//! image's prediction, as the loop's evaluation returns them and the records keep them.

use crate::confusion::Confusion;

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
    /// Every evaluated image's prediction, in the loader's order: what a report's mistakes are
    /// chosen from (see `mistakes`).
    pub predictions: Vec<ImagePrediction>,
}

/// What the model made of one validation image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImagePrediction {
    /// The image's index in the validation set.
    pub index: usize,
    pub label: usize,
    pub predicted: usize,
    /// The predicted class's probability (softmax; with `Tta::Hflip`, the mean of the image's
    /// and its mirror's).
    pub probability: f32,
}
