//! A row-major matrix product as cuBLAS's column-major `gemm`: pure arithmetic, tested on every
//! build.
//!
//! A row-major `[r, c]` matrix read column-major is its `[c, r]` transpose, so the row-major
//! `C = op(A) op(B)` is the column-major `C^T = op(B)^T op(A)^T`: cuBLAS gets `B` first, each
//! operand transposed where it is here, and the sizes of `C^T`; each leading dimension is the
//! row length of the matrix as stored.

/// The row-major product `c = op(a) op(b)` of `a` (`[rows, cols]` as stored) and `b`, `op`
/// transposing where asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Product {
    pub a: [usize; 2],
    pub a_transposed: bool,
    pub b: [usize; 2],
    pub b_transposed: bool,
}

/// `cublasGemmEx`'s sizes and operations, in its argument order (the first operand is `b`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gemm {
    pub first_transposed: bool,
    pub second_transposed: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub ld_first: i32,
    pub ld_second: i32,
    pub ldc: i32,
}

impl Product {
    /// The product, or why the shapes do not multiply (or do not fit cuBLAS's `int` sizes).
    pub(crate) fn new(
        a: [usize; 2],
        a_transposed: bool,
        b: [usize; 2],
        b_transposed: bool,
    ) -> Result<Self, String> {
        let product = Self {
            a,
            a_transposed,
            b,
            b_transposed,
        };
        let op = |dims: [usize; 2], t: bool| if t { [dims[1], dims[0]] } else { dims };
        let (lhs, rhs) = (op(a, a_transposed), op(b, b_transposed));
        if lhs[1] != rhs[0] {
            return Err(format!("{lhs:?} times {rhs:?} does not multiply"));
        }
        let fits = |n: usize| n <= i32::MAX as usize;
        if !a.into_iter().chain(b).all(fits) || !product.output().into_iter().all(fits) {
            return Err(format!("{a:?} times {b:?} is past cuBLAS's int sizes"));
        }
        Ok(product)
    }

    /// The output's `[rows, cols]`.
    pub(crate) fn output(&self) -> [usize; 2] {
        let rows = if self.a_transposed {
            self.a[1]
        } else {
            self.a[0]
        };
        let cols = if self.b_transposed {
            self.b[0]
        } else {
            self.b[1]
        };
        [rows, cols]
    }

    fn inner(&self) -> usize {
        if self.a_transposed {
            self.a[0]
        } else {
            self.a[1]
        }
    }

    /// The column-major call that computes it (see the module's documentation).
    pub(crate) fn gemm(&self) -> Gemm {
        let [rows, cols] = self.output();
        Gemm {
            first_transposed: self.b_transposed,
            second_transposed: self.a_transposed,
            m: cols as i32,
            n: rows as i32,
            k: self.inner() as i32,
            ld_first: self.b[1] as i32,
            ld_second: self.a[1] as i32,
            ldc: cols as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BLAS's column-major `gemm` (`C = op(X) op(Y)`, `C` of leading dimension `m`), naively.
    fn column_major_gemm(g: &Gemm, x: &[f32], y: &[f32]) -> Vec<f32> {
        let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
        let at = |data: &[f32], ld: i32, t: bool, row: usize, col: usize| {
            let ld = ld as usize;
            if t {
                data[col + row * ld]
            } else {
                data[row + col * ld]
            }
        };
        let mut c = vec![0.0; g.ldc as usize * n];
        for j in 0..n {
            for i in 0..m {
                c[i + j * g.ldc as usize] = (0..k)
                    .map(|l| {
                        at(x, g.ld_first, g.first_transposed, i, l)
                            * at(y, g.ld_second, g.second_transposed, l, j)
                    })
                    .sum();
            }
        }
        c
    }

    /// The row-major `[r, c]` matrix's element, of `op` of it.
    fn element(data: &[f32], dims: [usize; 2], t: bool, row: usize, col: usize) -> f32 {
        if t {
            data[col * dims[1] + row]
        } else {
            data[row * dims[1] + col]
        }
    }

    #[test]
    fn the_column_major_call_computes_the_row_major_product() {
        let values = |len: usize, salt: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7 + salt * 13) % 11) as f32 - 5.0)
                .collect()
        };
        // (m, k, n): op(a) is [m, k], op(b) is [k, n]; a classifier's product and its two
        // gradients among them.
        for (m, k, n) in [(4, 3, 5), (1, 7, 2), (6, 1, 3), (64, 16, 10)] {
            for (a_t, b_t) in [(false, false), (false, true), (true, false), (true, true)] {
                let a_dims = if a_t { [k, m] } else { [m, k] };
                let b_dims = if b_t { [n, k] } else { [k, n] };
                let (a, b) = (values(m * k, 1), values(k * n, 2));
                let product = Product::new(a_dims, a_t, b_dims, b_t).unwrap();
                assert_eq!(product.output(), [m, n]);
                let c = column_major_gemm(&product.gemm(), &b, &a);
                for row in 0..m {
                    for col in 0..n {
                        let expected: f32 = (0..k)
                            .map(|l| {
                                element(&a, a_dims, a_t, row, l) * element(&b, b_dims, b_t, l, col)
                            })
                            .sum();
                        // `c` read as the row-major `[m, n]` output.
                        assert_eq!(c[row * n + col], expected, "{m}x{k}x{n} {a_t} {b_t}");
                    }
                }
            }
        }
    }

    #[test]
    fn shapes_that_do_not_multiply_are_refused() {
        assert!(Product::new([2, 3], false, [4, 5], false).is_err());
        // [2, 3]^T is [3, 2], which does not take [3, 5]; [2, 5] it does.
        assert!(Product::new([2, 3], true, [3, 5], false).is_err());
        assert!(Product::new([2, 3], true, [2, 5], false).is_ok());
        assert!(Product::new([2, 3], false, [5, 3], true).is_ok());
        assert!(Product::new([2, 3], false, [3, 5], true).is_err());
    }
}
