mod base;
mod inputs;
mod strategy;

pub use base::launch_ref;
pub use inputs::{ConvolutionArgs, ConvolutionInputs};
pub use strategy::{AcceleratedTileKind, ConvAlgorithm, Strategy};
