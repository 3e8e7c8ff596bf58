//! A compiled graph forward and backward: each node's values in dependency order, the
//! heads' losses, then each node's gradient in reverse, first the nodes that lead to the
//! embeddings (whose gradients go out as soon as they are complete), then the rest.
//! A node's gradient is written by its first contributor and added into by the others,
//! and a block writes straight into its read's gradient where it can: the pooled
//! embeddings are the widest values of a step, and each extra pass over them costs about
//! as much as a small layer.

use crate::cpu::interaction::{Dots, fm_backward, fm_forward};
use crate::cpu::linalg::sized;
use crate::cpu::mlp::{Activations, GradBuffers, InputGrad, Stack};
use crate::cpu::{in_set_order, sigmoid};
use crate::inputs::Inputs;
use crate::params::{ParamSet, ParamTensor};
use crate::{EmbeddingGrads, ModelError};

use super::attention::{AttentionActs, AttentionGrads};
use super::cross::CrossActs;
use super::gate::{Gate, GateActs};
use super::norm::NormActs;
use super::{GraphNet, Loss, Node, Op};

/// One training step of a graph.
#[derive(Debug, Clone)]
pub struct GraphStep {
    /// Every head's mean loss times its weight, summed: what the step minimised.
    pub loss: f32,
    /// Each head's loss and predictions, in [`GraphNet::heads`]' order.
    pub heads: Vec<HeadOutput>,
    /// Gradient of every dense parameter, in the parameter set's order.
    pub dense_grads: Vec<ParamTensor>,
    /// `rows x embedding_width`: gradient of each sample's pooled embeddings.
    pub embedded_grad: Vec<f32>,
    /// `rows x features`: gradient of each pooled first-order weight (empty without a
    /// first-order input).
    pub wide_grad: Vec<f32>,
}

/// What one head computed on a minibatch.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadOutput {
    /// The head's name.
    pub name: String,
    /// Its mean loss before the update (unweighted).
    pub loss: f32,
    /// Per row: the probability (binary heads) or the predicted value (regression heads).
    pub predictions: Vec<f32>,
}

/// Every node's values and gradients, kept between forward and backward and across steps.
#[derive(Default)]
pub struct GraphWorkspace {
    values: Vec<Vec<f32>>,
    grads: NodeGrads,
    mlp: Vec<Activations>,
    cross: Vec<CrossActs>,
    norm: Vec<NormActs>,
    gate: Vec<GateActs>,
    attention: Vec<AttentionActs>,
    /// An attention block's query's and sequence's gradients.
    attention_grads: (Vec<f32>, Vec<f32>),
    /// A gate's experts' gradients.
    expert_grads: Vec<Vec<f32>>,
    buffers: GradBuffers,
    /// A dot block's vectors after its first input, gathered.
    gathered: Vec<f32>,
    scratch: Vec<f32>,
    scratch_first: Vec<f32>,
}

/// Each node's gradient in a step. Nothing zeroes them first: the first contribution is
/// written, later ones are added, and a node nothing wrote to has no backward.
#[derive(Default)]
struct NodeGrads {
    values: Vec<Vec<f32>>,
    written: Vec<bool>,
}

impl NodeGrads {
    /// A step over `rows` rows of nodes of these widths: nothing written yet.
    fn start(&mut self, rows: usize, widths: impl ExactSizeIterator<Item = usize>) {
        self.values.resize_with(widths.len(), Vec::new);
        for (values, width) in self.values.iter_mut().zip(widths) {
            if values.is_empty() {
                // Handed out last step (the pooled embeddings'): zeroed pages, not a pass.
                *values = vec![0.0; rows * width];
            } else {
                values.resize(rows * width, 0.0);
            }
        }
        self.written.clear();
        self.written.resize(self.values.len(), false);
    }

    fn written(&self, node: usize) -> bool {
        self.written[node]
    }

    /// Node `node`'s gradient to write whole, and whether to add to it (true) or write
    /// over it (false, the first contribution).
    fn slot(&mut self, node: usize) -> (&mut [f32], bool) {
        let accumulate = std::mem::replace(&mut self.written[node], true);
        (&mut self.values[node], accumulate)
    }

    /// Adds `grad` into node `node`'s gradient.
    fn add(&mut self, node: usize, grad: &[f32]) {
        match self.slot(node) {
            (into, true) => add(into, grad),
            (into, false) => into.copy_from_slice(grad),
        }
    }

    /// Adds columns `at..at + width` of each row of `grad` (`grad_width` per row) into
    /// node `node`'s gradient (`width` per row).
    fn add_columns(
        &mut self,
        node: usize,
        grad: &[f32],
        grad_width: usize,
        at: usize,
        width: usize,
    ) {
        let (into, accumulate) = self.slot(node);
        let rows = into
            .chunks_exact_mut(width)
            .zip(grad.chunks_exact(grad_width));
        for (into, row) in rows {
            let row = &row[at..at + width];
            match accumulate {
                true => add(into, row),
                false => into.copy_from_slice(row),
            }
        }
    }

    /// Node `node`'s gradient, taken out for its backward (put back with [`Self::put`]).
    fn take(&mut self, node: usize) -> Vec<f32> {
        std::mem::take(&mut self.values[node])
    }

    fn put(&mut self, node: usize, grad: Vec<f32>) {
        self.values[node] = grad;
    }
}

impl GraphNet {
    /// Checks that `params` holds exactly the graph's tensors, each of its shape.
    pub(super) fn check_params(&self, params: &ParamSet) -> Result<(), ModelError> {
        let shapes = &self.shapes;
        if shapes.len() != params.tensors.len() {
            return Err(ModelError::Params(format!(
                "{} tensors given, the graph has {}",
                params.tensors.len(),
                shapes.len()
            )));
        }
        for shape in shapes {
            match params.get(&shape.name) {
                Some(t) if t.shape == shape.shape => {}
                Some(t) => {
                    return Err(ModelError::Params(format!(
                        "tensor {:?}: shape {:?} given, the graph's is {:?}",
                        shape.name, t.shape, shape.shape
                    )));
                }
                None => {
                    return Err(ModelError::Params(format!(
                        "the set has no tensor {:?}",
                        shape.name
                    )));
                }
            }
        }
        Ok(())
    }

    pub(super) fn check_inputs(&self, inputs: &Inputs<'_>) -> Result<(), ModelError> {
        let rows = inputs.rows;
        let wide = if self.reads_first_order() {
            self.features
        } else {
            0
        };
        for (what, got, want) in [
            ("dense", inputs.dense.len(), rows * self.dense_width),
            (
                "embedded",
                inputs.embedded.len(),
                rows * self.embedding_width,
            ),
            ("wide", inputs.wide.len(), rows * wide),
        ] {
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

    pub(super) fn reads_first_order(&self) -> bool {
        self.nodes.iter().any(|n| matches!(n.op, Op::FirstOrder))
    }

    /// Forward and backward on one minibatch, `labels[h]` holding head `h`'s label per
    /// row ([`GraphNet::heads`]' order); the parameters are not changed.
    pub fn train_step(
        &self,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        labels: &[&[f32]],
        ws: &mut GraphWorkspace,
    ) -> Result<GraphStep, ModelError> {
        self.train_step_with(params, inputs, labels, ws, |_| {})
    }

    /// [`GraphNet::train_step`], handing `on_embedding_grads` the embeddings' gradients
    /// as soon as they are complete: before the backward of the blocks that lead to none
    /// (an MLP over the dense features).
    pub fn train_step_with(
        &self,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        labels: &[&[f32]],
        ws: &mut GraphWorkspace,
        on_embedding_grads: impl FnOnce(EmbeddingGrads<'_>),
    ) -> Result<GraphStep, ModelError> {
        self.check_params(params)?;
        self.check_inputs(inputs)?;
        if labels.len() != self.heads.len() {
            return Err(ModelError::Inputs(format!(
                "{} label columns given, the graph has {} heads",
                labels.len(),
                self.heads.len()
            )));
        }
        if let Some((h, l)) = (labels.iter().enumerate()).find(|(_, l)| l.len() != inputs.rows) {
            return Err(ModelError::Inputs(format!(
                "head {:?}: {} labels for {} rows",
                self.heads[h].name,
                l.len(),
                inputs.rows
            )));
        }
        self.forward(params, inputs, ws)?;
        let rows = inputs.rows;
        ws.grads.start(rows, self.nodes.iter().map(|n| n.width));
        let mut heads = Vec::with_capacity(self.heads.len());
        let mut total = 0.0f32;
        for (head, labels) in self.heads.iter().zip(labels) {
            let node = head.node;
            let (loss, predictions) = head_loss(
                head.loss,
                self.value(node, &ws.values, inputs),
                labels,
                head.weight,
                ws.grads.slot(node),
            );
            total += head.weight * loss;
            heads.push(HeadOutput {
                name: head.name.clone(),
                loss,
                predictions,
            });
        }
        let mut grads = Vec::new();
        let mut embedded_grad = Vec::new();
        let mut wide_grad = if self.reads_first_order() {
            vec![0.0; rows * self.features]
        } else {
            Vec::new()
        };
        let leads = &self.leads_to_sparse;
        for i in (0..self.nodes.len()).rev().filter(|i| leads[*i]) {
            let sparse = (&mut embedded_grad, &mut wide_grad);
            grads.extend(self.backward_node(i, params, inputs, ws, sparse)?);
        }
        if embedded_grad.is_empty() {
            embedded_grad = vec![0.0; rows * self.embedding_width];
        }
        on_embedding_grads(EmbeddingGrads {
            embedded: &embedded_grad,
            wide: &wide_grad,
        });
        for i in (0..self.nodes.len()).rev().filter(|i| !leads[*i]) {
            let sparse = (&mut embedded_grad, &mut wide_grad);
            grads.extend(self.backward_node(i, params, inputs, ws, sparse)?);
        }
        Ok(GraphStep {
            loss: total,
            heads,
            dense_grads: in_set_order(params, grads),
            embedded_grad,
            wide_grad,
        })
    }

    /// Each head's predictions (probabilities of binary heads, values of regression
    /// heads), in [`GraphNet::heads`]' order.
    pub fn predict(
        &self,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        ws: &mut GraphWorkspace,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.check_params(params)?;
        self.check_inputs(inputs)?;
        self.forward(params, inputs, ws)?;
        Ok((self.heads.iter())
            .map(|head| {
                let values = self.value(head.node, &ws.values, inputs);
                match head.loss {
                    Loss::BinaryCrossEntropy => values.iter().map(|z| sigmoid(*z)).collect(),
                    Loss::SquaredError => values.to_vec(),
                }
            })
            .collect())
    }

    /// Node `i`'s values: an input taken whole is read where the minibatch holds it.
    fn value<'a>(&self, i: usize, values: &'a [Vec<f32>], inputs: &Inputs<'a>) -> &'a [f32] {
        match self.nodes[i].op {
            Op::Dense(_) if self.whole[i] => inputs.dense,
            Op::Embeddings { .. } if self.whole[i] => inputs.embedded,
            _ => &values[i],
        }
    }

    /// Every node's values into `ws.values`.
    fn forward(
        &self,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        ws: &mut GraphWorkspace,
    ) -> Result<(), ModelError> {
        let rows = inputs.rows;
        let count = self.nodes.len();
        ws.values.resize_with(count, Vec::new);
        ws.mlp.resize_with(count, Activations::default);
        ws.cross.resize_with(count, CrossActs::default);
        ws.norm.resize_with(count, NormActs::default);
        ws.gate.resize_with(count, GateActs::default);
        ws.attention.resize_with(count, AttentionActs::default);
        for (i, node) in self.nodes.iter().enumerate() {
            if self.whole[i] {
                continue;
            }
            let (done, rest) = ws.values.split_at_mut(i);
            let done: &[Vec<f32>] = done;
            let out = sized(&mut rest[0], rows * node.width);
            let read = |k: usize| self.value(node.reads[k], done, inputs);
            match &node.op {
                Op::Dense(columns) => {
                    let from = self.dense_width;
                    for (out, row) in
                        (out.chunks_exact_mut(node.width)).zip(inputs.dense.chunks_exact(from))
                    {
                        for (o, c) in out.iter_mut().zip(columns) {
                            *o = row[*c];
                        }
                    }
                }
                Op::Embeddings { segments } => {
                    let from = self.embedding_width;
                    for (out, row) in
                        (out.chunks_exact_mut(node.width)).zip(inputs.embedded.chunks_exact(from))
                    {
                        let mut at = 0;
                        for (offset, dim) in segments {
                            out[at..at + dim].copy_from_slice(&row[*offset..offset + dim]);
                            at += dim;
                        }
                    }
                }
                Op::FirstOrder => {
                    for (o, row) in out.iter_mut().zip(inputs.wide.chunks_exact(self.features)) {
                        *o = row.iter().sum();
                    }
                }
                Op::Mlp { .. } => {
                    let stack = mlp_stack(node, params)?;
                    stack.forward(read(0), rows, &mut ws.mlp[i]);
                    out.copy_from_slice(ws.mlp[i].last());
                }
                Op::Concat => {
                    let mut at = 0;
                    for (k, r) in node.reads.iter().enumerate() {
                        let width = self.nodes[*r].width;
                        for (out, row) in
                            (out.chunks_exact_mut(node.width)).zip(read(k).chunks_exact(width))
                        {
                            out[at..at + width].copy_from_slice(row);
                        }
                        at += width;
                    }
                }
                Op::Add => {
                    out.copy_from_slice(read(0));
                    for k in 1..node.reads.len() {
                        for (o, v) in out.iter_mut().zip(read(k)) {
                            *o += v;
                        }
                    }
                }
                Op::Dot { dim, vectors } => {
                    let dots = Dots {
                        dim: *dim,
                        features: vectors - 1,
                    };
                    let rest = self.gather_rest(node, done, inputs, &mut ws.gathered);
                    dots.forward(read(0), rest, out);
                }
                Op::Fm { vectors, dim } => fm_forward(read(0), *vectors, *dim, out),
                Op::Cross(cross) => {
                    cross.forward(params, read(0), rows, &mut ws.cross[i])?;
                    out.copy_from_slice(ws.cross[i].last());
                }
                Op::LayerNorm(norm) => norm.forward(params, read(0), &mut ws.norm[i], out)?,
                Op::Gate(gate) => {
                    let experts: Vec<&[f32]> = (1..node.reads.len()).map(read).collect();
                    gate.forward(params, read(0), &experts, &mut ws.gate[i], out)?;
                }
                Op::Attention(attention) => {
                    let reads = (read(0), read(1));
                    attention.forward(params, reads, &mut ws.attention[i], out)?;
                }
            }
        }
        Ok(())
    }

    /// A dot block's reads after the first, side by side per row: the one read itself
    /// when there is one, else gathered into `gathered`.
    fn gather_rest<'a>(
        &self,
        node: &Node,
        values: &'a [Vec<f32>],
        inputs: &Inputs<'a>,
        gathered: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        if let [_, only] = node.reads[..] {
            return self.value(only, values, inputs);
        }
        let rows = inputs.rows;
        let widths: Vec<usize> = node.reads[1..]
            .iter()
            .map(|r| self.nodes[*r].width)
            .collect();
        let total: usize = widths.iter().sum();
        let out = sized(gathered, rows * total);
        let mut at = 0;
        for (r, width) in node.reads[1..].iter().zip(&widths) {
            let read = self.value(*r, values, inputs);
            for (out, row) in out.chunks_exact_mut(total).zip(read.chunks_exact(*width)) {
                out[at..at + width].copy_from_slice(row);
            }
            at += width;
        }
        out
    }

    /// Node `i`'s backward: its parameters' gradients (returned), its reads' gradients
    /// added into theirs, and the sparse inputs' into `sparse` (embedded, wide; the
    /// embedded one empty until something writes it).
    fn backward_node(
        &self,
        i: usize,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        ws: &mut GraphWorkspace,
        (embedded_grad, wide_grad): (&mut Vec<f32>, &mut Vec<f32>),
    ) -> Result<Vec<ParamTensor>, ModelError> {
        if !ws.grads.written(i) {
            return Ok(Vec::new());
        }
        let node = &self.nodes[i];
        let rows = inputs.rows;
        let grad = ws.grads.take(i);
        let wanted: Vec<bool> = node.reads.iter().map(|r| self.wants_grad[*r]).collect();
        let mut params_grads = Vec::new();
        match &node.op {
            Op::Dense(_) => {}
            Op::Embeddings { .. } if self.whole[i] && embedded_grad.is_empty() => {
                // The pooled embeddings' gradient itself: handed over, not copied.
                *embedded_grad = grad;
                return Ok(params_grads);
            }
            Op::Embeddings { segments } => {
                let width = self.embedding_width;
                if embedded_grad.is_empty() {
                    *embedded_grad = vec![0.0; rows * width];
                }
                for (out, g) in
                    (embedded_grad.chunks_exact_mut(width)).zip(grad.chunks_exact(node.width))
                {
                    let mut at = 0;
                    for (offset, dim) in segments {
                        add(&mut out[*offset..offset + dim], &g[at..at + dim]);
                        at += dim;
                    }
                }
            }
            Op::FirstOrder => {
                for (out, g) in wide_grad.chunks_exact_mut(self.features).zip(&grad) {
                    for o in out {
                        *o += g;
                    }
                }
            }
            Op::Mlp { .. } => {
                let stack = mlp_stack(node, params)?;
                let read = node.reads[0];
                let input = self.value(read, &ws.values, inputs);
                let input_grad = wanted[0].then(|| {
                    let (into, accumulate) = ws.grads.slot(read);
                    InputGrad { into, accumulate }
                });
                params_grads =
                    stack.backward(input, rows, &ws.mlp[i], &grad, &mut ws.buffers, input_grad);
            }
            Op::Concat => {
                let mut at = 0;
                for (r, wanted) in node.reads.iter().zip(&wanted) {
                    let width = self.nodes[*r].width;
                    if *wanted {
                        ws.grads.add_columns(*r, &grad, node.width, at, width);
                    }
                    at += width;
                }
            }
            Op::Add => {
                for (r, wanted) in node.reads.iter().zip(&wanted) {
                    if *wanted {
                        ws.grads.add(*r, &grad);
                    }
                }
            }
            Op::Dot { dim, vectors } => {
                self.dot_backward(node, (*dim, *vectors), &wanted, &grad, inputs, ws)
            }
            Op::Fm { vectors, dim } => {
                let read = node.reads[0];
                if wanted[0] {
                    let values = self.value(read, &ws.values, inputs);
                    let (into, accumulate) = ws.grads.slot(read);
                    if !accumulate {
                        into.fill(0.0);
                    }
                    fm_backward(values, *vectors, *dim, &grad, into);
                }
            }
            Op::Cross(cross) => {
                let read = node.reads[0];
                let grad_x0 = sized(&mut ws.scratch, rows * node.width);
                grad_x0.fill(0.0);
                params_grads = cross.backward(params, rows, &ws.cross[i], &grad, grad_x0)?;
                if wanted[0] {
                    ws.grads.add(read, &ws.scratch);
                }
            }
            Op::Gate(gate) => {
                params_grads = self.gate_backward(i, gate, params, &grad, inputs, ws)?
            }
            Op::Attention(attention) => {
                let (query, sequence) = (node.reads[0], node.reads[1]);
                let (grad_query, grad_sequence) = &mut ws.attention_grads;
                let grads = AttentionGrads {
                    query: sized(grad_query, rows * self.nodes[query].width),
                    sequence: sized(grad_sequence, rows * self.nodes[sequence].width),
                };
                let reads = (
                    self.value(query, &ws.values, inputs),
                    self.value(sequence, &ws.values, inputs),
                );
                params_grads = attention.backward(
                    params,
                    reads,
                    &ws.attention[i],
                    &grad,
                    &mut ws.buffers,
                    grads,
                )?;
                if wanted[0] {
                    ws.grads.add(query, &ws.attention_grads.0);
                }
                if wanted[1] {
                    ws.grads.add(sequence, &ws.attention_grads.1);
                }
            }
            Op::LayerNorm(norm) => {
                let read = node.reads[0];
                let grad_x = sized(&mut ws.scratch, rows * node.width);
                let output = &ws.values[i];
                params_grads = norm.backward(params, &ws.norm[i], output, &grad, grad_x)?;
                if wanted[0] {
                    ws.grads.add(read, &ws.scratch);
                }
            }
        }
        ws.grads.put(i, grad);
        Ok(params_grads)
    }

    /// A gate's backward: its parameters' gradients (returned), its input's and each
    /// expert's added into theirs.
    fn gate_backward(
        &self,
        i: usize,
        gate: &Gate,
        params: &ParamSet,
        grad: &[f32],
        inputs: &Inputs<'_>,
        ws: &mut GraphWorkspace,
    ) -> Result<Vec<ParamTensor>, ModelError> {
        let node = &self.nodes[i];
        let rows = inputs.rows;
        let experts = node.reads.len() - 1;
        ws.expert_grads.resize_with(experts, Vec::new);
        for (e, r) in ws.expert_grads.iter_mut().zip(&node.reads[1..]) {
            sized(e, rows * self.nodes[*r].width);
        }
        let input = node.reads[0];
        let grad_x = sized(&mut ws.scratch, rows * self.nodes[input].width);
        let x = self.value(input, &ws.values, inputs);
        let expert_values: Vec<&[f32]> = (node.reads[1..].iter())
            .map(|r| self.value(*r, &ws.values, inputs))
            .collect();
        let params_grads = gate.backward(
            params,
            (x, &expert_values),
            &ws.gate[i],
            grad,
            (grad_x, &mut ws.expert_grads),
        )?;
        if self.wants_grad[input] {
            ws.grads.add(input, &ws.scratch);
        }
        for (r, g) in node.reads[1..].iter().zip(&ws.expert_grads) {
            if self.wants_grad[*r] {
                ws.grads.add(*r, g);
            }
        }
        Ok(params_grads)
    }

    /// A dot block's backward. The vectors after the first, when one read holds them all,
    /// get their gradient written straight into that read's (DLRM's pooled embeddings).
    fn dot_backward(
        &self,
        node: &Node,
        (dim, vectors): (usize, usize),
        wanted: &[bool],
        grad: &[f32],
        inputs: &Inputs<'_>,
        ws: &mut GraphWorkspace,
    ) {
        let rows = inputs.rows;
        let dots = Dots {
            dim,
            features: vectors - 1,
        };
        let rest_width = (vectors - 1) * dim;
        let grad_first = sized(&mut ws.scratch_first, rows * dim);
        let rest = self.gather_rest(node, &ws.values, inputs, &mut ws.gathered);
        let first = self.value(node.reads[0], &ws.values, inputs);
        let direct = match node.reads[..] {
            [first_read, only] if wanted[1] && first_read != only && !ws.grads.written(only) => {
                Some(only)
            }
            _ => None,
        };
        match direct {
            Some(only) => {
                let (grad_rest, _) = ws.grads.slot(only);
                dots.backward(first, rest, grad, grad_first, grad_rest);
            }
            None => {
                let grad_rest = sized(&mut ws.scratch, rows * rest_width);
                dots.backward(first, rest, grad, grad_first, grad_rest);
                let mut at = 0;
                for (r, wanted) in node.reads[1..].iter().zip(&wanted[1..]) {
                    let width = self.nodes[*r].width;
                    if *wanted {
                        ws.grads.add_columns(*r, &ws.scratch, rest_width, at, width);
                    }
                    at += width;
                }
            }
        }
        if wanted[0] {
            ws.grads.add(node.reads[0], &ws.scratch_first);
        }
    }
}

/// An MLP node's layers over `params`.
fn mlp_stack<'p>(node: &Node, params: &'p ParamSet) -> Result<Stack<'p>, ModelError> {
    let Op::Mlp {
        prefix,
        widths,
        relu_hidden,
        relu_last,
    } = &node.op
    else {
        return Err(ModelError::Params(format!("{} is not an MLP", node.name)));
    };
    let stack = Stack::new(params, prefix, widths.len(), *relu_last)?;
    Ok(if *relu_hidden {
        stack
    } else {
        stack.linear_between()
    })
}

/// A head's mean loss and predictions from its values `z`, its weighted gradient written
/// into `grad`, or added with `accumulate` (heads may share a value).
fn head_loss(
    loss: Loss,
    z: &[f32],
    labels: &[f32],
    weight: f32,
    (grad, accumulate): (&mut [f32], bool),
) -> (f32, Vec<f32>) {
    let rows = z.len() as f32;
    let mut total = 0.0f64;
    let mut predictions = Vec::with_capacity(z.len());
    for ((z, y), g) in z.iter().zip(labels).zip(grad.iter_mut()) {
        let dz = match loss {
            Loss::BinaryCrossEntropy => {
                // max(z, 0) - z*y + log(1 + exp(-|z|)), stable for any z.
                total += f64::from(z.max(0.0) - z * y + (-z.abs()).exp().ln_1p());
                let p = sigmoid(*z);
                predictions.push(p);
                weight * (p - y) / rows
            }
            Loss::SquaredError => {
                let e = z - y;
                total += f64::from(e * e);
                predictions.push(*z);
                weight * 2.0 * e / rows
            }
        };
        *g = if accumulate { *g + dz } else { dz };
    }
    ((total / f64::from(rows)) as f32, predictions)
}

fn add(into: &mut [f32], values: &[f32]) {
    for (a, b) in into.iter_mut().zip(values) {
        *a += b;
    }
}
