//! A model graph (`primus_spec::job::graph::GraphSpec`) on the CPU: its inputs and blocks compiled
//! against a layout into nodes in dependency order, each node's width known, every
//! reference and width checked with the spec's path of what does not fit. `run` computes
//! them forward and backward over this module's kernels.

mod attention;
mod cross;
mod gate;
mod norm;
mod on_device;
mod onnx;
mod run;

use std::collections::BTreeMap;

use primus_spec::job::graph::{Activation, Block, GraphInput, GraphSpec, Loss};

use crate::ModelError;
use crate::layout::ModelLayout;
use crate::params::ParamSet;

pub use on_device::{DeviceGraph, EmbeddingGradBuffers};
pub use run::{GraphStep, GraphWorkspace, HeadOutput};

use attention::Attention;
use cross::CrossNet;
use gate::Gate;
use norm::LayerNorm;

/// A model graph compiled against a layout, ready to run on the CPU.
#[derive(Debug, Clone)]
pub struct GraphNet {
    nodes: Vec<Node>,
    heads: Vec<HeadNode>,
    /// Floats per row of the minibatch's pooled embeddings.
    embedding_width: usize,
    /// Values per row of the minibatch's dense features.
    dense_width: usize,
    /// Sparse features (the width of the first-order weights per row).
    features: usize,
    /// Every parameter tensor, in the order of the nodes.
    shapes: Vec<ParamShape>,
    /// Per node: an input that is the minibatch's whole dense or embedded values, in order
    /// (read in place, not copied).
    whole: Vec<bool>,
    /// Per node: whether its gradient flows to the pooled embeddings or first-order weights.
    leads_to_sparse: Vec<bool>,
    /// Per node: whether its gradient is needed (it leads to the sparse inputs or to
    /// parameters).
    wants_grad: Vec<bool>,
}

/// One value of the graph: `width` floats per row, `vectors` vectors of `width / vectors`
/// (a sequence's positions, with `sequence`).
#[derive(Debug, Clone)]
struct Node {
    name: String,
    width: usize,
    vectors: usize,
    sequence: bool,
    op: Op,
    /// The nodes it reads, in order.
    reads: Vec<usize>,
}

impl Node {
    fn vector_width(&self) -> usize {
        self.width / self.vectors
    }
}

/// What a node computes.
#[derive(Debug, Clone)]
enum Op {
    /// These columns of the dense features.
    Dense(Vec<usize>),
    /// The pooled embeddings at these `(offset, dim)` of each row, side by side.
    Embeddings {
        segments: Vec<(usize, usize)>,
    },
    /// The sum of each row's first-order weights.
    FirstOrder,
    /// Linear layers `{prefix}.{i}` of these output widths.
    Mlp {
        prefix: String,
        widths: Vec<usize>,
        relu_hidden: bool,
        relu_last: bool,
    },
    Concat,
    Add,
    /// The first read (one vector of `dim`), then the dot product of every pair of all
    /// reads' vectors.
    Dot {
        dim: usize,
        vectors: usize,
    },
    /// Rendle's second-order term over the read's vectors.
    Fm {
        vectors: usize,
        dim: usize,
    },
    Cross(CrossNet),
    LayerNorm(LayerNorm),
    /// The first read gates the others (the experts).
    Gate(Gate),
    /// The first read (the query) attends to the second (a sequence).
    Attention(Attention),
}

/// A head: the node whose single value per row it reads, and its loss.
#[derive(Debug, Clone)]
struct HeadNode {
    name: String,
    label: String,
    node: usize,
    loss: Loss,
    weight: f32,
}

/// A parameter tensor the graph needs, and how it starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParamShape {
    pub(crate) name: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) init: ParamInit,
}

/// A parameter's starting values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ParamInit {
    /// Glorot-uniform with this sum of fans.
    Glorot(usize),
    Zeros,
    Ones,
}

fn spec_error(field: String, message: impl Into<String>) -> ModelError {
    ModelError::Spec {
        field,
        message: message.into(),
    }
}

impl GraphNet {
    /// Compiles `spec` (found at `path`, `model.graph`) against `layout`: every name
    /// resolved, every width checked.
    pub fn new(spec: &GraphSpec, layout: &ModelLayout, path: &str) -> Result<Self, ModelError> {
        let order = spec.block_order().map_err(|cycle| {
            spec_error(
                format!("{path}.blocks.{}", cycle[0]),
                format!(
                    "the blocks read each other in a cycle: {}",
                    cycle.join(" -> ")
                ),
            )
        })?;
        let mut nodes = Vec::with_capacity(spec.inputs.len() + spec.blocks.len());
        let mut by_name = BTreeMap::new();
        for (name, input) in &spec.inputs {
            let node = input_node(name, input, layout, &format!("{path}.inputs.{name}"))?;
            by_name.insert(name.clone(), nodes.len());
            nodes.push(node);
        }
        for name in order {
            let at = format!("{path}.blocks.{name}");
            if by_name.contains_key(name) {
                return Err(spec_error(at, "an input has the same name"));
            }
            let block = &spec.blocks[name];
            let mut reads = Vec::new();
            for (field, read) in block.reads() {
                let index = by_name.get(read).copied().ok_or_else(|| {
                    spec_error(
                        format!("{at}.{field}"),
                        format!("{read:?} is neither an input nor a block"),
                    )
                })?;
                let takes_sequence =
                    matches!(block, Block::Attention { .. }) && field == "sequence";
                match (nodes[index].sequence, takes_sequence) {
                    (true, false) => {
                        return Err(spec_error(
                            format!("{at}.{field}"),
                            format!(
                                "{read:?} is a sequence; only an attention block's sequence \
                                 reads one (attend to it, then use the result)"
                            ),
                        ));
                    }
                    (false, true) => {
                        return Err(spec_error(
                            format!("{at}.{field}"),
                            format!("{read:?} is not a sequence input"),
                        ));
                    }
                    _ => {}
                }
                reads.push(index);
            }
            let node = block_node(name, block, reads, &nodes, &at)?;
            by_name.insert(name.to_owned(), nodes.len());
            nodes.push(node);
        }
        let mut heads = Vec::with_capacity(spec.heads.len());
        for (name, head) in &spec.heads {
            let at = format!("{path}.heads.{name}.input");
            let node = by_name.get(&head.input).copied().ok_or_else(|| {
                spec_error(
                    at.clone(),
                    format!("{:?} is neither an input nor a block", head.input),
                )
            })?;
            if nodes[node].width != 1 || nodes[node].sequence {
                return Err(spec_error(
                    at,
                    format!(
                        "{:?} is {} wide; a head reads a value of width 1",
                        head.input, nodes[node].width
                    ),
                ));
            }
            heads.push(HeadNode {
                name: name.clone(),
                label: head.label.clone(),
                node,
                loss: head.loss,
                weight: head.weight as f32,
            });
        }
        if heads.is_empty() {
            return Err(spec_error(
                format!("{path}.heads"),
                "a graph needs at least one head",
            ));
        }
        let (leads_to_sparse, wants_grad) = gradient_flow(&nodes);
        let whole = (nodes.iter())
            .map(|node| match &node.op {
                Op::Dense(columns) => columns.iter().copied().eq(0..layout.dense_inputs),
                Op::Embeddings { segments } => {
                    let columns = segments
                        .iter()
                        .flat_map(|(offset, dim)| *offset..offset + dim);
                    columns.eq(0..layout.embedding_width)
                }
                _ => false,
            })
            .collect();
        Ok(Self {
            whole,
            shapes: param_shapes(&nodes),
            leads_to_sparse,
            wants_grad,
            nodes,
            heads,
            embedding_width: layout.embedding_width,
            dense_width: layout.dense_inputs,
            features: layout.features.len(),
        })
    }

    /// The heads' names and label columns, in the order [`GraphNet::train_step`] takes
    /// the labels and returns the heads' outputs.
    pub fn heads(&self) -> Vec<(&str, &str, Loss)> {
        (self.heads.iter())
            .map(|h| (h.name.as_str(), h.label.as_str(), h.loss))
            .collect()
    }

    /// Each parameter as its block starts it (Glorot-uniform weights, zero biases and
    /// shifts, unit scales), the same for the same seed.
    pub fn init_params(&self, seed: u64) -> ParamSet {
        ParamSet::init_shapes(&self.shapes, seed)
    }

    /// A block that runs on the CPU only (a layer norm, a gate or an attention), by name and kind; none:
    /// the graph can be placed on the dense operations of a device.
    pub fn cpu_only_block(&self) -> Option<(&str, &str)> {
        self.nodes.iter().find_map(|node| {
            let kind = match node.op {
                Op::LayerNorm(_) => "a layer norm",
                Op::Gate(_) => "a gate",
                Op::Attention(_) => "an attention block",
                _ => return None,
            };
            Some((node.name.as_str(), kind))
        })
    }

    /// Every parameter tensor, in the order of the nodes.
    pub(crate) fn param_shapes(&self) -> &[ParamShape] {
        &self.shapes
    }
}

/// Every parameter tensor of `nodes`, in their order.
fn param_shapes(nodes: &[Node]) -> Vec<ParamShape> {
    let mut shapes = Vec::new();
    for node in nodes {
        match &node.op {
            Op::Mlp { prefix, widths, .. } => {
                let mut inputs = nodes[node.reads[0]].width;
                for (i, outputs) in widths.iter().copied().enumerate() {
                    shapes.push(ParamShape {
                        name: format!("{prefix}.{i}.weight"),
                        shape: vec![inputs, outputs],
                        init: ParamInit::Glorot(inputs + outputs),
                    });
                    shapes.push(ParamShape {
                        name: format!("{prefix}.{i}.bias"),
                        shape: vec![1, outputs],
                        init: ParamInit::Zeros,
                    });
                    inputs = outputs;
                }
            }
            Op::Cross(cross) => shapes.extend(cross.param_shapes()),
            Op::LayerNorm(norm) => shapes.extend(norm.param_shapes()),
            Op::Gate(gate) => shapes.extend(gate.param_shapes()),
            Op::Attention(attention) => shapes.extend(attention.param_shapes()),
            _ => {}
        }
    }
    shapes
}

/// Per node, in dependency order: whether its gradient reaches the sparse inputs, and
/// whether it is needed at all (it reaches them or a block with parameters).
fn gradient_flow(nodes: &[Node]) -> (Vec<bool>, Vec<bool>) {
    let mut leads = Vec::with_capacity(nodes.len());
    let mut wants = Vec::with_capacity(nodes.len());
    for node in nodes {
        let sparse = matches!(node.op, Op::Embeddings { .. } | Op::FirstOrder);
        let params = matches!(
            node.op,
            Op::Mlp { .. } | Op::Cross(_) | Op::LayerNorm(_) | Op::Gate(_) | Op::Attention(_)
        );
        leads.push(sparse || node.reads.iter().any(|r| leads[*r]));
        wants.push(sparse || params || node.reads.iter().any(|r| wants[*r]));
    }
    (leads, wants)
}

/// The node of an input.
fn input_node(
    name: &str,
    input: &GraphInput,
    layout: &ModelLayout,
    at: &str,
) -> Result<Node, ModelError> {
    let node = |width, vectors, op| Node {
        name: name.to_owned(),
        width,
        vectors,
        sequence: false,
        op,
        reads: Vec::new(),
    };
    match input {
        GraphInput::Dense { features } => {
            let columns: Vec<usize> = if features.is_empty() {
                (0..layout.dense_inputs).collect()
            } else {
                (features.iter().enumerate())
                    .map(|(i, feature)| {
                        (layout.dense_names.iter())
                            .position(|n| n == feature)
                            .ok_or_else(|| {
                                spec_error(
                                    format!("{at}.features[{i}]"),
                                    format!("the Dataset has no dense feature {feature:?}"),
                                )
                            })
                    })
                    .collect::<Result<_, _>>()?
            };
            if columns.is_empty() {
                return Err(spec_error(
                    at.to_owned(),
                    "the Dataset has no dense features",
                ));
            }
            Ok(node(columns.len(), 1, Op::Dense(columns)))
        }
        GraphInput::Embeddings { features } => {
            let slots: Vec<_> = if features.is_empty() {
                (layout.features.iter())
                    .filter(|slot| slot.position.is_none())
                    .collect()
            } else {
                (features.iter().enumerate())
                    .map(|(i, feature)| {
                        let slot = (layout.features.iter())
                            .find(|slot| slot.name == *feature)
                            .ok_or_else(|| {
                                spec_error(
                                    format!("{at}.features[{i}]"),
                                    format!("the Dataset has no sparse feature {feature:?}"),
                                )
                            })?;
                        match slot.position {
                            None => Ok(slot),
                            Some(_) => Err(spec_error(
                                format!("{at}.features[{i}]"),
                                format!(
                                    "{feature:?} is a sequence feature; a sequence input reads it"
                                ),
                            )),
                        }
                    })
                    .collect::<Result<_, _>>()?
            };
            if slots.is_empty() {
                return Err(spec_error(
                    at.to_owned(),
                    "the Dataset has no sparse features but sequences",
                ));
            }
            let segments: Vec<(usize, usize)> = slots.iter().map(|s| (s.offset, s.dim)).collect();
            let width = segments.iter().map(|(_, dim)| dim).sum();
            // Vectors of one width cross (dot, fm); of several, they are one vector.
            let one_width = segments.iter().all(|(_, dim)| *dim == segments[0].1);
            let vectors = if one_width { segments.len() } else { 1 };
            Ok(node(width, vectors, Op::Embeddings { segments }))
        }
        GraphInput::FirstOrder => {
            if !layout.has_wide() {
                return Err(spec_error(
                    at.to_owned(),
                    "first-order weights need a wide table for every sparse feature's table",
                ));
            }
            Ok(node(1, 1, Op::FirstOrder))
        }
        GraphInput::Sequence { feature } => {
            let slots: Vec<_> = (layout.features.iter())
                .filter(|slot| slot.name == *feature)
                .collect();
            let (first, length) = match slots.first() {
                None => {
                    return Err(spec_error(
                        format!("{at}.feature"),
                        format!("the Dataset has no sparse feature {feature:?}"),
                    ));
                }
                Some(slot) if slot.position.is_none() => {
                    return Err(spec_error(
                        format!("{at}.feature"),
                        format!(
                            "{feature:?} is not a sequence feature (the Dataset's \
                             schema.sparse[].sequence)"
                        ),
                    ));
                }
                Some(slot) => (slot, slots.len()),
            };
            // A feature's positions sit side by side in the embedding row.
            let width = length * first.dim;
            let segments = vec![(first.offset, width)];
            Ok(Node {
                sequence: true,
                ..node(width, length, Op::Embeddings { segments })
            })
        }
    }
}

/// The node of a block reading `reads`.
fn block_node(
    name: &str,
    block: &Block,
    reads: Vec<usize>,
    nodes: &[Node],
    at: &str,
) -> Result<Node, ModelError> {
    let read = |i: usize| &nodes[reads[i]];
    let (width, vectors, op) = match block {
        Block::Mlp {
            widths,
            activation,
            activate_last,
            ..
        } => {
            if widths.is_empty() || widths.contains(&0) {
                return Err(spec_error(
                    format!("{at}.widths"),
                    "needs one or more layers, each at least 1 wide",
                ));
            }
            let relu = *activation == Activation::Relu;
            let widths: Vec<usize> = widths.iter().map(|w| *w as usize).collect();
            let last = widths[widths.len() - 1];
            let op = Op::Mlp {
                prefix: name.to_owned(),
                widths,
                relu_hidden: relu,
                relu_last: relu && *activate_last,
            };
            (last, 1, op)
        }
        Block::Concat { .. } => {
            let width: usize = reads.iter().map(|r| nodes[*r].width).sum();
            (width, 1, Op::Concat)
        }
        Block::Add { inputs } => {
            let width = read(0).width;
            if let Some(i) = (0..reads.len()).find(|i| read(*i).width != width) {
                return Err(spec_error(
                    format!("{at}.inputs[{i}]"),
                    format!(
                        "{:?} is {} wide, {:?} {}: added values are of one width",
                        inputs[i],
                        read(i).width,
                        inputs[0],
                        width
                    ),
                ));
            }
            (width, 1, Op::Add)
        }
        Block::Dot { inputs } => {
            let first = read(0);
            if first.vectors != 1 {
                return Err(spec_error(
                    format!("{at}.inputs[0]"),
                    format!(
                        "{:?} holds {} vectors; the first input is one vector (DLRM's bottom MLP's output)",
                        inputs[0], first.vectors
                    ),
                ));
            }
            let dim = first.width;
            if let Some(i) = (1..reads.len()).find(|i| read(*i).vector_width() != dim) {
                return Err(spec_error(
                    format!("{at}.inputs[{i}]"),
                    format!(
                        "{:?}'s vectors are {} wide, the first input is {dim}: dot products take vectors of one width",
                        inputs[i],
                        read(i).vector_width()
                    ),
                ));
            }
            let vectors: usize = reads.iter().map(|r| nodes[*r].vectors).sum();
            if vectors < 2 {
                return Err(spec_error(
                    format!("{at}.inputs"),
                    "dot products need two or more vectors",
                ));
            }
            (
                dim + vectors * (vectors - 1) / 2,
                1,
                Op::Dot { dim, vectors },
            )
        }
        Block::Fm { input } => {
            let vectors = read(0).vectors;
            if vectors < 2 {
                return Err(spec_error(
                    format!("{at}.input"),
                    format!(
                        "{input:?} is one vector of {}; a factorisation machine crosses two or more of one width (an embeddings input whose features' tables have one dim)",
                        read(0).width
                    ),
                ));
            }
            let dim = read(0).vector_width();
            (1, 1, Op::Fm { vectors, dim })
        }
        Block::LayerNorm { activation, .. } => {
            let dim = read(0).width;
            if dim < 2 {
                return Err(spec_error(
                    format!("{at}.input"),
                    format!(
                        "{:?} is {dim} wide; normalising a row needs 2 or more values",
                        block.reads()[0].1
                    ),
                ));
            }
            let relu = *activation == Activation::Relu;
            (dim, 1, Op::LayerNorm(LayerNorm::new(name, dim, relu)))
        }
        Block::Gate { experts, .. } => {
            let width = read(1).width;
            if let Some(i) = (1..reads.len()).find(|i| read(*i).width != width) {
                return Err(spec_error(
                    format!("{at}.experts[{}]", i - 1),
                    format!(
                        "{:?} is {} wide, {:?} {width}: a gate mixes experts of one width",
                        experts[i - 1],
                        read(i).width,
                        experts[0]
                    ),
                ));
            }
            let gate = Gate::new(name, read(0).width, experts.len(), width);
            (width, 1, Op::Gate(gate))
        }
        Block::Attention { widths, .. } => {
            if widths.contains(&0) {
                return Err(spec_error(
                    format!("{at}.widths"),
                    "each hidden layer is at least 1 wide",
                ));
            }
            let (query, sequence) = (read(0), read(1));
            let dim = sequence.vector_width();
            if query.width != dim {
                return Err(spec_error(
                    format!("{at}.query"),
                    format!(
                        "{:?} is {} wide, the sequence's positions {dim}: the query is as \
                         wide as one position",
                        block.reads()[0].1,
                        query.width
                    ),
                ));
            }
            let hidden = widths.iter().map(|w| *w as usize).collect();
            let attention = Attention::new(name, dim, sequence.vectors, hidden);
            (dim, 1, Op::Attention(attention))
        }
        Block::Cross { layers, rank, .. } => {
            if *layers == 0 || *rank == Some(0) {
                return Err(spec_error(
                    at.to_owned(),
                    "layers and rank (when set) must be at least 1",
                ));
            }
            let dim = read(0).width;
            let cross = CrossNet::new(name, dim, *layers as usize, rank.map(|r| r as usize));
            (dim, 1, Op::Cross(cross))
        }
    };
    Ok(Node {
        name: name.to_owned(),
        width,
        vectors,
        sequence: false,
        op,
        reads,
    })
}
