//! 3x3 convolutions with stride 1 and padding 1, and both their gradients, by Winograd's minimal
//! filtering F(2x2, 3x3) (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2015): each
//! 2x2 block of outputs comes from a 4x4 tile of the input through 16 products per channel pair
//! instead of 36, so the matrix products, which bound ResNet-18 on flex, do 2.25x fewer
//! multiply-adds. The input's tiles and the kernels are transformed once, the 16 products
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
///
/// Tile `t` of a row reads the padded row's values `2t..2t + 4`; split into the values at even
/// and at odd positions (`e`, `o`), those are `e[t], o[t], e[t + 1], o[t + 1]`, so that every
/// loop below runs over contiguous values and vectorizes.
fn transform_input(x: &[f32], c_in: usize, tiles: &Tiles, group: Range<usize>) -> Vec<f32> {
    let columns = group.len() * tiles.per_image();
    let (height, width) = (tiles.height, tiles.width);
    let plane = height * width;
    let n = tiles.columns;
    let write = |c: usize, out: &mut [MaybeUninit<f32>]| {
        // The tile row's four input rows, split (`d[r]`), then `Bᵀ` down them (`v[a]`).
        let mut d = [(); 4].map(|_| Halves::new(n + 1));
        let mut v = [(); 4].map(|_| Halves::new(n + 1));
        for (i, image) in group.clone().enumerate() {
            let input = &x[(image * c_in + c) * plane..][..plane];
            for row in 0..tiles.rows {
                for (r, d) in d.iter_mut().enumerate() {
                    match (2 * row + r).checked_sub(1).filter(|&y| y < height) {
                        // The left padding is the even half's first value.
                        Some(y) => {
                            d.even[0] = 0.0;
                            split(&input[y * width..][..width], &mut d.odd, &mut d.even[1..]);
                        }
                        None => d.zero(),
                    }
                }
                let down = |[d0, d1, d2, d3]: [&[f32]; 4], [v0, v1, v2, v3]: [&mut [f32]; 4]| {
                    for p in 0..=n {
                        v0[p] = d0[p] - d2[p];
                        v1[p] = d1[p] + d2[p];
                        v2[p] = d2[p] - d1[p];
                        v3[p] = d1[p] - d3[p];
                    }
                };
                down(
                    d.each_ref().map(|d| &d.even[..]),
                    v.each_mut().map(|v| &mut v.even[..]),
                );
                down(
                    d.each_ref().map(|d| &d.odd[..]),
                    v.each_mut().map(|v| &mut v.odd[..]),
                );
                // ... then `Bᵀ` along the row, tile by tile.
                let first = i * tiles.per_image() + row * n;
                for (a, v) in v.iter().enumerate() {
                    let (e, o) = (&v.even[..n], &v.odd[..n]);
                    let (e1, o1) = (&v.even[1..], &v.odd[1..]);
                    let at = |b: usize| (a * 4 + b) * columns + first;
                    write_each(&mut out[at(0)..][..n], e, e1, |e, e1| e - e1);
                    write_each(&mut out[at(1)..][..n], o, e1, |o, e1| o + e1);
                    write_each(&mut out[at(2)..][..n], e1, o, |e1, o| e1 - o);
                    write_each(&mut out[at(3)..][..n], o, o1, |o, o1| o - o1);
                }
            }
        }
    };
    // SAFETY: every tile of every image of the group writes its 16 transformed values.
    unsafe { written_in_chunks(c_in * 16 * columns, 16 * columns, write) }
}

/// A row's values at even positions and at odd ones.
struct Halves {
    even: Vec<f32>,
    odd: Vec<f32>,
}

impl Halves {
    fn new(len: usize) -> Self {
        Self {
            even: vec![0.0; len],
            odd: vec![0.0; len],
        }
    }

    fn zero(&mut self) {
        self.even.fill(0.0);
        self.odd.fill(0.0);
    }
}

/// `row[2t]` into `first[t]` and `row[2t + 1]` into `second[t]`, zeros after the row's end.
fn split(row: &[f32], first: &mut [f32], second: &mut [f32]) {
    let (pairs, last) = row.as_chunks::<2>();
    for ((pair, f), s) in pairs.iter().zip(&mut *first).zip(&mut *second) {
        *f = pair[0];
        *s = pair[1];
    }
    let mut done = pairs.len();
    if let [value] = last {
        first[done] = *value;
        second[done] = 0.0;
        done += 1;
    }
    first[done..].fill(0.0);
    let start = done.min(second.len());
    second[start..].fill(0.0);
}

/// `target[t] = f(a[t], b[t])`.
fn write_each(target: &mut [MaybeUninit<f32>], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    for ((target, a), b) in target.iter_mut().zip(a).zip(b) {
        target.write(f(*a, *b));
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
