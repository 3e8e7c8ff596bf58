//! One training step of a minibatch from the rows it looked up: the rows pooled into each
//! sample's embeddings, the dense network forward and backward, and the embeddings'
//! gradients scattered back onto each table's unique keys. The scattered gradients are
//! handed out as soon as they are known, so that a caller pushes them while the rest of
//! the backward computes.

use std::time::{Duration, Instant};

use primus_batch::Minibatch;

use crate::device_step::DeviceMinibatch;
use crate::inputs::{Inputs, Tower};
use crate::params::ParamSet;
use crate::pooling::{BatchKeys, EmbeddingKernels};
use crate::{EmbeddingGrads, Engine, Model, ModelError, StepOutput};

/// The rows a minibatch looked up for its unique keys.
#[derive(Debug, Clone, Copy)]
pub struct LookedUp<'a> {
    /// The minibatch's unique keys per table and where each sample uses them.
    pub keys: &'a BatchKeys,
    /// Per table, its unique keys' embedding rows, one after the other.
    pub rows: &'a [Vec<f32>],
    /// Per wide table, its unique keys' first-order weights (empty without wide tables).
    pub wide: &'a [Vec<f32>],
}

/// The embedding gradients of a step on each table's unique keys.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseGrads {
    /// Per table, one gradient row per unique key, in [`LookedUp::rows`]' order.
    pub grads: Vec<Vec<f32>>,
    /// Per wide table, one gradient per unique key (empty without wide tables).
    pub wide_grads: Vec<Vec<f32>>,
}

impl Model {
    /// One step of `batch` (of `tower`) from the rows it `looked_up`, pooling and
    /// scattering with `kernels`: `on_sparse_grads` gets the embeddings' gradients on the
    /// unique keys as soon as they are known; the output carries the predictions, the loss
    /// and the dense gradients. With the dense network on a GPU and every feature pooled
    /// per sample, the pooling and its backward run there too, on the graph's stream
    /// (`device_step.rs`), and the output's `embedded_grad` and `wide_grad` are empty.
    pub fn train_minibatch(
        &self,
        params: &ParamSet,
        kernels: &dyn EmbeddingKernels,
        batch: &Minibatch,
        looked_up: LookedUp<'_>,
        tower: Tower,
        on_sparse_grads: impl FnOnce(Result<SparseGrads, ModelError>),
    ) -> Result<StepOutput, ModelError> {
        let layout = self.layout();
        let keys = looked_up.keys;
        if let (Engine::Device { net, ordinal, pool }, Some((input, pooling))) =
            (&self.engine, keys.per_sample_only())
        {
            let minibatch = DeviceMinibatch {
                batch,
                looked_up,
                input,
                pooling,
            };
            return Self::with_placed((net, *ordinal, pool), |placed| {
                self.train_on_device(placed, params, minibatch, on_sparse_grads)
            });
        }
        let pooling = Instant::now();
        let embedded = keys.pool(kernels, layout, looked_up.rows)?;
        let wide = match layout.has_wide() {
            true => keys.pool_wide(kernels, looked_up.wide)?,
            false => Vec::new(),
        };
        let inputs = Inputs {
            rows: batch.rows(),
            dense: self.dense_inputs(batch)?,
            embedded: &embedded,
            wide: &wide,
        };
        let dense = Instant::now();
        let mut scatter_time = Duration::ZERO;
        let scatter = |grads: EmbeddingGrads<'_>| {
            let scattering = Instant::now();
            let sparse = self.scatter(kernels, keys, grads);
            scatter_time = scattering.elapsed();
            on_sparse_grads(sparse);
        };
        let labels = self.head_labels(batch)?;
        let mut output = self.train_step_with(params, &inputs, &labels, tower, scatter)?;
        let times = &mut output.times;
        times.pooling = dense - pooling;
        times.dense = dense.elapsed().saturating_sub(scatter_time);
        times.scatter = scatter_time;
        Ok(output)
    }

    /// The pooling backward: the embeddings' gradients summed onto each table's unique keys.
    fn scatter(
        &self,
        kernels: &dyn EmbeddingKernels,
        keys: &BatchKeys,
        grads: EmbeddingGrads<'_>,
    ) -> Result<SparseGrads, ModelError> {
        let layout = self.layout();
        Ok(SparseGrads {
            grads: keys.scatter(kernels, layout, grads.embedded)?,
            wide_grads: match layout.has_wide() {
                true => keys.scatter_wide(kernels, grads.wide)?,
                false => Vec::new(),
            },
        })
    }
}
