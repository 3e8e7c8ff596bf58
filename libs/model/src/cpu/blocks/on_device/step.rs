//! A placed graph's step: every node forward in dependency order, the heads' losses, then
//! every node's backward in reverse. A node's gradient is written by its first
//! contributor and added to by the rest (the operations' accumulate flags), as on the CPU.

use primus_gpu::dense::{Columns, DenseOps, DotShape, FmShape, HeadLoss, Product, Stored};

use super::{
    ByName, DeviceGraph, Values, Workspace, cross, input_runs, param, param_grad, value, workspace,
};
use crate::ModelError;
use crate::cpu::blocks::{GraphNet, GraphStep, HeadOutput, Loss, Node, Op};
use crate::cpu::in_set_order;
use crate::inputs::Inputs;
use crate::params::{ParamSet, ParamTensor};

/// One layer of an MLP node: its parameter names, widths and activation.
struct Layer {
    weight: String,
    bias: String,
    inputs: usize,
    outputs: usize,
    relu: bool,
}

fn layers(node: &Node, input_width: usize) -> Vec<Layer> {
    let Op::Mlp {
        prefix,
        widths,
        relu_hidden,
        relu_last,
    } = &node.op
    else {
        return Vec::new();
    };
    let mut inputs = input_width;
    (widths.iter().enumerate())
        .map(|(l, &outputs)| {
            let layer = Layer {
                weight: format!("{prefix}.{l}.weight"),
                bias: format!("{prefix}.{l}.bias"),
                inputs,
                outputs,
                relu: if l + 1 < widths.len() {
                    *relu_hidden
                } else {
                    *relu_last
                },
            };
            inputs = outputs;
            layer
        })
        .collect()
}

fn head_loss(loss: Loss) -> HeadLoss {
    match loss {
        Loss::BinaryCrossEntropy => HeadLoss::BinaryCrossEntropy,
        Loss::SquaredError => HeadLoss::SquaredError,
    }
}

/// Whether a dot block reads its later vectors straight from its second read (two
/// distinct reads), rather than gathered side by side first.
pub(super) fn dot_reads_directly(node: &Node) -> bool {
    matches!(node.reads[..], [a, b] if a != b)
}

impl<O: DenseOps> DeviceGraph<O> {
    /// Forward and backward on the loaded minibatch, all where the operations run (nothing
    /// is copied); returns when they are done.
    pub fn step(&mut self) -> Result<(), ModelError> {
        if self.order.is_empty() {
            return Err(ModelError::Params(
                "no parameters loaded on the device".into(),
            ));
        }
        let mut passes = self.passes()?;
        passes.forward()?;
        passes.heads()?;
        passes.backward()?;
        Ok(self.ops.finish()?)
    }

    /// The graph and its buffers, borrowed apart for a step's passes.
    fn passes(&mut self) -> Result<Passes<'_, O>, ModelError> {
        let ws = workspace(&mut self.ws)?;
        Ok(Passes {
            net: &self.net,
            ops: &mut self.ops,
            params: &self.params,
            ws,
            direct_embedded: self.direct_embedded,
        })
    }
}

/// What a step's passes work on: the graph, and the operations, parameters and buffers
/// where they run.
struct Passes<'a, O: DenseOps> {
    net: &'a GraphNet,
    ops: &'a mut O,
    params: &'a ByName<O::Buffer>,
    ws: &'a mut Workspace<O::Buffer>,
    direct_embedded: Option<usize>,
}

impl<O: DenseOps> Passes<'_, O> {
    fn forward(&mut self) -> Result<(), ModelError> {
        let net = self.net;
        let (ops, params, ws) = (&mut *self.ops, self.params, &mut *self.ws);
        let rows = ws.rows;
        for (i, node) in net.nodes.iter().enumerate() {
            let (done, rest) = ws.values.split_at_mut(i);
            let out = &mut rest[0];
            let batch = &ws.batch;
            let value = |r: usize| value(net, r, done, batch);
            match &node.op {
                Op::Dense(_) | Op::Embeddings { .. } if net.whole[i] => {}
                Op::Dense(_) | Op::Embeddings { .. } => {
                    let (runs, from_width) = input_runs(net, node).unwrap_or_default();
                    let from = match node.op {
                        Op::Dense(_) => &batch.dense,
                        _ => &batch.embedded,
                    };
                    for (from_at, at, width) in runs {
                        let moved = Columns::new(
                            rows,
                            width,
                            (from_width, from_at),
                            (node.width, at),
                            false,
                        );
                        ops.copy_columns(&mut out.layers[0], from, moved)?;
                    }
                }
                Op::FirstOrder => {
                    let product = Product::new([rows, net.features, 1]);
                    ops.matmul(&mut out.layers[0], &batch.wide, &ws.ones, product)?;
                }
                Op::Mlp { .. } => {
                    let read = node.reads[0];
                    for (l, layer) in layers(node, net.nodes[read].width).iter().enumerate() {
                        let (before, after) = out.layers.split_at_mut(l);
                        let x = before.last().map_or_else(|| value(read), Ok)?;
                        let product = Product::new([rows, layer.inputs, layer.outputs]);
                        ops.matmul(&mut after[0], x, param(params, &layer.weight)?, product)?;
                        let bias = param(params, &layer.bias)?;
                        let shape = [rows, layer.outputs];
                        ops.bias_activation(&mut after[0], bias, shape, layer.relu)?;
                    }
                }
                Op::Concat | Op::Add => {
                    let mut at = 0;
                    for (k, &r) in node.reads.iter().enumerate() {
                        let width = net.nodes[r].width;
                        let moved = match node.op {
                            Op::Concat => {
                                Columns::new(rows, width, (width, 0), (node.width, at), false)
                            }
                            _ => Columns::new(rows, width, (width, 0), (width, 0), k > 0),
                        };
                        ops.copy_columns(&mut out.layers[0], value(r)?, moved)?;
                        at += width;
                    }
                }
                Op::Dot { dim, vectors } => {
                    let shape = DotShape {
                        rows,
                        dim: *dim,
                        vectors: *vectors,
                    };
                    let first = value(node.reads[0])?;
                    if dot_reads_directly(node) {
                        let rest = value(node.reads[1])?;
                        ops.dots_forward(shape, first, rest, &mut out.layers[0])?;
                        continue;
                    }
                    let Values {
                        layers, gathered, ..
                    } = out;
                    let [rest, _] = gathered.as_mut().ok_or_else(|| no_buffers(node))?;
                    let rest_width = (vectors - 1) * dim;
                    let mut at = 0;
                    for &r in &node.reads[1..] {
                        let width = net.nodes[r].width;
                        let moved = Columns::new(rows, width, (width, 0), (rest_width, at), false);
                        ops.copy_columns(rest, value(r)?, moved)?;
                        at += width;
                    }
                    ops.dots_forward(shape, first, rest, &mut layers[0])?;
                }
                Op::Fm { vectors, dim } => {
                    let shape = FmShape {
                        rows,
                        vectors: *vectors,
                        dim: *dim,
                    };
                    ops.fm_forward(shape, value(node.reads[0])?, &mut out.layers[0])?;
                }
                Op::Cross(net) => {
                    let Values { layers, cross, .. } = out;
                    let buffers = cross.as_mut().ok_or_else(|| no_buffers(node))?;
                    let x0 = value(node.reads[0])?;
                    cross::forward(ops, (net, params), rows, x0, (layers, buffers))?;
                }
                Op::LayerNorm(_) | Op::Gate(_) | Op::Attention(_) => return Err(cpu_only(node)),
            }
        }
        Ok(())
    }

    fn heads(&mut self) -> Result<(), ModelError> {
        let net = self.net;
        let direct = self.direct_embedded;
        let (ops, ws) = (&mut *self.ops, &mut *self.ws);
        ws.written.iter_mut().for_each(|w| *w = false);
        if direct.is_none() {
            ops.fill_zero(&mut ws.embedded_grad)?;
        }
        ops.fill_zero(&mut ws.wide_grad)?;
        for (h, head) in net.heads.iter().enumerate() {
            let z = value(net, head.node, &ws.values, &ws.batch)?;
            let accumulate = std::mem::replace(&mut ws.written[head.node], true);
            ops.head_loss(
                (z, &ws.batch.labels[h]),
                ws.rows,
                (head_loss(head.loss), head.weight),
                (&mut ws.grads[head.node], accumulate),
                (&mut ws.predictions[h], &mut ws.losses[h]),
            )?;
        }
        Ok(())
    }

    fn backward(&mut self) -> Result<(), ModelError> {
        let net = self.net;
        for i in (0..net.nodes.len()).rev() {
            if !self.ws.written[i] {
                continue;
            }
            match &net.nodes[i].op {
                Op::Mlp { .. } => self.mlp_backward(i)?,
                Op::Dot { dim, vectors } => self.dot_backward(i, *dim, *vectors)?,
                Op::Embeddings { .. } if self.direct_embedded == Some(i) => {}
                Op::Embeddings { .. } | Op::FirstOrder => self.sparse_backward(i)?,
                Op::Concat | Op::Add => self.spread_backward(i)?,
                Op::Fm { vectors, dim } => self.fm_backward(i, *vectors, *dim)?,
                Op::Cross(_) => self.cross_backward(i)?,
                Op::LayerNorm(_) | Op::Gate(_) | Op::Attention(_) => {
                    return Err(cpu_only(&net.nodes[i]));
                }
                Op::Dense(_) => {}
            }
        }
        Ok(())
    }

    /// An input's gradient added into the pooled embeddings' or first-order weights'.
    fn sparse_backward(&mut self, i: usize) -> Result<(), ModelError> {
        let net = self.net;
        let node = &net.nodes[i];
        let (ops, ws) = (&mut *self.ops, &mut *self.ws);
        let rows = ws.rows;
        if let Op::FirstOrder = node.op {
            let product = Product::new([rows, 1, net.features]).accumulate(true);
            return Ok(ops.matmul(&mut ws.wide_grad, &ws.grads[i], &ws.ones, product)?);
        }
        let (runs, to_width) = input_runs(net, node).unwrap_or_default();
        for (to_at, at, width) in runs {
            let moved = Columns::new(rows, width, (node.width, at), (to_width, to_at), true);
            ops.copy_columns(&mut ws.embedded_grad, &ws.grads[i], moved)?;
        }
        Ok(())
    }

    /// A concatenation's or sum's gradient handed to each of its reads that wants one.
    fn spread_backward(&mut self, i: usize) -> Result<(), ModelError> {
        let net = self.net;
        let node = &net.nodes[i];
        let (ops, ws) = (&mut *self.ops, &mut *self.ws);
        let rows = ws.rows;
        let mut at = 0;
        for &r in &node.reads {
            let width = net.nodes[r].width;
            if net.wants_grad[r] {
                let accumulate = std::mem::replace(&mut ws.written[r], true);
                let moved = match node.op {
                    Op::Concat => {
                        Columns::new(rows, width, (node.width, at), (width, 0), accumulate)
                    }
                    _ => Columns::new(rows, width, (width, 0), (width, 0), accumulate),
                };
                let [into, grad] = disjoint(&mut ws.grads, [r, i], node)?;
                ops.copy_columns(into, grad, moved)?;
            }
            at += width;
        }
        Ok(())
    }

    fn fm_backward(&mut self, i: usize, vectors: usize, dim: usize) -> Result<(), ModelError> {
        let net = self.net;
        let node = &net.nodes[i];
        let read = node.reads[0];
        if !net.wants_grad[read] {
            return Ok(());
        }
        let (ops, ws) = (&mut *self.ops, &mut *self.ws);
        let shape = FmShape {
            rows: ws.rows,
            vectors,
            dim,
        };
        let input = value(net, read, &ws.values, &ws.batch)?;
        let accumulate = std::mem::replace(&mut ws.written[read], true);
        let [into, grad] = disjoint(&mut ws.grads, [read, i], node)?;
        Ok(ops.fm_backward(shape, input, grad, (into, accumulate))?)
    }

    fn cross_backward(&mut self, i: usize) -> Result<(), ModelError> {
        let net = self.net;
        let node = &net.nodes[i];
        let Op::Cross(cross_net) = &node.op else {
            return Ok(());
        };
        let read = node.reads[0];
        let (ops, params, ws) = (&mut *self.ops, self.params, &mut *self.ws);
        let rows = ws.rows;
        let (done, later) = ws.values.split_at_mut(i);
        let x0 = value(net, read, done, &ws.batch)?;
        let Values { layers, cross, .. } = &mut later[0];
        let buffers = cross.as_mut().ok_or_else(|| no_buffers(node))?;
        let [grad, into] = disjoint(&mut ws.grads, [i, read], node)?;
        let parts = (cross_net, params, &mut ws.param_grads);
        let grad_x0 = cross::backward(ops, parts, rows, (x0, layers, grad), buffers)?;
        if net.wants_grad[read] {
            let accumulate = std::mem::replace(&mut ws.written[read], true);
            let width = net.nodes[read].width;
            let all = Columns::new(rows, width, (width, 0), (width, 0), accumulate);
            ops.copy_columns(into, grad_x0, all)?;
        }
        Ok(())
    }

    fn mlp_backward(&mut self, i: usize) -> Result<(), ModelError> {
        let net = self.net;
        let node = &net.nodes[i];
        let read = node.reads[0];
        let (ops, params, ws) = (&mut *self.ops, self.params, &mut *self.ws);
        let rows = ws.rows;
        let layers = layers(node, net.nodes[read].width);
        // Where the current layer's output gradient is: the node's, then a scratch buffer.
        let mut current: Option<usize> = None;
        for (l, layer) in layers.iter().enumerate().rev() {
            let [first, second] = &mut ws.scratch;
            let (grad, next) = match current {
                None => (&mut ws.grads[i], first),
                Some(0) => (first, second),
                Some(_) => (second, first),
            };
            let output = &ws.values[i].layers[l];
            if layer.relu {
                ops.relu_backward(grad, output, rows * layer.outputs)?;
            }
            let bias_grad = param_grad(&mut ws.param_grads, &layer.bias)?;
            ops.column_sums(bias_grad, grad, [rows, layer.outputs])?;
            let x = match l {
                0 => value(net, read, &ws.values, &ws.batch)?,
                _ => &ws.values[i].layers[l - 1],
            };
            let weight_grad = param_grad(&mut ws.param_grads, &layer.weight)?;
            let product = Product::new([layer.inputs, rows, layer.outputs]).a(Stored::Transposed);
            ops.matmul(weight_grad, x, grad, product)?;
            let weight = param(params, &layer.weight)?;
            let input = Product::new([rows, layer.outputs, layer.inputs]).b(Stored::Transposed);
            if l > 0 {
                ops.matmul(next, grad, weight, input)?;
                current = Some(match current {
                    Some(0) => 1,
                    _ => 0,
                });
            } else if net.wants_grad[read] {
                let accumulate = std::mem::replace(&mut ws.written[read], true);
                let [into, grad] = disjoint(&mut ws.grads, [read, i], node)?;
                let grad = match current {
                    None => &*grad,
                    Some(0) => &ws.scratch[0],
                    Some(_) => &ws.scratch[1],
                };
                ops.matmul(into, grad, weight, input.accumulate(accumulate))?;
            }
        }
        Ok(())
    }

    fn dot_backward(&mut self, i: usize, dim: usize, vectors: usize) -> Result<(), ModelError> {
        let net = self.net;
        let node = &net.nodes[i];
        let a = node.reads[0];
        let (ops, ws) = (&mut *self.ops, &mut *self.ws);
        let rows = ws.rows;
        let shape = DotShape { rows, dim, vectors };
        let wants_a = net.wants_grad[a];
        let accumulate_a = wants_a && std::mem::replace(&mut ws.written[a], true);
        if dot_reads_directly(node) {
            let b = node.reads[1];
            let first = value(net, a, &ws.values, &ws.batch)?;
            let rest = value(net, b, &ws.values, &ws.batch)?;
            let wants_b = net.wants_grad[b];
            let accumulate_b = wants_b && std::mem::replace(&mut ws.written[b], true);
            let [grad_a, grad_b, grad] = disjoint(&mut ws.grads, [a, b, i], node)?;
            // A read that wants no gradient gets it in a scratch buffer, unread.
            let [first_scratch, rest_scratch] = &mut ws.scratch;
            let grad_a = if wants_a { grad_a } else { first_scratch };
            let grad_b = if wants_b { grad_b } else { rest_scratch };
            let (into_a, into_b) = ((grad_a, accumulate_a), (grad_b, accumulate_b));
            return Ok(ops.dots_backward(shape, (first, rest), grad, into_a, into_b)?);
        }
        let (done, later) = ws.values.split_at_mut(i);
        let first = value(net, a, done, &ws.batch)?;
        let [rest, rest_grad] = later[0].gathered.as_mut().ok_or_else(|| no_buffers(node))?;
        let [grad_a, grad] = disjoint(&mut ws.grads, [a, i], node)?;
        let grad_a = if wants_a { grad_a } else { &mut ws.scratch[0] };
        let into_rest = (&mut *rest_grad, false);
        ops.dots_backward(
            shape,
            (first, rest),
            grad,
            (grad_a, accumulate_a),
            into_rest,
        )?;
        let rest_width = (vectors - 1) * dim;
        let mut at = 0;
        for &r in &node.reads[1..] {
            let width = net.nodes[r].width;
            if net.wants_grad[r] {
                let accumulate = std::mem::replace(&mut ws.written[r], true);
                let moved = Columns::new(rows, width, (rest_width, at), (width, 0), accumulate);
                ops.copy_columns(&mut ws.grads[r], rest_grad, moved)?;
            }
            at += width;
        }
        Ok(())
    }
}

impl<O: DenseOps> DeviceGraph<O> {
    /// Each head's predictions (probabilities of binary heads, values of regression
    /// heads) on a minibatch of host values, for the loaded parameters: the forward pass
    /// alone.
    pub fn predict(&mut self, inputs: &Inputs<'_>) -> Result<Vec<Vec<f32>>, ModelError> {
        let zeros = vec![0.0; inputs.rows];
        let labels = vec![&zeros[..]; self.net.heads.len()];
        self.load_minibatch(inputs, &labels)?;
        if self.order.is_empty() {
            return Err(ModelError::Params(
                "no parameters loaded on the device".into(),
            ));
        }
        let mut passes = self.passes()?;
        passes.forward()?;
        // The heads turn values into predictions; their losses against zeros go unread.
        passes.heads()?;
        let Self { ops, ws, .. } = self;
        let ws = workspace(ws)?;
        (ws.predictions.iter())
            .map(|p| Ok(ops.download(p, ws.rows)?))
            .collect()
    }

    /// The last step's losses, predictions and gradients, copied to the host.
    pub fn results(&mut self) -> Result<GraphStep, ModelError> {
        self.results_with(true)
    }

    /// The last step's losses, predictions and dense gradients, copied to the host; the
    /// embeddings' gradients stay where the operations run ([`Self::embedding_grads`]).
    pub fn dense_results(&mut self) -> Result<GraphStep, ModelError> {
        self.results_with(false)
    }

    /// After a step, where the operations run: the gradient of the pooled embeddings
    /// (`rows x embedding_width`) and, where the graph reads them, of the pooled
    /// first-order weights (`rows x features`); `None` for one the step left at zero.
    pub fn embedding_grads(&self) -> Result<EmbeddingGradBuffers<'_, O::Buffer>, ModelError> {
        let ws = self
            .ws
            .as_ref()
            .ok_or_else(|| ModelError::Inputs("no minibatch loaded on the device".into()))?;
        let embedded = match self.direct_embedded {
            Some(e) => ws.written[e].then_some(&ws.grads[e]),
            None => Some(&ws.embedded_grad),
        };
        let wide = self.net.reads_first_order().then_some(&ws.wide_grad);
        Ok(EmbeddingGradBuffers { embedded, wide })
    }

    fn results_with(&mut self, embedding_grads: bool) -> Result<GraphStep, ModelError> {
        let direct = self.direct_embedded;
        let Self {
            net,
            ops,
            ws,
            order,
            ..
        } = self;
        let ws = workspace(ws)?;
        let rows = ws.rows;
        let mut heads = Vec::with_capacity(net.heads.len());
        let mut total = 0.0f32;
        for (h, head) in net.heads.iter().enumerate() {
            let losses = ops.download(&ws.losses[h], rows)?;
            let loss = (losses.iter().map(|l| f64::from(*l)).sum::<f64>() / rows as f64) as f32;
            total += head.weight * loss;
            heads.push(HeadOutput {
                name: head.name.clone(),
                loss,
                predictions: ops.download(&ws.predictions[h], rows)?,
            });
        }
        let mut dense_grads = Vec::with_capacity(net.shapes.len());
        for shape in &net.shapes {
            let len = shape.shape.iter().product();
            let values = ops.download(param_grad(&mut ws.param_grads, &shape.name)?, len)?;
            dense_grads.push(ParamTensor {
                name: shape.name.clone(),
                shape: shape.shape.clone(),
                values,
            });
        }
        let embedded_len = rows * net.embedding_width;
        let embedded_grad = match direct {
            _ if !embedding_grads => Vec::new(),
            Some(e) if ws.written[e] => ops.download(&ws.grads[e], embedded_len)?,
            Some(_) => vec![0.0; embedded_len],
            None => ops.download(&ws.embedded_grad, embedded_len)?,
        };
        let wide_grad = match net.reads_first_order() && embedding_grads {
            true => ops.download(&ws.wide_grad, rows * net.features)?,
            false => Vec::new(),
        };
        Ok(GraphStep {
            loss: total,
            heads,
            dense_grads: in_set_order(&names_only(order), dense_grads),
            embedded_grad,
            wide_grad,
        })
    }
}

/// The embeddings' gradients of a step where the operations run (see
/// [`DeviceGraph::embedding_grads`]).
pub struct EmbeddingGradBuffers<'a, B> {
    /// The pooled embeddings' (`None`: zero).
    pub embedded: Option<&'a B>,
    /// The pooled first-order weights' (`None`: the graph reads none).
    pub wide: Option<&'a B>,
}

/// A parameter set of these names (and no values), for ordering gradients as the set
/// lists its tensors.
fn names_only(order: &[String]) -> ParamSet {
    let tensors = (order.iter())
        .map(|name| ParamTensor {
            name: name.clone(),
            shape: Vec::new(),
            values: Vec::new(),
        })
        .collect();
    ParamSet { tensors }
}

/// A block with no form over the dense operations.
fn cpu_only(node: &Node) -> ModelError {
    ModelError::Ops(format!(
        "block {:?} runs on the CPU only (a layer norm, a gate or an attention)",
        node.name
    ))
}

fn no_buffers(node: &Node) -> ModelError {
    ModelError::Params(format!("{}: no buffers for its values", node.name))
}

/// Distinct nodes' gradients, mutably at once.
fn disjoint<'a, B, const N: usize>(
    grads: &'a mut [B],
    nodes: [usize; N],
    node: &Node,
) -> Result<[&'a mut B; N], ModelError> {
    grads
        .get_disjoint_mut(nodes)
        .map_err(|_| ModelError::Params(format!("{}: reads itself", node.name)))
}
