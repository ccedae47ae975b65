//! `kiln stats`: a training set described. Per-channel mean and standard deviation of its images
//! after the transforms that come before `normalize` (what to paste into `normalize`), images per
//! class, the images' sizes as stored, and the files that cannot be read.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::SharedDataset;
use crate::seed::{Purpose, stream};
use crate::transforms::{Pipeline, Transform};

/// What [`statistics`] found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DataStats {
    /// Images read and counted in `mean` and `std`.
    pub images: usize,
    /// Per channel (RGB), of values in [0, 1] as `to_tensor` makes them.
    pub mean: [f64; 3],
    /// Per channel, over every pixel of every image (the population's deviation).
    pub std: [f64; 3],
    /// Images per class, in the data set's class order (unreadable files included).
    pub classes: Vec<(String, usize)>,
    /// Stored sizes (width, height) with their counts, the most common first.
    pub sizes: Vec<((u32, u32), usize)>,
    /// Each file that could not be read or transformed, with the reason.
    pub unreadable: Vec<String>,
}

impl DataStats {
    /// The largest class's images over the smallest's, where every class has some.
    pub fn imbalance(&self) -> Option<f64> {
        let counts = self.classes.iter().map(|(_, n)| *n);
        let (low, high) = (counts.clone().min()?, counts.max()?);
        (low > 0).then(|| high as f64 / low as f64)
    }
}

/// Per-thread sums: integers, so the totals are exact whatever the thread count.
#[derive(Default)]
struct Sums {
    images: usize,
    pixels: u64,
    values: [u64; 3],
    squares: [u64; 3],
    sizes: HashMap<(u32, u32), usize>,
    unreadable: Vec<(usize, String)>,
}

/// Reads every image of `dataset` on `workers` threads, applies the host transforms of
/// `transforms` that precede `normalize` (random ones with epoch 0's draws of `seed`, as the
/// loader draws them), and sums each channel's values. `progress` hears each image.
pub fn statistics(
    dataset: &SharedDataset,
    transforms: &[Transform],
    seed: u64,
    workers: usize,
    max_pixels: u64,
    progress: &(dyn Fn() + Sync),
) -> Result<DataStats, crate::DataError> {
    let before_normalize: Vec<Transform> = transforms
        .iter()
        .take_while(|t| !matches!(t, Transform::Normalize { .. }))
        .filter(|t| !matches!(t, Transform::RandomErasing { .. }))
        .cloned()
        .collect();
    let pipeline = Pipeline::new(&before_normalize)?.with_max_pixels(max_pixels);
    let next = AtomicUsize::new(0);
    let totals = Mutex::new(Sums::default());
    std::thread::scope(|scope| {
        for _ in 0..workers.max(1) {
            scope.spawn(|| {
                let mut sums = Sums::default();
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= dataset.len() {
                        break;
                    }
                    add_image(dataset, &pipeline, seed, index, &mut sums);
                    progress();
                }
                let mut totals = totals.lock().unwrap_or_else(|e| e.into_inner());
                merge(&mut totals, sums);
            });
        }
    });
    let mut sums = totals.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut counts = vec![0; dataset.classes().len()];
    for index in 0..dataset.len() {
        if let Some(count) = counts.get_mut(dataset.label(index)) {
            *count += 1;
        }
    }
    let pixels = sums.pixels.max(1) as f64;
    let mean = sums.values.map(|v| v as f64 / 255.0 / pixels);
    let mut std = [0.0; 3];
    for c in 0..3 {
        let square = sums.squares[c] as f64 / (255.0 * 255.0) / pixels;
        std[c] = (square - mean[c] * mean[c]).max(0.0).sqrt();
    }
    let mut sizes: Vec<((u32, u32), usize)> = sums.sizes.into_iter().collect();
    sizes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    sums.unreadable.sort();
    Ok(DataStats {
        images: sums.images,
        mean,
        std,
        classes: dataset.classes().iter().cloned().zip(counts).collect(),
        sizes,
        unreadable: sums.unreadable.into_iter().map(|(_, why)| why).collect(),
    })
}

fn add_image(
    dataset: &SharedDataset,
    pipeline: &Pipeline,
    seed: u64,
    index: usize,
    sums: &mut Sums,
) {
    let image = match dataset.image(index) {
        Ok(image) => image,
        Err(error) => return sums.unreadable.push((index, error.to_string())),
    };
    let size = image.dimensions();
    *sums.sizes.entry(size).or_default() += 1;
    if let Some((width, height)) = pipeline.too_large(size) {
        let why = format!(
            "{}: the transforms would make it {width}x{height}, over data.max_resize_pixels",
            dataset.describe(index)
        );
        return sums.unreadable.push((index, why));
    }
    let mut rng = stream(seed, Purpose::Augment, 0, index as u64);
    let image = pipeline.transform(image, &mut rng);
    for pixel in image.pixels() {
        for c in 0..3 {
            let value = u64::from(pixel.0[c]);
            sums.values[c] += value;
            sums.squares[c] += value * value;
        }
    }
    sums.pixels += u64::from(image.width()) * u64::from(image.height());
    sums.images += 1;
}

fn merge(totals: &mut Sums, sums: Sums) {
    totals.images += sums.images;
    totals.pixels += sums.pixels;
    for c in 0..3 {
        totals.values[c] += sums.values[c];
        totals.squares[c] += sums.squares[c];
    }
    for (size, count) in sums.sizes {
        *totals.sizes.entry(size).or_default() += count;
    }
    totals.unreadable.extend(sums.unreadable);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dataset::InMemory;

    /// Two 2x1 images of known values: red channel 0 and 255 in one, 255 and 255 in the other,
    /// so its mean is 3/4 and its deviation sqrt(3)/4; green all 51 (0.2, deviation 0).
    #[test]
    fn mean_and_deviation_are_those_of_every_pixel() {
        let pixels = vec![
            0, 51, 0, 255, 51, 0, //
            255, 51, 0, 255, 51, 255,
        ];
        let dataset: SharedDataset = Arc::new(InMemory {
            width: 2,
            height: 1,
            pixels,
            labels: vec![0, 0],
            classes: vec!["a".into(), "b".into()],
        });
        for workers in [1, 3] {
            let stats = statistics(&dataset, &[], 0, workers, u64::MAX, &|| {}).unwrap();
            assert_eq!(stats.images, 2);
            assert!((stats.mean[0] - 0.75).abs() < 1e-12, "{stats:?}");
            assert!(
                (stats.std[0] - 3f64.sqrt() / 4.0).abs() < 1e-12,
                "{stats:?}"
            );
            assert!((stats.mean[1] - 0.2).abs() < 1e-12 && stats.std[1] < 1e-7);
            assert!((stats.mean[2] - 0.25).abs() < 1e-12);
            assert_eq!(stats.classes, [("a".to_string(), 2), ("b".to_string(), 0)]);
            assert_eq!(stats.sizes, [((2, 1), 2)]);
            assert_eq!(stats.imbalance(), None);
        }
    }
}
