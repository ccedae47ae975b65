//! The loader: ordering, reproducibility across worker counts, resumption, and bad images.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use image::{Rgb, RgbImage};
use kiln_data::augment::Interpolation;
use kiln_data::transforms::ErasingValue;
use kiln_data::{
    BatchShare, Dataset, HostBatch, ImageFolder, ImageLimits, Loader, LoaderConfig, MixMode,
    Mixing, OnBadImage, Pipeline, Synthetic, Transform,
};

fn synthetic(len: usize) -> Arc<dyn Dataset> {
    Arc::new(Synthetic::new(len, 12, 10, 4, 3).unwrap())
}

fn augmenting() -> Pipeline {
    Pipeline::new(&[
        Transform::RandomResizedCrop {
            size: 8,
            scale: [0.3, 1.0],
            ratio: [0.75, 4.0 / 3.0],
        },
        Transform::RandomCrop {
            size: 8,
            padding: 2,
        },
        Transform::RandomHorizontalFlip { p: 0.5 },
        Transform::TrivialAugmentWide {
            num_magnitude_bins: 31,
            interpolation: Interpolation::Bilinear,
            fill: [0; 3],
        },
        Transform::ColorJitter {
            brightness: 0.4,
            contrast: 0.4,
            saturation: 0.4,
            hue: 0.1,
        },
        Transform::ToTensor,
        Transform::Normalize {
            mean: [0.5; 3],
            std: [0.25; 3],
        },
        Transform::RandomErasing {
            p: 0.5,
            scale: [0.02, 0.33],
            ratio: [0.3, 3.3],
            value: ErasingValue::Random("random".into()),
        },
    ])
    .unwrap()
}

/// Mixup and CutMix per image, so that every image draws.
fn mixing() -> Option<Mixing> {
    Some(Mixing {
        mixup_alpha: 0.8,
        cutmix_alpha: 1.0,
        prob: 0.8,
        switch_prob: 0.5,
        mode: MixMode::Elem,
        label_smoothing: 0.1,
        classes: 3,
    })
}

fn collect(loader: &Loader, epoch: u64) -> Vec<HostBatch> {
    loader.epoch(epoch).map(Result::unwrap).collect()
}

fn same(a: &[HostBatch], b: &[HostBatch]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.images == y.images
                && x.labels == y.labels
                && x.shape == y.shape
                && x.targets == y.targets
        })
}

#[test]
fn the_same_seed_gives_the_same_batches_whatever_the_worker_count() {
    let dataset = synthetic(45);
    let loader_with = |workers: usize, prefetch: usize, seed: u64| {
        let config = LoaderConfig {
            workers,
            prefetch,
            mixing: mixing(),
            ..LoaderConfig::new(8, seed)
        };
        Loader::new(dataset.clone(), augmenting(), config).unwrap()
    };
    let reference = collect(&loader_with(0, 0, 9), 2);
    assert_eq!(reference.len(), 6);
    assert_eq!(reference[5].shape, [5, 3, 8, 8]);
    // Mixed: a soft target row per image.
    assert_eq!(reference[5].targets.as_ref().map(Vec::len), Some(5 * 3));
    for (workers, prefetch) in [(1, 0), (3, 1), (4, 8)] {
        assert!(
            same(&collect(&loader_with(workers, prefetch, 9), 2), &reference),
            "{workers} workers, prefetch {prefetch}"
        );
    }
    // Another epoch shuffles and augments differently; another seed too.
    assert!(!same(&collect(&loader_with(2, 2, 9), 3), &reference));
    assert!(!same(&collect(&loader_with(2, 2, 10), 2), &reference));
}

#[test]
fn every_image_appears_once_per_epoch_and_drop_last_drops_the_remainder() {
    let dataset = synthetic(23);
    let plain = Pipeline::new(&[]).unwrap();
    let config = LoaderConfig {
        workers: 2,
        ..LoaderConfig::new(5, 1)
    };
    let loader = Loader::new(dataset.clone(), plain.clone(), config.clone()).unwrap();
    assert_eq!(loader.len(), 5);
    let mut labels: Vec<i64> = collect(&loader, 0)
        .into_iter()
        .flat_map(|b| b.labels)
        .collect();
    let mut expected: Vec<i64> = (0..23).map(|i| dataset.label(i) as i64).collect();
    assert_ne!(labels, expected, "shuffled");
    labels.sort();
    expected.sort();
    assert_eq!(labels, expected);

    let dropping = LoaderConfig {
        drop_last: true,
        shuffle: false,
        ..config
    };
    let loader = Loader::new(dataset.clone(), plain, dropping).unwrap();
    let batches = collect(&loader, 0);
    assert_eq!(batches.len(), 4);
    assert!(batches.iter().all(|b| b.labels.len() == 5));
    // Unshuffled, the first batch is images 0..5 as ToTensor writes them.
    let first = dataset.image(0).unwrap();
    assert_eq!(
        batches[0].images[0],
        first.get_pixel(0, 0).0[0] as f32 / 255.0
    );
}

#[test]
fn a_resumed_epoch_continues_with_the_same_batches() {
    let config = LoaderConfig {
        mixing: mixing(),
        ..LoaderConfig::new(4, 5)
    };
    let loader = Loader::new(synthetic(30), augmenting(), config).unwrap();
    let whole = collect(&loader, 1);
    let resumed: Vec<HostBatch> = loader.epoch_from(1, 5).map(Result::unwrap).collect();
    assert!(same(&whole[5..], &resumed));
}

#[test]
fn dropping_an_epoch_midway_stops_its_workers() {
    let watched = Arc::new(Watched {
        inner: synthetic(200),
        decoded: AtomicUsize::new(0),
        threads: Arc::new(ThreadCounts::default()),
    });
    let config = LoaderConfig::new(4, 5);
    let (workers, prefetch) = (config.workers, config.prefetch);
    let loader = Loader::new(watched.clone(), augmenting(), config).unwrap();
    for round in 1..=20 {
        let mut batches = loader.epoch(0);
        assert!(batches.next().unwrap().is_ok());
        drop(batches);
        // Every thread that decoded an image has ended (its thread-locals dropped) once the
        // epoch is dropped, and none was left running the rest of the epoch's 50 batches: the
        // first one and the `prefetch` queued after it are all that was decoded.
        let started = watched.threads.started.load(Ordering::SeqCst);
        let ended = watched.threads.ended.load(Ordering::SeqCst);
        assert_eq!(
            ended, started,
            "round {round}: {started} started, {ended} ended"
        );
        assert!(started >= round && started <= round * workers, "{started}");
        let decoded = watched.decoded.load(Ordering::SeqCst);
        assert!(
            decoded <= round * (1 + prefetch) * 4,
            "{decoded} images decoded"
        );
    }
}

/// A data set that counts the images it decodes and the threads that decode them, and sees
/// those threads end (a thread-local's destructor runs when its thread ends).
struct Watched {
    inner: Arc<dyn Dataset>,
    decoded: AtomicUsize,
    threads: Arc<ThreadCounts>,
}

#[derive(Default)]
struct ThreadCounts {
    started: AtomicUsize,
    ended: AtomicUsize,
}

struct ThreadEnd(Arc<ThreadCounts>);

impl Drop for ThreadEnd {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::SeqCst);
    }
}

thread_local! {
    static THREAD_END: std::cell::OnceCell<ThreadEnd> = const { std::cell::OnceCell::new() };
}

impl Dataset for Watched {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn image(&self, index: usize) -> Result<RgbImage, kiln_data::DataError> {
        THREAD_END.with(|end| {
            end.get_or_init(|| {
                self.threads.started.fetch_add(1, Ordering::SeqCst);
                ThreadEnd(self.threads.clone())
            });
        });
        self.decoded.fetch_add(1, Ordering::SeqCst);
        self.inner.image(index)
    }
    fn label(&self, index: usize) -> usize {
        self.inner.label(index)
    }
    fn classes(&self) -> &[String] {
        self.inner.classes()
    }
}

fn write_folder(root: &Path) {
    for (class, count) in [("a", 3), ("b", 3)] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        for i in 0..count {
            RgbImage::from_pixel(9, 7, Rgb([i * 40, 10, 10]))
                .save(root.join(class).join(format!("{i}.png")))
                .unwrap();
        }
    }
}

#[test]
fn bad_images_are_skipped_and_counted_or_stop_the_run_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path());
    let truncated = dir.path().join("a/1.png");
    let bytes = std::fs::read(&truncated).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(dir.path().join("b/0.png"), b"not a png at all").unwrap();
    RgbImage::new(300, 2)
        .save(dir.path().join("b/huge.png"))
        .unwrap();
    let limits = ImageLimits {
        max_side: 100,
        ..ImageLimits::default()
    };
    let folder: Arc<dyn Dataset> = Arc::new(ImageFolder::open(dir.path(), limits).unwrap());
    let pipeline = Pipeline::new(&[Transform::CenterCrop { size: 6 }]).unwrap();
    let config = LoaderConfig {
        shuffle: false,
        ..LoaderConfig::new(4, 0)
    };

    let loader = Loader::new(folder.clone(), pipeline.clone(), config.clone()).unwrap();
    let batches = collect(&loader, 0);
    let images: usize = batches.iter().map(|b| b.labels.len()).sum();
    let skipped: Vec<String> = batches
        .iter()
        .flat_map(|b| b.skipped.iter().map(|e| e.to_string()))
        .collect();
    assert_eq!((images, skipped.len()), (4, 3), "{skipped:?}");
    assert!(skipped[0].contains("1.png"));
    assert!(
        skipped
            .iter()
            .any(|e| e.contains("huge.png") && e.contains("300x2"))
    );
    assert!(
        batches
            .iter()
            .all(|b| b.images.len() == b.labels.len() * 3 * 36)
    );
    // Each batch names the images it kept, and the loader gives any of them as its batch
    // holds it before normalization (a report's thumbnails).
    let kept: Vec<(usize, i64)> = (batches.iter())
        .flat_map(|b| b.indices.iter().copied().zip(b.labels.iter().copied()))
        .collect();
    assert_eq!(kept.len(), images);
    for &(index, label) in &kept {
        assert_eq!(folder.label(index) as i64, label);
        assert_eq!(loader.image(0, index).unwrap().dimensions(), (6, 6));
    }

    let strict = LoaderConfig {
        on_bad_image: OnBadImage::Error,
        ..config
    };
    let loader = Loader::new(folder, pipeline, strict).unwrap();
    let err = loader.epoch(0).find_map(Result::err).unwrap().to_string();
    assert!(err.contains(&*truncated.to_string_lossy()), "{err}");
}

/// A resize of an extreme aspect ratio (within the side limit) would allocate gigabytes: it is
/// refused from the image's size, before the resize, and the image is skipped like a bad file;
/// a JPEG cut short is skipped as PIL refuses it.
#[test]
fn oversized_resizes_and_truncated_jpegs_are_skipped_naming_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path());
    RgbImage::new(2000, 1)
        .save(dir.path().join("a/sliver.png"))
        .unwrap();
    let jpeg = dir.path().join("b/cut.jpg");
    RgbImage::from_fn(128, 96, |x, y| {
        Rgb([(x * y % 251) as u8, (x * 7 + y * 3) as u8, (x ^ y) as u8])
    })
    .save(&jpeg)
    .unwrap();
    let bytes = std::fs::read(&jpeg).unwrap();
    std::fs::write(&jpeg, &bytes[..bytes.len() * 3 / 4]).unwrap();
    let folder: Arc<dyn Dataset> =
        Arc::new(ImageFolder::open(dir.path(), ImageLimits::default()).unwrap());
    let steps = [
        Transform::Resize {
            size: 64,
            interpolation: Default::default(),
        },
        Transform::CenterCrop { size: 4 },
    ];
    // 2000x1 resized to 64 on its short side is 128000x64: 8.2 megapixels.
    let pipeline = Pipeline::new(&steps).unwrap().with_max_pixels(1 << 20);
    let loader = Loader::new(folder.clone(), pipeline, LoaderConfig::new(8, 0)).unwrap();
    let batches = collect(&loader, 0);
    let skipped: Vec<String> = batches
        .iter()
        .flat_map(|b| b.skipped.iter().map(|e| e.to_string()))
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    let sliver = skipped.iter().find(|e| e.contains("sliver.png")).unwrap();
    assert!(
        sliver.contains("128000x64") && sliver.contains("data.max_resize_pixels"),
        "{sliver}"
    );
    let cut = skipped.iter().find(|e| e.contains("cut.jpg")).unwrap();
    assert!(cut.contains("truncated"), "{cut}");
    let images: usize = batches.iter().map(|b| b.labels.len()).sum();
    assert_eq!(images, 6);
    // Under the default limit the sliver is resized and trained on.
    let roomy = Pipeline::new(&steps).unwrap();
    let batches = collect(
        &Loader::new(folder, roomy, LoaderConfig::new(8, 0)).unwrap(),
        0,
    );
    assert_eq!(batches.iter().map(|b| b.skipped.len()).sum::<usize>(), 1);
}

#[test]
fn images_of_different_sizes_in_one_batch_ask_for_a_crop() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path());
    RgbImage::new(5, 5)
        .save(dir.path().join("a/odd.png"))
        .unwrap();
    let folder = Arc::new(ImageFolder::open(dir.path(), ImageLimits::default()).unwrap());
    let loader = Loader::new(folder, Pipeline::new(&[]).unwrap(), LoaderConfig::new(7, 0));
    let err = loader
        .unwrap()
        .epoch(0)
        .next()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(err.contains("center_crop"), "{err}");
}

#[test]
fn impossible_configurations_are_refused() {
    let err = |config: LoaderConfig| {
        Loader::new(synthetic(3), Pipeline::new(&[]).unwrap(), config)
            .err()
            .unwrap()
            .to_string()
    };
    assert!(err(LoaderConfig::new(0, 0)).contains("batch_size"));
    let dropping = LoaderConfig {
        drop_last: true,
        ..LoaderConfig::new(4, 0)
    };
    assert!(err(dropping).contains("drop_last"));
    let nothing_to_mix = LoaderConfig {
        mixing: mixing().map(|m| Mixing {
            mixup_alpha: 0.0,
            cutmix_alpha: 0.0,
            ..m
        }),
        ..LoaderConfig::new(2, 0)
    };
    assert!(err(nothing_to_mix).contains("mixup_alpha or cutmix_alpha"));
}

#[test]
fn shares_of_each_batch_together_are_the_whole_batch_in_order() {
    let dataset = synthetic(23);
    let loader = |share| {
        let config = LoaderConfig {
            share,
            ..LoaderConfig::new(5, 1)
        };
        Loader::new(dataset.clone(), augmenting(), config).unwrap()
    };
    let whole = collect(&loader(BatchShare::WHOLE), 2);
    let parts: Vec<Vec<HostBatch>> = (0..3)
        .map(|index| collect(&loader(BatchShare { index, count: 3 }), 2))
        .collect();
    assert_eq!(whole.len(), 5);
    for (b, batch) in whole.iter().enumerate() {
        let labels: Vec<i64> = parts.iter().flat_map(|p| p[b].labels.clone()).collect();
        let images: Vec<f32> = parts.iter().flat_map(|p| p[b].images.clone()).collect();
        assert_eq!(labels, batch.labels);
        // Augmentation is seeded per image, so a shard's images are those of the whole batch.
        assert_eq!(images, batch.images);
        let sizes: Vec<usize> = parts.iter().map(|p| p[b].labels.len()).collect();
        let n = batch.labels.len();
        assert!(
            sizes.iter().all(|&s| s == n / 3 || s == n / 3 + 1),
            "{sizes:?}"
        );
    }
}
