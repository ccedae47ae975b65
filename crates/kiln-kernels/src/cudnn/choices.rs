//! cuDNN's algorithm choices in this process, one state per convolution key (`policy`), and each
//! device's file of choices kept in kiln's cache (`store`), read into them on a device's first
//! key not met yet.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use super::plan::{self, AlgoKey, Choice};
use super::policy::Keys;
use super::store::Store;

/// Every convolution key met in this process.
pub(crate) fn convolutions() -> &'static Keys<AlgoKey, Choice> {
    static KEYS: LazyLock<Keys<AlgoKey, Choice>> = LazyLock::new(Keys::default);
    &KEYS
}

/// Reads `device`'s file of kept choices into the states, once per device (a key met first
/// keeps its state).
pub(crate) fn read_kept(device: usize) {
    file(device);
}

/// Writes a measured choice into the device's file (a failed write is logged once: the choice
/// still holds for this process).
pub(crate) fn keep(key: AlgoKey, choice: Choice) {
    let Some(store) = file(key.device) else {
        return;
    };
    if let Err(why) = store.save(key, choice)
        && convolutions().first_report("kept choices not written")
    {
        log::warn!("cuDNN's algorithm choices could not be kept (logged once): {why}");
    }
}

/// The device's file, its choices read on the first call for the device; `None` where the GPU's
/// name or cuDNN's version cannot be read (choices then last the process).
fn file(device: usize) -> Option<Arc<Store>> {
    static FILES: LazyLock<Mutex<HashMap<usize, Option<Arc<Store>>>>> =
        LazyLock::new(Default::default);
    let mut files = FILES.lock().unwrap_or_else(PoisonError::into_inner);
    files
        .entry(device)
        .or_insert_with(|| open(device).map(Arc::new))
        .clone()
}

fn open(device: usize) -> Option<Store> {
    use cudarc::driver::result::device as cu_device;
    let gpu = cu_device::get(device as i32)
        .and_then(cu_device::get_name)
        .ok()?;
    let library = super::library::library().ok()?;
    // SAFETY: takes no arguments.
    let cudnn = plan::version_name(unsafe { (library.cudnnGetVersion)() });
    let store = Store::new(&kiln_download::cache_root(), &gpu, &cudnn);
    match store.load() {
        Ok(saved) => {
            for (key, choice) in saved {
                let key = AlgoKey { device, ..key };
                if let Some(choice) = choice.kept_for(&key) {
                    convolutions().add_kept(key, choice);
                }
            }
        }
        Err(why) => {
            log::warn!("cuDNN's algorithm choices were not read, they are measured again: {why}")
        }
    }
    Some(store)
}
