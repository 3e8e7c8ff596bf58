//! A compiled graph's training step over [`DenseOps`]: parameters, values and gradients
//! live where the operations run (a GPU's memory through `primus_gpu::CudaDense`, or host
//! vectors through the reference `HostDense`, which is how this composition is tested
//! without a GPU). This file places a graph and holds its buffers; `on_device/step.rs`
//! runs it, `on_device/cross.rs` its cross networks. Every block has a form there.

mod cross;
mod step;

pub use step::EmbeddingGradBuffers;

use std::collections::HashMap;
use std::sync::Arc;

use primus_gpu::dense::DenseOps;

use super::{GraphNet, GraphStep, Node, Op};
use crate::ModelError;
use crate::inputs::Inputs;
use crate::params::ParamSet;

/// Buffers by parameter name.
type ByName<B> = HashMap<String, B>;

/// A graph placed on [`DenseOps`], with its parameters and the buffers of one minibatch
/// size kept across steps.
pub struct DeviceGraph<O: DenseOps> {
    net: Arc<GraphNet>,
    ops: O,
    /// Every parameter tensor by name, and the set's order of names.
    params: ByName<O::Buffer>,
    order: Vec<String>,
    /// The one embeddings input when it takes every pooled column: its gradient is the
    /// pooled embeddings' gradient itself, not added into a buffer of its own.
    direct_embedded: Option<usize>,
    ws: Option<Workspace<O::Buffer>>,
}

/// A minibatch where the operations run.
struct Minibatch<B> {
    dense: B,
    embedded: B,
    wide: B,
    labels: Vec<B>,
}

/// A node's forward values: an MLP's every layer output (the last is the node's value),
/// any other block's output; none for an input read where the minibatch holds it. A dot
/// block over more than two reads also keeps its later reads side by side, and their
/// gradient.
struct Values<B> {
    layers: Vec<B>,
    gathered: Option<[B; 2]>,
    cross: Option<cross::CrossBuffers<B>>,
}

struct Workspace<B> {
    rows: usize,
    batch: Minibatch<B>,
    values: Vec<Values<B>>,
    grads: Vec<B>,
    written: Vec<bool>,
    /// Two buffers of the widest value, which an MLP's backward alternates between.
    scratch: [B; 2],
    param_grads: ByName<B>,
    /// The pooled embeddings' and first-order weights' gradients, added into.
    embedded_grad: B,
    wide_grad: B,
    /// A column of ones as long as the features: first-order sums are products with it.
    ones: B,
    predictions: Vec<B>,
    losses: Vec<B>,
}

impl GraphNet {
    /// This graph on `ops`: its parameters, values and gradients held there.
    pub fn on_ops<O: DenseOps>(&self, ops: O) -> DeviceGraph<O> {
        let embeddings: Vec<usize> = (0..self.nodes.len())
            .filter(|i| matches!(self.nodes[*i].op, Op::Embeddings { .. }))
            .collect();
        let direct_embedded = match embeddings[..] {
            [only] if self.whole[only] => Some(only),
            _ => None,
        };
        DeviceGraph {
            net: Arc::new(self.clone()),
            ops,
            params: HashMap::new(),
            order: Vec::new(),
            direct_embedded,
            ws: None,
        }
    }
}

/// A contiguous block of an input's columns: `(first source column, first node column,
/// width)`.
type Run = (usize, usize, usize);

/// Contiguous runs of `columns`.
fn runs(columns: &[usize]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (at, &column) in columns.iter().enumerate() {
        match runs.last_mut() {
            Some((from, _, width)) if *from + *width == column => *width += 1,
            _ => runs.push((column, at, 1)),
        }
    }
    runs
}

/// Where an input node's columns come from, and the source's width.
fn input_runs(net: &GraphNet, node: &Node) -> Option<(Vec<Run>, usize)> {
    match &node.op {
        Op::Dense(columns) => Some((runs(columns), net.dense_width)),
        Op::Embeddings { segments } => {
            let mut at = 0;
            let runs = (segments.iter())
                .map(|(offset, dim)| {
                    at += dim;
                    (*offset, at - dim, *dim)
                })
                .collect();
            Some((runs, net.embedding_width))
        }
        _ => None,
    }
}

impl<O: DenseOps> DeviceGraph<O> {
    /// Copies `params` (checked against the graph) to where the operations run, into the
    /// buffers of the previous load.
    pub fn load_params(&mut self, params: &ParamSet) -> Result<(), ModelError> {
        self.net.check_params(params)?;
        self.params
            .retain(|name, _| params.tensors.iter().any(|t| t.name == *name));
        for tensor in &params.tensors {
            match self.params.get_mut(&tensor.name) {
                Some(buffer) => store(&mut self.ops, buffer, &tensor.values)?,
                None => {
                    let buffer = self.ops.upload(&tensor.values)?;
                    self.params.insert(tensor.name.clone(), buffer);
                }
            }
        }
        self.order = params.tensors.iter().map(|t| t.name.clone()).collect();
        Ok(())
    }

    /// Forward and backward on one minibatch of host values, `labels[h]` holding head
    /// `h`'s labels: what [`GraphNet::train_step`] returns for the loaded parameters. The
    /// minibatch is copied in, and the step's results out.
    pub fn train_step(
        &mut self,
        inputs: &Inputs<'_>,
        labels: &[&[f32]],
    ) -> Result<GraphStep, ModelError> {
        self.load_minibatch(inputs, labels)?;
        self.step()?;
        self.results()
    }

    /// Copies a minibatch of host values to where the operations run.
    pub fn load_minibatch(
        &mut self,
        inputs: &Inputs<'_>,
        labels: &[&[f32]],
    ) -> Result<(), ModelError> {
        self.net.check_inputs(inputs)?;
        self.load(inputs.rows, inputs.dense, labels, |ops, batch| {
            store(ops, &mut batch.embedded, inputs.embedded)?;
            store(ops, &mut batch.wide, inputs.wide)
        })
    }

    /// Copies a minibatch's dense values and labels to where the operations run, and has
    /// `pool` write its pooled embeddings (`rows x embedding_width`) and, where the graph
    /// reads them, its pooled first-order weights (`rows x features`) into their buffers
    /// there (with the operations): the pooled values need not be on the host.
    pub fn load_pooled_minibatch(
        &mut self,
        rows: usize,
        dense: &[f32],
        labels: &[&[f32]],
        pool: impl FnOnce(&mut O, &mut O::Buffer, Option<&mut O::Buffer>) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let net = Arc::clone(&self.net);
        if dense.len() != rows * net.dense_width || rows == 0 {
            return Err(ModelError::Inputs(format!(
                "dense holds {} values, {rows} rows need {} (and at least one row)",
                dense.len(),
                rows * net.dense_width
            )));
        }
        let wide = net.reads_first_order().then_some(rows * net.features);
        self.load(rows, dense, labels, |ops, batch| {
            sized(ops, &mut batch.embedded, rows * net.embedding_width)?;
            if let Some(floats) = wide {
                sized(ops, &mut batch.wide, floats)?;
            }
            pool(ops, &mut batch.embedded, wide.map(|_| &mut batch.wide))
        })
    }

    /// Copies the dense values and labels of a checked minibatch of `rows` rows, then has
    /// `fill` place its embeddings.
    fn load(
        &mut self,
        rows: usize,
        dense: &[f32],
        labels: &[&[f32]],
        fill: impl FnOnce(&mut O, &mut Minibatch<O::Buffer>) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let heads = self.net.heads.len();
        if labels.len() != heads || labels.iter().any(|l| l.len() != rows) {
            return Err(ModelError::Inputs(format!(
                "{heads} heads need a label column of {rows} rows each"
            )));
        }
        self.prepare(rows)?;
        let Self { ops, ws, .. } = self;
        let batch = &mut workspace(ws)?.batch;
        store(ops, &mut batch.dense, dense)?;
        for (buffer, labels) in batch.labels.iter_mut().zip(labels) {
            store(ops, buffer, labels)?;
        }
        fill(ops, batch)
    }

    /// Buffers for minibatches of `rows` rows (kept while the size stays).
    fn prepare(&mut self, rows: usize) -> Result<(), ModelError> {
        if self.ws.as_ref().is_some_and(|ws| ws.rows == rows) {
            return Ok(());
        }
        let net = Arc::clone(&self.net);
        let net = &*net;
        let ops = &mut self.ops;
        let mut values = Vec::with_capacity(net.nodes.len());
        let mut grads = Vec::with_capacity(net.nodes.len());
        let mut widest = 1;
        for (i, node) in net.nodes.iter().enumerate() {
            widest = widest.max(node.width);
            let mut cross_buffers = None;
            let layers = match &node.op {
                Op::Mlp { widths, .. } => {
                    widest = widths.iter().fold(widest, |w, v| w.max(*v));
                    (widths.iter().map(|w| ops.zeros(rows * w))).collect::<Result<_, _>>()?
                }
                Op::Cross(net) => {
                    cross_buffers = Some(cross::buffers(ops, net, rows)?);
                    cross::outputs(ops, net, rows)?
                }
                Op::Dense(_) | Op::Embeddings { .. } if net.whole[i] => Vec::new(),
                _ => vec![ops.zeros(rows * node.width)?],
            };
            let gathered = match node.op {
                Op::Dot { dim, vectors } if !step::dot_reads_directly(node) => {
                    let width = rows * (vectors - 1) * dim;
                    Some([ops.zeros(width)?, ops.zeros(width)?])
                }
                _ => None,
            };
            values.push(Values {
                layers,
                gathered,
                cross: cross_buffers,
            });
            grads.push(ops.zeros(rows * node.width)?);
        }
        let mut param_grads = HashMap::new();
        for shape in &net.shapes {
            let len = shape.shape.iter().product();
            param_grads.insert(shape.name.clone(), ops.zeros(len)?);
        }
        let heads = net.heads.len();
        let per_head = |ops: &mut O| -> Result<Vec<O::Buffer>, ModelError> {
            (0..heads).map(|_| Ok(ops.zeros(rows)?)).collect()
        };
        self.ws = Some(Workspace {
            rows,
            batch: Minibatch {
                dense: ops.zeros(1)?,
                embedded: ops.zeros(1)?,
                wide: ops.zeros(1)?,
                labels: per_head(ops)?,
            },
            values,
            written: vec![false; grads.len()],
            grads,
            scratch: [ops.zeros(rows * widest)?, ops.zeros(rows * widest)?],
            param_grads,
            embedded_grad: ops.zeros(rows * net.embedding_width)?,
            wide_grad: ops.zeros(rows * net.features)?,
            ones: ops.upload(&vec![1.0; net.features.max(1)])?,
            predictions: per_head(ops)?,
            losses: per_head(ops)?,
        });
        Ok(())
    }
}

fn workspace<B>(ws: &mut Option<Workspace<B>>) -> Result<&mut Workspace<B>, ModelError> {
    ws.as_mut()
        .ok_or_else(|| ModelError::Inputs("no minibatch loaded on the device".into()))
}

/// Node `r`'s forward value: a whole input where the minibatch holds it, an MLP's last
/// layer, any other block's output.
fn value<'a, B>(
    net: &GraphNet,
    r: usize,
    values: &'a [Values<B>],
    batch: &'a Minibatch<B>,
) -> Result<&'a B, ModelError> {
    match net.nodes[r].op {
        Op::Dense(_) if net.whole[r] => Ok(&batch.dense),
        Op::Embeddings { .. } if net.whole[r] => Ok(&batch.embedded),
        _ => (values.get(r).and_then(|v| v.layers.last()))
            .ok_or_else(|| ModelError::Params(format!("{} has no value yet", net.nodes[r].name))),
    }
}

fn param<'a, B>(params: &'a HashMap<String, B>, name: &str) -> Result<&'a B, ModelError> {
    params
        .get(name)
        .ok_or_else(|| ModelError::Params(format!("the set has no tensor {name:?}")))
}

fn param_grad<'a, B>(
    grads: &'a mut HashMap<String, B>,
    name: &str,
) -> Result<&'a mut B, ModelError> {
    grads
        .get_mut(name)
        .ok_or_else(|| ModelError::Params(format!("no gradient buffer for {name:?}")))
}

/// `buffer` with room for exactly `floats` values (a new one where its size differs).
fn sized<O: DenseOps>(
    ops: &mut O,
    buffer: &mut O::Buffer,
    floats: usize,
) -> Result<(), ModelError> {
    if O::floats(buffer) != floats {
        *buffer = ops.zeros(floats)?;
    }
    Ok(())
}

/// Copies `values` into `buffer` where it has their length (every step after the first of
/// a size), else into a new buffer: a step allocates nothing on the device once warm.
fn store<O: DenseOps>(
    ops: &mut O,
    buffer: &mut O::Buffer,
    values: &[f32],
) -> Result<(), ModelError> {
    if O::floats(buffer) == values.len() {
        ops.write(buffer, values)?;
    } else if !values.is_empty() {
        *buffer = ops.upload(values)?;
    }
    Ok(())
}
