//! How the process meets the CPU. On flex a training step is thousands of small operations, each
//! allocating its output and many of them split over rayon's threads; at the quickstart's sizes
//! the cost of handing out the work and of fetching fresh memory from the kernel outweighed the
//! arithmetic (`docs/performance.md`, "Thread hand-offs and page faults").

/// Makes the main thread one of the workers of rayon's global pool, which flex's kernels, the
/// gemm crate and kiln's convolutions all split their work over. A training step on one device
/// runs on this thread; outside the pool, every parallel operation it calls hands its work to
/// the pool's threads and sleeps until they are done (a wake-up and a sleep per operation, and
/// one core fewer doing the work). As a worker, it runs its share and the others steal the rest.
///
/// At least two threads, so that work given to the pool by other threads (the replicas of
/// `--devices 0,0`, image decoding in the loader) always has a worker besides this one, which
/// may be waiting on them.
pub fn join_compute_pool() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Fails only if the pool already exists, in which case there is nothing to join.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(2))
        .use_current_thread()
        .build_global();
}

/// Keeps freed memory in the process for the next step, where glibc's allocator would give it
/// back to the kernel: blocks above its (adaptive, 128 KiB at first) mmap threshold are unmapped
/// when freed, and the heap is trimmed once 128 KiB at its top are free, so every step faulted
/// its tensors' pages in again and had the kernel zero them. Blocks of up to 32 MiB (glibc's
/// largest threshold) now come from the heap, and it is trimmed only past 1 GiB free (and where
/// the memory meter starts a new stretch: an epoch, a benchmark row). A user's own
/// `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_` is left alone.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let set = |name: &str| std::env::var_os(name).is_some();
        if set("MALLOC_MMAP_THRESHOLD_") || set("MALLOC_TRIM_THRESHOLD_") {
            return;
        }
        // SAFETY: `mallopt` only changes the allocator's parameters; called before any thread
        // but the main one allocates.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The thread that joins runs rayon's parallel work as worker 0, beside at least one other.
    #[test]
    fn the_joining_thread_is_a_worker_of_the_global_pool() {
        std::thread::spawn(|| {
            assert_eq!(rayon::current_thread_index(), None);
            super::join_compute_pool();
            assert_eq!(rayon::current_thread_index(), Some(0));
            assert!(rayon::current_num_threads() >= 2);
            let sum: u64 = rayon::iter::ParallelIterator::sum(
                rayon::iter::IntoParallelIterator::into_par_iter(0..1000u64),
            );
            assert_eq!(sum, 499_500);
        })
        .join()
        .unwrap();
    }
}
