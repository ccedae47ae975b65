//! Mixup and CutMix on a loader batch, as timm's `Mixup`: each image is mixed with its mirror in
//! the batch (image `i` with image `n - 1 - i`), by one draw for the whole batch (`batch`), one
//! per mirrored pair (`pair`) or one per image (`elem`), and the labels become soft targets
//! that carry the label smoothing too.
//!
//! The draws ([`Mixing::draw`]) are separate from the arithmetic ([`Mixing::apply`]), so that
//! the arithmetic can be checked against timm's for given draws. The loader draws from a stream
//! seeded by (seed, epoch, batch), so resume is exact and the worker count changes nothing.

use rand::Rng;
use rand_distr::{Beta, Distribution};
use serde::{Deserialize, Serialize};

use crate::HostBatch;

/// What one draw mixes: the whole batch, each mirrored pair, or each image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MixMode {
    #[default]
    Batch,
    Pair,
    Elem,
}

/// timm's `Mixup(mixup_alpha, cutmix_alpha, prob, switch_prob, mode, label_smoothing,
/// num_classes)`, with the CutMix box's lambda always corrected for its clipped area.
#[derive(Debug, Clone, PartialEq)]
pub struct Mixing {
    /// Mixup's Beta(alpha, alpha); 0 leaves mixup out.
    pub mixup_alpha: f64,
    /// CutMix's Beta(alpha, alpha); 0 leaves CutMix out.
    pub cutmix_alpha: f64,
    /// The chance that a batch (pair, image) is mixed at all.
    pub prob: f64,
    /// With both on, the chance of CutMix rather than mixup.
    pub switch_prob: f64,
    pub mode: MixMode,
    pub label_smoothing: f64,
    pub classes: usize,
}

/// One mixing decision: the weight of the image itself (1: left alone) and, for CutMix, the
/// centre (row, column) of the box pasted from its mirror.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub lam: f64,
    pub cutmix_center: Option<(usize, usize)>,
}

/// A mixed batch's soft targets, `[n, classes]`, and each image's dominant label (the one with
/// the larger weight), which training accuracy is counted against.
#[derive(Debug, Clone, PartialEq)]
pub struct Mixed {
    pub targets: Vec<f32>,
    pub dominant: Vec<i64>,
}

impl Mixing {
    /// Each value in its range, and something to mix with.
    pub fn check(&self) -> Result<(), String> {
        for (name, alpha) in [
            ("mixup_alpha", self.mixup_alpha),
            ("cutmix_alpha", self.cutmix_alpha),
        ] {
            if !(alpha >= 0.0 && alpha.is_finite()) {
                return Err(format!("{name} must be 0 (off) or positive, got {alpha}"));
            }
        }
        if self.mixup_alpha == 0.0 && self.cutmix_alpha == 0.0 {
            return Err(
                "set mixup_alpha or cutmix_alpha above 0 (timm uses 0.8 and 1.0), \
                 or leave the section out"
                    .into(),
            );
        }
        for (name, p) in [("prob", self.prob), ("switch_prob", self.switch_prob)] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{name} must lie in [0, 1], got {p}"));
            }
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return Err(format!(
                "label_smoothing must lie in [0, 1), got {}",
                self.label_smoothing
            ));
        }
        if self.classes == 0 {
            return Err("mixing needs the number of classes".into());
        }
        Ok(())
    }

    /// Draws for a batch of `n` images of `height` x `width`, as timm's `_params_per_batch`
    /// (one draw), or `_params_per_elem` over the pairs or the images, each CutMix draw with
    /// its box centre.
    pub fn draw(&self, n: usize, (height, width): (usize, usize), rng: &mut impl Rng) -> Vec<Draw> {
        let count = match self.mode {
            MixMode::Batch => 1,
            MixMode::Pair => n / 2,
            MixMode::Elem => n,
        };
        let beta = |alpha: f64| Beta::new(alpha, alpha).expect("alpha checked positive");
        (0..count)
            .map(|_| {
                if rng.random::<f64>() >= self.prob {
                    return Draw {
                        lam: 1.0,
                        cutmix_center: None,
                    };
                }
                let cutmix = match (self.mixup_alpha > 0.0, self.cutmix_alpha > 0.0) {
                    (true, true) => rng.random::<f64>() < self.switch_prob,
                    (false, true) => true,
                    _ => false,
                };
                let alpha = if cutmix {
                    self.cutmix_alpha
                } else {
                    self.mixup_alpha
                };
                let lam = beta(alpha).sample(rng);
                let cutmix_center = cutmix.then(|| {
                    (
                        rng.random_range(0..height.max(1)),
                        rng.random_range(0..width.max(1)),
                    )
                });
                Draw { lam, cutmix_center }
            })
            .collect()
    }

    /// Mixes `batch` in place with fresh draws: its images mixed, its labels replaced by the
    /// dominant ones and its soft targets set.
    pub fn mix(&self, batch: &mut HostBatch, rng: &mut impl Rng) {
        let [n, _, height, width] = batch.shape;
        if n == 0 {
            return;
        }
        let draws = self.draw(n, (height, width), rng);
        let mixed = self.apply(&mut batch.images, batch.shape, &batch.labels, &draws);
        batch.labels = mixed.dominant;
        batch.targets = Some(mixed.targets);
    }

    /// timm's `Mixup.__call__` for given draws: `images` (`shape` `[n, c, h, w]`) are mixed in
    /// place, in f32 as PyTorch mixes them.
    pub fn apply(
        &self,
        images: &mut [f32],
        shape: [usize; 4],
        labels: &[i64],
        draws: &[Draw],
    ) -> Mixed {
        let [n, _, height, width] = shape;
        let image_len = images.len() / n.max(1);
        let original = images.to_vec();
        // Per image: its own weight in its soft target, and its mirror's, in f32.
        let mut weights = vec![(1.0f32, 0.0f32); n];
        // timm's batch mode keeps lambda a Python float; the others hold it in a float32 array,
        // box arithmetic included.
        let single = self.mode != MixMode::Batch;
        let mut paste = |i: usize, j: usize, draw: &Draw| -> f64 {
            let lam = match single {
                true => draw.lam as f32 as f64,
                false => draw.lam,
            };
            let (lam, rect) = match draw.cutmix_center {
                Some(center) => cutmix_box((height, width), lam, center, single),
                None => (lam, None),
            };
            let (image, source) = (
                &mut images[i * image_len..(i + 1) * image_len],
                &original[j * image_len..(j + 1) * image_len],
            );
            match rect {
                // CutMix: the box from the partner, the rest untouched.
                Some(rect) => paste_box(image, source, (height, width), rect),
                None if draw.cutmix_center.is_some() => {}
                // Mixup.
                None => {
                    let (own, other) = match single {
                        false => (lam as f32, (1.0 - lam) as f32),
                        true => (lam as f32, 1.0 - lam as f32),
                    };
                    for (x, &y) in image.iter_mut().zip(source) {
                        *x = *x * own + y * other;
                    }
                }
            }
            lam
        };
        let partner = |i: usize| n - 1 - i;
        match self.mode {
            MixMode::Batch => {
                let draw = draws[0];
                if draw.lam != 1.0 {
                    let mut lam = draw.lam;
                    for i in 0..n {
                        lam = paste(i, partner(i), &draw);
                    }
                    weights = vec![(lam as f32, (1.0 - lam) as f32); n];
                }
            }
            MixMode::Pair => {
                for (i, draw) in draws.iter().enumerate() {
                    let j = partner(i);
                    let mut lam = 1.0;
                    if draw.lam != 1.0 {
                        lam = paste(i, j, draw);
                        paste(j, i, draw);
                    }
                    let own = lam as f32;
                    (weights[i], weights[j]) = ((own, 1.0 - own), (own, 1.0 - own));
                }
            }
            MixMode::Elem => {
                for (i, draw) in draws.iter().enumerate() {
                    let mut lam = 1.0;
                    if draw.lam != 1.0 {
                        lam = paste(i, partner(i), draw);
                    }
                    let own = lam as f32;
                    weights[i] = (own, 1.0 - own);
                }
            }
        }
        self.targets(labels, &weights)
    }

    /// timm's `mixup_target`: smoothed one-hot rows, each weighted with its mirror's.
    fn targets(&self, labels: &[i64], weights: &[(f32, f32)]) -> Mixed {
        let (n, classes) = (labels.len(), self.classes);
        let off = self.label_smoothing / classes as f64;
        let on = (1.0 - self.label_smoothing + off) as f32;
        let off = off as f32;
        let mut targets = vec![0f32; n * classes];
        let mut dominant = Vec::with_capacity(n);
        for (i, (row, &(own, other))) in targets.chunks_mut(classes).zip(weights).enumerate() {
            let (a, b) = (labels[i] as usize, labels[n - 1 - i] as usize);
            for (c, value) in row.iter_mut().enumerate() {
                let y1 = if c == a { on } else { off };
                let y2 = if c == b { on } else { off };
                *value = y1 * own + y2 * other;
            }
            dominant.push(if own >= other {
                labels[i]
            } else {
                labels[n - 1 - i]
            });
        }
        Mixed { targets, dominant }
    }
}

/// A box as (top, bottom, left, right), bottom and right exclusive.
type Rect = (usize, usize, usize, usize);

/// timm's `rand_bbox` for a drawn centre, and `cutmix_bbox_and_lam`'s lambda corrected for the
/// box's area once clipped to the image. An empty box (lambda near 1) mixes nothing. `single`:
/// the side lengths in float32 arithmetic, as timm's per-pair and per-image modes compute them.
pub fn cutmix_box(
    (height, width): (usize, usize),
    lam: f64,
    (cy, cx): (usize, usize),
    single: bool,
) -> (f64, Option<Rect>) {
    let (cut_h, cut_w) = match single {
        false => {
            let ratio = (1.0 - lam).sqrt();
            (
                (height as f64 * ratio) as i64,
                (width as f64 * ratio) as i64,
            )
        }
        true => {
            let ratio = (1.0 - lam as f32).sqrt();
            (
                (height as f32 * ratio) as i64,
                (width as f32 * ratio) as i64,
            )
        }
    };
    let clip = |v: i64, end: usize| v.clamp(0, end as i64) as usize;
    let (cy, cx) = (cy as i64, cx as i64);
    let top = clip(cy - cut_h / 2, height);
    let bottom = clip(cy + (cut_h + 1) / 2, height);
    let left = clip(cx - cut_w / 2, width);
    let right = clip(cx + (cut_w + 1) / 2, width);
    let area = (bottom - top) * (right - left);
    let lam = 1.0 - area as f64 / (height * width) as f64;
    (lam, (area > 0).then_some((top, bottom, left, right)))
}

/// Copies `rect` of every channel of `source` into `image` (both `[c, height, width]`).
fn paste_box(image: &mut [f32], source: &[f32], (height, width): (usize, usize), rect: Rect) {
    let (top, bottom, left, right) = rect;
    let plane = height * width;
    for channel in 0..image.len() / plane {
        for row in top..bottom {
            let at = channel * plane + row * width;
            image[at + left..at + right].copy_from_slice(&source[at + left..at + right]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seed::{Purpose, stream};

    fn mixing(mode: MixMode) -> Mixing {
        Mixing {
            mixup_alpha: 0.8,
            cutmix_alpha: 1.0,
            prob: 1.0,
            switch_prob: 0.5,
            mode,
            label_smoothing: 0.1,
            classes: 4,
        }
    }

    #[test]
    fn targets_sum_to_one_and_the_dominant_label_has_the_larger_weight() {
        for mode in [MixMode::Batch, MixMode::Pair, MixMode::Elem] {
            let m = mixing(mode);
            let mut images: Vec<f32> = (0..5 * 3 * 6 * 6).map(|v| v as f32).collect();
            let labels = [0, 1, 2, 3, 1];
            let draws = m.draw(5, (6, 6), &mut stream(3, Purpose::Mix, 0, 0));
            let mixed = m.apply(&mut images, [5, 3, 6, 6], &labels, &draws);
            for (i, row) in mixed.targets.chunks(4).enumerate() {
                assert!(
                    (row.iter().sum::<f32>() - 1.0).abs() < 1e-6,
                    "{mode:?} {row:?}"
                );
                let top = row.iter().cloned().fold(f32::MIN, f32::max);
                assert_eq!(row[mixed.dominant[i] as usize], top, "{mode:?} {row:?}");
            }
            // An odd batch's middle image is its own mirror: it stays as it was.
            assert_eq!(mixed.dominant[2], 2);
        }
    }

    #[test]
    fn the_box_is_clipped_and_lambda_follows_its_area() {
        // A centred box of half the side: a quarter of the image.
        let (lam, rect) = cutmix_box((8, 8), 0.75, (4, 4), false);
        assert_eq!(rect, Some((2, 6, 2, 6)));
        assert_eq!(lam, 0.75);
        // The same box at the corner loses three quarters of itself.
        let (lam, rect) = cutmix_box((8, 8), 0.75, (0, 0), false);
        assert_eq!(rect, Some((0, 2, 0, 2)));
        assert_eq!(lam, 1.0 - 4.0 / 64.0);
    }

    #[test]
    fn prob_zero_mixes_nothing() {
        let m = Mixing {
            prob: 0.0,
            ..mixing(MixMode::Elem)
        };
        let draws = m.draw(6, (4, 4), &mut stream(1, Purpose::Mix, 0, 0));
        assert!(
            draws
                .iter()
                .all(|d| d.lam == 1.0 && d.cutmix_center.is_none())
        );
    }
}
