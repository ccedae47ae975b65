//! Data sets a program hands kiln in memory, by name, so that a config trains on them as on any
//! source: `kiln_data::register("pets", splits)`, then `data.source = { kind = "registered",
//! name = "pets" }`. This is how a burn-dataset `Dataset` (through [`crate::FromBurn`]) or any
//! kiln [`crate::Dataset`] built in code reaches `kiln::train`, whose runs open their data from
//! the config: checkpoints, resumption and the report then work as for a source on disk.
//!
//! A registration lives as long as the process: a resumed run, and each machine of a
//! multi-machine run, registers the same data again before training.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use crate::Splits;

fn registry() -> &'static Mutex<BTreeMap<String, Splits>> {
    static REGISTRY: OnceLock<Mutex<BTreeMap<String, Splits>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Makes `splits` the data set `name` for the rest of the process (replacing one of that name).
pub fn register(name: impl Into<String>, splits: Splits) {
    let mut registered = registry().lock().unwrap_or_else(|e| e.into_inner());
    registered.insert(name.into(), splits);
}

/// The data set registered as `name`.
pub fn registered(name: &str) -> Option<Splits> {
    let registered = registry().lock().unwrap_or_else(|e| e.into_inner());
    registered.get(name).cloned()
}

/// The names registered so far, for a message that lists them.
pub(crate) fn names() -> Vec<String> {
    let registered = registry().lock().unwrap_or_else(|e| e.into_inner());
    registered.keys().cloned().collect()
}
