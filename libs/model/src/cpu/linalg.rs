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

/// Work to run compiled for the widest SIMD instructions this CPU has ([`simd`]).
pub(crate) trait Kernel {
    type Output;
    /// Implementations are `#[inline(always)]`, as is everything they call: only code
    /// inlined into the dispatching function is compiled for its instructions.
    fn run(self) -> Self::Output;
}

struct Dispatch<K>(K);

impl<K: Kernel> pulp::WithSimd for Dispatch<K> {
    type Output = K::Output;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> K::Output {
        self.0.run()
    }
}

/// Runs `kernel` compiled for AVX-512, AVX2 with FMA, or the build's baseline, whichever
/// this CPU has (chosen at run time): its loops vectorize to those instructions.
pub(crate) fn simd<K: Kernel>(kernel: K) -> K::Output {
    pulp::Arch::new().dispatch(Dispatch(kernel))
}

/// `values (rows x cols) += bias` per row, then ReLU with `relu`: the bias and the
/// activation in one pass over the product.
pub(crate) fn bias_activation(values: &mut [f32], bias: &[f32], relu: bool) {
    values
        .par_chunks_mut(bias.len() * ROW_BLOCK)
        .for_each(|rows| simd(BiasActivation { rows, bias, relu }));
}

struct BiasActivation<'a> {
    rows: &'a mut [f32],
    bias: &'a [f32],
    relu: bool,
}

impl Kernel for BiasActivation<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        for row in self.rows.chunks_exact_mut(self.bias.len()) {
            for (v, b) in row.iter_mut().zip(self.bias) {
                let x = *v + b;
                *v = if self.relu { x.max(0.0) } else { x };
            }
        }
    }
}

/// A bias's gradient: the per-column sums of `grad (rows x cols)`. With `relu_output`,
/// first zeroes `grad` where that ReLU output was zero (the derivative there), in the same
/// pass.
pub(crate) fn bias_grad(grad: &mut [f32], relu_output: Option<&[f32]>, cols: usize) -> Vec<f32> {
    let block = cols * ROW_BLOCK;
    let add = |mut a: Vec<f32>, b: Vec<f32>| {
        for (x, y) in a.iter_mut().zip(&b) {
            *x += y;
        }
        a
    };
    let zeros = || vec![0.0f32; cols];
    match relu_output {
        Some(output) => grad
            .par_chunks_mut(block)
            .zip(output.par_chunks(block))
            .map(|(grad, output)| {
                simd(BiasGrad {
                    grad,
                    output: Some(output),
                    cols,
                })
            })
            .reduce(zeros, add),
        None => grad
            .par_chunks_mut(block)
            .map(|grad| {
                simd(BiasGrad {
                    grad,
                    output: None,
                    cols,
                })
            })
            .reduce(zeros, add),
    }
}

struct BiasGrad<'a> {
    grad: &'a mut [f32],
    output: Option<&'a [f32]>,
    cols: usize,
}

impl Kernel for BiasGrad<'_> {
    type Output = Vec<f32>;

    #[inline(always)]
    fn run(self) -> Vec<f32> {
        let cols = self.cols;
        let mut sums = vec![0.0f32; cols];
        for (r, row) in self.grad.chunks_exact_mut(cols).enumerate() {
            if let Some(output) = self.output {
                let y = &output[r * cols..(r + 1) * cols];
                // A select rather than a conditional store, so that it vectorizes.
                for (g, y) in row.iter_mut().zip(y) {
                    *g = if *y > 0.0 { *g } else { 0.0 };
                }
            }
            for (s, g) in sums.iter_mut().zip(row.iter()) {
                *s += g;
            }
        }
        sums
    }
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
    fn bias_relu_and_its_gradient() {
        let mut values: Vec<f32> = (0..1000 * 3).map(|i| (i % 5) as f32 - 2.0).collect();
        let original = values.clone();
        bias_activation(&mut values, &[0.5, -0.5, 0.0], true);
        for (i, (v, o)) in values.iter().zip(&original).enumerate() {
            let b = [0.5, -0.5, 0.0][i % 3];
            assert_eq!(*v, (o + b).max(0.0));
        }
        let mut grad = original.clone();
        let sums = bias_grad(&mut grad, None, 3);
        assert_eq!(grad, original);
        for (c, sum) in sums.iter().enumerate() {
            let want: f32 = original.iter().skip(c).step_by(3).sum();
            assert_eq!(*sum, want);
        }
        let mut grad = vec![1.0; values.len()];
        let sums = bias_grad(&mut grad, Some(&values), 3);
        for (g, y) in grad.iter().zip(&values) {
            assert_eq!(*g, if *y > 0.0 { 1.0 } else { 0.0 });
        }
        for (c, sum) in sums.iter().enumerate() {
            let want = values
                .iter()
                .skip(c)
                .step_by(3)
                .filter(|y| **y > 0.0)
                .count();
            assert_eq!(*sum, want as f32);
        }
    }
}
