mod select_kernel;

pub use select_kernel::*;
