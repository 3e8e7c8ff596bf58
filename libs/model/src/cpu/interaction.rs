//! Feature interactions per sample: DLRM's pairwise dot products and the factorisation
//! machine's second-order term, forward and backward, parallel over rows.

use rayon::prelude::*;

use super::linalg::{Kernel, ROW_BLOCK, simd};

/// The shapes of a dot interaction: `vectors` vectors of `dim` per sample, the bottom
/// MLP's output first, then each feature's pooled embedding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dots {
    pub dim: usize,
    pub features: usize,
}

impl Dots {
    #[inline(always)]
    fn vectors(self) -> usize {
        self.features + 1
    }

    /// Pairs `(i, j)`, `i < j`, in row-major order of the upper triangle.
    #[inline(always)]
    pub(crate) fn pairs(self) -> usize {
        let v = self.vectors();
        v * (v - 1) / 2
    }

    /// Width of the top MLP's input: the bottom output, then every pair's dot product.
    #[inline(always)]
    pub(crate) fn width(self) -> usize {
        self.dim + self.pairs()
    }

    #[inline(always)]
    fn vector<'a>(self, bottom: &'a [f32], embedded: &'a [f32], i: usize) -> &'a [f32] {
        if i == 0 {
            bottom
        } else {
            &embedded[(i - 1) * self.dim..i * self.dim]
        }
    }

    /// `out (rows x width)`: each row's bottom output followed by its dot products.
    pub(crate) fn forward(self, bottom: &[f32], embedded: &[f32], out: &mut [f32]) {
        out.par_chunks_mut(self.width() * ROW_BLOCK)
            .enumerate()
            .for_each(|(block, out)| {
                simd(DotsForward {
                    dots: self,
                    first: block * ROW_BLOCK,
                    bottom,
                    embedded,
                    out,
                })
            });
    }
}

/// [`Dots::forward`] of the rows from `first` on that `out` holds.
struct DotsForward<'a> {
    dots: Dots,
    first: usize,
    bottom: &'a [f32],
    embedded: &'a [f32],
    out: &'a mut [f32],
}

impl Kernel for DotsForward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let Self {
            dots,
            first,
            bottom,
            embedded,
            out,
        } = self;
        let (dim, width) = (dots.dim, dots.width());
        let embedded_width = dots.features * dim;
        for (r, out) in out.chunks_exact_mut(width).enumerate() {
            let row = first + r;
            let b = &bottom[row * dim..(row + 1) * dim];
            let e = &embedded[row * embedded_width..(row + 1) * embedded_width];
            out[..dim].copy_from_slice(b);
            let mut k = dim;
            for i in 0..dots.vectors() {
                let vi = dots.vector(b, e, i);
                for j in i + 1..dots.vectors() {
                    out[k] = dot(vi, dots.vector(b, e, j));
                    k += 1;
                }
            }
        }
    }
}

impl Dots {
    /// From the gradient of `forward`'s output, the bottom output's gradient
    /// (`rows x dim`) and the pooled embeddings' (`rows x features*dim`).
    pub(crate) fn backward(
        self,
        bottom: &[f32],
        embedded: &[f32],
        grad_out: &[f32],
        grad_bottom: &mut [f32],
        grad_embedded: &mut [f32],
    ) {
        let embedded_width = self.features * self.dim;
        grad_bottom
            .par_chunks_mut(self.dim * ROW_BLOCK)
            .zip(grad_embedded.par_chunks_mut(embedded_width * ROW_BLOCK))
            .enumerate()
            .for_each(|(block, grads)| {
                simd(DotsBackward {
                    dots: self,
                    first: block * ROW_BLOCK,
                    inputs: (bottom, embedded, grad_out),
                    grads,
                })
            });
    }
}

/// [`Dots::backward`] of the rows from `first` on that the gradients hold.
struct DotsBackward<'a> {
    dots: Dots,
    first: usize,
    /// The bottom outputs, the pooled embeddings and the output's gradient.
    inputs: (&'a [f32], &'a [f32], &'a [f32]),
    /// Of the bottom outputs and of the pooled embeddings.
    grads: (&'a mut [f32], &'a mut [f32]),
}

impl Kernel for DotsBackward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let Self {
            dots,
            first,
            inputs: (bottom, embedded, grad_out),
            grads: (grad_bottom, grad_embedded),
        } = self;
        let (dim, width) = (dots.dim, dots.width());
        let embedded_width = dots.features * dim;
        let mut grads = vec![0.0f32; dots.vectors() * dim];
        let rows = grad_bottom
            .chunks_exact_mut(dim)
            .zip(grad_embedded.chunks_exact_mut(embedded_width));
        for (r, (gb, ge)) in rows.enumerate() {
            let row = first + r;
            let b = &bottom[row * dim..(row + 1) * dim];
            let e = &embedded[row * embedded_width..(row + 1) * embedded_width];
            let g = &grad_out[row * width..(row + 1) * width];
            grads.fill(0.0);
            grads[..dim].copy_from_slice(&g[..dim]);
            let mut k = dim;
            for i in 0..dots.vectors() {
                let vi = dots.vector(b, e, i);
                for j in i + 1..dots.vectors() {
                    let vj = dots.vector(b, e, j);
                    let gk = g[k];
                    k += 1;
                    let (head, tail) = grads.split_at_mut(j * dim);
                    axpy(&mut head[i * dim..(i + 1) * dim], gk, vj);
                    axpy(&mut tail[..dim], gk, vi);
                }
            }
            gb.copy_from_slice(&grads[..dim]);
            ge.copy_from_slice(&grads[dim..]);
        }
    }
}

/// Rendle's pairwise term per row, `0.5 * sum_k ((sum_f e_fk)^2 - sum_f e_fk^2)`, over
/// `features` embeddings of `dim` each.
pub(crate) fn fm_forward(embedded: &[f32], features: usize, dim: usize, out: &mut [f32]) {
    let width = features * dim;
    out.par_chunks_mut(ROW_BLOCK)
        .zip(embedded.par_chunks(width * ROW_BLOCK))
        .for_each(|(out, rows)| simd(FmForward { rows, dim, out }));
}

struct FmForward<'a> {
    rows: &'a [f32],
    dim: usize,
    out: &'a mut [f32],
}

impl Kernel for FmForward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let Self { rows, dim, out } = self;
        let width = rows.len() / out.len().max(1);
        let mut sum = vec![0.0f32; dim];
        for (o, e) in out.iter_mut().zip(rows.chunks_exact(width)) {
            sum.fill(0.0);
            let mut squares = 0.0;
            for v in e.chunks_exact(dim) {
                axpy(&mut sum, 1.0, v);
                squares += dot(v, v);
            }
            *o = 0.5 * (dot(&sum, &sum) - squares);
        }
    }
}

/// Adds the factorisation machine's gradient, `grad_out[r] * (sum_f e_fk - e_fk)`, into
/// `grad_embedded`.
pub(crate) fn fm_backward(
    embedded: &[f32],
    features: usize,
    dim: usize,
    grad_out: &[f32],
    grad_embedded: &mut [f32],
) {
    let width = features * dim;
    grad_embedded
        .par_chunks_mut(width * ROW_BLOCK)
        .zip(embedded.par_chunks(width * ROW_BLOCK))
        .zip(grad_out.par_chunks(ROW_BLOCK))
        .for_each(|((grads, rows), grad_out)| {
            simd(FmBackward {
                rows,
                grad_out,
                dim,
                grads,
            })
        });
}

struct FmBackward<'a> {
    rows: &'a [f32],
    grad_out: &'a [f32],
    dim: usize,
    grads: &'a mut [f32],
}

impl Kernel for FmBackward<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let Self {
            rows,
            grad_out,
            dim,
            grads,
        } = self;
        let width = rows.len() / grad_out.len().max(1);
        let mut sum = vec![0.0f32; dim];
        let each = grads.chunks_exact_mut(width).zip(rows.chunks_exact(width));
        for ((ge, e), g) in each.zip(grad_out) {
            sum.fill(0.0);
            for v in e.chunks_exact(dim) {
                axpy(&mut sum, 1.0, v);
            }
            for (gv, v) in ge.chunks_exact_mut(dim).zip(e.chunks_exact(dim)) {
                for ((gv, s), v) in gv.iter_mut().zip(&sum).zip(v) {
                    *gv += g * (s - v);
                }
            }
        }
    }
}

/// Eight independent partial sums: float addition is not associative, so a single running
/// sum would be one long dependency chain the compiler may not vectorize.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut partial = [0.0f32; LANES];
    let (a_lanes, b_lanes) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_lanes
        .remainder()
        .iter()
        .zip(b_lanes.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a_lanes.zip(b_lanes) {
        for l in 0..LANES {
            partial[l] += x[l] * y[l];
        }
    }
    let [p0, p1, p2, p3, p4, p5, p6, p7] = partial;
    ((p0 + p4) + (p1 + p5)) + ((p2 + p6) + (p3 + p7)) + tail
}

/// `y += a * x`.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}
