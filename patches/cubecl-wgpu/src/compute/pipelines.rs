//! kiln: the driver's compiled pipelines kept across processes.
//!
//! cubecl keeps each kernel's SPIR-V on disk (`[compilation] cache`), but every process still
//! has the driver turn it into machine code again when it creates the pipeline: on an NVIDIA
//! H200's Vulkan driver a warm quickstart spent twice its second epoch in its first. Vulkan lets
//! an application hand a `VkPipelineCache` to every pipeline it creates and save its contents;
//! wgpu exposes it as [`wgpu::PipelineCache`] (`Features::PIPELINE_CACHE`, Vulkan only). Here one
//! cache per adapter and driver version lives beside cubecl's SPIR-V, in
//! `<compilation cache>/pipelines/`, read when the server starts and written back after a sync
//! that follows new pipelines. A file from another driver or a damaged one is ignored (one
//! warning) and replaced. See `KILN.md`.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

/// The pipeline cache of one server, and its file.
#[derive(Debug)]
pub(crate) struct PipelineStore {
    cache: wgpu::PipelineCache,
    path: PathBuf,
    /// Pipelines were created since the last save.
    changed: bool,
}

impl PipelineStore {
    /// The store for `adapter` under `root`, its file read where there is one; `None` where the
    /// device has no pipeline cache (every backend but Vulkan).
    pub(crate) fn open(device: &wgpu::Device, adapter: &wgpu::AdapterInfo, root: &Path) -> Option<Self> {
        if !device.features().contains(wgpu::Features::PIPELINE_CACHE) {
            return None;
        }
        let path = root.join("pipelines").join(file_name(adapter)?);
        let data = std::fs::read(&path).ok();
        let cache = match data.as_deref().map(|data| create(device, Some(data))) {
            Some(Ok(cache)) => cache,
            Some(Err(why)) => {
                log::warn!(
                    "the pipeline cache {} is not this driver's or is damaged, so it is ignored and will be replaced: {why}",
                    path.display()
                );
                create(device, None).ok()?
            }
            None => create(device, None).ok()?,
        };
        Some(Self {
            cache,
            path,
            changed: false,
        })
    }

    pub(crate) fn cache(&self) -> &wgpu::PipelineCache {
        &self.cache
    }

    /// A pipeline was created with [`Self::cache`].
    pub(crate) fn created(&mut self) {
        self.changed = true;
    }

    /// Writes the cache to its file if pipelines were created since the last write: whole, by a
    /// rename, so that a process killed while writing leaves the previous file.
    pub(crate) fn save_if_changed(&mut self) {
        if !std::mem::take(&mut self.changed) {
            return;
        }
        let Some(data) = self.cache.get_data() else {
            return;
        };
        if let Err(why) = write_whole(&self.path, &data) {
            log::warn!("the pipeline cache {} could not be written: {why}", self.path.display());
        }
    }
}

/// wgpu's key for the adapter (its vendor and device) with the driver's version, so that a
/// driver update starts a new file rather than offering the old driver's pipelines.
fn file_name(adapter: &wgpu::AdapterInfo) -> Option<String> {
    let key = wgpu::util::pipeline_cache_key(adapter)?;
    let mut hasher = DefaultHasher::new();
    (&adapter.driver, &adapter.driver_info).hash(&mut hasher);
    Some(format!("{key}_{:016x}.bin", hasher.finish()))
}

/// A pipeline cache from `data` (validated by wgpu against this adapter and driver), or why it
/// was refused.
fn create(device: &wgpu::Device, data: Option<&[u8]>) -> Result<wgpu::PipelineCache, String> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    // SAFETY: `data` is what `PipelineCache::get_data` wrote for a device with the same key
    // (wgpu checks its header against this adapter and driver, and refuses anything else with
    // `fallback: false`), or nothing.
    let cache = unsafe {
        device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
            label: Some("kiln pipeline cache"),
            data,
            fallback: false,
        })
    };
    match cubecl_common::future::block_on(scope.pop()) {
        Some(error) => Err(error.to_string()),
        None => Ok(cache),
    }
}

fn write_whole(path: &Path, data: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut partial = path.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    std::fs::write(&partial, data)?;
    std::fs::rename(&partial, path)
}
