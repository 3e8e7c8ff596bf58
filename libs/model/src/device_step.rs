//! A minibatch's step on a GPU from the rows it looked up: the unique rows copied to the
//! device once, pooled there into the placed graph's input, the graph stepped, and the
//! pooled embeddings' gradients summed onto the unique keys there. Only the keys'
//! gradients, the dense gradients and the predictions come back to the host; the pooled
//! embeddings and their gradients (`rows x embedding_width` each) never cross.

use std::time::Instant;

use primus_batch::Minibatch;
use primus_gpu::dense::DenseOps;
use primus_gpu::{
    Accumulation, CudaDense, CudaKernels, DevicePooling, DeviceTables, Pooling, PoolingInput,
    TableShape,
};

use crate::params::ParamSet;
use crate::pooling::BatchKeys;
use crate::step::{LookedUp, SparseGrads};
use crate::{Model, ModelError, Placed, StepOutput, StepTimes, graph_output};

/// Values on the device, as the placed graph holds them.
type DeviceBuffer = <CudaDense as DenseOps>::Buffer;

/// One kind of looked-up rows (embeddings, or first-order weights) on the device, with the
/// minibatch's bags over them.
struct PooledRows {
    tables: DeviceTables,
    bags: DevicePooling,
    pooling: Pooling,
}

impl PooledRows {
    fn upload(
        kernels: &CudaKernels,
        shapes: &[TableShape],
        rows: &[Vec<f32>],
        (input, pooling): (&PoolingInput, Pooling),
        what: &str,
    ) -> Result<Self, ModelError> {
        let refused = |e: primus_gpu::GpuError| ModelError::Inputs(format!("{what}: {e}"));
        let weights: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let tables = kernels.upload_tables(shapes, &weights).map_err(refused)?;
        let bags = kernels
            .upload_pooling(&tables, input, Accumulation::Deterministic)
            .map_err(refused)?;
        Ok(Self {
            tables,
            bags,
            pooling,
        })
    }

    fn pool(&self, kernels: &CudaKernels, out: &mut DeviceBuffer) -> Result<(), ModelError> {
        Ok(kernels.gather_pool_on_device(&self.tables, &self.bags, self.pooling, out)?)
    }

    /// Each table's gradient rows from the pooled values' gradient (`None`: zero).
    fn scatter(
        &self,
        kernels: &CudaKernels,
        grad: Option<&DeviceBuffer>,
        shapes: &[TableShape],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        match grad {
            Some(grad) => Ok(kernels.pool_backward_to_host(
                &self.bags,
                self.pooling,
                grad,
                Accumulation::Deterministic,
            )?),
            None => Ok((shapes.iter())
                .map(|t| vec![0.0; t.rows as usize * t.dim as usize])
                .collect()),
        }
    }
}

/// A minibatch for [`Model::train_on_device`]: its rows, keys and dense values.
pub(crate) struct DeviceMinibatch<'a> {
    pub batch: &'a Minibatch,
    pub looked_up: LookedUp<'a>,
    /// Its bags when every feature is pooled per sample (no RecD groups) the same way.
    pub input: &'a PoolingInput,
    pub pooling: Pooling,
}

impl Model {
    /// [`Model::train_minibatch`] on a placed graph, the pooling and its backward on the
    /// graph's stream.
    pub(crate) fn train_on_device(
        &self,
        placed: &mut Placed,
        params: &ParamSet,
        minibatch: DeviceMinibatch<'_>,
        on_sparse_grads: impl FnOnce(Result<SparseGrads, ModelError>),
    ) -> Result<StepOutput, ModelError> {
        let DeviceMinibatch {
            batch,
            looked_up,
            input,
            pooling,
        } = minibatch;
        let Placed { kernels, graph } = placed;
        let layout = self.layout();
        let keys: &BatchKeys = looked_up.keys;
        let dense = self.dense_inputs(batch)?;
        let labels = self.head_labels(batch)?;
        let started = Instant::now();
        let shapes = keys.embedding_shapes(layout);
        let embedded = PooledRows::upload(
            kernels,
            &shapes,
            looked_up.rows,
            (input, pooling),
            "embedding rows",
        )?;
        let wide_shapes = keys.wide_shapes();
        let wide = match layout.has_wide() {
            true => Some(PooledRows::upload(
                kernels,
                &wide_shapes,
                looked_up.wide,
                (input, pooling),
                "wide rows",
            )?),
            false => None,
        };
        let uploaded = Instant::now();
        graph.load_params(params)?;
        let loaded_params = Instant::now();
        graph.load_pooled_minibatch(batch.rows(), dense, &labels, |_, out, wide_out| {
            embedded.pool(kernels, out)?;
            if let (Some(wide), Some(out)) = (&wide, wide_out) {
                wide.pool(kernels, out)?;
            }
            // Done here, so that the step's time does not count it.
            Ok(kernels.synchronize()?)
        })?;
        let stepping = Instant::now();
        graph.step()?;
        let scattering = Instant::now();
        let grads = graph.embedding_grads()?;
        let sparse = SparseGrads {
            grads: embedded.scatter(kernels, grads.embedded, &shapes)?,
            wide_grads: match &wide {
                Some(wide) => wide.scatter(kernels, grads.wide, &wide_shapes)?,
                None => Vec::new(),
            },
        };
        on_sparse_grads(Ok(sparse));
        let copying_out = Instant::now();
        let mut output = graph_output(graph.dense_results()?);
        let copies = (loaded_params - uploaded) + copying_out.elapsed();
        output.times = StepTimes {
            pooling: (uploaded - started) + (stepping - loaded_params),
            dense: copies + (scattering - stepping),
            dense_copies: copies,
            scatter: copying_out - scattering,
        };
        Ok(output)
    }
}
