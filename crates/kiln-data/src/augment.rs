//! torchvision's automatic augmentation policies (`TrivialAugmentWide`, `RandAugment`,
//! `AutoAugment`) on host images, and the operations they draw from, with the arithmetic Pillow
//! gives them on PIL images: nearest-neighbour affine maps in Pillow's 16.16 fixed point, its
//! 3x3 smoothing in single precision, its lookup tables for posterize, solarize, autocontrast
//! and equalize.
//!
//! The draws come from the `rng` the loader seeds per (epoch, image); the magnitudes are the
//! policies' own tables.

use image::{Rgb, RgbImage};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::color::{adjust_brightness, adjust_contrast, adjust_saturation, blend};

/// One operation of the policies, named as torchvision's `_apply_op` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
    Invert,
}

impl Op {
    /// torchvision's name of the operation.
    pub fn name(self) -> &'static str {
        match self {
            Op::Identity => "Identity",
            Op::ShearX => "ShearX",
            Op::ShearY => "ShearY",
            Op::TranslateX => "TranslateX",
            Op::TranslateY => "TranslateY",
            Op::Rotate => "Rotate",
            Op::Brightness => "Brightness",
            Op::Color => "Color",
            Op::Contrast => "Contrast",
            Op::Sharpness => "Sharpness",
            Op::Posterize => "Posterize",
            Op::Solarize => "Solarize",
            Op::AutoContrast => "AutoContrast",
            Op::Equalize => "Equalize",
            Op::Invert => "Invert",
        }
    }
}

/// How the geometric operations sample the image, as torchvision's `interpolation` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interpolation {
    /// The policies' default.
    #[default]
    Nearest,
    /// What torchvision's reference training scripts pass.
    Bilinear,
}

/// What the geometric operations need besides the image: how to sample it, and the colour of
/// what they bring in from outside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sampling {
    pub interpolation: Interpolation,
    pub fill: [u8; 3],
}

/// torchvision's `_apply_op(img, op, magnitude, interpolation, fill)` on a PIL image.
pub fn apply_op(image: &RgbImage, op: Op, magnitude: f64, sampling: Sampling) -> RgbImage {
    let (w, h) = image.dimensions();
    let center = [f64::from(w) * 0.5, f64::from(h) * 0.5];
    // torchvision turns a shear magnitude into degrees, and `affine` back into radians.
    let shear = |m: f64| m.atan().to_degrees();
    match op {
        Op::Identity => image.clone(),
        Op::ShearX => affine(image, [0.0; 2], [0.0; 2], [shear(magnitude), 0.0], sampling),
        Op::ShearY => affine(image, [0.0; 2], [0.0; 2], [0.0, shear(magnitude)], sampling),
        // `int(magnitude)`: truncated towards zero.
        Op::TranslateX => affine(image, center, [magnitude.trunc(), 0.0], [0.0; 2], sampling),
        Op::TranslateY => affine(image, center, [0.0, magnitude.trunc()], [0.0; 2], sampling),
        Op::Rotate => rotate(image, magnitude, sampling),
        Op::Brightness => adjust_brightness(image, 1.0 + magnitude),
        Op::Color => adjust_saturation(image, 1.0 + magnitude),
        Op::Contrast => adjust_contrast(image, 1.0 + magnitude),
        Op::Sharpness => adjust_sharpness(image, 1.0 + magnitude),
        Op::Posterize => posterize(image, magnitude as u8),
        Op::Solarize => solarize(image, magnitude),
        Op::AutoContrast => autocontrast(image),
        Op::Equalize => equalize(image),
        Op::Invert => map_channels(image, |_| std::array::from_fn(|v| 255 - v as u8)),
    }
}

/// torchvision's `F.affine` on a PIL image with angle 0 and scale 1: the inverse matrix of
/// `_get_inverse_affine_matrix` (shears in degrees, about `center` in pixels), then Pillow's
/// nearest-neighbour transform.
fn affine(
    image: &RgbImage,
    center: [f64; 2],
    translate: [f64; 2],
    shear: [f64; 2],
    sampling: Sampling,
) -> RgbImage {
    let rot = 0.0f64;
    let (sx, sy) = (shear[0].to_radians(), shear[1].to_radians());
    let [cx, cy] = center;
    let [tx, ty] = translate;
    // The operations in torchvision's order: each rounding is part of the result.
    let a = (rot - sy).cos() / sy.cos();
    let b = -(rot - sy).cos() * sx.tan() / sy.cos() - rot.sin();
    let c = (rot - sy).sin() / sy.cos();
    let d = -(rot - sy).sin() * sx.tan() / sy.cos() + rot.cos();
    let mut m = [d, -b, 0.0, -c, a, 0.0];
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
    m[2] += cx;
    m[5] += cy;
    transform(image, m, sampling)
}

/// PIL's `Image.rotate(angle, interpolation, fillcolor=fill)` about the centre, counter-clockwise in
/// degrees: exact transposes for multiples of 90 where the shape allows, else the affine map
/// with the cosine and sine rounded to 15 decimals, as Pillow does.
pub fn rotate(image: &RgbImage, angle: f64, sampling: Sampling) -> RgbImage {
    use image::imageops;
    let (w, h) = image.dimensions();
    let angle = angle.rem_euclid(360.0);
    match angle {
        0.0 => return image.clone(),
        180.0 => return imageops::rotate180(image),
        90.0 if w == h => return imageops::rotate270(image),
        270.0 if w == h => return imageops::rotate90(image),
        _ => {}
    }
    let radians = -angle.to_radians();
    let round15 = |x: f64| -> f64 {
        format!("{x:.15}")
            .parse()
            .expect("a formatted float parses")
    };
    let (cos, sin) = (round15(radians.cos()), round15(radians.sin()));
    let mut m = [cos, sin, 0.0, round15(-radians.sin()), cos, 0.0];
    let (cx, cy) = (f64::from(w) / 2.0, f64::from(h) / 2.0);
    m[2] += m[0] * -cx + m[1] * -cy;
    m[5] += m[3] * -cx + m[4] * -cy;
    m[2] += cx;
    m[5] += cy;
    transform(image, m, sampling)
}

/// PIL's `Image.transform(size, AFFINE, m, interpolation, fillcolor=fill)` at the same size.
pub fn transform(image: &RgbImage, m: [f64; 6], sampling: Sampling) -> RgbImage {
    match sampling.interpolation {
        Interpolation::Nearest => transform_nearest(image, m, sampling.fill),
        Interpolation::Bilinear => transform_bilinear(image, m, sampling.fill),
    }
}

/// Pillow's generic transform with its bilinear filter: output pixel (x, y) samples the input
/// at `m · (x + ½, y + ½)` (`fill` where that falls outside), between the four pixels around
/// it with edge pixels repeated, in double precision, truncated.
pub fn transform_bilinear(image: &RgbImage, m: [f64; 6], fill: [u8; 3]) -> RgbImage {
    let (w, h) = image.dimensions();
    let (xsize, ysize) = (i64::from(w), i64::from(h));
    let floor = |v: f64| if v < 0.0 { v.floor() as i64 } else { v as i64 };
    let clip = |v: i64, size: i64| v.clamp(0, size - 1) as u32;
    let lerp = |a: f64, b: f64, d: f64| a + (b - a) * d;
    RgbImage::from_fn(w, h, |x, y| {
        let (xo, yo) = (f64::from(x) + 0.5, f64::from(y) + 0.5);
        let xin = m[0] * xo + m[1] * yo + m[2];
        let yin = m[3] * xo + m[4] * yo + m[5];
        if xin < 0.0 || xin >= f64::from(w) || yin < 0.0 || yin >= f64::from(h) {
            return Rgb(fill);
        }
        let (xin, yin) = (xin - 0.5, yin - 0.5);
        let (x0, y0) = (floor(xin), floor(yin));
        let (dx, dy) = (xin - x0 as f64, yin - y0 as f64);
        let (left, right) = (clip(x0, xsize), clip(x0 + 1, xsize));
        let value = |row: u32, c: usize| {
            let a = f64::from(image.get_pixel(left, row).0[c]);
            lerp(a, f64::from(image.get_pixel(right, row).0[c]), dx)
        };
        Rgb(std::array::from_fn(|c| {
            let top = value(clip(y0, ysize), c);
            // Pillow reuses the top row when the one below is outside.
            let bottom = match y0 + 1 < ysize && y0 + 1 >= 0 {
                true => value((y0 + 1) as u32, c),
                false => top,
            };
            lerp(top, bottom, dy) as u8
        }))
    })
}

/// Pillow's `ImagingTransformAffine` with nearest-neighbour resampling: output pixel (x, y)
/// takes the input pixel at `m · (x + ½, y + ½)`, or `fill` outside the image. Pillow has
/// three engines that round differently (a scaling one, 16.16 fixed point, and doubles for
/// coordinates past ±32768); each is followed.
pub fn transform_nearest(image: &RgbImage, m: [f64; 6], fill: [u8; 3]) -> RgbImage {
    let (w, h) = image.dimensions();
    let (xsize, ysize) = (w as i64, h as i64);
    let mut out = RgbImage::from_pixel(w, h, Rgb(fill));
    let coord = |v: f64| if v < 0.0 { -1 } else { v as i64 };
    let put = |out: &mut RgbImage, x: i64, y: i64, xin: i64, yin: i64| {
        if (0..xsize).contains(&xin) && (0..ysize).contains(&yin) {
            out.put_pixel(x as u32, y as u32, *image.get_pixel(xin as u32, yin as u32));
        }
    };
    if m[1] == 0.0 && m[3] == 0.0 {
        // ImagingScaleAffine: column positions tabulated once; between the first and the last
        // column that lands inside, Pillow copies even columns that do not (from column 0).
        let mut columns = vec![0i64; w as usize];
        let (mut first, mut end) = (xsize, 0);
        let mut xo = m[2] + m[0] * 0.5;
        for (x, column) in columns.iter_mut().enumerate() {
            let xin = coord(xo);
            if (0..xsize).contains(&xin) {
                end = x as i64 + 1;
                first = first.min(x as i64);
                *column = xin;
            }
            xo += m[0];
        }
        let mut yo = m[5] + m[4] * 0.5;
        for y in 0..ysize {
            let yin = coord(yo);
            for x in first..end {
                put(&mut out, x, y, columns[x as usize], yin);
            }
            yo += m[4];
        }
        return out;
    }
    let fits = |x: f64, y: f64| {
        (x * m[0] + y * m[1] + m[2]).abs() < 32768.0 && (x * m[3] + y * m[4] + m[5]).abs() < 32768.0
    };
    let (wf, hf) = (f64::from(w), f64::from(h));
    if fits(0.0, 0.0) && fits(wf, hf) && fits(0.0, hf) && fits(wf, 0.0) {
        let fix = |v: f64| -> i64 {
            let v = v * 65536.0 + 0.5;
            if v < 0.0 { v.floor() as i64 } else { v as i64 }
        };
        let (a0, a1, a3, a4) = (fix(m[0]), fix(m[1]), fix(m[3]), fix(m[4]));
        let mut a2 = fix(m[2] + m[0] * 0.5 + m[1] * 0.5);
        let mut a5 = fix(m[5] + m[3] * 0.5 + m[4] * 0.5);
        for y in 0..ysize {
            let (mut xx, mut yy) = (a2, a5);
            for x in 0..xsize {
                put(&mut out, x, y, xx >> 16, yy >> 16);
                xx += a0;
                yy += a3;
            }
            a2 += a1;
            a5 += a4;
        }
        return out;
    }
    let mut xo = m[2] + m[1] * 0.5 + m[0] * 0.5;
    let mut yo = m[5] + m[4] * 0.5 + m[3] * 0.5;
    for y in 0..ysize {
        let (mut xx, mut yy) = (xo, yo);
        for x in 0..xsize {
            put(&mut out, x, y, coord(xx), coord(yy));
            xx += m[0];
            yy += m[3];
        }
        xo += m[1];
        yo += m[4];
    }
    out
}

/// `F.adjust_sharpness`: a blend with Pillow's `SMOOTH` filter (3x3, centre 5, the rest 1,
/// over 13, summed in single precision and rounded), whose border pixels stay as they are.
pub fn adjust_sharpness(image: &RgbImage, factor: f64) -> RgbImage {
    let (w, h) = (image.width() as usize, image.height() as usize);
    let mut smooth = image.clone();
    if w >= 3 && h >= 3 {
        let (edge, centre) = (1.0f32 / 13.0, 5.0f32 / 13.0);
        let pixels = image.as_raw();
        let at = |x: usize, y: usize, c: usize| f32::from(pixels[(y * w + x) * 3 + c]);
        let row = |x: usize, y: usize, c: usize, k: [f32; 3]| {
            at(x - 1, y, c) * k[0] + at(x, y, c) * k[1] + at(x + 1, y, c) * k[2]
        };
        let out = smooth.as_mut();
        for y in 1..h - 1 {
            for x in 1..w - 1 {
                for c in 0..3 {
                    // Pillow's order: the row below, the centre row, the row above.
                    let mut sum = 0.5f32;
                    sum += row(x, y + 1, c, [edge; 3]);
                    sum += row(x, y, c, [edge, centre, edge]);
                    sum += row(x, y - 1, c, [edge; 3]);
                    out[(y * w + x) * 3 + c] = sum.clamp(0.0, 255.0) as u8;
                }
            }
        }
    }
    let degenerate = smooth.into_raw();
    blend(|i| degenerate[i], image, factor)
}

/// `ImageOps.posterize`: keeps the `bits` high bits of each channel (1 to 8).
pub fn posterize(image: &RgbImage, bits: u8) -> RgbImage {
    let mask = !((1u16 << (8 - bits.clamp(1, 8))) - 1) as u8;
    map_channels(image, |_| std::array::from_fn(|v| v as u8 & mask))
}

/// `ImageOps.solarize`: values at or above `threshold` are inverted.
pub fn solarize(image: &RgbImage, threshold: f64) -> RgbImage {
    map_channels(image, |_| {
        std::array::from_fn(|v| {
            if (v as f64) < threshold {
                v as u8
            } else {
                255 - v as u8
            }
        })
    })
}

/// `ImageOps.autocontrast`: each channel stretched so that its darkest value becomes 0 and its
/// lightest 255 (`int(v * scale + offset)`, in double precision).
pub fn autocontrast(image: &RgbImage) -> RgbImage {
    let histograms = histograms(image);
    map_channels(image, |c| {
        let h = &histograms[c];
        let lo = h.iter().position(|&n| n > 0).unwrap_or(0);
        let hi = h.iter().rposition(|&n| n > 0).unwrap_or(0);
        if hi <= lo {
            return std::array::from_fn(|v| v as u8);
        }
        let scale = 255.0 / (hi - lo) as f64;
        let offset = -(lo as f64) * scale;
        std::array::from_fn(|v| (v as f64 * scale + offset).clamp(0.0, 255.0) as u8)
    })
}

/// `ImageOps.equalize`: each channel mapped through its cumulative histogram, in Pillow's
/// integer steps.
pub fn equalize(image: &RgbImage) -> RgbImage {
    let histograms = histograms(image);
    map_channels(image, |c| {
        let h = &histograms[c];
        let used: Vec<u64> = h.iter().copied().filter(|&n| n > 0).collect();
        let step = match used.len() {
            0 | 1 => 0,
            _ => (used.iter().sum::<u64>() - used[used.len() - 1]) / 255,
        };
        if step == 0 {
            return std::array::from_fn(|v| v as u8);
        }
        let mut n = step / 2;
        std::array::from_fn(|v| {
            let value = (n / step).min(255) as u8;
            n += h[v];
            value
        })
    })
}

/// The 256-bin histogram of each channel.
fn histograms(image: &RgbImage) -> [[u64; 256]; 3] {
    let mut h = [[0u64; 256]; 3];
    for pixel in image.pixels() {
        for c in 0..3 {
            h[c][pixel.0[c] as usize] += 1;
        }
    }
    h
}

/// Each channel through the lookup table `table(channel)` gives it (PIL's `Image.point`).
fn map_channels(image: &RgbImage, table: impl Fn(usize) -> [u8; 256]) -> RgbImage {
    let tables = [table(0), table(1), table(2)];
    let mut out = image.clone();
    for pixel in out.pixels_mut() {
        for c in 0..3 {
            pixel.0[c] = tables[c][pixel.0[c] as usize];
        }
    }
    out
}

/// Which of AutoAugment's published policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoAugmentPolicy {
    Imagenet,
    Cifar10,
    Svhn,
}

/// One operation of a policy's space with its magnitudes (float32, as torch's tables hold
/// them; none for operations without one) and whether a coin flip negates them.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub op: Op,
    pub magnitudes: Vec<f32>,
    pub signed: bool,
}

/// `torch.linspace(start, end, steps)` in float32, with torch's scalar arithmetic: the first
/// half counted from `start`, the second from `end`. (torch's vectorised path rounds a few
/// values an ulp differently depending on the CPU's vector width.)
pub fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    let step = (end - start) / (steps - 1) as f32;
    (0..steps)
        .map(|i| match i < steps / 2 {
            true => start + step * i as f32,
            false => end - step * (steps - i - 1) as f32,
        })
        .collect()
}

/// `8 - (arange(bins) / ((bins - 1) / levels)).round()`: posterize's bits per bin.
fn posterize_bits(bins: usize, levels: f32) -> Vec<f32> {
    let divisor = ((bins - 1) as f64 / f64::from(levels)) as f32;
    (0..bins)
        .map(|i| 8.0 - (i as f32 / divisor).round_ties_even())
        .collect()
}

fn entry(op: Op, magnitudes: Vec<f32>, signed: bool) -> Entry {
    Entry {
        op,
        magnitudes,
        signed,
    }
}

/// `TrivialAugmentWide._augmentation_space(bins)`.
pub fn trivial_augment_space(bins: usize) -> Vec<Entry> {
    let wide = |op, end| entry(op, linspace(0.0, end, bins), true);
    vec![
        entry(Op::Identity, vec![], false),
        wide(Op::ShearX, 0.99),
        wide(Op::ShearY, 0.99),
        wide(Op::TranslateX, 32.0),
        wide(Op::TranslateY, 32.0),
        wide(Op::Rotate, 135.0),
        wide(Op::Brightness, 0.99),
        wide(Op::Color, 0.99),
        wide(Op::Contrast, 0.99),
        wide(Op::Sharpness, 0.99),
        entry(Op::Posterize, posterize_bits(bins, 6.0), false),
        entry(Op::Solarize, linspace(255.0, 0.0, bins), false),
        entry(Op::AutoContrast, vec![], false),
        entry(Op::Equalize, vec![], false),
    ]
}

/// RandAugment's and AutoAugment's space for an image of (height, width): the same tables,
/// RandAugment with `Identity` first, AutoAugment with `Invert` last.
fn classic_space(bins: usize, (height, width): (u32, u32)) -> Vec<Entry> {
    let range = |op, end: f64| entry(op, linspace(0.0, end as f32, bins), true);
    vec![
        range(Op::ShearX, 0.3),
        range(Op::ShearY, 0.3),
        range(Op::TranslateX, 150.0 / 331.0 * f64::from(width)),
        range(Op::TranslateY, 150.0 / 331.0 * f64::from(height)),
        range(Op::Rotate, 30.0),
        range(Op::Brightness, 0.9),
        range(Op::Color, 0.9),
        range(Op::Contrast, 0.9),
        range(Op::Sharpness, 0.9),
        entry(Op::Posterize, posterize_bits(bins, 4.0), false),
        entry(Op::Solarize, linspace(255.0, 0.0, bins), false),
        entry(Op::AutoContrast, vec![], false),
        entry(Op::Equalize, vec![], false),
    ]
}

/// `RandAugment._augmentation_space(bins, (height, width))`.
pub fn rand_augment_space(bins: usize, size: (u32, u32)) -> Vec<Entry> {
    let mut space = vec![entry(Op::Identity, vec![], false)];
    space.extend(classic_space(bins, size));
    space
}

/// `AutoAugment._augmentation_space(10, (height, width))`.
pub fn auto_augment_space(size: (u32, u32)) -> Vec<Entry> {
    let mut space = classic_space(10, size);
    space.push(entry(Op::Invert, vec![], false));
    space
}

/// One draw's magnitude: the table's value at `bin` (0 for operations without one), negated
/// when the operation is signed and `negate` is set.
fn magnitude(entry: &Entry, bin: usize, negate: bool) -> f64 {
    let value = entry.magnitudes.get(bin).copied().map_or(0.0, f64::from);
    if entry.signed && negate {
        -value
    } else {
        value
    }
}

/// `TrivialAugmentWide`: one operation, drawn uniformly, at a uniformly drawn magnitude bin.
pub fn trivial_augment_wide(
    image: &RgbImage,
    bins: usize,
    sampling: Sampling,
    rng: &mut impl Rng,
) -> RgbImage {
    let space = trivial_augment_space(bins);
    let entry = &space[rng.random_range(0..space.len())];
    let bin = match entry.magnitudes.len() {
        0 => 0,
        n => rng.random_range(0..n),
    };
    let negate = entry.signed && rng.random::<bool>();
    apply_op(image, entry.op, magnitude(entry, bin, negate), sampling)
}

/// `RandAugment(num_ops, magnitude, bins)`: `num_ops` operations drawn uniformly (with
/// repetition), each at the fixed magnitude bin.
pub fn rand_augment(
    mut image: RgbImage,
    num_ops: usize,
    bin: usize,
    bins: usize,
    sampling: Sampling,
    rng: &mut impl Rng,
) -> RgbImage {
    let (w, h) = image.dimensions();
    let space = rand_augment_space(bins, (h, w));
    for _ in 0..num_ops {
        let entry = &space[rng.random_range(0..space.len())];
        let negate = entry.signed && rng.random::<bool>();
        image = apply_op(&image, entry.op, magnitude(entry, bin, negate), sampling);
    }
    image
}

/// `AutoAugment(policy)`: one of the policy's 25 sub-policies, drawn uniformly; each of its two
/// operations applied with its probability, at its magnitude bin, negated on a coin flip.
pub fn auto_augment(
    mut image: RgbImage,
    policy: AutoAugmentPolicy,
    sampling: Sampling,
    rng: &mut impl Rng,
) -> RgbImage {
    let (w, h) = image.dimensions();
    let space = auto_augment_space((h, w));
    let table = policies(policy);
    let sub_policy = table[rng.random_range(0..table.len())];
    let probs: [f32; 2] = [rng.random(), rng.random()];
    let negate: [bool; 2] = [rng.random(), rng.random()];
    for (i, (op, p, bin)) in sub_policy.into_iter().enumerate() {
        if probs[i] > p {
            continue;
        }
        let entry = space
            .iter()
            .find(|e| e.op == op)
            .expect("every policy operation is in the space");
        image = apply_op(&image, op, magnitude(entry, bin, negate[i]), sampling);
    }
    image
}

type SubPolicy = [(Op, f32, usize); 2];

/// The published AutoAugment policies, as torchvision lists them (a magnitude bin of 0 for
/// operations without magnitudes).
fn policies(policy: AutoAugmentPolicy) -> &'static [SubPolicy] {
    use Op::*;
    match policy {
        AutoAugmentPolicy::Imagenet => &[
            [(Posterize, 0.4, 8), (Rotate, 0.6, 9)],
            [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
            [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
            [(Posterize, 0.6, 7), (Posterize, 0.6, 6)],
            [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
            [(Equalize, 0.4, 0), (Rotate, 0.8, 8)],
            [(Solarize, 0.6, 3), (Equalize, 0.6, 0)],
            [(Posterize, 0.8, 5), (Equalize, 1.0, 0)],
            [(Rotate, 0.2, 3), (Solarize, 0.6, 8)],
            [(Equalize, 0.6, 0), (Posterize, 0.4, 6)],
            [(Rotate, 0.8, 8), (Color, 0.4, 0)],
            [(Rotate, 0.4, 9), (Equalize, 0.6, 0)],
            [(Equalize, 0.0, 0), (Equalize, 0.8, 0)],
            [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
            [(Color, 0.6, 4), (Contrast, 1.0, 8)],
            [(Rotate, 0.8, 8), (Color, 1.0, 2)],
            [(Color, 0.8, 8), (Solarize, 0.8, 7)],
            [(Sharpness, 0.4, 7), (Invert, 0.6, 0)],
            [(ShearX, 0.6, 5), (Equalize, 1.0, 0)],
            [(Color, 0.4, 0), (Equalize, 0.6, 0)],
            [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
            [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
            [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
            [(Color, 0.6, 4), (Contrast, 1.0, 8)],
            [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
        ],
        AutoAugmentPolicy::Cifar10 => &[
            [(Invert, 0.1, 0), (Contrast, 0.2, 6)],
            [(Rotate, 0.7, 2), (TranslateX, 0.3, 9)],
            [(Sharpness, 0.8, 1), (Sharpness, 0.9, 3)],
            [(ShearY, 0.5, 8), (TranslateY, 0.7, 9)],
            [(AutoContrast, 0.5, 0), (Equalize, 0.9, 0)],
            [(ShearY, 0.2, 7), (Posterize, 0.3, 7)],
            [(Color, 0.4, 3), (Brightness, 0.6, 7)],
            [(Sharpness, 0.3, 9), (Brightness, 0.7, 9)],
            [(Equalize, 0.6, 0), (Equalize, 0.5, 0)],
            [(Contrast, 0.6, 7), (Sharpness, 0.6, 5)],
            [(Color, 0.7, 7), (TranslateX, 0.5, 8)],
            [(Equalize, 0.3, 0), (AutoContrast, 0.4, 0)],
            [(TranslateY, 0.4, 3), (Sharpness, 0.2, 6)],
            [(Brightness, 0.9, 6), (Color, 0.2, 8)],
            [(Solarize, 0.5, 2), (Invert, 0.0, 0)],
            [(Equalize, 0.2, 0), (AutoContrast, 0.6, 0)],
            [(Equalize, 0.2, 0), (Equalize, 0.6, 0)],
            [(Color, 0.9, 9), (Equalize, 0.6, 0)],
            [(AutoContrast, 0.8, 0), (Solarize, 0.2, 8)],
            [(Brightness, 0.1, 3), (Color, 0.7, 0)],
            [(Solarize, 0.4, 5), (AutoContrast, 0.9, 0)],
            [(TranslateY, 0.9, 9), (TranslateY, 0.7, 9)],
            [(AutoContrast, 0.9, 0), (Solarize, 0.8, 3)],
            [(Equalize, 0.8, 0), (Invert, 0.1, 0)],
            [(TranslateY, 0.7, 9), (AutoContrast, 0.9, 0)],
        ],
        AutoAugmentPolicy::Svhn => &[
            [(ShearX, 0.9, 4), (Invert, 0.2, 0)],
            [(ShearY, 0.9, 8), (Invert, 0.7, 0)],
            [(Equalize, 0.6, 0), (Solarize, 0.6, 6)],
            [(Invert, 0.9, 0), (Equalize, 0.6, 0)],
            [(Equalize, 0.6, 0), (Rotate, 0.9, 3)],
            [(ShearX, 0.9, 4), (AutoContrast, 0.8, 0)],
            [(ShearY, 0.9, 8), (Invert, 0.4, 0)],
            [(ShearY, 0.9, 5), (Solarize, 0.2, 6)],
            [(Invert, 0.9, 0), (AutoContrast, 0.8, 0)],
            [(Equalize, 0.6, 0), (Rotate, 0.9, 3)],
            [(ShearX, 0.9, 4), (Solarize, 0.3, 3)],
            [(ShearY, 0.8, 8), (Invert, 0.7, 0)],
            [(Equalize, 0.9, 0), (TranslateY, 0.6, 6)],
            [(Invert, 0.9, 0), (Equalize, 0.6, 0)],
            [(Contrast, 0.3, 3), (Rotate, 0.8, 4)],
            [(Invert, 0.8, 0), (TranslateY, 0.0, 2)],
            [(ShearY, 0.7, 6), (Solarize, 0.4, 8)],
            [(Invert, 0.6, 0), (Rotate, 0.8, 4)],
            [(ShearY, 0.3, 7), (TranslateX, 0.9, 3)],
            [(ShearX, 0.1, 6), (Invert, 0.6, 0)],
            [(Solarize, 0.7, 2), (TranslateY, 0.6, 7)],
            [(ShearY, 0.8, 4), (Invert, 0.8, 0)],
            [(ShearX, 0.7, 9), (TranslateY, 0.8, 3)],
            [(ShearY, 0.8, 5), (AutoContrast, 0.7, 0)],
            [(ShearX, 0.7, 2), (Invert, 0.1, 0)],
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_pcg::Pcg64Mcg;

    fn photo() -> RgbImage {
        RgbImage::from_fn(20, 14, |x, y| Rgb([(x * 12) as u8, (y * 17) as u8, 90]))
    }

    #[test]
    fn policies_draw_only_from_their_spaces_and_keep_the_size() {
        let mut rng = Pcg64Mcg::seed_from_u64(7);
        let mut changed = 0;
        for _ in 0..200 {
            let image = photo();
            let s = Sampling::default();
            let a = trivial_augment_wide(&image, 31, s, &mut rng);
            let b = rand_augment(image.clone(), 2, 9, 31, s, &mut rng);
            let c = auto_augment(image.clone(), AutoAugmentPolicy::Imagenet, s, &mut rng);
            for out in [&a, &b, &c] {
                assert_eq!(out.dimensions(), image.dimensions());
                changed += usize::from(*out != image);
            }
        }
        // Identity and probabilities leave some images alone, but most change.
        assert!(changed > 400, "only {changed} of 600 changed");
    }

    #[test]
    fn every_sub_policy_names_operations_of_the_space() {
        let space = auto_augment_space((32, 32));
        for policy in [
            AutoAugmentPolicy::Imagenet,
            AutoAugmentPolicy::Cifar10,
            AutoAugmentPolicy::Svhn,
        ] {
            assert_eq!(policies(policy).len(), 25);
            for (op, p, bin) in policies(policy).iter().flatten() {
                let entry = space.iter().find(|e| e.op == *op).unwrap();
                assert!((0.0..=1.0).contains(p));
                assert!(entry.magnitudes.is_empty() || *bin < entry.magnitudes.len());
            }
        }
    }

    #[test]
    fn fill_colours_what_the_map_brings_in_from_outside() {
        let image = RgbImage::from_pixel(10, 10, Rgb([200, 200, 200]));
        for interpolation in [Interpolation::Nearest, Interpolation::Bilinear] {
            let sampling = Sampling {
                interpolation,
                fill: [1, 2, 3],
            };
            let moved = apply_op(&image, Op::TranslateX, 4.0, sampling);
            assert_eq!(moved.get_pixel(0, 5).0, [1, 2, 3]);
            assert_eq!(moved.get_pixel(9, 5).0, [200; 3]);
        }
    }
}
