mod base;
pub use base::*;

/// Adaptor module for optimizers.
pub mod adaptor;

/// Record module for optimizers.
pub mod record;
