//! The weight gradient of 3x3 convolutions with stride 1 and padding 1 on maps of 16x16 and
//! more, without an im2col matrix (`winograd` computes their output and input gradient).
//!
//! Each channel of the input and of the output gradient is laid out once as all images' planes
//! one after another, every row followed by a zero and every image by a row of zeros
//! ([`Layout`]). Kernel position `(i, j)` then reads the input shifted by `i` rows and `j`
//! columns, and the zeros stand for the padding, so the gradient is nine products of the laid-out
//! output gradient with shifted views of one buffer (the gemm crate, which takes any strides).
//! The im2col matrix this replaces is nine times the input. (Winograd's weight gradient, 16
//! products over the transformed tiles, was faster still but its rounding, amplified by AdamW
//! in parameters whose gradients are near zero, took flex 100x outside the PyTorch trajectory
//! bounds.)

use gemm::{Parallelism, gemm};
use rayon::prelude::*;

/// About this many output positions are computed together: the nine products accumulate into a
/// `channels x BLOCK` block that stays in a core's cache.
const BLOCK: usize = 1024;

/// Where the laid-out values of `images` planes of `height x width` lie in one channel's row of
/// the buffer: position `(n, h, w)` at `ORIGIN + n * image + h * row + w`.
pub(crate) struct Layout {
    images: usize,
    height: usize,
    width: usize,
    /// `width + 1`: a row and the zero after it, which is also the next row's left padding.
    row: usize,
    /// `(height + 1) * row`: an image's rows and the zero row after it, also the next image's top.
    image: usize,
    /// Output positions per block: whole rows, so that no row is split between blocks.
    block: usize,
    /// All images' positions, rounded up to whole blocks.
    columns: usize,
    /// One channel's length in the buffer: the positions plus a zero row and a zero before them
    /// (read by the first row's top-left kernel positions) and after them (read by the last row's).
    pitch: usize,
}

impl Layout {
    pub(crate) fn new(images: usize, height: usize, width: usize) -> Self {
        let row = width + 1;
        let image = (height + 1) * row;
        let block = row * (BLOCK / row).max(1);
        let columns = (images * image).div_ceil(block) * block;
        Self {
            images,
            height,
            width,
            row,
            image,
            block,
            columns,
            pitch: columns + 2 * row + 2,
        }
    }

    /// Where output position 0 reads its own input position: one zero row and one zero in.
    fn origin(&self) -> usize {
        self.row + 1
    }

    /// How far kernel position `(i, j)` is shifted from the window's top-left corner.
    fn shift(&self, i: usize, j: usize) -> usize {
        i * self.row + j
    }

    fn blocks(&self) -> usize {
        self.columns / self.block
    }

    /// An NCHW tensor's values laid out: `[channels, pitch]`, zeros between rows and images.
    pub(crate) fn pack(&self, x: &[f32], channels: usize) -> Vec<f32> {
        let (height, width) = (self.height, self.width);
        assert_eq!(x.len(), self.images * channels * height * width);
        let mut out = vec![0.0f32; channels * self.pitch];
        out.par_chunks_mut(self.pitch)
            .enumerate()
            .for_each(|(c, line)| {
                for n in 0..self.images {
                    let plane = &x[(n * channels + c) * height * width..][..height * width];
                    for (h, values) in plane.chunks_exact(width).enumerate() {
                        line[self.origin() + n * self.image + h * self.row..][..width]
                            .copy_from_slice(values);
                    }
                }
            });
        out
    }
}

fn taps() -> impl Iterator<Item = (usize, usize)> {
    (0..3).flat_map(|i| (0..3).map(move |j| (i, j)))
}

/// The weight's gradient from the output's (`dy`, `[images, c_out, height, width]`).
pub(crate) fn weight_gradient(
    x: &[f32],
    dy: &[f32],
    layout: &Layout,
    c_in: usize,
    c_out: usize,
) -> Vec<f32> {
    let grad = layout.pack(dy, c_out);
    weight_products(x, &grad, layout, c_in, c_out)
}

/// The weight's gradient, `[c_out, c_in, 3, 3]`: for each kernel position, the laid-out output
/// gradient (`grad`) times the input shifted to that position (the zeros between rows make the
/// products at dropped positions add nothing), summed over blocks of positions in parallel.
fn weight_products(
    x: &[f32],
    grad: &[f32],
    layout: &Layout,
    c_in: usize,
    c_out: usize,
) -> Vec<f32> {
    let input = layout.pack(x, c_in);
    let size = c_out * c_in * 9;
    (0..layout.blocks())
        .into_par_iter()
        .fold(
            || vec![0.0f32; size],
            |mut dw, b| {
                let start = b * layout.block;
                let lhs = &grad[layout.origin() + start..];
                for (tap, (i, j)) in taps().enumerate() {
                    let rhs = &input[layout.shift(i, j) + start..];
                    // SAFETY: `dw` is `[c_out, c_in, 3, 3]`; position `tap` of row `o`, column
                    // `c` is `o * c_in * 9 + c * 9 + tap`. The gradient is read at
                    // `o * pitch + origin + start + q` and the input at `c * pitch + shift +
                    // start + q` for `q < block`, both below `pitch` within their channel.
                    unsafe {
                        gemm(
                            c_out,
                            c_in,
                            layout.block,
                            dw[tap..].as_mut_ptr(),
                            9,
                            (c_in * 9) as isize,
                            true,
                            lhs.as_ptr(),
                            1,
                            layout.pitch as isize,
                            rhs.as_ptr(),
                            layout.pitch as isize,
                            1,
                            1.0,
                            1.0,
                            false,
                            false,
                            false,
                            Parallelism::None,
                        );
                    }
                }
                dw
            },
        )
        .reduce(
            || vec![0.0f32; size],
            |mut sum, part| {
                sum.iter_mut().zip(part).for_each(|(s, p)| *s += p);
                sum
            },
        )
}

#[cfg(test)]
mod tests {
    use super::Layout;

    #[test]
    fn blocks_hold_whole_rows_and_the_buffer_covers_every_shifted_read() {
        for (images, height, width) in [(32, 32, 32), (3, 5, 7), (1, 1, 1), (2, 40, 1100)] {
            let layout = Layout::new(images, height, width);
            assert_eq!(layout.block % layout.row, 0);
            assert!(layout.columns >= images * layout.image);
            // The last block's bottom-right kernel position reads the last value of the pitch.
            assert_eq!(layout.shift(2, 2) + layout.columns, layout.pitch);
        }
    }

    #[test]
    fn padding_is_zero_around_every_plane() {
        let layout = Layout::new(2, 2, 3);
        let x: Vec<f32> = (1..=12).map(|v| v as f32).collect();
        let packed = layout.pack(&x, 1);
        // Row width 4 (3 values and a zero), image 3 rows (2 and a zero row), one zero row and
        // one zero in front.
        let expected = [
            0., 0., 0., 0., //
            0., 1., 2., 3., 0., 4., 5., 6., 0., 0., 0., 0., //
            0., 7., 8., 9., 0., 10., 11., 12., 0., 0., 0., 0.,
        ];
        assert_eq!(&packed[..expected.len()], &expected);
        assert!(packed[expected.len()..].iter().all(|v| *v == 0.0));
    }
}
