//! 3x3 convolutions with stride 1 and padding 1, and their input gradient, by Winograd's minimal
//! filtering F(2x2, 3x3) (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
//! 2015): each 2x2 block of outputs comes from a 4x4 tile of the input through 16 products per
//! channel pair instead of 36, so the matrix products, which bound ResNet-18 on flex, do 2.25x
//! fewer multiply-adds. The input's tiles and the kernels are transformed once, the 16 products
//! (one per position in the transformed 4x4 tile) are matrix products over all channels and
//! tiles, and the outputs are transformed back and finished by the epilogue.
//!
//! Two layouts for the transformed tiles, by the size of the map. On large maps each plane's
//! tiles lie in a row and the transforms run along the rows of tiles. On maps of 64 to 256
//! positions (8x8 to 16x16 in a ResNet) those rows are a few tiles long and their loops mostly
//! overhead, so the images are transposed channels-last first and each tile's transform runs
//! along its channels instead, which the layers on small maps have many of.
//!
//! Training uses it for the forward pass and the input gradient (the same convolution of the
//! output gradient with the kernels flipped); its float32 rounding stays within the gradient
//! tests' and the PyTorch trajectories' bounds. The weight gradient stays direct
//! (`shifted_conv`, im2col): Winograd's, though faster, put flex 100x outside the trajectory
//! bounds (AdamW amplifies rounding in near-zero gradients).

use std::array::from_fn;
use std::mem::MaybeUninit;
use std::ops::RangeInclusive;

use gemm::{Parallelism, gemm};
use rayon::prelude::*;

use crate::epilogue::Epilogue;
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

/// `y = conv2d(x, weight)` with stride 1 and padding 1 for `x` `[images, c_in, height, width]`
/// and `weight` `[c_out, c_in, 3, 3]`, each output plane finished by `epilogue` where given.
pub(crate) fn forward(
    x: &[f32],
    weight: &[f32],
    dims: [usize; 4],
    c_out: usize,
    epilogue: Option<&Epilogue>,
) -> Vec<f32> {
    convolve(x, Kernels::Weight(weight), dims, c_out, epilogue)
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
    convolve(
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

/// [`forward`] with `kernels`.
fn convolve(
    x: &[f32],
    kernels: Kernels,
    [images, c_in, height, width]: [usize; 4],
    c_out: usize,
    epilogue: Option<&Epilogue>,
) -> Vec<f32> {
    let tiles = Tiles::new(height, width);
    let layout = tiles.layout();
    let kernels = transform_kernels(kernels, c_out, c_in);
    let plane = height * width;
    let per_image = 16 * (c_in + c_out) * tiles.per_image() * std::mem::size_of::<f32>();
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
            Layout::ChannelsLast => tiles.channels_last_input(x, c_in),
        };
        let products = multiply(
            &kernels,
            &input,
            [c_out, c_in, group.len() * tiles.per_image()],
            layout,
        );
        let columns = group.len() * tiles.per_image();
        match layout {
            Layout::Planes => tiles.planes_output(&products, [c_out, columns], slab, finish),
            Layout::ChannelsLast => {
                tiles.channels_last_output(&products, [c_out, columns], slab, finish)
            }
        }
    }
    // SAFETY: the groups cover every image, and each group's output wrote all its planes.
    unsafe { y.set_len(len) };
    y
}

/// How the transformed tiles (`V`, 16 matrices `[c, columns]`, where column `image * tiles +
/// tile` is a tile of an image of the group) and the products (`M`, 16 `[c_out, columns]`) lie
/// in memory.
#[derive(Clone, Copy)]
enum Layout {
    /// `V` `[c, 16, columns]`, `M` `[16, c_out, columns]`: each plane's tiles in a row.
    Planes,
    /// `V` `[columns, 16, c]`, `M` `[16, columns, c_out]`: each tile's channels in a row.
    ChannelsLast,
}

/// `s[i][b]`: row `i` of `Aᵀ m` for every tile of a row of tiles, component `b`.
type Scratch = [[Vec<f32>; 4]; 2];

/// How a `height x width` map divides into 2x2 output tiles (the last row and column of tiles
/// overhang an odd size).
struct Tiles {
    height: usize,
    width: usize,
    rows: usize,
    columns: usize,
}

impl Tiles {
    fn new(height: usize, width: usize) -> Self {
        Self {
            height,
            width,
            rows: height.div_ceil(2),
            columns: width.div_ceil(2),
        }
    }

    fn per_image(&self) -> usize {
        self.rows * self.columns
    }

    fn plane(&self) -> usize {
        self.height * self.width
    }

    fn layout(&self) -> Layout {
        if CHANNELS_LAST_PLANES.contains(&self.plane()) {
            Layout::ChannelsLast
        } else {
            Layout::Planes
        }
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

    /// [`Tiles::planes_input`] laid out as `Layout::ChannelsLast`: in parallel over images (each
    /// transposed channels-last) and, within one, over rows of tiles.
    fn channels_last_input(&self, x: &[f32], c: usize) -> Vec<f32> {
        let plane = self.plane();
        let per_image = self.per_image() * 16 * c;
        let len = x.len() / plane * self.per_image() * 16;
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
                    let row_of_tiles = self.columns * 16 * c;
                    out.par_chunks_mut(row_of_tiles)
                        .enumerate()
                        .for_each(|(row, out)| {
                            for (t, out) in out.chunks_exact_mut(16 * c).enumerate() {
                                let d = from_fn(|i| from_fn(|j| pixel(2 * row + i, 2 * t + j)));
                                input_tile(&d, out, c);
                            }
                        });
                },
            );
        // SAFETY: every tile of every image wrote its 16 transformed values of each channel.
        unsafe { input.set_len(len) };
        input
    }

    /// [`Tiles::planes_output`] from products laid out as `Layout::ChannelsLast`: each image's
    /// tiles into a channels-last image, which is transposed into `y`. In parallel over images
    /// and, within one, over rows of tiles.
    fn channels_last_output(
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
                    // Two rows of pixels per row of tiles (one for the last of an odd height).
                    let rows_of_pixels = last.par_chunks_mut(2 * self.width * c_out);
                    rows_of_pixels.enumerate().for_each(|(row, pixels)| {
                        let rows = pixels.len() / (self.width * c_out);
                        for t in 0..self.columns {
                            let column = image * self.per_image() + row * self.columns + t;
                            let m = from_fn(|a| {
                                from_fn(|b| {
                                    &products[((a * 4 + b) * columns + column) * c_out..][..c_out]
                                })
                            });
                            let at = |i: usize, j: usize| {
                                let x = 2 * t + j;
                                (i < rows && x < self.width).then_some((i * self.width + x) * c_out)
                            };
                            let targets = from_fn(|i| from_fn(|j| at(i, j)));
                            output_tile(&m, pixels, &targets, c_out);
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

/// One tile's `Bᵀ d B` for all `c` channels, 16 at a time where the CPU has AVX-512.
fn input_tile(d: &Tile, out: &mut [MaybeUninit<f32>], c: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512.
        return unsafe { input_tile_avx512(d, out, c) };
    }
    input_tile_in::<LANES>(d, out, c)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn input_tile_avx512(d: &Tile, out: &mut [MaybeUninit<f32>], c: usize) {
    input_tile_in::<16>(d, out, c)
}

#[inline(always)]
fn input_tile_in<const L: usize>(d: &Tile, out: &mut [MaybeUninit<f32>], c: usize) {
    let blocks = c / L * L;
    for o in (0..blocks).step_by(L) {
        input_block::<L>(d, out, o, c);
    }
    for o in blocks..c {
        input_block::<1>(d, out, o, c);
    }
}

/// One tile's `Aᵀ m A` for all `c` channels, 16 at a time where the CPU has AVX-512.
fn output_tile(m: &Tile, pixels: &mut [f32], targets: &Targets, c: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512.
        return unsafe { output_tile_avx512(m, pixels, targets, c) };
    }
    output_tile_in::<LANES>(m, pixels, targets, c)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn output_tile_avx512(m: &Tile, pixels: &mut [f32], targets: &Targets, c: usize) {
    output_tile_in::<16>(m, pixels, targets, c)
}

#[inline(always)]
fn output_tile_in<const L: usize>(m: &Tile, pixels: &mut [f32], targets: &Targets, c: usize) {
    let blocks = c / L * L;
    for o in (0..blocks).step_by(L) {
        output_block::<L>(m, pixels, targets, o);
    }
    for o in blocks..c {
        output_block::<1>(m, pixels, targets, o);
    }
}

/// A tile's 16 positions (`[row][column]`), each the channels there.
type Tile<'a> = [[&'a [f32]; 4]; 4];

/// Where each output pixel of a tile goes in a row of pixels, `None` off the map.
type Targets = [[Option<usize>; 2]; 2];

/// Channels `o..o + L` of one tile's `Bᵀ d B` (`d[i][j]`: the channels of the tile's pixel in
/// row `i`, column `j`) into `out` (`[16, c]`).
#[inline(always)]
fn input_block<const L: usize>(d: &Tile, out: &mut [MaybeUninit<f32>], o: usize, c: usize) {
    let d: [[[f32; L]; 4]; 4] =
        from_fn(|i| from_fn(|j| *d[i][j][o..].first_chunk().expect("a tile's channel block")));
    // `Bᵀ` down each column of the tile, then along each of the rows that gives.
    let columns: [[[f32; L]; 4]; 4] = from_fn(|j| bt([d[0][j], d[1][j], d[2][j], d[3][j]]));
    for a in 0..4 {
        let row = bt([columns[0][a], columns[1][a], columns[2][a], columns[3][a]]);
        for (b, values) in row.iter().enumerate() {
            for (out, &v) in out[(a * 4 + b) * c + o..][..L].iter_mut().zip(values) {
                out.write(v);
            }
        }
    }
}

/// Channels `o..o + L` of one tile's `Aᵀ m A` (`m[a][b]`: the channels of the products at
/// position `(a, b)` of the tile) into `pixels` at `targets[i][j]`, where the output pixel lies
/// on the map.
#[inline(always)]
fn output_block<const L: usize>(m: &Tile, pixels: &mut [f32], targets: &Targets, o: usize) {
    let m: [[[f32; L]; 4]; 4] =
        from_fn(|a| from_fn(|b| *m[a][b][o..].first_chunk().expect("a tile's channel block")));
    // `Aᵀ` down each column, then along each of the two rows that gives.
    let columns: [[[f32; L]; 2]; 4] = from_fn(|b| at([m[0][b], m[1][b], m[2][b], m[3][b]]));
    for i in 0..2 {
        let row = at([columns[0][i], columns[1][i], columns[2][i], columns[3][i]]);
        for (j, values) in row.iter().enumerate() {
            if let Some(target) = targets[i][j] {
                pixels[target + o..][..L].copy_from_slice(values);
            }
        }
    }
}

/// `Bᵀ v` for four blocks of values, `Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0],
/// [0, 1, 0, -1]]`.
#[inline(always)]
fn bt<const L: usize>([v0, v1, v2, v3]: [[f32; L]; 4]) -> [[f32; L]; 4] {
    [
        from_fn(|l| v0[l] - v2[l]),
        from_fn(|l| v1[l] + v2[l]),
        from_fn(|l| v2[l] - v1[l]),
        from_fn(|l| v1[l] - v3[l]),
    ]
}

/// `Aᵀ v` for four blocks of values, `Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]`.
#[inline(always)]
fn at<const L: usize>([v0, v1, v2, v3]: [[f32; L]; 4]) -> [[f32; L]; 2] {
    [
        from_fn(|l| v0[l] + v1[l] + v2[l]),
        from_fn(|l| v1[l] - v2[l] - v3[l]),
    ]
}

/// The kernels transformed, `G g Gᵀ` with `G = [[1, 0, 0], [½, ½, ½], [½, -½, ½],
/// [0, 0, 1]]`: `[c_out, 16, c_in]`, in parallel over output channels.
fn transform_kernels(kernels: Kernels, c_out: usize, c_in: usize) -> Vec<f32> {
    let write = |k: usize, out: &mut [MaybeUninit<f32>]| {
        for c in 0..c_in {
            let g = kernels.get(k, c, c_out, c_in);
            let gg = |q: [f32; 3]| {
                [
                    q[0],
                    (q[0] + q[1] + q[2]) / 2.0,
                    (q[0] - q[1] + q[2]) / 2.0,
                    q[2],
                ]
            };
            // G g: along the kernel's rows, for each of its columns.
            let columns: [[f32; 4]; 3] = from_fn(|j| gg([g[j], g[3 + j], g[6 + j]]));
            for a in 0..4 {
                let row = gg([columns[0][a], columns[1][a], columns[2][a]]);
                for (b, value) in row.into_iter().enumerate() {
                    out[(a * 4 + b) * c_in + c].write(value);
                }
            }
        }
    };
    // SAFETY: each output channel writes its 16 transformed values of every input channel.
    unsafe { written_in_chunks(c_out * 16 * c_in, 16 * c_in, write) }
}

/// The 16 products `M[ξ] = U[ξ] · V[ξ]` (`[c_out, c_in] · [c_in, columns]`, `U[ξ]`'s rows
/// `16 * c_in` apart in the transformed kernels), in parallel over `ξ`, the transformed input
/// and the products laid out as `layout`.
fn multiply(
    kernels: &[f32],
    input: &[f32],
    [c_out, c_in, columns]: [usize; 3],
    layout: Layout,
) -> Vec<f32> {
    // Where `V[ξ]` starts and its strides between columns and rows, and `M[ξ]`'s strides.
    let (start, [input_cs, input_rs], [out_cs, out_rs]) = match layout {
        Layout::Planes => (columns, [1, 16 * columns], [1, columns]),
        Layout::ChannelsLast => (c_in, [16 * c_in, 1], [c_out, 1]),
    };
    let write = |xi: usize, out: &mut [MaybeUninit<f32>]| {
        // SAFETY: `out` holds `c_out * columns` values, each at `k * out_rs + t * out_cs` for
        // one row `k` and column `t`; `U[xi]`'s value `(k, c)` lies at `(k * 16 + xi) * c_in +
        // c`, inside `kernels` (`[c_out, 16, c_in]`); `V[xi]`'s value `(c, t)` lies at
        // `xi * start + c * input_rs + t * input_cs`, inside `input` in either layout (the
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
                kernels.as_ptr().wrapping_add(xi * c_in),
                1,
                (16 * c_in) as isize,
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
    unsafe { written_in_chunks(16 * c_out * columns, c_out * columns, write) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tile's transforms give the same values at every block width (16 with AVX-512,
    /// [`LANES`] without, 1 for the channels left over), so that CPUs without AVX-512 compute
    /// what this one does; and channel `ch` of each is `Bᵀ d B` and `Aᵀ m A` written out.
    #[test]
    fn tile_transforms_agree_at_every_block_width() {
        let c = 37;
        let values: Vec<Vec<f32>> = (0..16)
            .map(|p| {
                (0..c)
                    .map(|ch| ((p * 31 + ch * 7) % 23) as f32 * 0.37 - 3.0)
                    .collect()
            })
            .collect();
        let tile: Tile = from_fn(|i| from_fn(|j| &values[i * 4 + j][..]));

        let input = |f: fn(&Tile, &mut [MaybeUninit<f32>], usize)| {
            let mut out = vec![MaybeUninit::new(f32::NAN); 16 * c];
            f(&tile, &mut out, c);
            // SAFETY: initialized above.
            out.iter()
                .map(|v| unsafe { v.assume_init() })
                .collect::<Vec<f32>>()
        };
        let transformed = input(input_tile_in::<16>);
        assert_eq!(transformed, input(input_tile_in::<LANES>));
        assert_eq!(transformed, input(input_tile_in::<1>));
        let b_t = [
            [1.0, 0.0, -1.0, 0.0],
            [0.0, 1.0, 1.0, 0.0],
            [0.0, -1.0, 1.0, 0.0],
            [0.0, 1.0, 0.0, -1.0],
        ];
        for ch in [0, 15, 16, 36] {
            for (a, b) in (0..4).flat_map(|a| (0..4).map(move |b| (a, b))) {
                let expected: f32 = (0..4)
                    .flat_map(|i| (0..4).map(move |j| (i, j)))
                    .map(|(i, j)| b_t[a][i] * tile[i][j][ch] * b_t[b][j])
                    .sum();
                let got = transformed[(a * 4 + b) * c + ch];
                assert!(
                    (got - expected).abs() < 1e-5,
                    "({a}, {b}) channel {ch}: {got} != {expected}"
                );
            }
        }

        let targets = [[Some(0), Some(c)], [Some(2 * c), Some(3 * c)]];
        let output = |f: fn(&Tile, &mut [f32], &Targets, usize)| {
            let mut pixels = vec![f32::NAN; 4 * c];
            f(&tile, &mut pixels, &targets, c);
            pixels
        };
        let pixels = output(output_tile_in::<16>);
        assert_eq!(pixels, output(output_tile_in::<LANES>));
        assert_eq!(pixels, output(output_tile_in::<1>));
        let a_t = [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]];
        for ch in [0, 15, 16, 36] {
            for (i, j) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let expected: f32 = (0..4)
                    .flat_map(|a| (0..4).map(move |b| (a, b)))
                    .map(|(a, b)| a_t[i][a] * tile[a][b][ch] * a_t[j][b])
                    .sum();
                let got = pixels[(i * 2 + j) * c + ch];
                assert!(
                    (got - expected).abs() < 1e-5,
                    "({i}, {j}) channel {ch}: {got} != {expected}"
                );
            }
        }
    }
}
