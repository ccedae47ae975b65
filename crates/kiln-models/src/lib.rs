//! torchvision's ResNets for burn: the networks, PyTorch-exact batch norm, and torchvision
//! weight files in and out.

mod batch_norm;
mod footprint;
pub mod onnx;
mod precision;
pub mod pretrained;
mod resnet;
pub mod weights;

pub use batch_norm::{BatchNorm2d, synchronized};
pub use footprint::{Footprint, StageFootprint, Summary};
pub use precision::Precision;
pub use resnet::{
    BasicBlock, Block, BlockKind, Bottleneck, Downsample, ResNet, ResNetConfig, Stem, architecture,
};

/// A model that cannot be built as asked.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("ResNet depth {0} does not exist: choose 18, 34, 50, 101 or 152")]
    UnknownDepth(usize),
    #[error("unknown model `{0}`: choose resnet18, resnet34, resnet50, resnet101 or resnet152")]
    UnknownModel(String),
    #[error(
        "a ResNet needs at least one class and a width of at least 1 (got num_classes = {num_classes}, width = {width})"
    )]
    ZeroSize { num_classes: usize, width: usize },
}
