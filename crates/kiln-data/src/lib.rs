//! Images in, host batches out. kiln-data knows no model, no optimizer and no burn tensor: it
//! reads data sets (CIFAR, ImageFolder, labels in a CSV, WebDataset's tar shards, Hugging Face
//! data sets, the shipped digits, synthetic), applies torchvision's transforms, and a loader
//! turns them into batches of normalized floats on worker threads. Every source is also a
//! burn-dataset `Dataset<LabelledImage>`, and [`FromBurn`] takes one of those in.
//!
//! Data flows: [`Source`] (from the config) opens into [`Dataset`]s, a [`Pipeline`] of
//! [`Transform`]s augments each image (torchvision's policies in [`augment`]), and a [`Loader`]
//! batches them into [`HostBatch`]es, mixed by [`Mixing`] (mixup, CutMix) when training asks
//! for it.

mod archive;
pub mod augment;
mod burn_interface;
pub mod cifar;
mod color;
pub mod csv_labels;
mod dataset;
pub mod digits;
mod error;
pub mod huggingface;
mod image_folder;
mod image_io;
mod loader;
pub mod mix;
mod registry;
mod seed;
pub mod shards;
mod source;
pub mod stats;
mod synthetic;
pub mod transforms;

pub use archive::extract_tar_gz;
/// burn-dataset, the version kiln's sources implement, for programs that build a
/// `burn_dataset::Dataset` to hand kiln (`InMemDataset`, the transforms).
pub use burn_dataset;
pub use burn_interface::{FromBurn, ImageData, LabelledImage};
pub use dataset::{Dataset, InMemory, SharedDataset, Subset, split};
pub use error::DataError;
pub use huggingface::{HubSettings, HuggingFace};
pub use image_folder::{IMAGE_EXTENSIONS, ImageFolder};
pub use image_io::{ImageLimits, load_rgb};
pub use loader::{BatchShare, Batches, HostBatch, Loader, LoaderConfig, OnBadImage, max_workers};
pub use mix::{MixMode, Mixing};
pub use registry::{register, registered};
pub use source::{Source, Splits};
pub use synthetic::Synthetic;
pub use transforms::{EvalTransform, Pipeline, Resample, Transform};
