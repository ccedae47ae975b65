pub mod args;
pub mod launch;
pub mod selector;

pub use launch::launch_kernel;
