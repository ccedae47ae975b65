//! kiln as a library: each command's entry point, re-exported from the crate that does its
//! work, so that a program (the binary, an example) names them in one place. kiln-train runs
//! training, evaluation, the plan's measure, the range test, the warm-up, prediction and the
//! export; kiln-check the comparison and the benchmarks. Each resolves the backend through
//! kiln-backend and runs its crate's generic code, compiled there once for every backend.
//!
//! A training program hands in an observer (`Console` shows what the binary shows) and may
//! install the binary's panic hook (`panics::install_hook`), which turns a device's
//! out-of-memory panic into the run's error with a batch that fits.

pub use kiln_backend::{BackendChoice, DeviceSelection, KernelCache};
pub use kiln_check::entry as check;
pub use kiln_records::run_dir::Start;
pub use kiln_train::cluster::Cluster;
pub use kiln_train::entry::{
    PlanReport, TrainRequest, WarmUpProgress, evaluate, lr_find, mistakes_page, plan, predict,
    train, warmup,
};
pub use kiln_train::export as export_model;
pub use kiln_train::lr_find::{LrFind, LrFindOptions, LrPoint};
pub use kiln_train::panics;
pub use kiln_train::progress::Console;
