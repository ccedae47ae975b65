//! The convolutions that `winograd` does not cover (strided, 1x1, the 7x7 stem) and their two
//! gradients, as matrix products over an im2col matrix `cols` (`[c_in * kh * kw, images * oh *
//! ow]`), built for a group of images at a time:
//! `y = w · cols`, `dw = dy · colsᵀ`, `dx = col2im(wᵀ · dy)`. The matrices are laid out here in
//! parallel (rayon); the products are the gemm crate's, written straight into kiln's buffers
//! (through burn's matmul, each result was allocated, copied to realign it, and copied out of
//! its tensor again: 2-3% of ResNet-18's training step at batch 32). Every product
//! spans all the group's images, so it stays large where the feature maps are small (flex's own
//! convolution multiplies one image's 512 positions at a time, 16 at 4x4).
//!
//! Grouped convolutions (ResNeXt's) take the same route, one product per channel group over its
//! block of the im2col matrix, the groups in parallel: burn's own weight gradient runs one
//! convolution per group whose kernel is the whole output gradient.

use std::mem::MaybeUninit;
use std::ops::Range;

use burn::tensor::ops::ConvOptions;
use gemm::{Parallelism, gemm};
use rayon::prelude::*;

use crate::epilogue::PlaneEpilogue;
use crate::shifted_conv::{self, Layout};
use crate::uninit::{assume_written, written_in_chunks};
use crate::winograd::{self, ForwardKind};

/// im2col matrices are built for as many images at a time as fit in this many bytes, which bounds
/// the extra memory whatever the batch size; larger groups make faster products.
const CHUNK_BYTES: usize = 32 << 20;

/// The input gradient's product writes an im2col-sized matrix, and ran at a fifth of its speed on
/// ResNet-18's first stage when that matrix was 30 MB rather than 9 MB: smaller groups there
/// (4 MiB measured best of 2 to 16 with `kiln bench`, within its noise).
const WRITE_CHUNK_BYTES: usize = 4 << 20;

/// 1x1 convolutions with stride 1 multiply each image in place from maps of this many positions
/// (ResNet-50's 14x14 and larger at 224x224); on smaller ones a product per image is too narrow,
/// and the im2col matrix that puts all the images side by side pays for its copy.
const POINTWISE_PLANE: usize = 196;

/// The sizes of one convolution, NCHW.
pub(crate) struct Geometry {
    images: usize,
    c_in: usize,
    height: usize,
    width: usize,
    c_out: usize,
    kernel: [usize; 2],
    out: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    /// Channel groups: input channel block `i` meets only output channel block `i`.
    groups: usize,
}

impl Geometry {
    pub(crate) fn new(
        x: [usize; 4],
        weight: [usize; 4],
        dy: [usize; 4],
        options: &ConvOptions<2>,
    ) -> Self {
        Self {
            images: x[0],
            c_in: x[1],
            height: x[2],
            width: x[3],
            c_out: weight[0],
            kernel: [weight[2], weight[3]],
            out: [dy[2], dy[3]],
            stride: options.stride,
            padding: options.padding,
            dilation: options.dilation,
            groups: options.groups,
        }
    }

    /// Rows of the im2col matrix: one per input channel and kernel position.
    fn rows(&self) -> usize {
        self.c_in * self.kernel[0] * self.kernel[1]
    }

    /// Rows of one channel group's block of the im2col matrix (a weight's row length).
    fn group_rows(&self) -> usize {
        self.rows() / self.groups
    }

    /// Output channels of one channel group.
    fn group_out(&self) -> usize {
        self.c_out / self.groups
    }

    /// The layout of `shifted_conv`'s weight gradient where it covers this convolution (3x3,
    /// stride 1, padding 1) and is the faster: on feature maps of 16x16 and more. On smaller
    /// maps the padding it computes is a large share (56% at 4x4) and its few blocks leave
    /// cores idle; there im2col ran 1.7x (8x8) and 2.8x (4x4) faster (`conv_shapes`).
    fn shifted(&self) -> Option<Layout> {
        let covered = self.winograd() && self.height * self.width >= 16 * 16;
        covered.then(|| Layout::new(self.images, self.height, self.width))
    }

    /// `[images, c_in, height, width]`.
    fn input(&self) -> [usize; 4] {
        [self.images, self.c_in, self.height, self.width]
    }

    /// A 3x3 convolution with stride 1 and padding 1 (most of a ResNet's), which `winograd`
    /// computes with its input gradient.
    fn winograd(&self) -> bool {
        self.groups == 1
            && self.kernel == [3, 3]
            && self.stride == [1, 1]
            && self.padding == [1, 1]
            && self.dilation == [1, 1]
    }

    /// Training's Winograd route: maps of 4x4 and more. On the quickstart's 2x2 and 1x1 maps the
    /// transforms cost more than the products they save (its whole run 6% slower with them);
    /// im2col takes those.
    fn tiled(&self) -> bool {
        self.height * self.width >= 16
    }

    /// A 1x1 convolution with stride 1 and no padding, on maps large enough for [`pointwise`].
    fn pointwise(&self) -> bool {
        self.groups == 1
            && self.kernel == [1, 1]
            && self.stride == [1, 1]
            && self.padding == [0, 0]
            && self.out_plane() >= POINTWISE_PLANE
    }

    fn out_plane(&self) -> usize {
        self.out[0] * self.out[1]
    }

    /// Groups of consecutive images whose im2col matrix fits in `bytes`.
    fn chunks(&self, bytes: usize) -> impl Iterator<Item = Range<usize>> + use<> {
        let per_image = self.rows() * self.out_plane() * std::mem::size_of::<f32>();
        let chunk = (bytes / per_image.max(1)).max(1);
        let images = self.images;
        (0..images)
            .step_by(chunk)
            .map(move |first| first..(first + chunk).min(images))
    }
}

/// `y = conv2d(x, w)`, NCHW, each output plane finished by `epilogue` where there is one.
pub(crate) fn forward(
    x: &[f32],
    weight: &[f32],
    g: &Geometry,
    epilogue: Option<&PlaneEpilogue>,
    kind: ForwardKind,
) -> Vec<f32> {
    if g.winograd() && (kind == ForwardKind::Inference || g.tiled()) {
        return winograd::forward(x, weight, g.input(), g.c_out, epilogue, kind);
    }
    if g.pointwise() {
        return pointwise(x, weight, g, epilogue);
    }
    let plane = g.out_plane();
    let len = g.images * g.c_out * plane;
    let mut y = Vec::with_capacity(len);
    for images in g.chunks(CHUNK_BYTES) {
        let columns = images.len() * plane;
        let cols = im2col(x, g, images.clone());
        let dims = [g.group_out(), g.group_rows(), columns];
        let groups = [g.groups, g.group_rows() * columns];
        let part = grouped_product(None, weight, &cols, groups, dims, [columns, 1]);
        let slab = &mut y.spare_capacity_mut()[..len]
            [images.start * g.c_out * plane..images.end * g.c_out * plane];
        slab.par_chunks_mut(g.c_out * plane)
            .enumerate()
            .for_each(|(k, image)| {
                for (co, out) in image.chunks_mut(plane).enumerate() {
                    let values = &part[(co * images.len() + k) * plane..][..plane];
                    let out = out.write_copy_of_slice(values);
                    if let Some(epilogue) = epilogue {
                        epilogue.finish((images.start + k) * g.c_out + co, out);
                    }
                }
            });
    }
    // SAFETY: the groups of images cover every image, and each image's every plane was copied.
    unsafe { y.set_len(len) };
    y
}

/// A 1x1 convolution with stride 1 on maps of `POINTWISE_PLANE` positions or more: each image's
/// output is the weight times the image itself (`[c_in, h * w]`, as NCHW lays it out), written
/// in place, with no im2col matrix (it would be a copy of the input) and no copy of the product.
fn pointwise(
    x: &[f32],
    weight: &[f32],
    g: &Geometry,
    epilogue: Option<&PlaneEpilogue>,
) -> Vec<f32> {
    let plane = g.out_plane();
    // Images in parallel where there are enough for every thread, else each product is.
    let parallelism = if g.images >= rayon::current_num_threads() {
        Parallelism::None
    } else {
        Parallelism::Rayon(0)
    };
    let write = |n: usize, out: &mut [MaybeUninit<f32>]| {
        let input = &x[n * g.c_in * plane..][..g.c_in * plane];
        let dims = [g.c_out, g.c_in, plane];
        // SAFETY: `out` is one image's `[c_out, plane]` chunk, which the product writes without
        // reading it.
        unsafe {
            multiply(
                out.as_mut_ptr().cast(),
                false,
                weight,
                input,
                dims,
                [plane, 1],
                parallelism,
            )
        }
        if let Some(epilogue) = epilogue {
            // SAFETY: the product wrote all of `out`.
            let out = unsafe { assume_written(out) };
            for (co, out) in out.chunks_mut(plane).enumerate() {
                epilogue.finish(n * g.c_out + co, out);
            }
        }
    };
    // SAFETY: `write` fills each image's output (above).
    unsafe { written_in_chunks(g.images * g.c_out * plane, g.c_out * plane, write) }
}

/// The gradients with respect to the input (NCHW) and to the weight, each where `wanted`
/// (`[input, weight]`), from the output's gradient `dy`.
pub(crate) fn gradients(
    x: &[f32],
    weight: &[f32],
    dy: &[f32],
    g: &Geometry,
    wanted: [bool; 2],
) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    if g.winograd() && g.tiled() {
        let dx = wanted[0].then(|| winograd::input_gradient(weight, dy, g.input(), g.c_out));
        let dw = wanted[1].then(|| match g.shifted() {
            Some(layout) => shifted_conv::weight_gradient(x, dy, &layout, g.c_in, g.c_out),
            None => weight_gradient(x, dy, g),
        });
        return (dx, dw);
    }
    let dx = wanted[0].then(|| input_gradient(weight, dy, g));
    let dw = wanted[1].then(|| weight_gradient(x, dy, g));
    (dx, dw)
}

/// The gradient with respect to the weight, `[c_out, c_in / groups, kh, kw]`, from the input `x`
/// and the output's gradient `dy`: `cols · dyᵀ` per channel group (three times faster than
/// `dy · colsᵀ` here), summed over groups of images and transposed.
fn weight_gradient(x: &[f32], dy: &[f32], g: &Geometry) -> Vec<f32> {
    let mut dw_t: Option<Vec<f32>> = None;
    for images in g.chunks(CHUNK_BYTES) {
        let len = images.len() * g.out_plane();
        let cols = im2col(x, g, images.clone());
        let dy = channels_by_position(dy, g, images);
        // `dy` is `[c_out, len]`; each group's block read as `dyᵀ`, `[len, c_out / groups]`, in
        // place.
        let dims = [g.group_rows(), len, g.group_out()];
        let groups = [g.groups, g.group_out() * len];
        let sum = grouped_product(dw_t.take(), &cols, &dy, groups, dims, [1, len]);
        dw_t = Some(sum);
    }
    dw_t.map(|dw_t| transpose_blocks(&dw_t, g.groups, g.group_rows(), g.group_out()))
        .unwrap_or_else(|| vec![0.0; g.c_out * g.group_rows()])
}

/// The gradient with respect to the input, NCHW: `wᵀ · dy` per channel group gives each kernel
/// position's contribution (together, an im2col matrix), which col2im adds up per input position.
fn input_gradient(weight: &[f32], dy: &[f32], g: &Geometry) -> Vec<f32> {
    let mut dx = vec![0.0f32; g.images * g.c_in * g.height * g.width];
    let weight_t = transpose_blocks(weight, g.groups, g.group_out(), g.group_rows());
    for images in g.chunks(WRITE_CHUNK_BYTES) {
        let len = images.len() * g.out_plane();
        let dy = channels_by_position(dy, g, images.clone());
        let dims = [g.group_rows(), g.group_out(), len];
        let groups = [g.groups, g.group_out() * len];
        let cols = grouped_product(None, &weight_t, &dy, groups, dims, [len, 1]);
        col2im(&cols, g, images, &mut dx);
    }
    dx
}

/// Each of `groups` row-major `[rows, columns]` blocks, one after another, transposed in place
/// of it.
fn transpose_blocks(values: &[f32], groups: usize, rows: usize, columns: usize) -> Vec<f32> {
    if groups == 1 {
        return transpose(values, rows, columns);
    }
    let block = rows * columns;
    let mut out = vec![0.0; values.len()];
    out.par_chunks_mut(block)
        .zip(values.par_chunks(block))
        .for_each(|(out, values)| transpose::transpose(values, out, columns, rows));
    out
}

/// The products of `groups` channel groups, stacked: for group `i`, `a_i · b_i` with `a_i` the
/// `i`th row-major `[m, k]` block of `a` and `b_i` the `[k, n]` matrix read from `b` at `i *
/// b_group` with `b_strides` (as [`product`] takes them), written as rows `i * m..` of a
/// `[groups * m, n]` result; added to `sum` where given. One group is [`product`]; several run
/// in parallel, each product on one thread where there are enough groups for every thread.
fn grouped_product(
    sum: Option<Vec<f32>>,
    a: &[f32],
    b: &[f32],
    [groups, b_group]: [usize; 2],
    [m, k, n]: [usize; 3],
    b_strides: [usize; 2],
) -> Vec<f32> {
    if groups == 1 {
        return match sum {
            Some(mut sum) => {
                add_product(&mut sum, a, b, [m, k, n], b_strides);
                sum
            }
            None => product(a, b, [m, k, n], b_strides),
        };
    }
    let parallelism = if groups >= rayon::current_num_threads() {
        Parallelism::None
    } else {
        shared(m * k * n)
    };
    let write = |i: usize, out: *mut f32, read_dst: bool| {
        // SAFETY: `out` is group `i`'s `[m, n]` block of the result, initialised where
        // `read_dst`.
        unsafe {
            multiply(
                out,
                read_dst,
                &a[i * m * k..][..m * k],
                &b[i * b_group..],
                [m, k, n],
                b_strides,
                parallelism,
            )
        }
    };
    match sum {
        Some(mut sum) => {
            assert_eq!(sum.len(), groups * m * n, "the sum is [groups * m, n]");
            sum.par_chunks_mut(m * n)
                .enumerate()
                .for_each(|(i, out)| write(i, out.as_mut_ptr(), true));
            sum
        }
        // SAFETY: each group's block is written whole by its product.
        None => unsafe {
            written_in_chunks(groups * m * n, m * n, |i, out| {
                write(i, out.as_mut_ptr().cast(), false)
            })
        },
    }
}

/// A row-major `[rows, columns]` matrix's transpose, laid out (the product runs twice as fast
/// with a contiguous left operand).
fn transpose(values: &[f32], rows: usize, columns: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    transpose::transpose(values, &mut out, columns, rows);
    out
}

/// `a · b` as a new row-major `[m, n]` matrix, for `[m, k, n]`: `a` is `[m, k]`, row-major;
/// `b` is `[k, n]`, read with `b_strides` (between rows, between columns), so that a transposed
/// operand costs no copy.
fn product(a: &[f32], b: &[f32], [m, k, n]: [usize; 3], b_strides: [usize; 2]) -> Vec<f32> {
    let mut dst = Vec::with_capacity(m * n);
    // SAFETY: `dst` has room for `m * n` values, which the product writes without reading.
    unsafe {
        let parallelism = shared(m * k * n);
        multiply(
            dst.as_mut_ptr(),
            false,
            a,
            b,
            [m, k, n],
            b_strides,
            parallelism,
        );
        dst.set_len(m * n);
    }
    dst
}

/// `dst += a · b`, as [`product`] takes its operands.
fn add_product(
    dst: &mut [f32],
    a: &[f32],
    b: &[f32],
    [m, k, n]: [usize; 3],
    b_strides: [usize; 2],
) {
    assert_eq!(dst.len(), m * n, "the sum is [m, n]");
    // SAFETY: `dst` holds `m * n` values.
    unsafe {
        multiply(
            dst.as_mut_ptr(),
            true,
            a,
            b,
            [m, k, n],
            b_strides,
            shared(m * k * n),
        )
    }
}

/// On every thread when a product is large enough to share (burn's matmul's threshold, 192³).
fn shared(multiply_adds: usize) -> Parallelism {
    if multiply_adds >= 192 * 192 * 192 {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// The gemm crate's product `a · b` into `dst` (row-major `[m, n]`), added to it where
/// `read_dst`; `a` and `b` as [`product`] takes them.
///
/// # Safety
/// `dst` points to `m * n` writable values, initialised where `read_dst`.
unsafe fn multiply(
    dst: *mut f32,
    read_dst: bool,
    a: &[f32],
    b: &[f32],
    [m, k, n]: [usize; 3],
    [row, column]: [usize; 2],
    parallelism: Parallelism,
) {
    assert!(a.len() >= m * k, "a is [m, k]");
    if m == 0 || n == 0 {
        return;
    }
    assert!(k > 0, "an empty sum would leave dst unwritten");
    assert!(
        (k - 1) * row + (n - 1) * column < b.len(),
        "b's last value lies inside it"
    );
    // SAFETY: `a` is read at `i * k + p` (< m * k, checked), `b` at `p * row + j * column`
    // (checked for the last `p` and `j`), `dst` written at `i * n + j` (< m * n, the caller's).
    unsafe {
        gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            read_dst,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            column as isize,
            row as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `[c_in * kh * kw, images * oh * ow]`: row `(ci, i, j)` holds, for every output position of
/// every image, the input value that kernel position `(i, j)` of channel `ci` multiplies (zero in
/// the padding).
fn im2col(x: &[f32], g: &Geometry, images: Range<usize>) -> Vec<f32> {
    let [kh, kw] = g.kernel;
    let [oh, ow] = g.out;
    let plane = g.out_plane();
    let mut cols = vec![0.0f32; g.rows() * images.len() * plane];
    cols.par_chunks_mut(images.len() * plane)
        .enumerate()
        .for_each(|(row, out)| {
            let (ci, i, j) = (row / (kh * kw), row / kw % kh, row % kw);
            let columns = valid_outputs(j * g.dilation[1], g.padding[1], g.stride[1], g.width, ow);
            if columns.is_empty() {
                return;
            }
            for (k, n) in images.clone().enumerate() {
                let input = &x[(n * g.c_in + ci) * g.height * g.width..][..g.height * g.width];
                let out = &mut out[k * plane..][..plane];
                for y in valid_outputs(i * g.dilation[0], g.padding[0], g.stride[0], g.height, oh) {
                    let iy = y * g.stride[0] + i * g.dilation[0] - g.padding[0];
                    let input = &input[iy * g.width..][..g.width];
                    let out = &mut out[y * ow..][..ow];
                    let first = columns.start * g.stride[1] + j * g.dilation[1] - g.padding[1];
                    if g.stride[1] == 1 {
                        out[columns.clone()].copy_from_slice(&input[first..first + columns.len()]);
                    } else {
                        for (o, value) in columns
                            .clone()
                            .zip(input[first..].iter().step_by(g.stride[1]))
                        {
                            out[o] = *value;
                        }
                    }
                }
            }
        });
    cols
}

/// `[c_out, images * oh * ow]`: the output gradient with channels first, so that all images'
/// positions form one row per channel.
fn channels_by_position(dy: &[f32], g: &Geometry, images: Range<usize>) -> Vec<f32> {
    let plane = g.out_plane();
    let write = |co: usize, row: &mut [MaybeUninit<f32>]| {
        for (k, n) in images.clone().enumerate() {
            row[k * plane..][..plane]
                .write_copy_of_slice(&dy[(n * g.c_out + co) * plane..][..plane]);
        }
    };
    // SAFETY: each channel's row is every image's plane, one after another.
    unsafe { written_in_chunks(g.c_out * images.len() * plane, images.len() * plane, write) }
}

/// Adds each column of `cols` (`[c_in * kh * kw, images * oh * ow]`) into the input position it
/// was read from; in parallel over (image, input channel) planes, which no two rows share.
fn col2im(cols: &[f32], g: &Geometry, images: Range<usize>, dx: &mut [f32]) {
    let [kh, kw] = g.kernel;
    let [oh, ow] = g.out;
    let plane = g.out_plane();
    let len = images.len() * plane;
    let input_plane = g.height * g.width;
    let slab = &mut dx[images.start * g.c_in * input_plane..images.end * g.c_in * input_plane];
    slab.par_chunks_mut(input_plane)
        .enumerate()
        .for_each(|(index, dx)| {
            let (k, ci) = (index / g.c_in, index % g.c_in);
            for (i, j) in (0..kh).flat_map(|i| (0..kw).map(move |j| (i, j))) {
                let columns =
                    valid_outputs(j * g.dilation[1], g.padding[1], g.stride[1], g.width, ow);
                if columns.is_empty() {
                    continue;
                }
                let row = &cols[((ci * kh + i) * kw + j) * len + k * plane..][..plane];
                for y in valid_outputs(i * g.dilation[0], g.padding[0], g.stride[0], g.height, oh) {
                    let iy = y * g.stride[0] + i * g.dilation[0] - g.padding[0];
                    let dx = &mut dx[iy * g.width..][..g.width];
                    let row = &row[y * ow..][..ow];
                    let first = columns.start * g.stride[1] + j * g.dilation[1] - g.padding[1];
                    if g.stride[1] == 1 {
                        for (d, v) in dx[first..first + columns.len()]
                            .iter_mut()
                            .zip(&row[columns.clone()])
                        {
                            *d += v;
                        }
                    } else {
                        for (d, v) in dx[first..]
                            .iter_mut()
                            .step_by(g.stride[1])
                            .zip(&row[columns.clone()])
                        {
                            *d += v;
                        }
                    }
                }
            }
        });
}

/// The output positions `o` whose input position `o * stride + offset - padding` lies inside
/// `0..size`.
fn valid_outputs(
    offset: usize,
    padding: usize,
    stride: usize,
    size: usize,
    outputs: usize,
) -> Range<usize> {
    let first = padding.saturating_sub(offset).div_ceil(stride);
    let end = if size + padding > offset {
        ((size + padding - offset - 1) / stride + 1).min(outputs)
    } else {
        0
    };
    first.min(end)..end
}

#[cfg(test)]
mod tests {
    use super::{add_product, product, valid_outputs};

    /// `a · b` term by term in f64, `b` read with the given strides.
    fn plain(a: &[f32], b: &[f32], [m, k, n]: [usize; 3], [row, column]: [usize; 2]) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let sum: f64 = (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * row + j * column] as f64)
                    .sum();
                out[i * n + j] = sum as f32;
            }
        }
        out
    }

    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{i}: {g} vs {w}");
        }
    }

    /// Odd sizes, `b` as laid out and read transposed in place, and a sum added to; one size
    /// large enough to run on every thread.
    #[test]
    fn products_match_plain_sums() {
        for [m, k, n] in [[5, 7, 3], [1, 1, 1], [3, 300, 2], [200, 203, 201]] {
            let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 / 7.0 - 0.9).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 11) as f32 / 5.0 - 1.1).collect();
            for strides in [[n, 1], [1, k]] {
                let want = plain(&a, &b, [m, k, n], strides);
                let mut got = product(&a, &b, [m, k, n], strides);
                close(&got, &want);
                add_product(&mut got, &a, &b, [m, k, n], strides);
                let twice: Vec<f32> = want.iter().map(|w| 2.0 * w).collect();
                close(&got, &twice);
            }
        }
    }

    #[test]
    fn valid_outputs_skip_the_padding() {
        // 3x3, padding 1, stride 1 over 5 columns: kernel column 0 reads column o - 1.
        assert_eq!(valid_outputs(0, 1, 1, 5, 5), 1..5);
        assert_eq!(valid_outputs(1, 1, 1, 5, 5), 0..5);
        assert_eq!(valid_outputs(2, 1, 1, 5, 5), 0..4);
        // stride 2 over 8 columns, 4 outputs: kernel column 0 reads 2o - 1.
        assert_eq!(valid_outputs(0, 1, 2, 8, 4), 1..4);
        assert_eq!(valid_outputs(2, 1, 2, 8, 4), 0..4);
        // A kernel position entirely in the padding reads nothing.
        assert!(valid_outputs(0, 3, 1, 2, 2).is_empty());
    }
}
