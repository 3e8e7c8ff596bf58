//! CPU references of every kernel, with the kernels' signatures ([`EmbeddingKernels`]).
//! They perform the same float operations in the same order as kernels.cu, so forward
//! pooling, the deterministic backward and the optimizers match the GPU bit for bit.
//! Pooling spreads over the cores (blocks of samples forward, tables backward) without
//! changing any output element's order of operations.

use rayon::prelude::*;

use crate::GpuError;
use crate::layout::{
    Accumulation, Pooling, PoolingInput, RowOptimizer, TableShape, validate_update,
};

/// The embedding work a trainer or PS hands to a device. `weights[t]` and the returned
/// gradients are host slices in every implementation; device-resident forms live on the
/// implementations themselves.
pub trait EmbeddingKernels {
    /// Pooled embeddings, `samples x input.out_width(tables)`, row major.
    fn gather_pool(
        &self,
        tables: &[TableShape],
        weights: &[&[f32]],
        input: &PoolingInput,
        pooling: Pooling,
    ) -> Result<Vec<f32>, GpuError>;

    /// Backward of [`Self::gather_pool`]: per table, `rows x dim` gradients (rows no bag
    /// touched stay zero).
    fn pool_backward(
        &self,
        tables: &[TableShape],
        input: &PoolingInput,
        pooling: Pooling,
        grad_out: &[f32],
        accumulation: Accumulation,
    ) -> Result<Vec<Vec<f32>>, GpuError>;

    /// Applies one gradient row per distinct id to `table` (weights and state in place).
    fn update_rows(
        &self,
        shape: TableShape,
        optimizer: RowOptimizer,
        table: &mut [f32],
        ids: &[u32],
        grads: &[f32],
    ) -> Result<(), GpuError>;
}

/// The CPU path.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuKernels;

pub(crate) fn validate_weights(tables: &[TableShape], weights: &[&[f32]]) -> Result<(), GpuError> {
    if weights.len() != tables.len() {
        return Err(GpuError::invalid(
            "weights",
            format!("{} slices for {} tables", weights.len(), tables.len()),
        ));
    }
    for (t, (shape, w)) in tables.iter().zip(weights).enumerate() {
        if w.len() != shape.floats() {
            return Err(GpuError::invalid(
                format!("weights[{t}]"),
                format!(
                    "{} floats for {} rows x stride {}",
                    w.len(),
                    shape.rows,
                    shape.stride
                ),
            ));
        }
    }
    Ok(())
}

pub(crate) fn validate_grad_out(
    tables: &[TableShape],
    input: &PoolingInput,
    grad_out: &[f32],
) -> Result<(), GpuError> {
    let expected = input.samples * input.out_width(tables);
    if grad_out.len() != expected {
        return Err(GpuError::invalid(
            "grad_out",
            format!(
                "{} floats for {} samples x width {}",
                grad_out.len(),
                input.samples,
                input.out_width(tables)
            ),
        ));
    }
    Ok(())
}

/// Samples a core pools at a time.
const SAMPLE_BLOCK: usize = 64;

fn scale(pooling: Pooling, bag_len: usize) -> f32 {
    match pooling {
        Pooling::Mean if bag_len > 0 => 1.0 / bag_len as f32,
        _ => 1.0,
    }
}

impl EmbeddingKernels for CpuKernels {
    fn gather_pool(
        &self,
        tables: &[TableShape],
        weights: &[&[f32]],
        input: &PoolingInput,
        pooling: Pooling,
    ) -> Result<Vec<f32>, GpuError> {
        input.validate(tables)?;
        validate_weights(tables, weights)?;
        let width = input.out_width(tables);
        let columns = input.columns(tables);
        let mut out = vec![0.0f32; input.samples * width];
        if width == 0 {
            return Ok(out);
        }
        // Blocks of samples on every core; within a sample the order is the kernel's.
        out.par_chunks_mut(width * SAMPLE_BLOCK)
            .enumerate()
            .for_each(|(block, out)| {
                for (i, sample) in out.chunks_exact_mut(width).enumerate() {
                    let b = block * SAMPLE_BLOCK + i;
                    for (f, feature) in input.features.iter().enumerate() {
                        let shape = tables[feature.table];
                        let (dim, stride) = (shape.dim as usize, shape.stride as usize);
                        let bag = feature.bag(feature.bag_of(b));
                        let dst = &mut sample[columns[f]..][..dim];
                        for &row in bag {
                            let src = &weights[feature.table][row as usize * stride..][..dim];
                            for (acc, w) in dst.iter_mut().zip(src) {
                                *acc += w;
                            }
                        }
                        if pooling == Pooling::Mean && !bag.is_empty() {
                            let n = bag.len() as f32;
                            dst.iter_mut().for_each(|acc| *acc /= n);
                        }
                    }
                }
            });
        Ok(out)
    }

    fn pool_backward(
        &self,
        tables: &[TableShape],
        input: &PoolingInput,
        pooling: Pooling,
        grad_out: &[f32],
        _accumulation: Accumulation,
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        input.validate(tables)?;
        validate_grad_out(tables, input, grad_out)?;
        let width = input.out_width(tables);
        let columns = input.columns(tables);
        let mut grads: Vec<Vec<f32>> = tables
            .iter()
            .map(|t| vec![0.0; t.rows as usize * t.dim as usize])
            .collect();
        // Tables on every core; within a table feature, then sample, then position in the
        // bag: the order the sorted kernel sums in.
        grads.par_iter_mut().enumerate().for_each(|(t, grads)| {
            let dim = tables[t].dim as usize;
            let features = (input.features.iter().enumerate()).filter(|(_, f)| f.table == t);
            for (f, feature) in features {
                for b in 0..input.samples {
                    let bag = feature.bag(feature.bag_of(b));
                    let s = scale(pooling, bag.len());
                    let src = &grad_out[b * width + columns[f]..][..dim];
                    for &row in bag {
                        let dst = &mut grads[row as usize * dim..][..dim];
                        for (acc, g) in dst.iter_mut().zip(src) {
                            *acc += g * s;
                        }
                    }
                }
            }
        });
        Ok(grads)
    }

    fn update_rows(
        &self,
        shape: TableShape,
        optimizer: RowOptimizer,
        table: &mut [f32],
        ids: &[u32],
        grads: &[f32],
    ) -> Result<(), GpuError> {
        validate_update(shape, optimizer, table.len(), ids, grads)?;
        let (dim, stride) = (shape.dim as usize, shape.stride as usize);
        for (&id, grad) in ids.iter().zip(grads.chunks_exact(dim)) {
            let row = &mut table[id as usize * stride..][..stride];
            let (weights, state) = row.split_at_mut(dim);
            update_row(optimizer, weights, state, grad);
        }
        Ok(())
    }
}

/// One row's update; `state` holds at least the optimizer's state after the weights.
#[inline]
pub fn update_row(optimizer: RowOptimizer, weights: &mut [f32], state: &mut [f32], grad: &[f32]) {
    match optimizer {
        RowOptimizer::Adagrad { lr, epsilon } => {
            for ((w, acc), g) in weights.iter_mut().zip(state.iter_mut()).zip(grad) {
                *acc += g * g;
                *w -= lr * g / (acc.sqrt() + epsilon);
            }
        }
        RowOptimizer::Adam {
            lr,
            beta1,
            beta2,
            epsilon,
        } => {
            let dim = weights.len();
            let (moments, powers) = state.split_at_mut(2 * dim);
            powers[0] *= beta1;
            powers[1] *= beta2;
            let step = lr * (1.0 - powers[1]).sqrt() / (1.0 - powers[0]);
            let (m, v) = moments.split_at_mut(dim);
            for (((w, m), v), g) in weights.iter_mut().zip(m).zip(v).zip(grad) {
                *m = beta1 * *m + (1.0 - beta1) * g;
                *v = beta2 * *v + (1.0 - beta2) * g * g;
                *w -= step * *m / (v.sqrt() + epsilon);
            }
        }
    }
}
