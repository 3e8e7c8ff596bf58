//! DCN-v2's cross network on [`DenseOps`], as `blocks/cross.rs` computes it on the CPU:
//! `x(l+1) = x0 * (W(l) x(l) + b(l)) + x(l)`, W full or low-rank `V U`.

use primus_gpu::dense::{Columns, DenseOps, Product, Stored};

use super::{ByName, param, param_grad};
use crate::ModelError;
use crate::cpu::blocks::cross::CrossNet;

/// A cross node's buffers beyond its layer outputs.
pub(super) struct CrossBuffers<B> {
    /// `z(l) = W x(l) + b`.
    zs: Vec<B>,
    /// Low rank: `t(l) = x(l) V`.
    ts: Vec<B>,
    dz: B,
    dt: B,
    grad_x0: B,
}

/// One layer's parameter names.
struct Names {
    /// Full: the weight; low rank: V.
    first: String,
    /// Low rank: U.
    second: Option<String>,
    bias: String,
}

fn names(cross: &CrossNet) -> Vec<Names> {
    let (prefix, _, layers, rank) = cross.parts();
    (0..layers)
        .map(|l| Names {
            first: format!(
                "{prefix}.{l}.{}",
                if rank.is_some() { "v" } else { "weight" }
            ),
            second: rank.map(|_| format!("{prefix}.{l}.u")),
            bias: format!("{prefix}.{l}.bias"),
        })
        .collect()
}

/// A cross node's layer outputs over `rows` rows.
pub(super) fn outputs<O: DenseOps>(
    ops: &mut O,
    cross: &CrossNet,
    rows: usize,
) -> Result<Vec<O::Buffer>, ModelError> {
    let (_, d, layers, _) = cross.parts();
    (0..layers).map(|_| Ok(ops.zeros(rows * d)?)).collect()
}

/// A cross node's other buffers over `rows` rows.
pub(super) fn buffers<O: DenseOps>(
    ops: &mut O,
    cross: &CrossNet,
    rows: usize,
) -> Result<CrossBuffers<O::Buffer>, ModelError> {
    let (_, d, layers, rank) = cross.parts();
    let r = rank.unwrap_or(0);
    let mut many = |count: usize, len: usize| -> Result<Vec<O::Buffer>, ModelError> {
        (0..count).map(|_| Ok(ops.zeros(len)?)).collect()
    };
    let zs = many(layers, rows * d)?;
    let ts = many(if rank.is_some() { layers } else { 0 }, rows * r)?;
    Ok(CrossBuffers {
        zs,
        ts,
        dz: ops.zeros(rows * d)?,
        dt: ops.zeros(rows * r.max(1))?,
        grad_x0: ops.zeros(rows * d)?,
    })
}

/// Runs `x0 (rows x d)` through every layer into `outputs`.
pub(super) fn forward<O: DenseOps>(
    ops: &mut O,
    (cross, params): (&CrossNet, &ByName<O::Buffer>),
    rows: usize,
    x0: &O::Buffer,
    (outputs, bufs): (&mut [O::Buffer], &mut CrossBuffers<O::Buffer>),
) -> Result<(), ModelError> {
    let (_, d, _, rank) = cross.parts();
    for (l, layer) in names(cross).iter().enumerate() {
        let (done, rest) = outputs.split_at_mut(l);
        let x = done.last().unwrap_or(x0);
        let z = &mut bufs.zs[l];
        match (rank, &layer.second) {
            (Some(r), Some(u)) => {
                let t = &mut bufs.ts[l];
                ops.matmul(
                    t,
                    x,
                    param(params, &layer.first)?,
                    Product::new([rows, d, r]),
                )?;
                ops.matmul(z, t, param(params, u)?, Product::new([rows, r, d]))?;
            }
            _ => ops.matmul(
                z,
                x,
                param(params, &layer.first)?,
                Product::new([rows, d, d]),
            )?,
        }
        ops.bias_activation(z, param(params, &layer.bias)?, [rows, d], false)?;
        ops.cross_forward(rows * d, (x0, z, x), &mut rest[0])?;
    }
    Ok(())
}

/// From the output's gradient `g` (used up), every parameter's gradient and the input's,
/// left in the buffers' `grad_x0` (returned).
pub(super) fn backward<'b, O: DenseOps>(
    ops: &mut O,
    (cross, params, param_grads): (&CrossNet, &ByName<O::Buffer>, &mut ByName<O::Buffer>),
    rows: usize,
    (x0, outputs, g): (&O::Buffer, &[O::Buffer], &mut O::Buffer),
    bufs: &'b mut CrossBuffers<O::Buffer>,
) -> Result<&'b O::Buffer, ModelError> {
    let (_, d, _, rank) = cross.parts();
    ops.fill_zero(&mut bufs.grad_x0)?;
    for (l, layer) in names(cross).iter().enumerate().rev() {
        let x = if l == 0 { x0 } else { &outputs[l - 1] };
        let z = &bufs.zs[l];
        ops.cross_backward(rows * d, (g, x0, z), &mut bufs.dz, &mut bufs.grad_x0)?;
        let dz = &bufs.dz;
        match (rank, &layer.second) {
            (Some(r), Some(u)) => {
                let t = &bufs.ts[l];
                let grad_u = param_grad(param_grads, u)?;
                let product = Product::new([r, rows, d]).a(Stored::Transposed);
                ops.matmul(grad_u, t, dz, product)?;
                let u = param(params, u)?;
                let product = Product::new([rows, d, r]).b(Stored::Transposed);
                ops.matmul(&mut bufs.dt, dz, u, product)?;
                let grad_v = param_grad(param_grads, &layer.first)?;
                let product = Product::new([d, rows, r]).a(Stored::Transposed);
                ops.matmul(grad_v, x, &bufs.dt, product)?;
                // x(l+1) = x0 * z + x(l): g already holds the residual's share.
                let v = param(params, &layer.first)?;
                let product = Product::new([rows, r, d]).b(Stored::Transposed);
                ops.matmul(g, &bufs.dt, v, product.accumulate(true))?;
            }
            _ => {
                let grad_w = param_grad(param_grads, &layer.first)?;
                let product = Product::new([d, rows, d]).a(Stored::Transposed);
                ops.matmul(grad_w, x, dz, product)?;
                let w = param(params, &layer.first)?;
                let product = Product::new([rows, d, d]).b(Stored::Transposed);
                ops.matmul(g, dz, w, product.accumulate(true))?;
            }
        }
        let grad_bias = param_grad(param_grads, &layer.bias)?;
        ops.column_sums(grad_bias, &bufs.dz, [rows, d])?;
    }
    // x(0) is the input itself.
    let all = Columns::new(rows, d, (d, 0), (d, 0), true);
    ops.copy_columns(&mut bufs.grad_x0, g, all)?;
    Ok(&bufs.grad_x0)
}
