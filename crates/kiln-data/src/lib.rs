//! Images in, normalized tensors out. kiln-data knows no model and no optimizer.
//!
//! So far: decoding any common image file to RGB, safely, and torchvision's evaluation
//! transforms (Resize, CenterCrop, ToTensor, Normalize). Data sets and the loader come with the
//! data pipeline issue.

mod image_io;
pub mod transforms;

pub use image_io::{DataError, ImageLimits, load_rgb};
pub use transforms::EvalTransform;
