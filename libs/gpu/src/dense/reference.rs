//! The CPU reference of every dense launch: plain loops over row-major slices, each
//! computing what its kernel (or cuBLAS's product) computes, for the GPU checks to compare
//! against within a tolerance.

use super::{Columns, DotShape, FmShape, HeadLoss, Product, Stored};

/// `dst = a · b` (or `dst += a · b`), as [`Product`] describes.
pub fn matmul(dst: &mut [f32], a: &[f32], b: &[f32], product: Product) {
    let Product { m, k, n, .. } = product;
    let at = |i: usize, l: usize| match product.a {
        Stored::AsIs => a[i * k + l],
        Stored::Transposed => a[l * m + i],
    };
    let bt = |l: usize, j: usize| match product.b {
        Stored::AsIs => b[l * n + j],
        Stored::Transposed => b[j * k + l],
    };
    for i in 0..m {
        for j in 0..n {
            let sum: f32 = (0..k).map(|l| at(i, l) * bt(l, j)).sum();
            let into = &mut dst[i * n + j];
            *into = if product.accumulate { *into + sum } else { sum };
        }
    }
}

/// `values (rows x bias.len()) += bias` per row, then ReLU with `relu`.
pub fn bias_activation(values: &mut [f32], bias: &[f32], relu: bool) {
    for row in values.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            let x = *v + b;
            *v = if relu { x.max(0.0) } else { x };
        }
    }
}

/// Zeroes `grad` where the ReLU's `output` was not positive.
pub fn relu_backward(grad: &mut [f32], output: &[f32]) {
    for (g, y) in grad.iter_mut().zip(output) {
        // A NaN output is not positive either, as in the kernel.
        if y.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            *g = 0.0;
        }
    }
}

/// Per-column sums of `values (rows x cols)`.
pub fn column_sums(values: &[f32], cols: usize) -> Vec<f32> {
    let mut sums = vec![0.0; cols];
    for row in values.chunks_exact(cols) {
        for (s, v) in sums.iter_mut().zip(row) {
            *s += v;
        }
    }
    sums
}

fn vector<'a>(first: &'a [f32], rest: &'a [f32], shape: DotShape, r: usize, v: usize) -> &'a [f32] {
    let dim = shape.dim;
    match v {
        0 => &first[r * dim..(r + 1) * dim],
        v => {
            let at = (r * (shape.vectors - 1) + v - 1) * dim;
            &rest[at..at + dim]
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// `out (rows x shape.width())`: each row's first vector, then every pair's dot product.
pub fn dots_forward(first: &[f32], rest: &[f32], shape: DotShape, out: &mut [f32]) {
    let pairs: Vec<_> = shape.pair_list().collect();
    for (r, row) in out.chunks_exact_mut(shape.width()).enumerate() {
        row[..shape.dim].copy_from_slice(vector(first, rest, shape, r, 0));
        for (o, &(i, j)) in row[shape.dim..].iter_mut().zip(&pairs) {
            *o = dot(
                vector(first, rest, shape, r, i),
                vector(first, rest, shape, r, j),
            );
        }
    }
}

/// The interaction's backward into `grad_first (rows x dim)` and `grad_rest (rows x
/// (vectors - 1) * dim)`, each written, or added to with its flag.
pub fn dots_backward(
    (first, rest): (&[f32], &[f32]),
    grad_out: &[f32],
    shape: DotShape,
    (grad_first, accumulate_first): (&mut [f32], bool),
    (grad_rest, accumulate_rest): (&mut [f32], bool),
) {
    let dim = shape.dim;
    let pairs: Vec<_> = shape.pair_list().collect();
    for (r, g) in grad_out.chunks_exact(shape.width()).enumerate() {
        let mut grads = vec![0.0f32; shape.vectors * dim];
        grads[..dim].copy_from_slice(&g[..dim]);
        for (&gp, &(i, j)) in g[dim..].iter().zip(&pairs) {
            let (a, b) = (
                vector(first, rest, shape, r, i),
                vector(first, rest, shape, r, j),
            );
            for d in 0..dim {
                grads[i * dim + d] += gp * b[d];
                grads[j * dim + d] += gp * a[d];
            }
        }
        let rest_width = (shape.vectors - 1) * dim;
        let write = |into: &mut [f32], from: &[f32], accumulate: bool| {
            for (x, y) in into.iter_mut().zip(from) {
                *x = if accumulate { *x + y } else { *y };
            }
        };
        write(
            &mut grad_first[r * dim..(r + 1) * dim],
            &grads[..dim],
            accumulate_first,
        );
        write(
            &mut grad_rest[r * rest_width..(r + 1) * rest_width],
            &grads[dim..],
            accumulate_rest,
        );
    }
}

/// A head's predictions and per-row losses from its `values`, and the weighted gradient
/// of its mean loss into `grad` (written, or added with `accumulate`).
pub fn head_loss(
    values: &[f32],
    labels: &[f32],
    loss: HeadLoss,
    weight: f32,
    (grad, accumulate): (&mut [f32], bool),
) -> (Vec<f32>, Vec<f32>) {
    let rows = values.len() as f32;
    let mut predictions = Vec::with_capacity(values.len());
    let mut losses = Vec::with_capacity(values.len());
    for ((z, y), g) in values.iter().zip(labels).zip(grad.iter_mut()) {
        let dz = match loss {
            HeadLoss::BinaryCrossEntropy => {
                losses.push(z.max(0.0) - z * y + (-z.abs()).exp().ln_1p());
                let p = 1.0 / (1.0 + (-z).exp());
                predictions.push(p);
                weight * (p - y) / rows
            }
            HeadLoss::SquaredError => {
                let e = z - y;
                losses.push(e * e);
                predictions.push(*z);
                weight * 2.0 * e / rows
            }
        };
        *g = if accumulate { *g + dz } else { dz };
    }
    (predictions, losses)
}

/// Moves the block of columns `columns` describes from `src` into `dst`.
pub fn copy_columns(dst: &mut [f32], src: &[f32], columns: Columns) {
    let Columns {
        rows,
        width,
        src_width,
        src_at,
        dst_width,
        dst_at,
        accumulate,
    } = columns;
    for r in 0..rows {
        let from = &src[r * src_width + src_at..r * src_width + src_at + width];
        let into = &mut dst[r * dst_width + dst_at..r * dst_width + dst_at + width];
        for (d, s) in into.iter_mut().zip(from) {
            *d = if accumulate { *d + s } else { *s };
        }
    }
}

/// `out[r]`: half the squared norm of the sum of row `r`'s vectors less the sum of their
/// squared norms.
pub fn fm_forward(e: &[f32], shape: FmShape, out: &mut [f32]) {
    let FmShape { vectors, dim, .. } = shape;
    for (o, row) in out.iter_mut().zip(e.chunks_exact(shape.width())) {
        let (mut sums, mut squares) = (0.0f32, 0.0f32);
        for d in 0..dim {
            let column = (0..vectors).map(|v| row[v * dim + d]);
            sums += column.clone().sum::<f32>().powi(2);
            squares += column.map(|x| x * x).sum::<f32>();
        }
        *o = 0.5 * (sums - squares);
    }
}

/// Its backward into `grad` (shaped as `e`), written or added with `accumulate`.
pub fn fm_backward(
    e: &[f32],
    grad_out: &[f32],
    shape: FmShape,
    (grad, accumulate): (&mut [f32], bool),
) {
    let FmShape { vectors, dim, .. } = shape;
    let rows = e.chunks_exact(shape.width());
    let grads = grad.chunks_exact_mut(shape.width());
    for ((row, into), g) in rows.zip(grads).zip(grad_out) {
        for d in 0..dim {
            let sum: f32 = (0..vectors).map(|v| row[v * dim + d]).sum();
            for v in 0..vectors {
                let x = g * (sum - row[v * dim + d]);
                let at = &mut into[v * dim + d];
                *at = if accumulate { *at + x } else { x };
            }
        }
    }
}

/// A cross layer's output from its product `z`: `next = x0 * z + x`.
pub fn cross_forward(x0: &[f32], z: &[f32], x: &[f32], next: &mut [f32]) {
    for (((n, x0), z), x) in next.iter_mut().zip(x0).zip(z).zip(x) {
        *n = x0 * z + x;
    }
}

/// Its backward through the product: `dz = g * x0`, and `grad_x0 += g * z`.
pub fn cross_backward(g: &[f32], x0: &[f32], z: &[f32], dz: &mut [f32], grad_x0: &mut [f32]) {
    for ((((dz, gx0), g), x0), z) in dz.iter_mut().zip(grad_x0).zip(g).zip(x0).zip(z) {
        *dz = g * x0;
        *gx0 += g * z;
    }
}
