//! A compiled graph's training step over [`DenseOps`]: parameters, values and gradients
//! live where the operations run (a GPU's memory through `primus_gpu::CudaDense`, or host
//! vectors through the reference `HostDense`, which is how this composition is tested
//! without a GPU). Blocks without a form there are refused when the graph is placed,
//! naming the block: the minibatch's whole dense and embedded inputs, MLPs, and dot
//! interactions of two reads run; concatenation, sums, first-order weights, FM and cross
//! blocks and inputs of part of the columns do not yet.

use std::collections::HashMap;

use primus_gpu::dense::{DenseOps, DotShape, HeadLoss, Product, Stored};

use super::{GraphNet, GraphStep, HeadOutput, Loss, Node, Op};
use crate::ModelError;
use crate::cpu::in_set_order;
use crate::inputs::Inputs;
use crate::params::{ParamSet, ParamTensor};

/// A graph placed on [`DenseOps`], with its parameters and the buffers of one minibatch
/// size kept across steps.
pub struct DeviceGraph<'n, O: DenseOps> {
    net: &'n GraphNet,
    ops: O,
    /// Every parameter tensor by name, and the set's order of names.
    params: HashMap<String, O::Buffer>,
    order: Vec<String>,
    ws: Option<Workspace<O::Buffer>>,
}

/// A node's forward values: an MLP's every layer output (the last is the node's value),
/// a dot block's output; none for an input read where the minibatch holds it.
struct Values<B> {
    layers: Vec<B>,
}

struct Workspace<B> {
    rows: usize,
    dense: B,
    embedded: B,
    labels: Vec<B>,
    values: Vec<Values<B>>,
    grads: Vec<B>,
    written: Vec<bool>,
    /// Two buffers of the widest layer, which an MLP's backward alternates between.
    scratch: [B; 2],
    param_grads: HashMap<String, B>,
    predictions: Vec<B>,
    losses: Vec<B>,
}

impl GraphNet {
    /// This graph on `ops`, or the first block that has no form there.
    pub fn on_ops<O: DenseOps>(&self, ops: O) -> Result<DeviceGraph<'_, O>, ModelError> {
        for (i, node) in self.nodes.iter().enumerate() {
            let refuse = |reason: &str| ModelError::NotOnDevice {
                node: node.name.clone(),
                reason: reason.into(),
            };
            match &node.op {
                Op::Dense(_) | Op::Embeddings { .. } if !self.whole[i] => {
                    return Err(refuse(
                        "an input of part of the columns has no device form yet",
                    ));
                }
                Op::Dense(_) | Op::Embeddings { .. } | Op::Mlp { .. } => {}
                Op::Dot { .. } if node.reads.len() == 2 && node.reads[0] != node.reads[1] => {}
                Op::Dot { .. } => {
                    return Err(refuse(
                        "a dot block on the device reads exactly two distinct values",
                    ));
                }
                Op::Concat | Op::Add | Op::FirstOrder | Op::Fm { .. } | Op::Cross(_) => {
                    return Err(refuse("this block has no device form yet"));
                }
            }
        }
        Ok(DeviceGraph {
            net: self,
            ops,
            params: HashMap::new(),
            order: Vec::new(),
            ws: None,
        })
    }
}

fn head_loss(loss: Loss) -> HeadLoss {
    match loss {
        Loss::BinaryCrossEntropy => HeadLoss::BinaryCrossEntropy,
        Loss::SquaredError => HeadLoss::SquaredError,
    }
}

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

impl<O: DenseOps> DeviceGraph<'_, O> {
    /// Copies `params` (checked against the graph) to where the operations run.
    pub fn load_params(&mut self, params: &ParamSet) -> Result<(), ModelError> {
        self.net.check_params(params)?;
        self.params.clear();
        for tensor in &params.tensors {
            let buffer = self.ops.upload(&tensor.values)?;
            self.params.insert(tensor.name.clone(), buffer);
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
        let net = self.net;
        net.check_inputs(inputs)?;
        if labels.len() != net.heads.len() || labels.iter().any(|l| l.len() != inputs.rows) {
            return Err(ModelError::Inputs(format!(
                "{} heads need a label column of {} rows each",
                net.heads.len(),
                inputs.rows
            )));
        }
        self.prepare(inputs.rows)?;
        let Self { ops, ws, .. } = self;
        let ws = ws
            .as_mut()
            .ok_or_else(|| ModelError::Params("no workspace".into()))?;
        ws.dense = ops.upload(inputs.dense)?;
        ws.embedded = ops.upload(inputs.embedded)?;
        for (buffer, labels) in ws.labels.iter_mut().zip(labels) {
            *buffer = ops.upload(labels)?;
        }
        Ok(())
    }

    /// Forward and backward on the loaded minibatch, all where the operations run (nothing
    /// is copied); returns when they are done.
    pub fn step(&mut self) -> Result<(), ModelError> {
        if self.order.is_empty() {
            return Err(ModelError::Params(
                "no parameters loaded on the device".into(),
            ));
        }
        if self.ws.is_none() {
            return Err(ModelError::Inputs(
                "no minibatch loaded on the device".into(),
            ));
        }
        self.forward()?;
        self.heads()?;
        self.backward()?;
        Ok(self.ops.finish()?)
    }

    /// Buffers for minibatches of `rows` rows (kept while the size stays).
    fn prepare(&mut self, rows: usize) -> Result<(), ModelError> {
        if self.ws.as_ref().is_some_and(|ws| ws.rows == rows) {
            return Ok(());
        }
        let net = self.net;
        let ops = &mut self.ops;
        let mut values = Vec::with_capacity(net.nodes.len());
        let mut grads = Vec::with_capacity(net.nodes.len());
        let mut widest = 1;
        for node in &net.nodes {
            widest = widest.max(node.width);
            let layers = match &node.op {
                Op::Mlp { widths, .. } => {
                    widest = widths.iter().fold(widest, |w, v| w.max(*v));
                    (widths.iter().map(|w| ops.zeros(rows * w))).collect::<Result<_, _>>()?
                }
                Op::Dot { .. } => vec![ops.zeros(rows * node.width)?],
                _ => Vec::new(),
            };
            values.push(Values { layers });
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
            dense: ops.zeros(1)?,
            embedded: ops.zeros(1)?,
            labels: per_head(ops)?,
            values,
            written: vec![false; grads.len()],
            grads,
            scratch: [ops.zeros(rows * widest)?, ops.zeros(rows * widest)?],
            param_grads,
            predictions: per_head(ops)?,
            losses: per_head(ops)?,
        });
        Ok(())
    }

    fn forward(&mut self) -> Result<(), ModelError> {
        let net = self.net;
        let Self {
            ops, params, ws, ..
        } = self;
        let ws = ws
            .as_mut()
            .ok_or_else(|| ModelError::Params("no workspace".into()))?;
        let rows = ws.rows;
        for (i, node) in net.nodes.iter().enumerate() {
            let (done, rest) = ws.values.split_at_mut(i);
            let out = &mut rest[0];
            let value = |r: usize| value(net, r, done, &ws.dense, &ws.embedded);
            match &node.op {
                Op::Mlp { .. } => {
                    let read = node.reads[0];
                    for (l, layer) in layers(node, net.nodes[read].width).iter().enumerate() {
                        let (before, after) = out.layers.split_at_mut(l);
                        let x = before.last().map_or_else(|| value(read), Ok)?;
                        let product = Product::new([rows, layer.inputs, layer.outputs]);
                        ops.matmul(&mut after[0], x, param(params, &layer.weight)?, product)?;
                        let bias = param(params, &layer.bias)?;
                        ops.bias_activation(
                            &mut after[0],
                            bias,
                            [rows, layer.outputs],
                            layer.relu,
                        )?;
                    }
                }
                Op::Dot { dim, vectors } => {
                    let shape = DotShape {
                        rows,
                        dim: *dim,
                        vectors: *vectors,
                    };
                    let (first, rest) = (value(node.reads[0])?, value(node.reads[1])?);
                    ops.dots_forward(shape, first, rest, &mut out.layers[0])?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn heads(&mut self) -> Result<(), ModelError> {
        let net = self.net;
        let Self { ops, ws, .. } = self;
        let ws = ws
            .as_mut()
            .ok_or_else(|| ModelError::Params("no workspace".into()))?;
        ws.written.iter_mut().for_each(|w| *w = false);
        for (h, head) in net.heads.iter().enumerate() {
            let z = value(net, head.node, &ws.values, &ws.dense, &ws.embedded)?;
            let accumulate = std::mem::replace(&mut ws.written[head.node], true);
            ops.head_loss(
                (z, &ws.labels[h]),
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
            let written = self.ws.as_ref().is_some_and(|ws| ws.written[i]);
            if !written {
                continue;
            }
            match &net.nodes[i].op {
                Op::Mlp { .. } => self.mlp_backward(i)?,
                Op::Dot { dim, vectors } => self.dot_backward(i, *dim, *vectors)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn mlp_backward(&mut self, i: usize) -> Result<(), ModelError> {
        let net = self.net;
        let node = &net.nodes[i];
        let read = node.reads[0];
        let Self {
            ops, params, ws, ..
        } = self;
        let ws = ws
            .as_mut()
            .ok_or_else(|| ModelError::Params("no workspace".into()))?;
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
                0 => value(net, read, &ws.values, &ws.dense, &ws.embedded)?,
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
                let [into, grad] = ws
                    .grads
                    .get_disjoint_mut([read, i])
                    .map_err(|_| ModelError::Params(format!("{}: reads itself", node.name)))?;
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
        let (a, b) = (node.reads[0], node.reads[1]);
        let Self { ops, ws, .. } = self;
        let ws = ws
            .as_mut()
            .ok_or_else(|| ModelError::Params("no workspace".into()))?;
        let shape = DotShape {
            rows: ws.rows,
            dim,
            vectors,
        };
        let first = value(net, a, &ws.values, &ws.dense, &ws.embedded)?;
        let rest = value(net, b, &ws.values, &ws.dense, &ws.embedded)?;
        let (into_a, into_b) = (net.wants_grad[a], net.wants_grad[b]);
        let accumulate_a = into_a && std::mem::replace(&mut ws.written[a], true);
        let accumulate_b = into_b && std::mem::replace(&mut ws.written[b], true);
        let [grad_a, grad_b, grad] = ws
            .grads
            .get_disjoint_mut([a, b, i])
            .map_err(|_| ModelError::Params(format!("{}: reads itself", node.name)))?;
        // A read that wants no gradient gets it in a scratch buffer, unread.
        let [first_scratch, rest_scratch] = &mut ws.scratch;
        let grad_a = if into_a { grad_a } else { first_scratch };
        let grad_b = if into_b { grad_b } else { rest_scratch };
        ops.dots_backward(
            shape,
            (first, rest),
            grad,
            (grad_a, accumulate_a),
            (grad_b, accumulate_b),
        )?;
        Ok(())
    }

    /// The last step's losses, predictions and gradients, copied to the host.
    pub fn results(&mut self) -> Result<GraphStep, ModelError> {
        let net = self.net;
        let Self { ops, ws, order, .. } = self;
        let ws = ws
            .as_mut()
            .ok_or_else(|| ModelError::Params("no workspace".into()))?;
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
            dense_grads.push(ParamTensor {
                name: shape.name.clone(),
                shape: shape.shape.clone(),
                values: ops.download(param_grad(&mut ws.param_grads, &shape.name)?, len)?,
            });
        }
        let embedded_grad = match net
            .nodes
            .iter()
            .position(|n| matches!(n.op, Op::Embeddings { .. }))
        {
            Some(e) if ws.written[e] => ops.download(&ws.grads[e], rows * net.embedding_width)?,
            _ => vec![0.0; rows * net.embedding_width],
        };
        let set = ParamSet {
            tensors: (order.iter())
                .map(|name| ParamTensor {
                    name: name.clone(),
                    shape: Vec::new(),
                    values: Vec::new(),
                })
                .collect(),
        };
        Ok(GraphStep {
            loss: total,
            heads,
            dense_grads: in_set_order(&set, dense_grads),
            embedded_grad,
            wide_grad: Vec::new(),
        })
    }
}

/// Node `r`'s forward value: a whole input where the minibatch holds it, an MLP's last
/// layer, a dot block's output.
fn value<'a, B>(
    net: &GraphNet,
    r: usize,
    values: &'a [Values<B>],
    dense: &'a B,
    embedded: &'a B,
) -> Result<&'a B, ModelError> {
    match net.nodes[r].op {
        Op::Dense(_) => Ok(dense),
        Op::Embeddings { .. } => Ok(embedded),
        _ => values
            .get(r)
            .and_then(|v| v.layers.last())
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
