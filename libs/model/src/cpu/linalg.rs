//! Row-major matrix products over the `gemm` crate's sgemm and the row-parallel passes
//! around them.

use rayon::prelude::*;

/// Rows per parallel chunk of an elementwise pass: large enough that scheduling is noise.
pub(crate) const ROW_BLOCK: usize = 128;

/// Products smaller than this (m·n·k) run on the calling thread: below it, waking the
/// pool costs more than it saves.
const PARALLEL_FLOPS: usize = 1 << 21;

/// How an operand of [`matmul`] is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// As used: `rows x cols` row-major.
    AsIs,
    /// Transposed: the operand's transpose is stored row-major.
    Transposed,
}

/// `dst (m x n) = a (m x k) · b (k x n)`, or `dst += a · b` with `accumulate`. A transposed
/// operand is read through its strides, never copied.
pub(crate) fn matmul(
    dst: &mut [f32],
    (a, a_stored): (&[f32], Stored),
    (b, b_stored): (&[f32], Stored),
    [m, k, n]: [usize; 3],
    accumulate: bool,
) {
    assert!(
        dst.len() == m * n && a.len() == m * k && b.len() == k * n,
        "matmul shapes: dst {} a {} b {} for m {m} k {k} n {n}",
        dst.len(),
        a.len(),
        b.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return;
    }
    // (column stride, row stride) of each operand.
    let (a_cs, a_rs) = match a_stored {
        Stored::AsIs => (1, k),
        Stored::Transposed => (m, 1),
    };
    let (b_cs, b_rs) = match b_stored {
        Stored::AsIs => (1, n),
        Stored::Transposed => (k, 1),
    };
    let parallelism = if m * n * k >= PARALLEL_FLOPS {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // sgemm over raw strides is `unsafe` in the gemm crate; this is the one call.
    // SAFETY: the lengths are checked above against the shapes, and every index
    // (i * rs + j * cs) of each operand lies inside its slice for i < rows, j < cols; `dst`
    // is borrowed mutably, so it aliases neither input.
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `values (rows x cols) += bias` per row, then ReLU with `relu`: the bias and the
/// activation in one pass over the product.
pub(crate) fn bias_activation(values: &mut [f32], bias: &[f32], relu: bool) {
    let cols = bias.len();
    values.par_chunks_mut(cols * ROW_BLOCK).for_each(|block| {
        for row in block.chunks_exact_mut(cols) {
            for (v, b) in row.iter_mut().zip(bias) {
                let x = *v + b;
                *v = if relu { x.max(0.0) } else { x };
            }
        }
    });
}

/// Zeroes the gradient where ReLU's output was zero (its derivative there).
pub(crate) fn relu_backward(grad: &mut [f32], output: &[f32]) {
    grad.par_chunks_mut(4096)
        .zip(output.par_chunks(4096))
        .for_each(|(g, y)| {
            for (g, y) in g.iter_mut().zip(y) {
                if *y <= 0.0 {
                    *g = 0.0;
                }
            }
        });
}

/// Per-column sums of `values (rows x cols)` (a bias's gradient).
pub(crate) fn column_sums(values: &[f32], cols: usize) -> Vec<f32> {
    values
        .par_chunks(cols * ROW_BLOCK)
        .map(|block| {
            let mut sums = vec![0.0f32; cols];
            for row in block.chunks_exact(cols) {
                for (s, v) in sums.iter_mut().zip(row) {
                    *s += v;
                }
            }
            sums
        })
        .reduce(
            || vec![0.0f32; cols],
            |mut a, b| {
                for (x, y) in a.iter_mut().zip(&b) {
                    *x += y;
                }
                a
            },
        )
}

/// Resizes a reused buffer to `len` values; its contents are to be overwritten.
pub(crate) fn sized(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buffer.resize(len, 0.0);
    &mut buffer[..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], [m, k, n]: [usize; 3]) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
            }
        }
        out
    }

    fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let mut out = vec![0.0; values.len()];
        for i in 0..rows {
            for j in 0..cols {
                out[j * rows + i] = values[i * cols + j];
            }
        }
        out
    }

    #[test]
    fn products_read_transposed_operands_through_strides() {
        let [m, k, n] = [300, 70, 130];
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let want = naive(&a, &b, [m, k, n]);
        let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
        for (a, sa, b, sb) in [
            (&a, Stored::AsIs, &b, Stored::AsIs),
            (&at, Stored::Transposed, &b, Stored::AsIs),
            (&a, Stored::AsIs, &bt, Stored::Transposed),
            (&at, Stored::Transposed, &bt, Stored::Transposed),
        ] {
            let mut dst = vec![1.0; m * n];
            matmul(&mut dst, (a, sa), (b, sb), [m, k, n], false);
            assert_eq!(dst, want, "{sa:?} x {sb:?}");
            matmul(&mut dst, (a, sa), (b, sb), [m, k, n], true);
            let doubled: Vec<f32> = want.iter().map(|v| 2.0 * v).collect();
            assert_eq!(dst, doubled, "{sa:?} x {sb:?} accumulated");
        }
    }

    #[test]
    fn bias_relu_and_column_sums() {
        let mut values: Vec<f32> = (0..1000 * 3).map(|i| (i % 5) as f32 - 2.0).collect();
        let original = values.clone();
        bias_activation(&mut values, &[0.5, -0.5, 0.0], true);
        for (i, (v, o)) in values.iter().zip(&original).enumerate() {
            let b = [0.5, -0.5, 0.0][i % 3];
            assert_eq!(*v, (o + b).max(0.0));
        }
        let sums = column_sums(&original, 3);
        for (c, sum) in sums.iter().enumerate() {
            let want: f32 = original.iter().skip(c).step_by(3).sum();
            assert_eq!(*sum, want);
        }
        let mut grad = vec![1.0; values.len()];
        relu_backward(&mut grad, &values);
        for (g, y) in grad.iter().zip(&values) {
            assert_eq!(*g, if *y > 0.0 { 1.0 } else { 0.0 });
        }
    }
}
