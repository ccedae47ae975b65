mod bias;
mod im2col;
mod out;
mod spatial;
mod tma_im2col;
mod tma_out_grad;
mod weight;

pub use bias::*;
pub use im2col::*;
pub use out::*;
pub use spatial::*;
pub use tma_im2col::*;
pub use tma_out_grad::*;
pub use weight::*;
