//! Outputs written in full, allocated without zeroing them first: zeroing is a pass over memory
//! as long as the writing itself (`memset` took 7% of ResNet-50's inference on flex).

use std::mem::MaybeUninit;

use rayon::prelude::*;

/// `len` values, written by `write` in parallel chunks of `chunk` values (chunk `i` holds values
/// `i * chunk..`), which it is handed uninitialized.
///
/// # Safety
///
/// `write` initializes every value of each chunk it is given.
pub(crate) unsafe fn written_in_chunks(
    len: usize,
    chunk: usize,
    write: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync + Send,
) -> Vec<f32> {
    let mut values = Vec::with_capacity(len);
    values.spare_capacity_mut()[..len]
        .par_chunks_mut(chunk.max(1))
        .enumerate()
        .for_each(|(i, chunk)| write(i, chunk));
    // SAFETY: the caller's `write` initialized all `len` values.
    unsafe { values.set_len(len) };
    values
}

/// `values`, every one of which has been written, as plain values.
///
/// # Safety
///
/// Every value of `values` is initialized.
pub(crate) unsafe fn assume_written(values: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: `MaybeUninit<f32>` has `f32`'s layout, and the caller vouches for every value.
    unsafe { &mut *(values as *mut [MaybeUninit<f32>] as *mut [f32]) }
}
