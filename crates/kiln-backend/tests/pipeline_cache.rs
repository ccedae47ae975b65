//! The Vulkan driver's compiled pipelines kept in kiln's kernel cache (patches/cubecl-wgpu): a
//! process that runs kernels leaves one pipeline cache file for its adapter and driver under
//! `<kernel cache>/pipelines/`, and a file that is not this driver's (or is damaged) is ignored
//! with one warning and replaced. Each run in a child process with a kernel cache of its own
//! (cubecl reads its config once a process). Skips without a Vulkan adapter unless
//! `KILN_REQUIRE_WGPU` is set (CI sets it).

#![cfg(feature = "vulkan")]

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use kiln_backend::{Backend, BackendChoice, BackendTask, DeviceSelection, probe, resolve, run_on};

/// Set in the child process: the kernel cache folder.
const CHILD: &str = "KILN_TEST_PIPELINE_CACHE_CHILD";

/// A few kernels on the first device, read back.
struct Kernels;

impl BackendTask for Kernels {
    type Output = f32;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> f32 {
        let x = Tensor::<B, 1>::from_floats([1.0, 2.0, 3.5], &devices[0]);
        (x.clone() * 2.0 + 1.0)
            .exp()
            .log()
            .sum()
            .into_scalar()
            .elem()
    }
}

fn child(cache: PathBuf) {
    env_logger::builder()
        .filter_level(log::LevelFilter::Warn)
        .is_test(false)
        .init();
    kiln_backend::configure_private_kernel_cache(cache);
    let resolved = resolve(
        BackendChoice::Explicit(Backend::Vulkan),
        &DeviceSelection::default(),
        &probe(),
    )
    .expect("the parent found a Vulkan adapter");
    let sum = run_on(&resolved, Kernels).unwrap();
    assert!((sum - 16.0).abs() < 1e-3, "{sum}");
}

/// Runs the child with `cache`; its standard error.
fn run_child(cache: &Path) -> String {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "pipelines_are_kept_in_the_kernel_cache",
            "--nocapture",
        ])
        .env(CHILD, cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "the child failed: {stderr}");
    stderr
}

fn pipeline_files(cache: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(cache.join("pipelines")) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn pipelines_are_kept_in_the_kernel_cache() {
    if let Some(cache) = std::env::var_os(CHILD) {
        return child(cache.into());
    }
    let probe = probe();
    if let Err(why) = probe.report(Backend::Vulkan).devices() {
        if std::env::var_os("KILN_REQUIRE_WGPU").is_some() {
            panic!("KILN_REQUIRE_WGPU is set but Vulkan is unusable: {why}")
        }
        eprintln!("skipping: {why}");
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    run_child(cache.path());
    let files = pipeline_files(cache.path());
    assert_eq!(
        files.len(),
        1,
        "one file for the adapter and driver: {files:?}"
    );
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("wgpu_pipeline_cache_vulkan_") && name.ends_with(".bin"),
        "{name}"
    );
    assert!(!std::fs::read(&files[0]).unwrap().is_empty());

    // Another driver's file, or a damaged one: one warning, and replaced by this driver's.
    let foreign = b"not a pipeline cache of this driver".repeat(4);
    std::fs::write(&files[0], &foreign).unwrap();
    let stderr = run_child(cache.path());
    let warnings = stderr.matches("is not this driver's or is damaged").count();
    assert_eq!(warnings, 1, "{stderr}");
    assert_ne!(std::fs::read(&files[0]).unwrap(), foreign, "replaced");
    assert_eq!(
        pipeline_files(cache.path()).len(),
        1,
        "no partial file left"
    );
    // The replacement is this driver's: the next process takes it without a word.
    let stderr = run_child(cache.path());
    assert!(!stderr.contains("pipeline cache"), "{stderr}");
}
