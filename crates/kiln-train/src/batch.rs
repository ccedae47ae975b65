//! Host batches onto a device, one batch ahead, so that on backends that queue work (CUDA,
//! wgpu) the upload of the next batch is issued while the current step's kernels still run.

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};
use kiln_data::{DataError, HostBatch};

/// A batch on the device: `images` `[n, 3, h, w]`, `labels` `[n]` (a mixed batch's dominant
/// labels), a mixed batch's soft `targets` `[n, classes]`, and the images the loader skipped
/// while building it.
pub struct DeviceBatch<B: Backend> {
    pub images: Tensor<B, 4>,
    pub labels: Tensor<B, 1, Int>,
    pub targets: Option<Tensor<B, 2>>,
    pub skipped: Vec<DataError>,
    /// Each image's index in the data set (on the host).
    pub indices: Vec<usize>,
}

impl<B: Backend> DeviceBatch<B> {
    pub fn len(&self) -> usize {
        self.labels.dims()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Copies a host batch to `device`.
pub fn to_device<B: Backend>(batch: HostBatch, device: &B::Device) -> DeviceBatch<B> {
    let count = batch.labels.len();
    let images = TensorData::new(batch.images, batch.shape);
    let labels = TensorData::new(batch.labels, [count]);
    let targets = batch.targets.map(|targets| {
        let classes = targets.len() / count.max(1);
        Tensor::from_data(TensorData::new(targets, [count, classes]), device)
    });
    DeviceBatch {
        images: Tensor::from_data(images, device),
        labels: Tensor::from_data(labels, device),
        targets,
        skipped: batch.skipped,
        indices: batch.indices,
    }
}

/// Wraps host batches so that each `next` returns a batch already on the device and issues the
/// upload of the one after it.
pub struct Uploaded<B: Backend, I> {
    host: I,
    device: B::Device,
    ahead: Option<Result<DeviceBatch<B>, DataError>>,
}

impl<B: Backend, I: Iterator<Item = Result<HostBatch, DataError>>> Uploaded<B, I> {
    pub fn new(host: I, device: B::Device) -> Self {
        Self {
            host,
            device,
            ahead: None,
        }
    }

    fn upload_next(&mut self) -> Option<Result<DeviceBatch<B>, DataError>> {
        let batch = self.host.next()?;
        Some(batch.map(|batch| to_device(batch, &self.device)))
    }
}

impl<B: Backend, I: Iterator<Item = Result<HostBatch, DataError>>> Iterator for Uploaded<B, I> {
    type Item = Result<DeviceBatch<B>, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let current = match self.ahead.take() {
            Some(batch) => batch,
            None => self.upload_next()?,
        };
        if current.is_ok() {
            self.ahead = self.upload_next();
        }
        Some(current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use kiln_data::{Loader, LoaderConfig, Pipeline, Synthetic};
    use std::sync::Arc;

    #[test]
    fn uploaded_batches_hold_the_host_values_in_order() {
        let dataset = Arc::new(Synthetic::new(10, 4, 3, 5, 0).unwrap());
        let config = LoaderConfig {
            shuffle: false,
            ..LoaderConfig::new(4, 0)
        };
        let loader = Loader::new(dataset, Pipeline::new(&[]).unwrap(), config).unwrap();
        let host: Vec<HostBatch> = loader.epoch(0).map(Result::unwrap).collect();
        let device = Default::default();
        let uploaded: Vec<DeviceBatch<Flex>> = Uploaded::new(loader.epoch(0), device)
            .map(Result::unwrap)
            .collect();
        assert_eq!(uploaded.len(), 3);
        for (host, device) in host.iter().zip(&uploaded) {
            assert_eq!(device.images.dims(), host.shape);
            let values: Vec<f32> = device.images.to_data().to_vec().unwrap();
            assert_eq!(values, host.images);
            let labels: Vec<i64> = device.labels.to_data().convert::<i64>().to_vec().unwrap();
            assert_eq!(labels, host.labels);
        }
    }
}
