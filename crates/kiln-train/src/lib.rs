//! kiln's engine, generic over burn's backends. The training loop arrives with the training
//! issue; prediction is here because it is the first job that joins data and models, and
//! `batch` moves the loader's host batches onto a device.

pub mod batch;
pub mod predict;
