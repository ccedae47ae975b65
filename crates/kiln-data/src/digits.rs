//! The 1,797 8x8 handwritten digits (UCI, CC BY 4.0) shipped inside kiln, so that the
//! quickstart trains offline. See `assets/DIGITS-LICENSE.md`.

use std::sync::Arc;

use crate::dataset::{InMemory, SharedDataset, split};

const RECORDS: &[u8] = include_bytes!("../assets/digits.bin");
const SIDE: u32 = 8;
/// The validation part: 297 images, as in scikit-learn's usual 1,500 / 297 split.
const VAL_COUNT: usize = 297;
/// The training part.
pub const TRAIN: usize = 1500;
/// Fixed, so that every run validates on the same 297 images whatever its seed.
const SPLIT_SEED: u64 = 0;

/// All 1,797 digits as 8x8 RGB images (gray replicated), labels 0 to 9.
pub fn all() -> InMemory {
    let records = RECORDS.chunks_exact(1 + (SIDE * SIDE) as usize);
    let mut pixels = Vec::with_capacity(records.len() * 3 * 64);
    let mut labels = Vec::with_capacity(records.len());
    for record in records {
        labels.push(record[0] as u16);
        pixels.extend(record[1..].iter().flat_map(|&v| [v, v, v]));
    }
    InMemory {
        width: SIDE,
        height: SIDE,
        pixels,
        labels,
        classes: (0..10).map(|d| d.to_string()).collect(),
    }
}

/// (train, validation): 1,500 and 297 images.
pub fn splits() -> (SharedDataset, SharedDataset) {
    let all: SharedDataset = Arc::new(all());
    let fraction = VAL_COUNT as f64 / all.len() as f64;
    split(all, fraction, SPLIT_SEED).expect("the fraction lies in (0, 1)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dataset;

    #[test]
    fn the_shipped_digits_are_whole_and_balanced() {
        let digits = all();
        assert_eq!(digits.len(), 1797);
        let mut counts = [0usize; 10];
        for i in 0..digits.len() {
            counts[digits.label(i)] += 1;
        }
        assert!(
            counts.iter().all(|&c| (174..=183).contains(&c)),
            "{counts:?}"
        );
        // The first image of scikit-learn's digits is a 0: a ring, dark in the middle.
        let zero = digits.image(0).unwrap();
        assert_eq!(digits.label(0), 0);
        assert!(zero.get_pixel(4, 3).0[0] < 64 && zero.get_pixel(2, 3).0[0] > 128);

        let (train, val) = splits();
        assert_eq!((train.len(), val.len()), (TRAIN, 297));
    }
}
