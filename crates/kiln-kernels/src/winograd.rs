//! 3x3 convolutions with stride 1 and padding 1, and their input gradient, by Winograd's minimal
//! filtering F(m x m, 3x3) (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
//! 2015): each m x m block of outputs comes from an (m + 2) x (m + 2) tile of the input through
//! (m + 2)² products per channel pair instead of 9 m², so the matrix products, which bound
//! ResNet-18 on flex, do fewer multiply-adds: 2.25x fewer with F(2x2, 3x3), 4x with F(4x4, 3x3).
//! The input's tiles and the kernels are transformed once, the products (one per position in
//! the transformed tile) are matrix products over all channels and tiles, and the outputs are
//! transformed back and finished by the epilogue.
//!
//! Two layouts for the transformed tiles. On large maps each plane's tiles lie in a row and the
//! transforms run along the rows of tiles. On maps of 64 to 256 positions (8x8 to 16x16 in a
//! ResNet) those rows are a few tiles long and their loops mostly overhead, so the images are
//! transposed channels-last first and each tile's transform runs along its channels instead,
//! which the layers on small maps have many of. F(4x4, 3x3) always takes the channels-last
//! layout (the plane layout's row loops are written for F(2x2, 3x3)).
//!
//! Training uses F(2x2, 3x3) for the forward pass and the input gradient (the same convolution
//! of the output gradient with the kernels flipped); its float32 rounding stays within the
//! gradient tests' and the PyTorch trajectories' bounds. The weight gradient stays direct
//! (`shifted_conv`, im2col): Winograd's, though faster, put flex 100x outside the trajectory
//! bounds (AdamW amplifies rounding in near-zero gradients). Inference takes F(4x4, 3x3) where
//! it is the faster ([`takes_f4`]): its rounding error is 4 to 30 times F(2x2, 3x3)'s (up to
//! 2.3e-5 of the largest output against float64 sums), which a forward pass alone can carry.

use std::array::from_fn;
use std::borrow::Cow;
use std::mem::MaybeUninit;
use std::ops::RangeInclusive;

use gemm::{Parallelism, gemm};
use rayon::prelude::*;

use crate::epilogue::PlaneEpilogue;
use crate::uninit::{assume_written, written_in_chunks};

/// Images are transformed and multiplied in groups whose transformed tiles and products fit in
/// this many bytes.
const CHUNK_BYTES: usize = 32 << 20;

/// The map sizes (positions) whose tiles are laid out channels-last. ResNet-18's convolution
/// with both gradients at batch 32 (`conv_shapes`, two runs) took 18.7 ms instead of 22.5 on
/// 8x8 maps (256 channels) and 22.2 instead of 24.3 on 16x16 (128), but 29.2 instead of 26.4
/// on 32x32 (64) and 30.5 and 26.1 against 27.9 and 28.1 on 4x4 (512; the products ran slower
/// in this layout).
const CHANNELS_LAST_PLANES: RangeInclusive<usize> = 8 * 8..=16 * 16;

/// Channels transformed together in the channels-last layout on CPUs without AVX-512 (16 with
/// it): a block of this many stays in registers through a tile's transform.
const LANES: usize = 8;

/// What a forward convolution is for, which decides the algorithm's tile size.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ForwardKind {
    /// Training: F(2x2, 3x3), whose rounding keeps the PyTorch trajectories' bounds.
    Training,
    /// Inference: F(4x4, 3x3) where [`takes_f4`] says it is the faster (36 products per 4x4
    /// block of outputs instead of F(2x2, 3x3)'s 64), F(2x2, 3x3) elsewhere, on every map size;
    /// F(4x4, 3x3)'s larger rounding error (its transforms hold 4s, 5s and sixths) is one only a
    /// forward pass has to carry.
    Inference,
}

/// `y = conv2d(x, weight)` with stride 1 and padding 1 for `x` `[images, c_in, height, width]`
/// and `weight` `[c_out, c_in, 3, 3]`, each output plane finished by `epilogue` where given.
pub(crate) fn forward(
    x: &[f32],
    weight: &[f32],
    dims: [usize; 4],
    c_out: usize,
    epilogue: Option<&PlaneEpilogue>,
    kind: ForwardKind,
) -> Vec<f32> {
    let kernels = Kernels::Weight(weight);
    if kind == ForwardKind::Inference && takes_f4(dims, c_out) {
        convolve::<6, 4, F4>(x, kernels, dims, c_out, epilogue)
    } else {
        convolve::<4, 2, F2>(x, kernels, dims, c_out, epilogue)
    }
}

/// Whether F(4x4, 3x3) is the faster for an inference convolution of `x`'s dimensions to
/// `c_out` channels (one convolution alone, 20 runs each way, AMD EPYC, with kiln's allocator
/// settings). Faster on ResNet-18's maps of 8x8 to 32x32 (256 channels at 8x8, batch 32: 7.0 to
/// 7.5 ms against 10.1 to 10.4; 128 at 16x16: 7.7 to 10.5 against 12.3 to 14.4; 64 at 32x32: 12.9
/// to 13.6 against 15.1 to 15.6; batch 1 at 8x8: 1.0 against 2.3). Slower where its transformed
/// kernels, 36/9 of the weight against 16/9, outgrow the allocator's reuse (512 channels: 26 ms
/// against 12 at 4x4), on maps larger than 32x32 (64 channels at 56x56: 22 to 24 ms against 19),
/// with few input channels (16: 2.7 to 2.9 against 2.3 to 3.1), and on maps under 4x4, where its
/// 6x6 tiles are mostly padding.
fn takes_f4([_, c_in, height, width]: [usize; 4], c_out: usize) -> bool {
    let kernels = 36 * c_in * c_out * std::mem::size_of::<f32>();
    c_in >= 32 && height >= 4 && width >= 4 && height * width <= 32 * 32 && kernels <= 16 << 20
}

/// The gradient of [`forward`]'s convolution (without epilogue) with respect to its input
/// `[images, c_in, height, width]`, from the output's gradient `dy` `[images, c_out, height,
/// width]`: the same kind of convolution, of `dy` with each kernel flipped and the channels
/// swapped.
pub(crate) fn input_gradient(
    weight: &[f32],
    dy: &[f32],
    [images, c_in, height, width]: [usize; 4],
    c_out: usize,
) -> Vec<f32> {
    convolve::<4, 2, F2>(
        dy,
        Kernels::Flipped(weight),
        [images, c_out, height, width],
        c_in,
        None,
    )
}

/// The kernels a convolution applies, as the weight holds them.
#[derive(Clone, Copy)]
enum Kernels<'a> {
    /// `[c_out, c_in, 3, 3]`.
    Weight(&'a [f32]),
    /// A weight `[c_in, c_out, 3, 3]` (the convolution's input channels first), each kernel
    /// turned by 180 degrees: the input gradient's.
    Flipped(&'a [f32]),
}

impl Kernels<'_> {
    /// The kernel from input channel `c` to output channel `k` of a convolution with `c_in`
    /// input and `c_out` output channels, row-major.
    fn get(&self, k: usize, c: usize, c_out: usize, c_in: usize) -> [f32; 9] {
        match self {
            Kernels::Weight(w) => *w[(k * c_in + c) * 9..].first_chunk().expect("a 3x3 kernel"),
            Kernels::Flipped(w) => {
                let mut g = *w[(c * c_out + k) * 9..]
                    .first_chunk()
                    .expect("a 3x3 kernel");
                g.reverse();
                g
            }
        }
    }
}

/// [`forward`] with `kernels`, by `W`: F(M x M, 3x3) over `T x T` input tiles.
fn convolve<const T: usize, const M: usize, W: Minimal<T, M>>(
    x: &[f32],
    kernels: Kernels,
    [images, c_in, height, width]: [usize; 4],
    c_out: usize,
    epilogue: Option<&PlaneEpilogue>,
) -> Vec<f32> {
    let tiles = Tiles::new(height, width, M);
    let layout = W::layout(tiles.plane());
    let kernels = match layout {
        Layout::Planes => transform_kernels::<T, M, W>(kernels, c_out, c_in),
        Layout::ChannelsLast => transform_kernels_by_product::<T, M, W>(kernels, c_out, c_in),
    };
    let plane = height * width;
    let per_image = T * T * (c_in + c_out) * tiles.per_image() * std::mem::size_of::<f32>();
    let group = (CHUNK_BYTES / per_image.max(1)).max(1);
    let len = images * c_out * plane;
    let mut y = Vec::with_capacity(len);
    for first in (0..images).step_by(group) {
        let group = first..(first + group).min(images);
        let x = &x[group.start * c_in * plane..group.end * c_in * plane];
        let slab = &mut y.spare_capacity_mut()[..len]
            [group.start * c_out * plane..group.end * c_out * plane];
        let finish = |index: usize, plane: &mut [f32]| {
            if let Some(epilogue) = epilogue {
                epilogue.finish(group.start * c_out + index, plane);
            }
        };
        let input = match layout {
            Layout::Planes => tiles.planes_input(x, c_in),
            Layout::ChannelsLast => tiles.channels_last_input::<T, M, W>(x, c_in),
        };
        let products = multiply(
            &kernels,
            &input,
            [T * T, c_out, c_in, group.len() * tiles.per_image()],
            layout,
        );
        let columns = group.len() * tiles.per_image();
        match layout {
            Layout::Planes => tiles.planes_output(&products, [c_out, columns], slab, finish),
            Layout::ChannelsLast => {
                tiles.channels_last_output::<T, M, W>(&products, [c_out, columns], slab, finish)
            }
        }
    }
    // SAFETY: the groups cover every image, and each group's output wrote all its planes.
    unsafe { y.set_len(len) };
    y
}

/// How the transformed tiles (`V`, one matrix `[c, columns]` for each of the `T x T` positions
/// of a tile, `P = T²` of them, where column `image * tiles + tile` is a tile of an image of
/// the group) and the products (`M`, `P` matrices `[c_out, columns]`) lie in memory.
#[derive(Clone, Copy)]
enum Layout {
    /// `V` `[c, P, columns]`, `M` `[P, c_out, columns]`: each plane's tiles in a row
    /// (F(2x2, 3x3) only).
    Planes,
    /// `V` `[columns, P, c]`, `M` `[P, columns, c_out]`: each tile's channels in a row.
    ChannelsLast,
}

/// Winograd's minimal filtering F(M x M, 3x3): each `M x M` block of outputs from a `T x T`
/// tile of the input (`T = M + 2`), `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`.
trait Minimal<const T: usize, const M: usize> {
    /// `Bᵀ v` for `T` blocks of values.
    fn bt<const L: usize>(v: [[f32; L]; T]) -> [[f32; L]; T];
    /// `Aᵀ v` for `T` blocks of values.
    fn at<const L: usize>(v: [[f32; L]; T]) -> [[f32; L]; M];
    /// `G q` for one row or column `q` of a kernel.
    fn g(q: [f32; 3]) -> [f32; T];
    /// The layout of the transformed tiles on maps of `plane` positions.
    fn layout(plane: usize) -> Layout;
}

/// F(2x2, 3x3): 16 products per 2x2 block of outputs (2.25x fewer than direct sums).
struct F2;

impl Minimal<4, 2> for F2 {
    /// `Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]`.
    #[inline(always)]
    fn bt<const L: usize>([v0, v1, v2, v3]: [[f32; L]; 4]) -> [[f32; L]; 4] {
        [
            from_fn(|l| v0[l] - v2[l]),
            from_fn(|l| v1[l] + v2[l]),
            from_fn(|l| v2[l] - v1[l]),
            from_fn(|l| v1[l] - v3[l]),
        ]
    }

    /// `Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]`.
    #[inline(always)]
    fn at<const L: usize>([v0, v1, v2, v3]: [[f32; L]; 4]) -> [[f32; L]; 2] {
        [
            from_fn(|l| v0[l] + v1[l] + v2[l]),
            from_fn(|l| v1[l] - v2[l] - v3[l]),
        ]
    }

    /// `G = [[1, 0, 0], [½, ½, ½], [½, -½, ½], [0, 0, 1]]`.
    fn g(q: [f32; 3]) -> [f32; 4] {
        [
            q[0],
            (q[0] + q[1] + q[2]) / 2.0,
            (q[0] - q[1] + q[2]) / 2.0,
            q[2],
        ]
    }

    fn layout(plane: usize) -> Layout {
        if CHANNELS_LAST_PLANES.contains(&plane) {
            Layout::ChannelsLast
        } else {
            Layout::Planes
        }
    }
}

/// F(4x4, 3x3) (Lavin and Gray's matrices, interpolating at 0, ±1, ±2 and infinity): 36
/// products per 4x4 block of outputs (4x fewer than direct sums).
struct F4;

impl Minimal<6, 4> for F4 {
    /// `Bᵀ = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
    /// [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]`.
    #[inline(always)]
    fn bt<const L: usize>([v0, v1, v2, v3, v4, v5]: [[f32; L]; 6]) -> [[f32; L]; 6] {
        [
            from_fn(|l| 4.0 * v0[l] - 5.0 * v2[l] + v4[l]),
            from_fn(|l| v3[l] + v4[l] - 4.0 * (v1[l] + v2[l])),
            from_fn(|l| v4[l] - v3[l] + 4.0 * (v1[l] - v2[l])),
            from_fn(|l| v4[l] - v2[l] + 2.0 * (v3[l] - v1[l])),
            from_fn(|l| v4[l] - v2[l] + 2.0 * (v1[l] - v3[l])),
            from_fn(|l| 4.0 * v1[l] - 5.0 * v3[l] + v5[l]),
        ]
    }

    /// `Aᵀ = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
    /// [0, 1, -1, 8, -8, 1]]`.
    #[inline(always)]
    fn at<const L: usize>([v0, v1, v2, v3, v4, v5]: [[f32; L]; 6]) -> [[f32; L]; 4] {
        let sum: [[f32; L]; 2] = [from_fn(|l| v1[l] + v2[l]), from_fn(|l| v3[l] + v4[l])];
        let diff: [[f32; L]; 2] = [from_fn(|l| v1[l] - v2[l]), from_fn(|l| v3[l] - v4[l])];
        [
            from_fn(|l| v0[l] + sum[0][l] + sum[1][l]),
            from_fn(|l| diff[0][l] + 2.0 * diff[1][l]),
            from_fn(|l| sum[0][l] + 4.0 * sum[1][l]),
            from_fn(|l| diff[0][l] + 8.0 * diff[1][l] + v5[l]),
        ]
    }

    /// `G = [[¼, 0, 0], [-⅙, -⅙, -⅙], [-⅙, ⅙, -⅙], [1/24, 1/12, ⅙], [1/24, -1/12, ⅙],
    /// [0, 0, 1]]`.
    fn g(q: [f32; 3]) -> [f32; 6] {
        let (even, odd) = (q[0] + q[2], q[1]);
        [
            q[0] / 4.0,
            -(even + odd) / 6.0,
            -(even - odd) / 6.0,
            (q[0] / 4.0 + odd / 2.0 + q[2]) / 6.0,
            (q[0] / 4.0 - odd / 2.0 + q[2]) / 6.0,
            q[2],
        ]
    }

    /// Channels-last on every map: the plane layout's row loops are F(2x2, 3x3)'s.
    fn layout(_plane: usize) -> Layout {
        Layout::ChannelsLast
    }
}

/// `s[i][b]`: row `i` of `Aᵀ m` for every tile of a row of tiles, component `b`.
type Scratch = [[Vec<f32>; 4]; 2];

/// How a `height x width` map divides into `step x step` blocks of outputs, one a tile (the last
/// row and column of tiles overhang a size that is no multiple of `step`).
struct Tiles {
    height: usize,
    width: usize,
    step: usize,
    rows: usize,
    columns: usize,
}

impl Tiles {
    fn new(height: usize, width: usize, step: usize) -> Self {
        Self {
            height,
            width,
            step,
            rows: height.div_ceil(step),
            columns: width.div_ceil(step),
        }
    }

    fn per_image(&self) -> usize {
        self.rows * self.columns
    }

    fn plane(&self) -> usize {
        self.height * self.width
    }

    /// Room for a row of tiles' `Aᵀ m` in `planes_output`, made once per thread.
    fn scratch(&self) -> Scratch {
        [(); 2].map(|_| [(); 4].map(|_| vec![0.0f32; self.columns]))
    }

    /// Output plane `index` (image `index / c_out` of the group, channel `index % c_out`) from the
    /// products (`[16, c_out, columns]`): `Aᵀ m A` with `Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]`
    /// for each tile, clipped to the map; a row of tiles at a time, so that the loops run along
    /// it.
    fn output_plane(
        &self,
        products: &[f32],
        c_out: usize,
        columns: usize,
        index: usize,
        out: &mut [MaybeUninit<f32>],
        s: &mut Scratch,
    ) {
        let (image, k) = (index / c_out, index % c_out);
        let n = self.columns;
        for row in 0..self.rows {
            let first = image * self.per_image() + row * n;
            let m =
                |a: usize, b: usize| &products[((a * 4 + b) * c_out + k) * columns + first..][..n];
            for b in 0..4 {
                let (m0, m1, m2, m3) = (m(0, b), m(1, b), m(2, b), m(3, b));
                let [s0, s1] = &mut *s;
                for t in 0..n {
                    s0[b][t] = m0[t] + m1[t] + m2[t];
                    s1[b][t] = m1[t] - m2[t] - m3[t];
                }
            }
            // ... then `A` along the columns, into output rows `2 row` and `2 row + 1`.
            for (i, [s0, s1, s2, s3]) in s.iter().enumerate() {
                let y = 2 * row + i;
                if y >= self.height {
                    break;
                }
                let line = &mut out[y * self.width..][..self.width];
                let (pairs, last) = line.as_chunks_mut::<2>();
                for (t, pair) in pairs.iter_mut().enumerate() {
                    pair[0].write(s0[t] + s1[t] + s2[t]);
                    pair[1].write(s1[t] - s2[t] - s3[t]);
                }
                if let [only] = last {
                    let t = n - 1;
                    only.write(s0[t] + s1[t] + s2[t]);
                }
            }
        }
    }

    /// The group's output planes (`y`: `[images, c_out, height, width]`) from the products
    /// (`Layout::Planes`), each then finished by `finish(index, plane)`; in parallel over
    /// planes.
    fn planes_output(
        &self,
        products: &[f32],
        [c_out, columns]: [usize; 2],
        y: &mut [MaybeUninit<f32>],
        finish: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        debug_assert_eq!(self.step, 2, "the plane layout is F(2x2, 3x3)'s");
        y.par_chunks_mut(self.plane().max(1))
            .enumerate()
            .for_each_init(
                || self.scratch(),
                |scratch, (index, out)| {
                    self.output_plane(products, c_out, columns, index, out, scratch);
                    // SAFETY: every output position lies in exactly one 2x2 tile, which
                    // `output_plane` wrote.
                    finish(index, unsafe { assume_written(out) });
                },
            );
    }

    /// The group's input tiles (`x`: `[images, c, height, width]`) transformed, `Bᵀ d B` with
    /// `Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]` for each 4x4 tile `d`,
    /// laid out as `Layout::Planes`; in parallel over channels, a row of tiles at a time.
    fn planes_input(&self, x: &[f32], c_in: usize) -> Vec<f32> {
        debug_assert_eq!(self.step, 2, "the plane layout is F(2x2, 3x3)'s");
        let (height, width) = (self.height, self.width);
        let plane = height * width;
        let images = x.len() / (c_in * plane).max(1);
        let columns = images * self.per_image();
        // Padded rows: a zero on the left, the row, zeros up to the last tile's right edge.
        let padded = 2 * self.columns + 2;
        let write = |c: usize, out: &mut [MaybeUninit<f32>]| {
            // The tile rows' four input rows, padded; then `Bᵀ` along them: `rows[a][p]`.
            let mut d = [(); 4].map(|_| vec![0.0f32; padded]);
            let mut rows = [(); 4].map(|_| vec![0.0f32; padded]);
            for n in 0..images {
                let input = &x[(n * c_in + c) * plane..][..plane];
                for row in 0..self.rows {
                    for (r, d) in d.iter_mut().enumerate() {
                        match (2 * row + r).checked_sub(1).filter(|&y| y < height) {
                            Some(y) => d[1..=width].copy_from_slice(&input[y * width..][..width]),
                            None => d.fill(0.0),
                        }
                    }
                    let [d0, d1, d2, d3] = &d;
                    let [t0, t1, t2, t3] = &mut rows;
                    for p in 0..padded {
                        t0[p] = d0[p] - d2[p];
                        t1[p] = d1[p] + d2[p];
                        t2[p] = d2[p] - d1[p];
                        t3[p] = d1[p] - d3[p];
                    }
                    // ... then Bᵀ along its columns, tile by tile along the row.
                    let first = n * self.per_image() + row * self.columns;
                    for a in 0..4 {
                        for b in 0..4 {
                            let target = &mut out[(a * 4 + b) * columns + first..][..self.columns];
                            match b {
                                0 => along(target, &rows[a], |[r0, _, r2, _]| r0 - r2),
                                1 => along(target, &rows[a], |[_, r1, r2, _]| r1 + r2),
                                2 => along(target, &rows[a], |[_, r1, r2, _]| r2 - r1),
                                _ => along(target, &rows[a], |[_, r1, _, r3]| r1 - r3),
                            }
                        }
                    }
                }
            }
        };
        // SAFETY: every tile of every image of the group writes its 16 transformed values.
        unsafe { written_in_chunks(c_in * 16 * columns, 16 * columns, write) }
    }

    /// The group's input tiles transformed by `W` (as [`Tiles::planes_input`] does by F(2x2,
    /// 3x3)), laid out as `Layout::ChannelsLast`: in parallel over images (each transposed
    /// channels-last) and, within one, over rows of tiles.
    fn channels_last_input<const T: usize, const M: usize, W: Minimal<T, M>>(
        &self,
        x: &[f32],
        c: usize,
    ) -> Vec<f32> {
        let plane = self.plane();
        let per_image = self.per_image() * T * T * c;
        let len = x.len() / plane * self.per_image() * T * T;
        let zeros = vec![0.0f32; c];
        let mut input = Vec::with_capacity(len);
        input.spare_capacity_mut()[..len]
            .par_chunks_mut(per_image.max(1))
            .enumerate()
            .for_each_init(
                || vec![0.0f32; plane * c],
                |last, (image, out)| {
                    transpose::transpose(&x[image * c * plane..][..c * plane], last, plane, c);
                    // The channels at `(y, x)` of the map padded by one all round.
                    let pixel = |y: usize, x: usize| match (y.checked_sub(1), x.checked_sub(1)) {
                        (Some(y), Some(x)) if y < self.height && x < self.width => {
                            &last[(y * self.width + x) * c..][..c]
                        }
                        _ => &zeros[..],
                    };
                    let (step, row_of_tiles) = (self.step, self.columns * T * T * c);
                    out.par_chunks_mut(row_of_tiles)
                        .enumerate()
                        .for_each(|(row, out)| {
                            for (t, out) in out.chunks_exact_mut(T * T * c).enumerate() {
                                let d =
                                    from_fn(|i| from_fn(|j| pixel(step * row + i, step * t + j)));
                                input_tile::<T, M, W>(&d, out, c);
                            }
                        });
                },
            );
        // SAFETY: every tile of every image wrote its `T²` transformed values of each channel.
        unsafe { input.set_len(len) };
        input
    }

    /// [`Tiles::planes_output`] from `W`'s products laid out as `Layout::ChannelsLast`: each
    /// image's tiles into a channels-last image, which is transposed into `y`. In parallel over
    /// images and, within one, over rows of tiles.
    fn channels_last_output<const T: usize, const M: usize, W: Minimal<T, M>>(
        &self,
        products: &[f32],
        [c_out, columns]: [usize; 2],
        y: &mut [MaybeUninit<f32>],
        finish: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        let plane = self.plane();
        y.par_chunks_mut((c_out * plane).max(1))
            .enumerate()
            .for_each_init(
                || vec![0.0f32; plane * c_out],
                |last, (image, y)| {
                    // `M` rows of pixels per row of tiles (fewer for the last where `M` does not
                    // divide the height).
                    let rows_of_pixels = last.par_chunks_mut(M * self.width * c_out);
                    rows_of_pixels.enumerate().for_each(|(row, pixels)| {
                        let rows = pixels.len() / (self.width * c_out);
                        for t in 0..self.columns {
                            let column = image * self.per_image() + row * self.columns + t;
                            let m = from_fn(|a| {
                                from_fn(|b| {
                                    &products[((a * T + b) * columns + column) * c_out..][..c_out]
                                })
                            });
                            let at = |i: usize, j: usize| {
                                let x = M * t + j;
                                (i < rows && x < self.width).then_some((i * self.width + x) * c_out)
                            };
                            let targets = from_fn(|i| from_fn(|j| at(i, j)));
                            output_tile::<T, M, W>(&m, pixels, &targets, c_out);
                        }
                    });
                    y.fill(MaybeUninit::new(0.0));
                    // SAFETY: filled just above.
                    let y = unsafe { assume_written(y) };
                    transpose::transpose(last, y, c_out, plane);
                    for (k, plane) in y.chunks_mut(plane).enumerate() {
                        finish(image * c_out + k, plane);
                    }
                },
            );
    }
}

/// `f` of each tile's four padded values (`2 t..2 t + 4` of `row`), along a row of tiles.
fn along(target: &mut [MaybeUninit<f32>], row: &[f32], f: impl Fn([f32; 4]) -> f32) {
    for (t, target) in target.iter_mut().enumerate() {
        let r = |q: usize| row[2 * t + q];
        target.write(f([r(0), r(1), r(2), r(3)]));
    }
}

/// One tile's `Bᵀ d B` by `W` for all `c` channels, 16 at a time where the CPU has AVX-512.
fn input_tile<const T: usize, const M: usize, W: Minimal<T, M>>(
    d: &Tile<T>,
    out: &mut [MaybeUninit<f32>],
    c: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512.
        return unsafe { input_tile_avx512::<T, M, W>(d, out, c) };
    }
    input_tile_in::<T, M, W, LANES>(d, out, c)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn input_tile_avx512<const T: usize, const M: usize, W: Minimal<T, M>>(
    d: &Tile<T>,
    out: &mut [MaybeUninit<f32>],
    c: usize,
) {
    input_tile_in::<T, M, W, 16>(d, out, c)
}

#[inline(always)]
fn input_tile_in<const T: usize, const M: usize, W: Minimal<T, M>, const L: usize>(
    d: &Tile<T>,
    out: &mut [MaybeUninit<f32>],
    c: usize,
) {
    let blocks = c / L * L;
    for o in (0..blocks).step_by(L) {
        input_block::<T, M, W, L>(d, out, o, c);
    }
    for o in blocks..c {
        input_block::<T, M, W, 1>(d, out, o, c);
    }
}

/// One tile's `Aᵀ m A` by `W` for all `c` channels, 16 at a time where the CPU has AVX-512.
fn output_tile<const T: usize, const M: usize, W: Minimal<T, M>>(
    m: &Tile<T>,
    pixels: &mut [f32],
    targets: &Targets<M>,
    c: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512.
        return unsafe { output_tile_avx512::<T, M, W>(m, pixels, targets, c) };
    }
    output_tile_in::<T, M, W, LANES>(m, pixels, targets, c)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn output_tile_avx512<const T: usize, const M: usize, W: Minimal<T, M>>(
    m: &Tile<T>,
    pixels: &mut [f32],
    targets: &Targets<M>,
    c: usize,
) {
    output_tile_in::<T, M, W, 16>(m, pixels, targets, c)
}

#[inline(always)]
fn output_tile_in<const T: usize, const M: usize, W: Minimal<T, M>, const L: usize>(
    m: &Tile<T>,
    pixels: &mut [f32],
    targets: &Targets<M>,
    c: usize,
) {
    let blocks = c / L * L;
    for o in (0..blocks).step_by(L) {
        output_block::<T, M, W, L>(m, pixels, targets, o);
    }
    for o in blocks..c {
        output_block::<T, M, W, 1>(m, pixels, targets, o);
    }
}

/// A tile's `T x T` positions (`[row][column]`), each the channels there.
type Tile<'a, const T: usize> = [[&'a [f32]; T]; T];

/// Where each output pixel of a tile goes in a row of pixels, `None` off the map.
type Targets<const M: usize> = [[Option<usize>; M]; M];

/// Channels `o..o + L` of one tile's `Bᵀ d B` (`d[i][j]`: the channels of the tile's pixel in
/// row `i`, column `j`) into `out` (`[T², c]`).
#[inline(always)]
fn input_block<const T: usize, const M: usize, W: Minimal<T, M>, const L: usize>(
    d: &Tile<T>,
    out: &mut [MaybeUninit<f32>],
    o: usize,
    c: usize,
) {
    let d: [[[f32; L]; T]; T] =
        from_fn(|i| from_fn(|j| *d[i][j][o..].first_chunk().expect("a tile's channel block")));
    // `Bᵀ` down each column of the tile, then along each of the rows that gives.
    let columns: [[[f32; L]; T]; T] = from_fn(|j| W::bt(from_fn(|i| d[i][j])));
    for a in 0..T {
        let row = W::bt(from_fn(|j| columns[j][a]));
        for (b, values) in row.iter().enumerate() {
            for (out, &v) in out[(a * T + b) * c + o..][..L].iter_mut().zip(values) {
                out.write(v);
            }
        }
    }
}

/// Channels `o..o + L` of one tile's `Aᵀ m A` (`m[a][b]`: the channels of the products at
/// position `(a, b)` of the tile) into `pixels` at `targets[i][j]`, where the output pixel lies
/// on the map.
#[inline(always)]
fn output_block<const T: usize, const M: usize, W: Minimal<T, M>, const L: usize>(
    m: &Tile<T>,
    pixels: &mut [f32],
    targets: &Targets<M>,
    o: usize,
) {
    let m: [[[f32; L]; T]; T] =
        from_fn(|a| from_fn(|b| *m[a][b][o..].first_chunk().expect("a tile's channel block")));
    // `Aᵀ` down each column, then along each of the `M` rows that gives.
    let columns: [[[f32; L]; M]; T] = from_fn(|b| W::at(from_fn(|a| m[a][b])));
    for i in 0..M {
        let row = W::at(from_fn(|b| columns[b][i]));
        for (j, values) in row.iter().enumerate() {
            if let Some(target) = targets[i][j] {
                pixels[target + o..][..L].copy_from_slice(values);
            }
        }
    }
}

/// Transformed kernels `U`, `T²` matrices `[c_out, c_in]`, and where each `U[ξ]` lies in them.
struct Transformed {
    values: Vec<f32>,
    /// How far `U[ξ + 1]` starts from `U[ξ]`.
    step: usize,
    /// The strides between columns (input channels) and rows (output channels) of `U[ξ]`.
    strides: [usize; 2],
}

/// The kernels transformed by `W`, `G g Gᵀ` kernel by kernel: `[c_out, T², c_in]`, in parallel
/// over output channels.
fn transform_kernels<const T: usize, const M: usize, W: Minimal<T, M>>(
    kernels: Kernels,
    c_out: usize,
    c_in: usize,
) -> Transformed {
    let write = |k: usize, out: &mut [MaybeUninit<f32>]| {
        for c in 0..c_in {
            let g = kernels.get(k, c, c_out, c_in);
            // G g: along the kernel's rows, for each of its columns.
            let columns: [[f32; T]; 3] = from_fn(|j| W::g([g[j], g[3 + j], g[6 + j]]));
            for a in 0..T {
                let row = W::g([columns[0][a], columns[1][a], columns[2][a]]);
                for (b, value) in row.into_iter().enumerate() {
                    out[(a * T + b) * c_in + c].write(value);
                }
            }
        }
    };
    // SAFETY: each output channel writes its `T²` transformed values of every input channel.
    let values = unsafe { written_in_chunks(c_out * T * T * c_in, T * T * c_in, write) };
    Transformed {
        values,
        step: c_in,
        strides: [1, T * T * c_in],
    }
}

/// The kernels transformed by `W` as one matrix product, `[c_in c_out, 9] · Kᵀ` with `K = G ⊗ G`
/// (`[T², 9]`): `U` laid out `[T², c_in, c_out]`, each `U[ξ]` column-major, which the gemm
/// crate reads in place where it packed `transform_kernels`' rows for every product (most of
/// the time on 4x4 maps, where there are few columns to share the packing).
fn transform_kernels_by_product<const T: usize, const M: usize, W: Minimal<T, M>>(
    kernels: Kernels,
    c_out: usize,
    c_in: usize,
) -> Transformed {
    // Each kernel's nine values, `[c_in, c_out, 9]`, and whether it is to be turned by 180°.
    let (nine, flipped) = match kernels {
        Kernels::Weight(w) => {
            let mut swapped = vec![[0.0f32; 9]; c_in * c_out];
            transpose::transpose(w.as_chunks::<9>().0, &mut swapped, c_in, c_out);
            (Cow::Owned(swapped.into_flattened()), false)
        }
        Kernels::Flipped(w) => (Cow::Borrowed(w), true),
    };
    assert_eq!(
        nine.len(),
        c_in * c_out * 9,
        "a 3x3 kernel for each channel pair"
    );
    // `Kᵀ`: row `3 i + j` (`8 - 3 i - j` turned) is `G[a][i] G[b][j]` at column `a T + b`.
    let g: [[f32; T]; 3] = from_fn(|i| W::g(from_fn(|q| if q == i { 1.0 } else { 0.0 })));
    let mut k_t = vec![0.0f32; 9 * T * T];
    for p in 0..9 {
        let row = if flipped { 8 - p } else { p };
        for (a, b) in (0..T).flat_map(|a| (0..T).map(move |b| (a, b))) {
            k_t[row * T * T + a * T + b] = g[p / 3][a] * g[p % 3][b];
        }
    }
    let (rows, len) = (c_in * c_out, T * T * c_in * c_out);
    let mut values = Vec::with_capacity(len);
    // SAFETY: `values` has room for the product `[rows, T²]`, column-major; `nine` holds `rows`
    // rows of nine values, `k_t` nine rows of `T²`. The product writes all of it without
    // reading it.
    unsafe {
        gemm(
            rows,
            T * T,
            9,
            values.as_mut_ptr(),
            rows as isize,
            1,
            false,
            nine.as_ptr(),
            1,
            9,
            k_t.as_ptr(),
            1,
            (T * T) as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            Parallelism::Rayon(0),
        );
        values.set_len(len);
    }
    Transformed {
        values,
        step: c_in * c_out,
        strides: [c_out, 1],
    }
}

/// The `positions` products `M[ξ] = U[ξ] · V[ξ]` (`[c_out, c_in] · [c_in, columns]`), in
/// parallel over `ξ`, the transformed input and the products laid out as `layout`.
fn multiply(
    kernels: &Transformed,
    input: &[f32],
    [positions, c_out, c_in, columns]: [usize; 4],
    layout: Layout,
) -> Vec<f32> {
    // Where `V[ξ]` starts and its strides between columns and rows, and `M[ξ]`'s strides.
    let (start, [input_cs, input_rs], [out_cs, out_rs]) = match layout {
        Layout::Planes => (columns, [1, positions * columns], [1, columns]),
        Layout::ChannelsLast => (c_in, [positions * c_in, 1], [c_out, 1]),
    };
    let write = |xi: usize, out: &mut [MaybeUninit<f32>]| {
        // SAFETY: `out` holds `c_out * columns` values, each at `k * out_rs + t * out_cs` for
        // one row `k` and column `t`; `U[xi]`'s value `(k, c)` lies at `xi * step + c * cs + k *
        // rs` inside `kernels` (`[c_out, positions, c_in]` or `[positions, c_in, c_out]`, as
        // `Transformed` says); `V[xi]`'s value `(c, t)` lies at `xi * start + c * input_rs + t * input_cs`, inside `input` in either layout (the
        // pointers are only offset, not read, where a dimension is empty). The product writes
        // all of `out` without reading it.
        unsafe {
            gemm(
                c_out,
                columns,
                c_in,
                out.as_mut_ptr().cast::<f32>(),
                out_cs as isize,
                out_rs as isize,
                false,
                kernels.values.as_ptr().wrapping_add(xi * kernels.step),
                kernels.strides[0] as isize,
                kernels.strides[1] as isize,
                input.as_ptr().wrapping_add(xi * start),
                input_cs as isize,
                input_rs as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
    };
    // SAFETY: each `write` fills its product (above).
    unsafe { written_in_chunks(positions * c_out * columns, c_out * columns, write) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tile's transforms by `W` give the same values at every block width (16 with AVX-512,
    /// [`LANES`] without, 1 for the channels left over), so that CPUs without AVX-512 compute
    /// what this one does; and channel `ch` of each is `Bᵀ d B` and `Aᵀ m A` written out.
    fn check_tile_transforms<const T: usize, const M: usize, W: Minimal<T, M>>(
        b_t: [[f32; T]; T],
        a_t: [[f32; T]; M],
    ) {
        let c = 37;
        let values: Vec<Vec<f32>> = (0..T * T)
            .map(|p| {
                (0..c)
                    .map(|ch| ((p * 31 + ch * 7) % 23) as f32 * 0.37 - 3.0)
                    .collect()
            })
            .collect();
        let tile: Tile<T> = from_fn(|i| from_fn(|j| &values[i * T + j][..]));
        // `left ᵀ tile right` in channel `ch`, within a few roundings of its terms' size (the
        // coefficients reach 5 and 8).
        let near = |got: f32, left: &[f32; T], right: &[f32; T], ch: usize| {
            let terms = (0..T)
                .flat_map(|p| (0..T).map(move |q| (p, q)))
                .map(|(p, q)| f64::from(left[p] * tile[p][q][ch] * right[q]));
            let (expected, size) = terms.fold((0.0, 0.0), |(e, s), t| (e + t, s + t.abs()));
            (f64::from(got) - expected).abs() <= 1e-6 * size
        };

        let input = |f: fn(&Tile<T>, &mut [MaybeUninit<f32>], usize)| {
            let mut out = vec![MaybeUninit::new(f32::NAN); T * T * c];
            f(&tile, &mut out, c);
            // SAFETY: initialized above.
            out.iter()
                .map(|v| unsafe { v.assume_init() })
                .collect::<Vec<f32>>()
        };
        let transformed = input(input_tile_in::<T, M, W, 16>);
        assert_eq!(transformed, input(input_tile_in::<T, M, W, LANES>));
        assert_eq!(transformed, input(input_tile_in::<T, M, W, 1>));
        for ch in [0, 15, 16, 36] {
            for (a, b) in (0..T).flat_map(|a| (0..T).map(move |b| (a, b))) {
                let got = transformed[(a * T + b) * c + ch];
                assert!(
                    near(got, &b_t[a], &b_t[b], ch),
                    "({a}, {b}) channel {ch}: {got}"
                );
            }
        }

        let targets: Targets<M> = from_fn(|i| from_fn(|j| Some((i * M + j) * c)));
        let output = |f: fn(&Tile<T>, &mut [f32], &Targets<M>, usize)| {
            let mut pixels = vec![f32::NAN; M * M * c];
            f(&tile, &mut pixels, &targets, c);
            pixels
        };
        let pixels = output(output_tile_in::<T, M, W, 16>);
        assert_eq!(pixels, output(output_tile_in::<T, M, W, LANES>));
        assert_eq!(pixels, output(output_tile_in::<T, M, W, 1>));
        for ch in [0, 15, 16, 36] {
            for (i, j) in (0..M).flat_map(|i| (0..M).map(move |j| (i, j))) {
                let got = pixels[(i * M + j) * c + ch];
                assert!(
                    near(got, &a_t[i], &a_t[j], ch),
                    "({i}, {j}) channel {ch}: {got}"
                );
            }
        }
    }

    #[test]
    fn tile_transforms_agree_at_every_block_width() {
        check_tile_transforms::<4, 2, F2>(
            [
                [1.0, 0.0, -1.0, 0.0],
                [0.0, 1.0, 1.0, 0.0],
                [0.0, -1.0, 1.0, 0.0],
                [0.0, 1.0, 0.0, -1.0],
            ],
            [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]],
        );
        check_tile_transforms::<6, 4, F4>(
            [
                [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
                [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
                [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
                [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
                [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
                [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
            ],
            [
                [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
                [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
                [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
                [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
            ],
        );
    }

    /// Values in [-1, 1) from a fixed hash of the index.
    fn values(len: usize, salt: u64) -> Vec<f32> {
        (0..len as u64)
            .map(|i| {
                let z = (i ^ (salt << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The convolution summed directly in float64.
    fn direct(x: &[f32], w: &[f32], [n, c_in, h, wd]: [usize; 4], c_out: usize) -> Vec<f64> {
        let mut y = vec![0.0f64; n * c_out * h * wd];
        for (i, k, r, q) in (0..n).flat_map(|i| {
            (0..c_out)
                .flat_map(move |k| (0..h).flat_map(move |r| (0..wd).map(move |q| (i, k, r, q))))
        }) {
            let mut sum = 0.0f64;
            for c in 0..c_in {
                for (dr, dq) in (0..3).flat_map(|dr| (0..3).map(move |dq| (dr, dq))) {
                    let (y_in, x_in) = ((r + dr).checked_sub(1), (q + dq).checked_sub(1));
                    if let (Some(yi), Some(xi)) = (y_in, x_in)
                        && yi < h
                        && xi < wd
                    {
                        sum += f64::from(x[((i * c_in + c) * h + yi) * wd + xi])
                            * f64::from(w[((k * c_in + c) * 3 + dr) * 3 + dq]);
                    }
                }
            }
            y[((i * c_out + k) * h + r) * wd + q] = sum;
        }
        y
    }

    /// The kernels transformed as one matrix product hold what the kernel-by-kernel transform
    /// gives, in their own layout, for the weight and for the input gradient's turned kernels.
    #[test]
    fn kernel_transforms_agree() {
        let (c_out, c_in) = (5, 19);
        let w = values(c_out * c_in * 9, 3);
        for kernels in [Kernels::Weight(&w), Kernels::Flipped(&w)] {
            let by_kernel = transform_kernels::<4, 2, F2>(kernels, c_out, c_in);
            let by_product = transform_kernels_by_product::<4, 2, F2>(kernels, c_out, c_in);
            for (xi, k, c) in (0..16)
                .flat_map(|xi| (0..c_out).flat_map(move |k| (0..c_in).map(move |c| (xi, k, c))))
            {
                let at =
                    |u: &Transformed| u.values[xi * u.step + c * u.strides[0] + k * u.strides[1]];
                let (a, b) = (at(&by_kernel), at(&by_product));
                assert!((a - b).abs() <= 1e-6, "U[{xi}] ({k}, {c}): {a} != {b}");
            }
        }
    }

    /// F(2x2, 3x3) and F(4x4, 3x3) against direct float64 sums, on maps that 4x4 blocks
    /// do not divide (5x7, 3x3, 1x1), one image and channel counts off the vector width; the
    /// largest error of each, relative to the largest output, within its bound: F(2x2, 3x3)
    /// measured up to 4.5e-7 here, F(4x4, 3x3) up to 2.3e-5 (16x16).
    #[test]
    fn forward_matches_direct_sums() {
        for (dims, c_out) in [
            ([1, 17, 5, 7], 19),
            ([2, 3, 1, 1], 5),
            ([3, 20, 3, 3], 33),
            ([2, 64, 8, 8], 64),
            ([2, 64, 16, 16], 64),
        ] {
            let x = values(dims.iter().product(), 1);
            let w = values(c_out * dims[1] * 9, 2);
            let expected = direct(&x, &w, dims, c_out);
            let largest = expected.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let f2 = |x: &[f32]| convolve::<4, 2, F2>(x, Kernels::Weight(&w), dims, c_out, None);
            let f4 = |x: &[f32]| convolve::<6, 4, F4>(x, Kernels::Weight(&w), dims, c_out, None);
            type Convolve<'a> = &'a dyn Fn(&[f32]) -> Vec<f32>;
            for (name, convolve, bound) in [("F2", &f2 as Convolve, 1e-6), ("F4", &f4, 5e-5)] {
                let y = convolve(&x);
                let error = y
                    .iter()
                    .zip(&expected)
                    .fold(0.0f64, |m, (&a, &b)| m.max((f64::from(a) - b).abs()));
                println!("{dims:?} -> {c_out} {name}: {:.2e}", error / largest);
                assert!(
                    error <= bound * largest,
                    "{dims:?} -> {c_out} {name}: {error} against {largest}"
                );
            }
        }
    }
}
