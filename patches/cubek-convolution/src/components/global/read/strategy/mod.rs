pub mod async_copy;

pub mod async_full_cyclic;
pub mod async_full_strided;

pub mod sync_bias;
