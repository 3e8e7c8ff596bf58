//! Feature interactions per sample: DLRM's pairwise dot products and the factorisation
//! machine's second-order term, forward and backward, parallel over rows.

use rayon::prelude::*;

use super::linalg::ROW_BLOCK;

/// The shapes of a dot interaction: `vectors` vectors of `dim` per sample, the bottom
/// MLP's output first, then each feature's pooled embedding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dots {
    pub dim: usize,
    pub features: usize,
}

impl Dots {
    fn vectors(self) -> usize {
        self.features + 1
    }

    /// Pairs `(i, j)`, `i < j`, in row-major order of the upper triangle.
    pub(crate) fn pairs(self) -> usize {
        let v = self.vectors();
        v * (v - 1) / 2
    }

    /// Width of the top MLP's input: the bottom output, then every pair's dot product.
    pub(crate) fn width(self) -> usize {
        self.dim + self.pairs()
    }

    fn vector<'a>(self, bottom: &'a [f32], embedded: &'a [f32], i: usize) -> &'a [f32] {
        if i == 0 {
            bottom
        } else {
            &embedded[(i - 1) * self.dim..i * self.dim]
        }
    }

    /// `out (rows x width)`: each row's bottom output followed by its dot products.
    pub(crate) fn forward(self, bottom: &[f32], embedded: &[f32], out: &mut [f32]) {
        let (dim, width) = (self.dim, self.width());
        let embedded_width = self.features * dim;
        out.par_chunks_mut(width * ROW_BLOCK)
            .enumerate()
            .for_each(|(block, rows)| {
                for (r, out) in rows.chunks_exact_mut(width).enumerate() {
                    let row = block * ROW_BLOCK + r;
                    let b = &bottom[row * dim..(row + 1) * dim];
                    let e = &embedded[row * embedded_width..(row + 1) * embedded_width];
                    out[..dim].copy_from_slice(b);
                    let mut k = dim;
                    for i in 0..self.vectors() {
                        let vi = self.vector(b, e, i);
                        for j in i + 1..self.vectors() {
                            out[k] = dot(vi, self.vector(b, e, j));
                            k += 1;
                        }
                    }
                }
            });
    }

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
        let (dim, width) = (self.dim, self.width());
        let embedded_width = self.features * dim;
        grad_bottom
            .par_chunks_mut(dim * ROW_BLOCK)
            .zip(grad_embedded.par_chunks_mut(embedded_width * ROW_BLOCK))
            .enumerate()
            .for_each(|(block, (gb_rows, ge_rows))| {
                let mut grads = vec![0.0f32; self.vectors() * dim];
                let rows = gb_rows
                    .chunks_exact_mut(dim)
                    .zip(ge_rows.chunks_exact_mut(embedded_width));
                for (r, (gb, ge)) in rows.enumerate() {
                    let row = block * ROW_BLOCK + r;
                    let b = &bottom[row * dim..(row + 1) * dim];
                    let e = &embedded[row * embedded_width..(row + 1) * embedded_width];
                    let g = &grad_out[row * width..(row + 1) * width];
                    grads.fill(0.0);
                    grads[..dim].copy_from_slice(&g[..dim]);
                    let mut k = dim;
                    for i in 0..self.vectors() {
                        let vi = self.vector(b, e, i);
                        for j in i + 1..self.vectors() {
                            let vj = self.vector(b, e, j);
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
            });
    }
}

/// Rendle's pairwise term per row, `0.5 * sum_k ((sum_f e_fk)^2 - sum_f e_fk^2)`, over
/// `features` embeddings of `dim` each.
pub(crate) fn fm_forward(embedded: &[f32], features: usize, dim: usize, out: &mut [f32]) {
    let width = features * dim;
    out.par_chunks_mut(ROW_BLOCK)
        .zip(embedded.par_chunks(width * ROW_BLOCK))
        .for_each(|(out, rows)| {
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
        });
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
        .for_each(|((grad_rows, rows), g)| {
            let mut sum = vec![0.0f32; dim];
            let each = grad_rows
                .chunks_exact_mut(width)
                .zip(rows.chunks_exact(width));
            for ((ge, e), g) in each.zip(g) {
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
        });
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += a * x`.
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}
