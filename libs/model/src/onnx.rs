//! ONNX export of a model's dense network with its current parameters, for the serving role
//! (ONNX Runtime runs it there). A model graph (a Job's own, or a preset's) is written
//! block by block by `cpu/blocks/onnx.rs` under the parameter names the graph reads; MTRM's
//! towers are written here as `crate::on_burn` computes them.
//!
//! Inputs (f32, `N` rows): `dense` `[N, dense_inputs]`, `embedded` `[N, embedding_width]`
//! (each feature's pooled embedding), and for wide models `wide` `[N, features]` (each
//! feature's pooled first-order weight). Output: `probability` `[N, 1]`, the first head's:
//! for a schema with a negative sample rate r, sigmoid(logit + ln r), the probability over
//! all rows rather than over the sampled ones the network was trained on (Monolith
//! §2.2.2), so whoever runs the model needs no rate of their own; a regression head's is
//! its value. A graph of several heads also has one output per head, `head.<name>`
//! `[N, 1]`, in the graph's head order.

use primus_proto::onnx::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, attribute_proto::AttributeType,
    tensor_proto::DataType, tensor_shape_proto, type_proto,
};
use primus_spec::job::graph::Loss;
use prost::Message;

use crate::ModelError;
use crate::cpu::blocks::GraphNet;
use crate::inputs::Tower;
use crate::layout::{GRAPH_PATH, ModelLayout};
use crate::params::ParamSet;
use crate::presets::model_graph;

/// ONNX IR version 8 with the default operator set 17: read by every ONNX Runtime since 1.13.
const IR_VERSION: i64 = 8;
const OPSET: i64 = 17;

/// Input: the dense features.
pub const DENSE_INPUT: &str = "dense";
/// Input: the pooled embeddings.
pub const EMBEDDED_INPUT: &str = "embedded";
/// Input: the summed first-order weights.
pub const WIDE_INPUT: &str = "wide";
/// Output: the click probability (a regression head's prediction, for a graph whose head
/// is one).
pub const OUTPUT: &str = "probability";
/// What the output of each head of a model with several heads is named after.
pub const HEAD_OUTPUT_PREFIX: &str = "head.";

/// The output of head `name` of a model with several heads.
pub fn head_output(name: &str) -> String {
    format!("{HEAD_OUTPUT_PREFIX}{name}")
}

/// Metadata key of the negative sample rate the output is corrected for.
pub const NEGATIVE_SAMPLE_RATE_KEY: &str = "negative_sample_rate";

/// The serialized ONNX model of `layout`'s dense network with `params`, predicting with
/// `tower` (MTRM; other models have one). `version` is recorded as the model version.
pub fn export(
    layout: &ModelLayout,
    params: &ParamSet,
    tower: Tower,
    version: u64,
) -> Result<Vec<u8>, ModelError> {
    let mut graph = Builder::new(params);
    let mut inputs = vec![
        input(DENSE_INPUT, layout.dense_inputs),
        input(EMBEDDED_INPUT, layout.embedding_width),
    ];
    if layout.has_wide() {
        inputs.push(input(WIDE_INPUT, layout.features.len()));
    }
    let heads = match model_graph(layout) {
        Some(spec) => GraphNet::new(&spec, layout, GRAPH_PATH)?.onnx_heads(&mut graph)?,
        None => vec![(graph.mtrm(layout, tower)?, Loss::BinaryCrossEntropy)],
    };
    let predictions: Vec<String> = (heads.into_iter())
        .map(|(value, loss)| graph.prediction(layout, value, loss))
        .collect();
    graph.node_named("Identity", &[&predictions[0]], OUTPUT, vec![]);
    let mut outputs = vec![input(OUTPUT, 1)];
    if predictions.len() > 1 {
        for (head, prediction) in layout.heads.iter().zip(&predictions) {
            let name = head_output(&head.name);
            graph.node_named("Identity", &[prediction], &name, vec![]);
            outputs.push(input(&name, 1));
        }
    }
    let model = ModelProto {
        ir_version: Some(IR_VERSION),
        producer_name: Some("primus-rs".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        model_version: Some(i64::try_from(version).unwrap_or(i64::MAX)),
        doc_string: Some(format!("{:?} dense network", layout.kind)),
        graph: Some(GraphProto {
            node: graph.nodes,
            name: Some("dense".into()),
            initializer: graph.initializers,
            input: inputs,
            output: outputs,
        }),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(OPSET),
        }],
        metadata_props: vec![
            StringStringEntryProto {
                key: Some("tower".into()),
                value: Some(format!("{tower:?}")),
            },
            StringStringEntryProto {
                key: Some(NEGATIVE_SAMPLE_RATE_KEY.into()),
                value: Some(layout.negative_sample_rate.unwrap_or(1.0).to_string()),
            },
        ],
    };
    Ok(model.encode_to_vec())
}

/// A float input or output `[N, width]` with a symbolic batch dimension.
fn input(name: &str, width: usize) -> ValueInfoProto {
    let dim = |value| tensor_shape_proto::Dimension { value: Some(value) };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(DataType::Float as i32),
                shape: Some(TensorShapeProto {
                    dim: vec![
                        dim(tensor_shape_proto::dimension::Value::DimParam("N".into())),
                        dim(tensor_shape_proto::dimension::Value::DimValue(width as i64)),
                    ],
                }),
            })),
        }),
    }
}

fn ints(name: &str, values: Vec<i64>) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: values,
        ..AttributeProto::default()
    }
}

fn int(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(value),
        ..AttributeProto::default()
    }
}

/// An ONNX graph under construction: its nodes and initializers, each value named.
pub(crate) struct Builder<'p> {
    params: &'p ParamSet,
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    next: usize,
}

impl<'p> Builder<'p> {
    fn new(params: &'p ParamSet) -> Self {
        Self {
            params,
            nodes: Vec::new(),
            initializers: Vec::new(),
            next: 0,
        }
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("t{}", self.next)
    }

    pub(crate) fn node(
        &mut self,
        op: &str,
        inputs: &[&str],
        attributes: Vec<AttributeProto>,
    ) -> String {
        let output = self.fresh();
        self.node_named(op, inputs, &output, attributes);
        output
    }

    /// A head's prediction from its `value`: a binary head's probability (corrected for
    /// a negative sample rate), a regression head's value as it is.
    fn prediction(&mut self, layout: &ModelLayout, value: String, loss: Loss) -> String {
        match loss {
            Loss::BinaryCrossEntropy => {
                let mut logit = value;
                if let Some(rate) = layout.negative_sample_rate.filter(|r| *r < 1.0) {
                    // Sampled negatives leave the odds 1/rate too high: the log-odds
                    // correction.
                    let shift = self.constant_f32(&[rate.ln() as f32], vec![1]);
                    logit = self.node("Add", &[&logit, &shift], vec![]);
                }
                self.node("Sigmoid", &[&logit], vec![])
            }
            Loss::SquaredError => value,
        }
    }

    pub(crate) fn node_named(
        &mut self,
        op: &str,
        inputs: &[&str],
        output: &str,
        attributes: Vec<AttributeProto>,
    ) {
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| (*s).to_owned()).collect(),
            output: vec![output.to_owned()],
            name: Some(format!("{op}_{output}")),
            op_type: Some(op.into()),
            attribute: attributes,
            domain: None,
        });
    }

    /// A parameter tensor as an initializer named after it (each is added once).
    pub(crate) fn param(&mut self, name: &str) -> Result<String, ModelError> {
        if self
            .initializers
            .iter()
            .any(|t| t.name.as_deref() == Some(name))
        {
            return Ok(name.to_owned());
        }
        let tensor = self
            .params
            .get(name)
            .ok_or_else(|| ModelError::Params(format!("the parameter set has no {name:?}")))?;
        let raw: Vec<u8> = tensor.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.initializers.push(TensorProto {
            dims: tensor.shape.iter().map(|d| *d as i64).collect(),
            data_type: Some(DataType::Float as i32),
            name: Some(name.to_owned()),
            raw_data: Some(raw),
        });
        Ok(name.to_owned())
    }

    pub(crate) fn constant_f32(&mut self, values: &[f32], dims: Vec<i64>) -> String {
        let name = self.fresh();
        self.initializers.push(TensorProto {
            dims,
            data_type: Some(DataType::Float as i32),
            name: Some(name.clone()),
            raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        });
        name
    }

    pub(crate) fn constant_i64(&mut self, values: &[i64]) -> String {
        let name = self.fresh();
        self.initializers.push(TensorProto {
            dims: vec![values.len() as i64],
            data_type: Some(DataType::Int64 as i32),
            name: Some(name.clone()),
            raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        });
        name
    }

    pub(crate) fn linear(&mut self, x: &str, layer: &str) -> Result<String, ModelError> {
        let weight = self.param(&format!("{layer}.weight"))?;
        let bias = self.param(&format!("{layer}.bias"))?;
        let product = self.node("MatMul", &[x, &weight], vec![]);
        Ok(self.node("Add", &[&product, &bias], vec![]))
    }

    /// Layers `{prefix}.0 ..` over `x`, ReLU between them (and after the last with
    /// `relu_last`).
    pub(crate) fn mlp(
        &mut self,
        x: &str,
        prefix: &str,
        layers: usize,
        relu_last: bool,
    ) -> Result<String, ModelError> {
        let mut x = x.to_owned();
        for i in 0..layers {
            x = self.linear(&x, &format!("{prefix}.{i}"))?;
            if i + 1 < layers || relu_last {
                x = self.node("Relu", &[&x], vec![]);
            }
        }
        Ok(x)
    }

    pub(crate) fn concat(&mut self, parts: &[&str]) -> String {
        self.concat_on(parts, 1)
    }

    pub(crate) fn concat_on(&mut self, parts: &[&str], axis: i64) -> String {
        self.node("Concat", parts, vec![int("axis", axis)])
    }

    pub(crate) fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        let shape = self.constant_i64(shape);
        self.node("Reshape", &[x, &shape], vec![])
    }

    pub(crate) fn reduce_sum(&mut self, x: &str, axis: i64, keep: bool) -> String {
        let axes = self.constant_i64(&[axis]);
        self.node(
            "ReduceSum",
            &[x, &axes],
            vec![int("keepdims", i64::from(keep))],
        )
    }

    /// Each row's mean of `x`, kept as a column (`[N, 1]`; opset 17 takes the axes as an
    /// attribute).
    pub(crate) fn reduce_mean(&mut self, x: &str) -> String {
        self.node(
            "ReduceMean",
            &[x],
            vec![ints("axes", vec![1]), int("keepdims", 1)],
        )
    }

    /// The columns `columns` of `x`, in that order.
    pub(crate) fn columns(&mut self, x: &str, columns: &[usize]) -> String {
        let indices: Vec<i64> = columns.iter().map(|c| *c as i64).collect();
        let indices = self.constant_i64(&indices);
        self.node("Gather", &[x, &indices], vec![int("axis", 1)])
    }

    /// Rendle's second-order term over `x`'s `vectors` vectors of `dim`: width 1.
    pub(crate) fn factorisation_machine(&mut self, x: &str, vectors: usize, dim: usize) -> String {
        let e = self.reshape(x, &[-1, vectors as i64, dim as i64]);
        let sum = self.reduce_sum(&e, 1, false);
        let square_of_sum = self.node("Mul", &[&sum, &sum], vec![]);
        let squares = self.node("Mul", &[&e, &e], vec![]);
        let sum_of_squares = self.reduce_sum(&squares, 1, false);
        let difference = self.node("Sub", &[&square_of_sum, &sum_of_squares], vec![]);
        let total = self.reduce_sum(&difference, 1, true);
        let half = self.constant_f32(&[0.5], vec![]);
        self.node("Mul", &[&total, &half], vec![])
    }

    /// The dot product of every pair `i < j` of `x`'s `vectors` vectors of `dim`, in
    /// row-major order of the upper triangle.
    pub(crate) fn pair_dots(&mut self, x: &str, vectors: usize, dim: usize) -> String {
        let stacked = self.reshape(x, &[-1, vectors as i64, dim as i64]);
        let transposed = self.node("Transpose", &[&stacked], vec![ints("perm", vec![0, 2, 1])]);
        let products = self.node("MatMul", &[&stacked, &transposed], vec![]);
        let flat = self.reshape(&products, &[-1, (vectors * vectors) as i64]);
        let upper: Vec<usize> = (0..vectors)
            .flat_map(|i| ((i + 1)..vectors).map(move |j| i * vectors + j))
            .collect();
        self.columns(&flat, &upper)
    }

    fn mtrm(&mut self, layout: &ModelLayout, tower: Tower) -> Result<String, ModelError> {
        let spec = &layout.dense_spec;
        let bottom = self.mlp(DENSE_INPUT, "bottom", spec.bottom.len(), true)?;
        let memory_in = self.concat(&[&bottom, EMBEDDED_INPUT]);
        let hidden_layers = spec.top.len() - 1;
        let hidden = self.mlp(&memory_in, "memory", hidden_layers, true)?;
        let memory = self.linear(&hidden, &format!("memory.{hidden_layers}"))?;
        match tower {
            Tower::Memory => Ok(memory),
            Tower::Adapt => {
                let adapt_in = self.concat(&[DENSE_INPUT, EMBEDDED_INPUT, &hidden]);
                let adapt = self.mlp(&adapt_in, "adapt", spec.top.len(), false)?;
                Ok(self.node("Add", &[&memory, &adapt], vec![]))
            }
        }
    }
}
