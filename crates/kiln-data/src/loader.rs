//! The loader: decodes and augments on worker threads, keeps batches prepared ahead, and hands
//! them out in order as host memory (normalized CHW floats and labels).
//!
//! Every random choice is drawn from a stream seeded by (seed, epoch, image index) or (seed,
//! epoch) for the shuffle, so the batches are the same whatever the number of workers.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::dataset::SharedDataset;
use crate::mix::Mixing;
use crate::seed::{Purpose, stream};
use crate::transforms::Pipeline;

/// What to do with an image that cannot be decoded or is over the size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBadImage {
    /// Leave it out of its batch and report it in [`HostBatch::skipped`].
    #[default]
    Skip,
    /// Stop with an error naming the file.
    Error,
}

#[derive(Debug, Clone)]
pub struct LoaderConfig {
    pub batch_size: usize,
    pub shuffle: bool,
    /// Leave out the last batch of an epoch when it is smaller than `batch_size`.
    pub drop_last: bool,
    /// Decoding threads; 0 decodes on the calling thread. At most [`max_workers`] start.
    pub workers: usize,
    /// Batches prepared ahead of the one being consumed.
    pub prefetch: usize,
    pub seed: u64,
    pub on_bad_image: OnBadImage,
    /// The part of each batch this process loads, when several machines train together.
    pub share: BatchShare,
    /// Mixup and CutMix on each batch (on each machine's share of it), for training.
    pub mixing: Option<Mixing>,
}

/// The most decoding threads a loader starts: four per core (decoding waits on files too),
/// between 8 and 256. More only cost memory, and tens of thousands exhaust the process.
pub fn max_workers() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (4 * cores).clamp(8, 256)
}

/// Part `index` of `count` equal parts of every batch: each machine of a multi-machine run
/// decodes only the images its devices train on, while all agree on the epoch's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchShare {
    pub index: usize,
    pub count: usize,
}

impl BatchShare {
    /// The whole batch.
    pub const WHOLE: BatchShare = BatchShare { index: 0, count: 1 };

    /// The range of a batch of `len` items that this share takes: as even as can be, the first
    /// shares one larger when `len` does not divide.
    pub fn range(&self, len: usize) -> std::ops::Range<usize> {
        let start = |i: usize| i * (len / self.count) + i.min(len % self.count);
        start(self.index)..start(self.index + 1)
    }
}

impl LoaderConfig {
    /// Shuffled, two workers, two batches ahead per worker, bad images skipped.
    pub fn new(batch_size: usize, seed: u64) -> Self {
        Self {
            batch_size,
            shuffle: true,
            drop_last: false,
            workers: 2,
            prefetch: 4,
            seed,
            on_bad_image: OnBadImage::Skip,
            share: BatchShare::WHOLE,
            mixing: None,
        }
    }
}

/// One batch in host memory: `images` is `shape = [n, 3, height, width]` floats.
#[derive(Debug)]
pub struct HostBatch {
    pub images: Vec<f32>,
    pub shape: [usize; 4],
    /// Each image's label; in a mixed batch, its dominant label (the one weighted most).
    pub labels: Vec<i64>,
    /// Each image's index in the data set, so that evaluation can name the images it gets
    /// wrong (skipped images leave positions in the batch that no longer say it).
    pub indices: Vec<usize>,
    /// A mixed batch's soft targets, `[n, classes]`, label smoothing included.
    pub targets: Option<Vec<f32>>,
    /// Images left out of this batch, each with its path and why. A batch whose every image
    /// was bad has `n = 0`.
    pub skipped: Vec<DataError>,
}

/// A data set, a pipeline and a batching policy.
pub struct Loader {
    shared: Arc<Shared>,
}

struct Shared {
    dataset: SharedDataset,
    pipeline: Pipeline,
    config: LoaderConfig,
}

impl Loader {
    pub fn new(
        dataset: SharedDataset,
        pipeline: Pipeline,
        config: LoaderConfig,
    ) -> Result<Self, DataError> {
        if config.batch_size == 0 {
            return Err(DataError::Invalid("batch_size must be at least 1".into()));
        }
        if dataset.is_empty() {
            return Err(DataError::Invalid("the data set has no images".into()));
        }
        if let Some(mixing) = &config.mixing {
            mixing
                .check()
                .map_err(|e| DataError::Invalid(format!("mixup: {e}")))?;
        }
        if config.drop_last && dataset.len() < config.batch_size {
            return Err(DataError::Invalid(format!(
                "drop_last with batch_size {} leaves nothing of a data set of {} images",
                config.batch_size,
                dataset.len()
            )));
        }
        Ok(Self {
            shared: Arc::new(Shared {
                dataset,
                pipeline,
                config,
            }),
        })
    }

    /// Batches per epoch.
    pub fn len(&self) -> usize {
        let (n, size) = (self.shared.dataset.len(), self.shared.config.batch_size);
        if self.shared.config.drop_last {
            n / size
        } else {
            n.div_ceil(size)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dataset(&self) -> &SharedDataset {
        &self.shared.dataset
    }

    /// Image `index` as a batch of `epoch` holds it before normalization: decoded and
    /// transformed (a validation loader's resize and crop), so that a report shows the images
    /// the model saw.
    pub fn image(&self, epoch: u64, index: usize) -> Result<image::RgbImage, DataError> {
        let Shared {
            dataset,
            pipeline,
            config,
        } = &*self.shared;
        let image = dataset.image(index)?;
        if let Some(to) = pipeline.too_large(image.dimensions()) {
            return Err(DataError::ResizeTooLarge {
                image: dataset.describe(index),
                from: image.dimensions(),
                to,
                max: pipeline.max_pixels(),
            });
        }
        let mut rng = stream(config.seed, Purpose::Augment, epoch, index as u64);
        Ok(pipeline.transform(image, &mut rng))
    }

    /// The batches of `epoch`, in order.
    pub fn epoch(&self, epoch: u64) -> Batches {
        self.epoch_from(epoch, 0)
    }

    /// The batches of `epoch` from batch `first` on, as a resumed run needs them: the same
    /// order and augmentation as an uninterrupted epoch.
    pub fn epoch_from(&self, epoch: u64, first: usize) -> Batches {
        let shared = &self.shared;
        let mut order: Vec<usize> = (0..shared.dataset.len()).collect();
        if shared.config.shuffle {
            order.shuffle(&mut stream(shared.config.seed, Purpose::Shuffle, epoch, 0));
        }
        let plan = Arc::new(EpochPlan {
            shared: shared.clone(),
            order,
            epoch,
        });
        let end = self.len();
        let workers = if shared.config.workers == 0 {
            None
        } else {
            Some(Workers::start(
                plan.clone(),
                shared.config.workers.min(max_workers()),
            ))
        };
        Batches {
            plan,
            next: first.min(end),
            end,
            workers,
        }
    }
}

/// What an epoch's workers share: the data, the pipeline and the epoch's order.
struct EpochPlan {
    shared: Arc<Shared>,
    order: Vec<usize>,
    epoch: u64,
}

impl EpochPlan {
    fn indices(&self, batch: usize) -> &[usize] {
        let size = self.shared.config.batch_size;
        let start = batch * size;
        let whole = &self.order[start..(start + size).min(self.order.len())];
        &whole[self.shared.config.share.range(whole.len())]
    }

    /// Decodes, augments, normalizes and (for training) mixes one batch.
    fn build(&self, batch_index: usize) -> Result<HostBatch, DataError> {
        let Shared {
            dataset,
            pipeline,
            config,
        } = &*self.shared;
        let indices = self.indices(batch_index);
        let mut images = Vec::new();
        let mut labels = Vec::with_capacity(indices.len());
        let mut kept = Vec::with_capacity(indices.len());
        let mut skipped = Vec::new();
        let mut size: Option<(u32, u32)> = None;
        for &index in indices {
            let image = dataset.image(index).and_then(|image| {
                match pipeline.too_large(image.dimensions()) {
                    Some(to) => Err(DataError::ResizeTooLarge {
                        image: dataset.describe(index),
                        from: image.dimensions(),
                        to,
                        max: pipeline.max_pixels(),
                    }),
                    None => Ok(image),
                }
            });
            let image = match image {
                Ok(image) => image,
                Err(e) if e.is_bad_image() && config.on_bad_image == OnBadImage::Skip => {
                    skipped.push(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut rng = stream(config.seed, Purpose::Augment, self.epoch, index as u64);
            let image = pipeline.transform(image, &mut rng);
            let dims = image.dimensions();
            match size {
                None => {
                    size = Some(dims);
                    images.reserve_exact(indices.len() * 3 * (dims.0 * dims.1) as usize);
                }
                Some(first) if first != dims => {
                    return Err(DataError::MixedSizes { first, other: dims });
                }
                Some(_) => {}
            }
            let start = images.len();
            images.resize(start + 3 * (dims.0 * dims.1) as usize, 0.0);
            pipeline.write_tensor(&image, &mut images[start..], &mut rng);
            labels.push(dataset.label(index) as i64);
            kept.push(index);
        }
        let (width, height) = size.unwrap_or((0, 0));
        let mut batch = HostBatch {
            images,
            shape: [labels.len(), 3, height as usize, width as usize],
            labels,
            indices: kept,
            targets: None,
            skipped,
        };
        if let Some(mixing) = &config.mixing {
            mixing.mix(
                &mut batch,
                &mut stream(config.seed, Purpose::Mix, self.epoch, batch_index as u64),
            );
        }
        Ok(batch)
    }
}

/// Worker threads building batches from a job queue; results come back tagged with their
/// batch number, since workers finish out of order.
struct Workers {
    jobs: Option<Sender<usize>>,
    results: Receiver<(usize, Result<HostBatch, DataError>)>,
    ready: BTreeMap<usize, Result<HostBatch, DataError>>,
    /// The next batch number to queue.
    queued: usize,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    fn start(plan: Arc<EpochPlan>, count: usize) -> Self {
        let (jobs, job_queue) = crossbeam_channel::unbounded::<usize>();
        let (done, results) = crossbeam_channel::unbounded();
        let threads = (0..count)
            .map(|_| {
                let (plan, job_queue, done) = (plan.clone(), job_queue.clone(), done.clone());
                std::thread::spawn(move || {
                    for batch in job_queue {
                        let result = catch_unwind(AssertUnwindSafe(|| plan.build(batch)))
                            .unwrap_or_else(|panic| {
                                Err(DataError::Worker {
                                    batch,
                                    reason: panic_message(panic),
                                })
                            });
                        if done.send((batch, result)).is_err() {
                            break;
                        }
                    }
                })
            })
            .collect();
        Self {
            jobs: Some(jobs),
            results,
            ready: BTreeMap::new(),
            queued: 0,
            threads,
        }
    }

    /// Queues batches up to `ahead` past `next` (never past `end`), then waits for `next`.
    fn take(&mut self, next: usize, end: usize, ahead: usize) -> Result<HostBatch, DataError> {
        self.queued = self.queued.max(next);
        let jobs = self.jobs.as_ref().expect("jobs close only on drop");
        while self.queued < end && self.queued <= next + ahead {
            // The workers hold the receiving end until dropped, so this cannot fail.
            let _ = jobs.send(self.queued);
            self.queued += 1;
        }
        loop {
            if let Some(result) = self.ready.remove(&next) {
                return result;
            }
            match self.results.recv() {
                Ok((batch, result)) => {
                    self.ready.insert(batch, result);
                }
                Err(_) => {
                    return Err(DataError::Worker {
                        batch: next,
                        reason: "every worker thread has stopped".into(),
                    });
                }
            }
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Closing the queue lets each worker finish its batch and stop.
        self.jobs.take();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a worker panicked".into())
}

/// The batches of one epoch, in order. Dropping it stops its workers.
pub struct Batches {
    plan: Arc<EpochPlan>,
    next: usize,
    end: usize,
    workers: Option<Workers>,
}

impl Batches {
    /// The number of the batch the next call to `next` returns.
    pub fn position(&self) -> usize {
        self.next
    }
}

impl Iterator for Batches {
    type Item = Result<HostBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        let batch = self.next;
        self.next += 1;
        let ahead = self.plan.shared.config.prefetch;
        Some(match &mut self.workers {
            Some(workers) => workers.take(batch, self.end, ahead),
            None => self.plan.build(batch),
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.end - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Batches {}
