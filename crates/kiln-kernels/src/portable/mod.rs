//! kiln's own CubeCL kernels, for every GPU burn's cubecl backends drive: wgpu (Vulkan, Metal,
//! DX12) and CUDA alike. Training batch norm with what follows it in a ResNet (the residual and
//! ReLU) as four kernels a layer, two each way (`kernels.rs`), where burn's operations take
//! about thirty launches and their layout copies (`batch_norm.rs` installs them as one autodiff
//! operation); and in inference, one.

mod batch_norm;
mod kernels;

pub(crate) use batch_norm::{batch_norm_eval, batch_norm_train};
