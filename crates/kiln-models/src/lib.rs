//! torchvision's ResNets for burn, with the family around them (ResNeXt, Wide ResNet, timm's
//! ResNet-D): the networks, PyTorch-exact batch norm, and torchvision's and timm's weight files
//! in and out, by name from their caches and the Hugging Face Hub.

mod batch_norm;
mod buffer;
pub mod eval_transform;
mod footprint;
pub mod hub;
pub mod onnx;
mod precision;
pub mod pretrained;
mod resnet;
pub mod weights;

pub use batch_norm::{BatchNorm2d, synchronized};
pub use buffer::Buffer;
pub use footprint::{Footprint, StageFootprint, Summary};
pub use precision::Precision;
pub use resnet::{
    BasicBlock, Block, BlockKind, Bottleneck, DeepStem, Downsample, MODEL_NAMES, ResNet,
    ResNetConfig, Stem, architecture,
};

/// A model that cannot be built as asked.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("ResNet depth {0} does not exist: choose 18, 26, 34, 50, 101, 152 or 200")]
    UnknownDepth(usize),
    #[error("unknown model `{0}`: choose {names}", names = MODEL_NAMES.join(", "))]
    UnknownModel(String),
    #[error("{model} cannot be built so: {reason}")]
    Invalid { model: String, reason: String },
    #[error(
        "a ResNet needs at least one class and a width of at least 1 (got num_classes = {num_classes}, width = {width})"
    )]
    ZeroSize { num_classes: usize, width: usize },
}
