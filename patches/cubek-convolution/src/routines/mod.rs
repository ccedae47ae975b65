mod base;
pub mod simple;
pub mod specialized;

pub use base::*;
