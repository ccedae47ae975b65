mod base;
mod v1;

pub use base::*;
pub use v1::*;
