//! A compiled graph as ONNX nodes: each node's value built from the export's inputs
//! (`dense`, `embedded`, `wide`) and the parameters under the names `run` reads, with the
//! same column order, so ONNX Runtime computes what the trainer does.

use primus_proto::onnx::AttributeProto;
use primus_proto::onnx::attribute_proto::AttributeType;
use primus_spec::job::graph::Loss;

use super::{GraphNet, Node, Op};
use crate::ModelError;
use crate::onnx::{Builder, DENSE_INPUT, EMBEDDED_INPUT, WIDE_INPUT};

impl GraphNet {
    /// Adds the nodes of every value the heads need; each head's value (logit or
    /// prediction) and loss, in head order.
    pub(crate) fn onnx_heads(
        &self,
        builder: &mut Builder<'_>,
    ) -> Result<Vec<(String, Loss)>, ModelError> {
        let mut values: Vec<String> = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let value = self.onnx_node(node, &values, builder)?;
            values.push(value);
        }
        Ok((self.heads.iter())
            .map(|head| (values[head.node].clone(), head.loss))
            .collect())
    }

    fn onnx_node(
        &self,
        node: &Node,
        values: &[String],
        b: &mut Builder<'_>,
    ) -> Result<String, ModelError> {
        let reads: Vec<&str> = node.reads.iter().map(|r| values[*r].as_str()).collect();
        Ok(match &node.op {
            Op::Dense(columns) => match columns.iter().copied().eq(0..self.dense_width) {
                true => DENSE_INPUT.to_owned(),
                false => b.columns(DENSE_INPUT, columns),
            },
            Op::Embeddings { segments } => {
                let columns: Vec<usize> = (segments.iter())
                    .flat_map(|(offset, dim)| *offset..offset + dim)
                    .collect();
                match columns.iter().copied().eq(0..self.embedding_width) {
                    true => EMBEDDED_INPUT.to_owned(),
                    false => b.columns(EMBEDDED_INPUT, &columns),
                }
            }
            Op::FirstOrder => b.reduce_sum(WIDE_INPUT, 1, true),
            Op::Mlp {
                prefix,
                widths,
                relu_hidden,
                relu_last,
            } => {
                let mut x = reads[0].to_owned();
                for i in 0..widths.len() {
                    x = b.linear(&x, &format!("{prefix}.{i}"))?;
                    let relu = match i + 1 == widths.len() {
                        true => *relu_last,
                        false => *relu_hidden,
                    };
                    if relu {
                        x = b.node("Relu", &[&x], vec![]);
                    }
                }
                x
            }
            Op::Concat => b.concat(&reads),
            Op::Add => {
                let mut sum = reads[0].to_owned();
                for read in &reads[1..] {
                    sum = b.node("Add", &[&sum, read], vec![]);
                }
                sum
            }
            Op::Dot { dim, vectors } => {
                let all = b.concat(&reads);
                let pairs = b.pair_dots(&all, *vectors, *dim);
                b.concat(&[reads[0], &pairs])
            }
            Op::Fm { vectors, dim } => b.factorisation_machine(reads[0], *vectors, *dim),
            Op::LayerNorm(norm) => {
                let (prefix, relu) = norm.parts();
                let x = reads[0];
                let mean = b.reduce_mean(x);
                let centered = b.node("Sub", &[x, &mean], vec![]);
                let squares = b.node("Mul", &[&centered, &centered], vec![]);
                let var = b.reduce_mean(&squares);
                let epsilon = b.constant_f32(&[super::norm::EPSILON], vec![]);
                let shifted_var = b.node("Add", &[&var, &epsilon], vec![]);
                let std = b.node("Sqrt", &[&shifted_var], vec![]);
                let normalized = b.node("Div", &[&centered, &std], vec![]);
                let scale = b.param(&format!("{prefix}.scale"))?;
                let shift = b.param(&format!("{prefix}.shift"))?;
                let scaled = b.node("Mul", &[&normalized, &scale], vec![]);
                let y = b.node("Add", &[&scaled, &shift], vec![]);
                match relu {
                    true => b.node("Relu", &[&y], vec![]),
                    false => y,
                }
            }
            Op::Gate(gate) => {
                let logits = b.linear(reads[0], gate.prefix())?;
                let axis = AttributeProto {
                    name: Some("axis".into()),
                    r#type: Some(AttributeType::Int as i32),
                    i: Some(1),
                    ..AttributeProto::default()
                };
                let weights = b.node("Softmax", &[&logits], vec![axis]);
                let mut mixed: Option<String> = None;
                for (i, expert) in reads[1..].iter().enumerate() {
                    let weight = b.columns(&weights, &[i]);
                    let term = b.node("Mul", &[&weight, expert], vec![]);
                    mixed = Some(match mixed {
                        Some(sum) => b.node("Add", &[&sum, &term], vec![]),
                        None => term,
                    });
                }
                mixed.ok_or_else(|| {
                    ModelError::Params(format!("gate {} has no expert", node.name))
                })?
            }
            Op::Attention(attention) => {
                let (dim, length) = attention.shape();
                let (d, l) = (dim as i64, length as i64);
                let query = b.reshape(reads[0], &[-1, 1, d]);
                let keys = b.reshape(reads[1], &[-1, l, d]);
                let each = b.constant_i64(&[1, l, d]);
                let query = b.node("Expand", &[&query, &each], vec![]);
                let difference = b.node("Sub", &[&query, &keys], vec![]);
                let product = b.node("Mul", &[&query, &keys], vec![]);
                let features = b.concat_on(&[&query, &keys, &difference, &product], 2);
                let features = b.reshape(&features, &[-1, 4 * d]);
                let (prefix, widths) = attention.layers();
                let scores = b.mlp(&features, prefix, widths.len(), false)?;
                let scores = b.reshape(&scores, &[-1, l, 1]);
                let weighted = b.node("Mul", &[&scores, &keys], vec![]);
                b.reduce_sum(&weighted, 1, false)
            }
            Op::Cross(cross) => {
                let (prefix, _, layers, rank) = cross.parts();
                let x0 = reads[0];
                let mut x = x0.to_owned();
                for l in 0..layers {
                    let product = match rank {
                        None => {
                            let w = b.param(&format!("{prefix}.{l}.weight"))?;
                            b.node("MatMul", &[&x, &w], vec![])
                        }
                        Some(_) => {
                            let v = b.param(&format!("{prefix}.{l}.v"))?;
                            let u = b.param(&format!("{prefix}.{l}.u"))?;
                            let t = b.node("MatMul", &[&x, &v], vec![]);
                            b.node("MatMul", &[&t, &u], vec![])
                        }
                    };
                    let bias = b.param(&format!("{prefix}.{l}.bias"))?;
                    let z = b.node("Add", &[&product, &bias], vec![]);
                    let scaled = b.node("Mul", &[x0, &z], vec![]);
                    x = b.node("Add", &[&scaled, &x], vec![]);
                }
                x
            }
        })
    }
}
