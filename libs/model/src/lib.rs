//! `primus-model`: the dense part of recommendation models and what connects it to the
//! embedding tables.
//!
//! - [`layout`]: what a Job's model and a Dataset's schema imply together (tables per
//!   feature, embedding row layout, the PS's tables) and the checks that they fit.
//! - [`params`]: dense parameters as named flat tensors (held by the PS between steps).
//! - `on_burn` (the `burn` feature): DLRM (dot interaction), DeepFM, Wide&Deep and
//!   MTRM (Primus Alg. 1) written as functions of those tensors on burn: the GPU, MTRM, and
//!   the reference for the rest.
//! - `cpu`: [`GraphNet`], a model graph (`primus_spec::job::graph`) on the CPU: its
//!   blocks (MLP, concatenation, sum, DLRM's dot interaction, the factorisation machine,
//!   DCN-v2's cross network, layer norm, MMoE's gate, DIN's attention) and heads (binary cross-entropy, squared error) forward and
//!   backward over a tuned sgemm; and [`DeviceGraph`], the same graph's step over
//!   primus-gpu's dense operations (cuBLAS and the dense kernels on a GPU).
//! - [`presets`]: DLRM, DeepFM and Wide&Deep as graphs, which [`Model`] runs on the CPU
//!   and, placed on cuBLAS, on a GPU.
//! - [`onnx`]: the dense network with its parameters as an ONNX model (for serving).
//! - [`peak`]: the machine's measured FMA peak, the ceiling of the networks' speed.
//! - [`pooling`]: unique keys per table of a minibatch, sum pooling of looked-up rows into
//!   embedding rows, and the backward scatter of pooled gradients onto unique keys.
//! - [`Model::train_minibatch`]: a trainer's step in one call: pooling, the dense network
//!   forward and backward, the scatter.
//!
//! The embedding tables themselves live on the PS (`primus-embedding`); this crate sees
//! only the rows a minibatch needs.
//!
//! Features: `burn` (default) builds the networks on burn's CPU backend, which MTRM needs;
//! `cuda` (which implies `burn`) builds them on burn's CUDA backend and its CPU backend
//! instead. A build without either trains DLRM, DeepFM and Wide&Deep and refuses MTRM with
//! [`ModelError::NoBurnBuild`].

#![warn(missing_docs)]

mod cpu;
mod device_step;
mod inputs;
pub mod layout;
#[cfg(feature = "burn")]
mod on_burn;
pub mod onnx;
pub mod params;
pub mod peak;
pub mod pooling;
pub mod presets;
mod step;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use primus_batch::Minibatch;
use primus_gpu::{CudaDense, CudaKernels};
use primus_spec::job::graph::Loss;

pub use cpu::blocks::{
    DeviceGraph, EmbeddingGradBuffers, GraphNet, GraphStep, GraphWorkspace, HeadOutput,
};
pub use inputs::{Inputs, Tower};
pub use layout::{FeatureSlot, HeadSlot, LabelColumn, ModelLayout, SequencePosition, TableSlot};
pub use params::{ParamSet, ParamTensor};
pub use step::{LookedUp, SparseGrads};

/// Where the dense network computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseDevice {
    /// The host's CPU.
    Cpu,
    /// An NVIDIA GPU by CUDA ordinal, through burn's CUDA backend.
    Cuda(usize),
}

/// Why a model cannot be built or run.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ModelError {
    /// The schema and the model do not fit; names the feature.
    #[error("feature {feature:?}: {message}")]
    Mismatch {
        /// The feature.
        feature: String,
        /// What does not fit.
        message: String,
    },
    /// The model's spec cannot be built.
    #[error("{field}: {message}")]
    Spec {
        /// The spec's field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Dense parameters that do not fit the network.
    #[error("dense parameters: {0}")]
    Params(String),
    /// A minibatch that does not fit the network.
    #[error("minibatch: {0}")]
    Inputs(String),
    /// This build has no burn backend, which the model kind needs on the CPU.
    #[error(
        "model.kind {kind}: its dense network runs on burn, and this binary was built without primus-model's burn feature"
    )]
    NoBurnBuild {
        /// The model kind.
        kind: String,
    },
    /// This build has no CUDA backend for MTRM's network (burn's).
    #[error(
        "model.kind mtrm runs on burn's CUDA backend on a GPU, and this binary was built without primus-model's cuda feature"
    )]
    NoCudaBuild,
    /// The dense operations on a device failed (the device's error, as text).
    #[error("dense operations: {0}")]
    Ops(String),
    /// The dense network's device cannot be used.
    #[error("dense network on {device:?}: {reason}")]
    Device {
        /// The device.
        device: DenseDevice,
        /// Why.
        reason: String,
    },
}

impl From<primus_gpu::GpuError> for ModelError {
    fn from(e: primus_gpu::GpuError) -> Self {
        Self::Ops(e.to_string())
    }
}

/// The result of one training step.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// The loss the step minimised (each head's mean loss times its weight, summed), before
    /// the update.
    pub loss: f32,
    /// Each head's loss and predictions before the update (progressive validation), in
    /// [`ModelLayout::heads`]' order.
    pub heads: Vec<HeadOutput>,
    /// Gradient of every dense parameter the step trained, by name; a tower that did not
    /// take part has none.
    pub dense_grads: Vec<ParamTensor>,
    /// `rows x embedding_width`: gradient of each sample's pooled embeddings (empty where
    /// they stayed on a GPU: [`Model::train_minibatch`]).
    pub embedded_grad: Vec<f32>,
    /// `rows x features`: gradient of each pooled first-order weight (wide models).
    pub wide_grad: Vec<f32>,
    /// Where the step's time went.
    pub times: StepTimes,
}

impl StepOutput {
    /// The first head's predictions: the probabilities of the four kinds' one head.
    pub fn probabilities(&self) -> &[f32] {
        self.heads.first().map_or(&[], |head| &head.predictions)
    }
}

/// Where a step's compute time went: what a trainer reports, to show what bounds it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Pooling the looked-up rows into each sample's embeddings and first-order weights.
    pub pooling: Duration,
    /// The dense network's forward and backward, its copies to and from a device included.
    pub dense: Duration,
    /// The share of `dense` spent copying parameters, the minibatch and the results
    /// between the host and a GPU (zero on the CPU).
    pub dense_copies: Duration,
    /// Summing the embeddings' gradients onto each table's unique keys.
    pub scatter: Duration,
}

impl std::ops::AddAssign<&StepTimes> for StepTimes {
    fn add_assign(&mut self, other: &StepTimes) {
        self.pooling += other.pooling;
        self.dense += other.dense;
        self.dense_copies += other.dense_copies;
        self.scatter += other.scatter;
    }
}

/// The gradients a step computes for the embeddings, handed out by
/// [`Model::train_step_with`] as soon as they are known.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddingGrads<'a> {
    /// `rows x embedding_width`: each sample's pooled embeddings'.
    pub embedded: &'a [f32],
    /// `rows x features`: each pooled first-order weight's (wide models; empty otherwise).
    pub wide: &'a [f32],
}

/// A model of one layout, computing on the CPU or a GPU.
#[derive(Clone)]
pub struct Model {
    layout: ModelLayout,
    device: DenseDevice,
    engine: Engine,
}

/// What computes the dense network.
#[derive(Clone)]
enum Engine {
    /// The model's graph on the CPU, with workspaces reused across steps (one per
    /// concurrent caller).
    Graph {
        net: Arc<GraphNet>,
        pool: Arc<Mutex<Vec<GraphWorkspace>>>,
    },
    /// The model's graph on a GPU (cuBLAS and primus-gpu's dense kernels), one placed
    /// graph per concurrent caller.
    Device {
        net: Arc<GraphNet>,
        ordinal: usize,
        pool: Arc<Mutex<Vec<Placed>>>,
    },
    /// burn on a device.
    #[cfg(feature = "burn")]
    Burn(on_burn::BurnNets),
}

/// A graph placed on a GPU, with the embedding kernels on the stream its operations use.
struct Placed {
    kernels: CudaKernels,
    graph: DeviceGraph<CudaDense>,
}

/// `net` on GPU `ordinal`, or why it cannot run there.
fn placed(net: &GraphNet, ordinal: usize) -> Result<Placed, ModelError> {
    if let Some((block, kind)) = net.cpu_only_block() {
        return Err(ModelError::Device {
            device: DenseDevice::Cuda(ordinal),
            reason: format!("block {block:?} is {kind}, which runs on the CPU only"),
        });
    }
    let unusable = |e: primus_gpu::GpuError| ModelError::Device {
        device: DenseDevice::Cuda(ordinal),
        reason: e.to_string(),
    };
    let kernels = CudaKernels::new(ordinal).map_err(unusable)?;
    let dense = kernels.dense().map_err(unusable)?;
    Ok(Placed {
        kernels,
        graph: net.on_ops(dense),
    })
}

impl Model {
    /// On the CPU: a graph model, and DLRM, DeepFM and Wide&Deep as their graphs
    /// ([`presets`]); MTRM on burn (which a build without the `burn` feature lacks).
    pub fn new(layout: ModelLayout) -> Result<Self, ModelError> {
        if let Some(spec) = presets::model_graph(&layout) {
            let net = GraphNet::new(&spec, &layout, "model")?;
            return Ok(Self {
                layout,
                device: DenseDevice::Cpu,
                engine: Engine::Graph {
                    net: Arc::new(net),
                    pool: Arc::default(),
                },
            });
        }
        #[cfg(feature = "burn")]
        return Self::burn_cpu(layout);
        #[cfg(not(feature = "burn"))]
        Err(ModelError::NoBurnBuild {
            kind: format!("{:?}", layout.kind).to_lowercase(),
        })
    }

    /// Every model kind but `graph` on burn's CPU backend: the reference the CPU graphs
    /// are tested against, and the dense step bench's baseline.
    #[cfg(feature = "burn")]
    pub fn burn_cpu(layout: ModelLayout) -> Result<Self, ModelError> {
        if layout.kind == primus_spec::job::ModelKind::Graph {
            return Err(ModelError::Spec {
                field: "spec.model.kind".into(),
                message: "a graph runs on the graph engine; burn runs the four kinds".into(),
            });
        }
        Ok(Self {
            layout,
            device: DenseDevice::Cpu,
            engine: Engine::Burn(on_burn::BurnNets::cpu()),
        })
    }

    /// On `device`. On a GPU, graph models, DLRM, DeepFM and Wide&Deep run their graphs on cuBLAS and
    /// primus-gpu's dense kernels; MTRM runs on burn's CUDA backend, which needs the `cuda`
    /// feature. Without a usable device, or the feature MTRM needs, this says which is
    /// missing.
    pub fn on(layout: ModelLayout, device: DenseDevice) -> Result<Self, ModelError> {
        let DenseDevice::Cuda(ordinal) = device else {
            return Self::new(layout);
        };
        if let Some(spec) = presets::model_graph(&layout) {
            let net = GraphNet::new(&spec, &layout, "model")?;
            // Placed once now, so that a device that cannot be used is refused here.
            let first = placed(&net, ordinal)?;
            return Ok(Self {
                layout,
                device,
                engine: Engine::Device {
                    net: Arc::new(net),
                    ordinal,
                    pool: Arc::new(Mutex::new(vec![first])),
                },
            });
        }
        #[cfg(feature = "burn")]
        return Ok(Self {
            layout,
            device,
            engine: Engine::Burn(on_burn::BurnNets::cuda(ordinal)?),
        });
        #[cfg(not(feature = "burn"))]
        Err(ModelError::NoCudaBuild)
    }

    /// Runs `f` with a placed graph from the pool (placing one when all are in use),
    /// returned to the pool after.
    fn with_placed<T>(
        (net, ordinal, pool): (&GraphNet, usize, &Mutex<Vec<Placed>>),
        f: impl FnOnce(&mut Placed) -> Result<T, ModelError>,
    ) -> Result<T, ModelError> {
        let taken = pool.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut placed = match taken {
            Some(placed) => placed,
            None => placed(net, ordinal)?,
        };
        let out = f(&mut placed);
        pool.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(placed);
        out
    }

    /// Runs `f` with a workspace of the CPU graph, returned to the pool after.
    fn with_workspace<T>(
        pool: &Mutex<Vec<GraphWorkspace>>,
        f: impl FnOnce(&mut GraphWorkspace) -> T,
    ) -> T {
        let taken = pool.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut workspace = taken.unwrap_or_default();
        let out = f(&mut workspace);
        pool.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(workspace);
        out
    }

    /// Where the dense network runs.
    pub fn device(&self) -> DenseDevice {
        self.device
    }

    /// The layout it was built for.
    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    fn check(&self, inputs: &Inputs<'_>, labels: Option<&[&[f32]]>) -> Result<(), ModelError> {
        let rows = inputs.rows;
        let wide = if self.layout.has_wide() {
            self.layout.features.len()
        } else {
            0
        };
        let checks = [
            ("dense", inputs.dense.len(), rows * self.layout.dense_inputs),
            (
                "embedded",
                inputs.embedded.len(),
                rows * self.layout.embedding_width,
            ),
            ("wide", inputs.wide.len(), rows * wide),
        ];
        let heads = self.layout.heads.len();
        if let Some(labels) = labels
            && labels.len() != heads
        {
            return Err(ModelError::Inputs(format!(
                "{} label columns for {heads} heads",
                labels.len()
            )));
        }
        let label_checks = (labels.unwrap_or_default().iter().zip(&self.layout.heads))
            .map(|(labels, head)| (head.column_name.as_str(), labels.len(), rows));
        for (what, got, want) in checks.into_iter().chain(label_checks) {
            if got != want {
                return Err(ModelError::Inputs(format!(
                    "{what} holds {got} values, {rows} rows need {want}"
                )));
            }
        }
        if rows == 0 {
            return Err(ModelError::Inputs("no rows".into()));
        }
        Ok(())
    }

    /// Forward and backward on one minibatch; the parameters are not changed (the PS
    /// applies the gradients).
    pub fn train_step(
        &self,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        labels: &[&[f32]],
        tower: Tower,
    ) -> Result<StepOutput, ModelError> {
        self.train_step_with(params, inputs, labels, tower, |_| {})
    }

    /// [`Model::train_step`], handing `on_embedding_grads` the embeddings' gradients as
    /// soon as they are known: for DLRM on the CPU, before its bottom MLP's backward, so
    /// that a caller can push them while the rest of the step computes.
    pub fn train_step_with(
        &self,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        labels: &[&[f32]],
        tower: Tower,
        on_embedding_grads: impl FnOnce(EmbeddingGrads<'_>),
    ) -> Result<StepOutput, ModelError> {
        self.check(inputs, Some(labels))?;
        #[cfg(not(feature = "burn"))]
        let _only_mtrm_reads_it = tower;
        match &self.engine {
            Engine::Graph { net, pool } => Self::with_workspace(pool, |ws| {
                let step = net.train_step_with(params, inputs, labels, ws, on_embedding_grads)?;
                Ok(graph_output(step))
            }),
            Engine::Device { net, ordinal, pool } => {
                Self::with_placed((net, *ordinal, pool), |Placed { graph, .. }| {
                    let copying_in = Instant::now();
                    graph.load_params(params)?;
                    graph.load_minibatch(inputs, labels)?;
                    let stepping = Instant::now();
                    graph.step()?;
                    let copying_out = Instant::now();
                    let step = graph.results()?;
                    let copies = (stepping - copying_in) + copying_out.elapsed();
                    on_embedding_grads(EmbeddingGrads {
                        embedded: &step.embedded_grad,
                        wide: &step.wide_grad,
                    });
                    let mut output = graph_output(step);
                    output.times.dense_copies = copies;
                    Ok(output)
                })
            }
            #[cfg(feature = "burn")]
            Engine::Burn(nets) => {
                let output = nets.train_step(&self.layout, params, inputs, labels[0], tower);
                on_embedding_grads(EmbeddingGrads {
                    embedded: &output.embedded_grad,
                    wide: &output.wide_grad,
                });
                Ok(output)
            }
        }
    }

    /// Probabilities of the minibatch (the first head's predictions), with the tower that
    /// serves it.
    pub fn predict(
        &self,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        tower: Tower,
    ) -> Result<Vec<f32>, ModelError> {
        let heads = self.predict_heads(params, inputs, tower)?;
        Ok(heads.into_iter().next().unwrap_or_default())
    }

    /// Each head's predictions of the minibatch (probabilities of binary heads, values of
    /// regression heads), in [`ModelLayout::heads`]' order, with the tower that serves it.
    pub fn predict_heads(
        &self,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        tower: Tower,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.check(inputs, None)?;
        #[cfg(not(feature = "burn"))]
        let _only_mtrm_reads_it = tower;
        match &self.engine {
            Engine::Graph { net, pool } => {
                Self::with_workspace(pool, |ws| net.predict(params, inputs, ws))
            }
            Engine::Device { net, ordinal, pool } => {
                Self::with_placed((net, *ordinal, pool), |Placed { graph, .. }| {
                    graph.load_params(params)?;
                    graph.predict(inputs)
                })
            }
            #[cfg(feature = "burn")]
            Engine::Burn(nets) => Ok(vec![nets.predict(&self.layout, params, inputs, tower)]),
        }
    }

    /// Each head's labels in `batch`, in the layout's order: the Dataset's label or one of
    /// its targets, which must be the ones the layout names, in [0, 1] under a binary head.
    pub fn head_labels<'a>(&self, batch: &'a Minibatch) -> Result<Vec<&'a [f32]>, ModelError> {
        let layout = &self.layout;
        let carried = || batch.targets.iter().map(|t| &t.name);
        if !carried().eq(layout.targets.iter()) {
            return Err(ModelError::Inputs(format!(
                "targets {:?}, the model expects {:?}",
                carried().collect::<Vec<_>>(),
                layout.targets
            )));
        }
        let column = |head: &HeadSlot| -> Result<&'a [f32], ModelError> {
            let values = match head.column {
                LabelColumn::Label => &batch.labels,
                LabelColumn::Target(t) => &batch.targets[t].values,
            };
            let binary = head.loss == Loss::BinaryCrossEntropy;
            if binary && let Some(v) = values.iter().find(|v| !(0.0..=1.0).contains(*v)) {
                return Err(ModelError::Inputs(format!(
                    "head {:?} is binary, and its label column {:?} holds {v}, not in [0, 1]",
                    head.name, head.column_name
                )));
            }
            Ok(values)
        };
        layout.heads.iter().map(column).collect()
    }

    /// The minibatch's dense features, checked against the layout's names.
    pub fn dense_inputs<'a>(&self, batch: &'a Minibatch) -> Result<&'a [f32], ModelError> {
        if batch.dense.names != self.layout.dense_names {
            return Err(ModelError::Inputs(format!(
                "dense features {:?}, the model expects {:?}",
                batch.dense.names, self.layout.dense_names
            )));
        }
        Ok(&batch.dense.values)
    }
}

/// A graph's step as a step of its model.
fn graph_output(step: GraphStep) -> StepOutput {
    StepOutput {
        loss: step.loss,
        heads: step.heads,
        dense_grads: step.dense_grads,
        embedded_grad: step.embedded_grad,
        wide_grad: step.wide_grad,
        times: StepTimes::default(),
    }
}
