//! What follows a convolution in a ResNet at inference, applied while the convolution writes its
//! output: batch norm with its running statistics (a scale and a shift per channel), the
//! residual, ReLU. burn's operations take a pass over memory and an allocation each for these;
//! here they touch each output plane once, while it is still in cache.

/// Per output channel `relu(y * scale + shift + residual)`, ReLU and residual where given.
pub(crate) struct PlaneEpilogue<'a> {
    pub scale: &'a [f32],
    pub shift: &'a [f32],
    /// Laid out as the output (NCHW).
    pub residual: Option<&'a [f32]>,
    pub relu: bool,
}

impl PlaneEpilogue<'_> {
    /// Finishes output plane `index` (image `index / c_out`, channel `index % c_out`) in place.
    pub(crate) fn finish(&self, index: usize, plane: &mut [f32]) {
        let channel = index % self.scale.len();
        let (scale, shift) = (self.scale[channel], self.shift[channel]);
        // `v < 0`, not `max`: a NaN passes through, as through burn's and PyTorch's ReLU.
        let relu = |v: f32| if self.relu && v < 0.0 { 0.0 } else { v };
        match self.residual {
            Some(residual) => {
                let residual = &residual[index * plane.len()..][..plane.len()];
                for (y, r) in plane.iter_mut().zip(residual) {
                    *y = relu(*y * scale + shift + r);
                }
            }
            None => plane.iter_mut().for_each(|y| *y = relu(*y * scale + shift)),
        }
    }
}
