//! 3x3 convolutions with stride 1 and padding 1, and their input gradient, by Winograd's minimal
//! filtering F(2x2, 3x3) (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
//! 2015): each 2x2 block of outputs comes from a 4x4 tile of the input through 16 products per
//! channel pair instead of 36, so the matrix products, which bound ResNet-18 on flex, do 2.25x
//! fewer multiply-adds. The input's tiles and the kernels are transformed once, the 16 products
//! (one per position in the transformed 4x4 tile) are matrix products over all channels and
//! tiles, and the outputs are transformed back and finished by the epilogue.
//!
//! Training uses it for the forward pass and the input gradient (the same convolution of the
//! output gradient with the kernels flipped); its float32 rounding stays within the gradient
//! tests' and the PyTorch trajectories' bounds. The weight gradient stays direct
//! (`shifted_conv`, im2col): Winograd's, though faster, put flex 100x outside the trajectory
//! bounds (AdamW amplifies rounding in near-zero gradients).

use std::mem::MaybeUninit;
use std::ops::Range;

use gemm::{Parallelism, gemm};
use rayon::prelude::*;

use crate::epilogue::Epilogue;
use crate::uninit::{assume_written, written_in_chunks};

/// Images are transformed and multiplied in groups whose transformed tiles and products fit in
/// this many bytes.
const CHUNK_BYTES: usize = 32 << 20;

/// `y = conv2d(x, weight)` with stride 1 and padding 1 for `x` `[images, c_in, height, width]`
/// and `weight` `[c_out, c_in, 3, 3]`, each output plane finished by `epilogue` where given.
pub(crate) fn forward(
    x: &[f32],
    weight: &[f32],
    [images, c_in, height, width]: [usize; 4],
    c_out: usize,
    epilogue: Option<&Epilogue>,
) -> Vec<f32> {
    let tiles = Tiles::new(height, width);
    let kernels = transform_kernels(weight, c_out, c_in);
    let plane = height * width;
    let per_image = 16 * (c_in + c_out) * tiles.per_image() * std::mem::size_of::<f32>();
    let group = (CHUNK_BYTES / per_image.max(1)).max(1);
    let len = images * c_out * plane;
    let mut y = Vec::with_capacity(len);
    for first in (0..images).step_by(group) {
        let group = first..(first + group).min(images);
        let columns = group.len() * tiles.per_image();
        let input = transform_input(x, c_in, &tiles, group.clone());
        let products = multiply(&kernels, &input, c_out, c_in, columns);
        let slab = &mut y.spare_capacity_mut()[..len]
            [group.start * c_out * plane..group.end * c_out * plane];
        slab.par_chunks_mut(plane).enumerate().for_each_init(
            || tiles.scratch(),
            |scratch, (index, out)| {
                tiles.transform_output(&products, c_out, columns, index, out, scratch);
                if let Some(epilogue) = epilogue {
                    // SAFETY: every output position lies in exactly one 2x2 tile, which
                    // `transform_output` wrote.
                    epilogue.finish(group.start * c_out + index, unsafe { assume_written(out) });
                }
            },
        );
    }
    // SAFETY: the groups cover every image and each image's every plane was written.
    unsafe { y.set_len(len) };
    y
}

/// The gradient of [`forward`]'s convolution (without epilogue) with respect to its input
/// `[images, c_in, height, width]`, from the output's gradient `dy` `[images, c_out, height,
/// width]`: the same kind of convolution, of `dy` with each kernel flipped and the channels
/// swapped (`[c_in, c_out, 3, 3]`).
pub(crate) fn input_gradient(
    weight: &[f32],
    dy: &[f32],
    [images, c_in, height, width]: [usize; 4],
    c_out: usize,
) -> Vec<f32> {
    let mut flipped = Vec::with_capacity(weight.len());
    for c in 0..c_in {
        for k in 0..c_out {
            flipped.extend(weight[(k * c_in + c) * 9..][..9].iter().rev());
        }
    }
    forward(dy, &flipped, [images, c_out, height, width], c_in, None)
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

    /// Room for a row of tiles' `Aᵀ m` in `transform_output`, made once per thread.
    fn scratch(&self) -> Scratch {
        [(); 2].map(|_| [(); 4].map(|_| vec![0.0f32; self.columns]))
    }

    fn per_image(&self) -> usize {
        self.rows * self.columns
    }

    /// Output plane `index` (image `index / c_out` of the group, channel `index % c_out`) from the
    /// products (`[16, c_out, columns]`): `Aᵀ m A` with `Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]`
    /// for each tile, clipped to the map; a row of tiles at a time, so that the loops run along
    /// it.
    fn transform_output(
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
}

/// The group's input tiles transformed, `Bᵀ d B` with `Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0],
/// [0, -1, 1, 0], [0, 1, 0, -1]]` for each 4x4 tile `d`: `[c_in, 16, columns]`, where column
/// `image * tiles + tile` is a tile of an image of the group; in parallel over channels, a row
/// of tiles at a time.
fn transform_input(x: &[f32], c_in: usize, tiles: &Tiles, group: Range<usize>) -> Vec<f32> {
    let columns = group.len() * tiles.per_image();
    let (height, width) = (tiles.height, tiles.width);
    let plane = height * width;
    // Padded rows: a zero on the left, the row, zeros up to the last tile's right edge.
    let padded = 2 * tiles.columns + 2;
    let write = |c: usize, out: &mut [MaybeUninit<f32>]| {
        // The tile rows' four input rows, padded; then `Bᵀ` along them: `rows[a][p]`.
        let mut d = [(); 4].map(|_| vec![0.0f32; padded]);
        let mut rows = [(); 4].map(|_| vec![0.0f32; padded]);
        for (i, n) in group.clone().enumerate() {
            let input = &x[(n * c_in + c) * plane..][..plane];
            for row in 0..tiles.rows {
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
                let first = i * tiles.per_image() + row * tiles.columns;
                for a in 0..4 {
                    for b in 0..4 {
                        let target = &mut out[(a * 4 + b) * columns + first..][..tiles.columns];
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

/// `f` of each tile's four padded values (`2 t..2 t + 4` of `row`), along a row of tiles.
fn along(target: &mut [MaybeUninit<f32>], row: &[f32], f: impl Fn([f32; 4]) -> f32) {
    for (t, target) in target.iter_mut().enumerate() {
        let r = |q: usize| row[2 * t + q];
        target.write(f([r(0), r(1), r(2), r(3)]));
    }
}

/// The kernels transformed, `G g Gᵀ` with `G = [[1, 0, 0], [½, ½, ½], [½, -½, ½], [0, 0, 1]]`:
/// `[16, c_out, c_in]`.
fn transform_kernels(weight: &[f32], c_out: usize, c_in: usize) -> Vec<f32> {
    let mut u = vec![0.0f32; 16 * c_out * c_in];
    for k in 0..c_out {
        for c in 0..c_in {
            let g = &weight[(k * c_in + c) * 9..][..9];
            let gg = |q: [f32; 3]| {
                [
                    q[0],
                    (q[0] + q[1] + q[2]) / 2.0,
                    (q[0] - q[1] + q[2]) / 2.0,
                    q[2],
                ]
            };
            // G g: along the kernel's rows, for each of its columns.
            let columns: [[f32; 4]; 3] = std::array::from_fn(|j| gg([g[j], g[3 + j], g[6 + j]]));
            for a in 0..4 {
                let row = gg([columns[0][a], columns[1][a], columns[2][a]]);
                for (b, value) in row.into_iter().enumerate() {
                    u[((a * 4 + b) * c_out + k) * c_in + c] = value;
                }
            }
        }
    }
    u
}

/// The 16 products `M[ξ] = U[ξ] · V[ξ]` (`[c_out, c_in] · [c_in, columns]`, `V[ξ]`'s rows
/// `16 * columns` apart in the transformed input), `[16, c_out, columns]`, in parallel over `ξ`.
fn multiply(kernels: &[f32], input: &[f32], c_out: usize, c_in: usize, columns: usize) -> Vec<f32> {
    let write = |xi: usize, out: &mut [MaybeUninit<f32>]| {
        // SAFETY: `out` is `[c_out, columns]` row-major; the kernels of `xi` are `[c_out, c_in]`
        // row-major at `xi * c_out * c_in`; row `c` of `V[xi]` starts at `(c * 16 + xi) *
        // columns` and holds `columns` values, inside `input` (`[c_in, 16, columns]`). The
        // product writes all of `out` without reading it.
        unsafe {
            gemm(
                c_out,
                columns,
                c_in,
                out.as_mut_ptr().cast::<f32>(),
                1,
                columns as isize,
                false,
                kernels[xi * c_out * c_in..].as_ptr(),
                1,
                c_in as isize,
                input[xi * columns..].as_ptr(),
                1,
                (16 * columns) as isize,
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
