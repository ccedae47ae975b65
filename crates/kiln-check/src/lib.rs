//! Checks on kiln's backends, generic over burn's `Backend` like the engine they check.
//!
//! - [`compare`]: the same weights and batch on several backends; logits, loss, gradients, batch
//!   norm statistics and the parameters after optimizer steps, each compared with a reference.
//! - [`bench`]: training and inference throughput, step time and peak memory, and the same
//!   figures from PyTorch (written by `xtask/scripts/bench_torch.py`) side by side.
//! - [`entry`]: `kiln compare` and `kiln bench` on each backend asked for.
//! - [`kernels`]: kernel launches per step by kind, read from cubecl's profiling log.
//! - [`parity`]: one training step of kiln's ResNets against PyTorch's float64 answer.
//! - [`trajectory`]: whole training runs (50 steps of the trainer's step function) against
//!   PyTorch's, loss by loss and tensor by tensor.
//! - [`verdict`]: what a comparison found on every backend, and whether it passed.

pub mod bench;
pub mod compare;
pub mod entry;
pub mod kernels;
pub mod parity;
pub mod trajectory;
pub mod verdict;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_train::batch::DeviceBatch;
use rand::{Rng, SeedableRng};

/// A seeded batch of `n` random images `size` x `size` (uniform with unit variance, as
/// normalized images are) and random labels below `classes`.
fn seeded_batch<B: Backend>(
    seed: u64,
    n: usize,
    size: usize,
    classes: usize,
    device: &B::Device,
) -> DeviceBatch<B> {
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
    let shape = [n, 3, size, size];
    let limit = 3f32.sqrt();
    let pixels: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| rng.random_range(-limit..limit))
        .collect();
    let labels: Vec<i64> = (0..n)
        .map(|_| rng.random_range(0..classes as i64))
        .collect();
    DeviceBatch {
        images: Tensor::from_data(TensorData::new(pixels, shape), device),
        labels: Tensor::<B, 1, Int>::from_data(TensorData::new(labels, [n]), device),
        targets: None,
        skipped: Vec::new(),
        indices: Vec::new(),
    }
}

/// Why a check could not run (as opposed to a check that ran and found a difference).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Model(#[from] kiln_models::ModelError),
    #[error(transparent)]
    Weights(#[from] kiln_models::weights::WeightsError),
    #[error(transparent)]
    Step(#[from] kiln_train::error::ParallelError),
    /// A fixture's config that kiln does not accept, or a model or optimizer it cannot build.
    #[error("cannot set up the run: {0}")]
    Setup(String),
    #[error("cannot read {path}: {reason}")]
    Read {
        path: std::path::PathBuf,
        reason: String,
    },
}
