//! Where cubecl keeps what it compiles and tunes, so that a second run on the same machine
//! compiles and tunes nothing it did before. cubecl keeps neither by default in a place that
//! outlives a checkout: compiled kernels not at all, autotune results beside the nearest
//! `Cargo.toml`. kiln puts both in its cache folder, per backend and device model (the compiled
//! kernels' keys do not include the GPU), unless the user's own `cubecl.toml` says otherwise.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The largest cache the NVIDIA driver accepts for machine code it compiled from PTX (4 GiB;
/// its default is 256 MiB, which one cold kiln run on an H200 filled, so that every later
/// process compiled its kernels again: 0.8 s each).
pub const DRIVER_CACHE_MAXSIZE: u64 = 4 << 30;

/// What kernel caching a run uses.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelCache {
    /// kiln's: compiled kernels and autotune results under this folder.
    Kiln(PathBuf),
    /// The user's `cubecl.toml` (or `burn.toml`) in force here decides.
    User(PathBuf),
    /// A CPU backend compiles nothing.
    None,
}

/// The cubecl config file that cubecl itself would read from `dir` (it looks in the working
/// directory and each parent).
pub fn user_config(dir: &Path) -> Option<PathBuf> {
    let names = ["cubecl.toml", "CubeCL.toml", "burn.toml", "Burn.toml"];
    dir.ancestors()
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .find(|p| p.is_file())
}

/// Where cubecl's profiling log goes, when asked for before the first device starts
/// ([`profile_kernels_to`]).
static PROFILE_LOG: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Has cubecl time every kernel it launches and write one line for each to `file`
/// (`| <device time> | <kernel>`), as `CUBECL_DEBUG_OPTION=profile` does: for counting a
/// step's kernels (`kiln bench --kernels`). Each launch then waits for the device: the figures
/// are for where the time goes, not for speed. Takes effect only before cubecl's config is
/// first read (the first GPU device of the process).
pub fn profile_kernels_to(file: PathBuf) {
    let _ = PROFILE_LOG.set(file);
}

/// Sets cubecl's caches to `folder` before any GPU device is created (cubecl reads its config
/// once, on first use), keeping the environment's overrides (`CUBECL_DEBUG_LOG`, ...).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub fn configure(folder: PathBuf) -> KernelCache {
    use cubecl_runtime::config::cache::CacheConfig;
    use cubecl_runtime::config::profiling::ProfilingLogLevel;
    use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};

    let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    if let Some(file) = user_config(&here) {
        return KernelCache::User(file);
    }
    if CubeClRuntimeConfig::storage().lock().is_some() {
        // Already read (an earlier run in this process): it keeps what it had.
        return KernelCache::Kiln(folder);
    }
    let mut config = CubeClRuntimeConfig::default();
    config.compilation.cache = Some(CacheConfig::File(folder.clone()));
    config.autotune.cache = CacheConfig::File(folder.clone());
    let mut config = config.override_from_env();
    if let Some(file) = PROFILE_LOG.get() {
        config.profiling.logger.level = ProfilingLogLevel::Basic;
        config.profiling.logger.file = Some(file.clone());
        config.profiling.logger.append = false;
    }
    CubeClRuntimeConfig::set(config);
    KernelCache::Kiln(folder)
}

/// The environment the NVIDIA driver reads for its compiled-kernel cache, to set before it
/// starts: its largest size, in kiln's cache folder under `root` (beside cubecl's kernels,
/// where `kiln warmup` and a cleaned cache find it), each unless the user set it (`get` reads
/// the environment).
pub fn driver_cache_settings(
    get: impl Fn(&str) -> Option<OsString>,
    root: &Path,
) -> Vec<(&'static str, OsString)> {
    let wanted = [
        (
            "CUDA_CACHE_MAXSIZE",
            DRIVER_CACHE_MAXSIZE.to_string().into(),
        ),
        ("CUDA_CACHE_PATH", root.join("kernels/cuda-driver").into()),
    ];
    wanted
        .into_iter()
        .filter(|(key, _)| get(key).is_none_or(|v| v.is_empty()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_cache_is_kilns_and_largest_unless_the_user_set_it() {
        let root = Path::new("/cache/kiln");
        let none = |_: &str| None;
        assert_eq!(
            driver_cache_settings(none, root),
            vec![
                ("CUDA_CACHE_MAXSIZE", OsString::from("4294967296")),
                (
                    "CUDA_CACHE_PATH",
                    OsString::from("/cache/kiln/kernels/cuda-driver")
                ),
            ]
        );
        let users = |key: &str| (key == "CUDA_CACHE_PATH").then(|| OsString::from("/scratch/nv"));
        assert_eq!(
            driver_cache_settings(users, root),
            vec![("CUDA_CACHE_MAXSIZE", OsString::from("4294967296"))]
        );
        let empty = |key: &str| (key == "CUDA_CACHE_MAXSIZE").then(OsString::new);
        assert_eq!(driver_cache_settings(empty, root).len(), 2);
    }

    #[test]
    fn a_cubecl_toml_above_the_working_directory_is_the_users() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        assert_eq!(user_config(&deep), None);
        std::fs::write(dir.path().join("a/cubecl.toml"), "").unwrap();
        assert_eq!(user_config(&deep), Some(dir.path().join("a/cubecl.toml")));
    }
}
