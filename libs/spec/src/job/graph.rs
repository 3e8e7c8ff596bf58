//! A model's dense network as a graph: named inputs taken from the Dataset's features,
//! named blocks over them and over each other (a DAG), and heads that each train one
//! label column.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validate::{FieldError, Validate, check_name, fail, field, index};

/// The dense network as a graph of blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GraphSpec {
    /// Values taken from a minibatch, by name.
    pub inputs: BTreeMap<String, GraphInput>,
    /// Blocks by name; each reads inputs and other blocks by their names.
    pub blocks: BTreeMap<String, Block>,
    /// What the network predicts, by name: each head reads one value of width 1.
    pub heads: BTreeMap<String, Head>,
}

/// A value taken from a minibatch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum GraphInput {
    /// Dense features, one value each: the schema's in its order, or the ones named.
    Dense {
        /// The features; empty: every dense feature.
        #[serde(default)]
        features: Vec<String>,
    },
    /// Sparse features' pooled embeddings side by side: the schema's in its order, or the
    /// ones named. When their tables have one dim they are vectors that `dot` and `fm`
    /// cross; otherwise one vector.
    Embeddings {
        /// The features; empty: every sparse feature.
        #[serde(default)]
        features: Vec<String>,
    },
    /// The sum of the sparse features' first-order weights (a wide model's linear part;
    /// every table needs its wide twin).
    FirstOrder,
    /// A sequence feature (`schema.sparse[].sequence`) kept as its sequence: one embedding
    /// per position, empty positions zero. Only an `attention` block reads it.
    Sequence {
        /// The feature.
        feature: String,
    },
}

/// An activation function.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `max(0, x)`.
    #[default]
    Relu,
    /// The identity.
    None,
}

/// A block: a function of named values with parameters of its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Block {
    /// Linear layers of `widths`, `activation` between them (and after the last with
    /// `activate_last`).
    Mlp {
        /// The value it reads.
        input: String,
        /// Each layer's output width.
        widths: Vec<u32>,
        /// Between the layers.
        #[serde(default)]
        activation: Activation,
        /// Also after the last layer.
        #[serde(default)]
        activate_last: bool,
    },
    /// Its inputs side by side.
    Concat {
        /// The values, in order.
        inputs: Vec<String>,
    },
    /// Its inputs added element by element (all of one width).
    Add {
        /// The values.
        inputs: Vec<String>,
    },
    /// DLRM's interaction: the first input, then the dot product of every pair of the
    /// vectors of all inputs (all of one width).
    Dot {
        /// The vectors' values, in order.
        inputs: Vec<String>,
    },
    /// A factorisation machine's second-order term over the vectors of its input: width 1.
    Fm {
        /// Vectors of one width (an `embeddings` input).
        input: String,
    },
    /// Layer normalisation: each row of its input to mean 0 and variance 1 (`(x - mean) /
    /// sqrt(var + 1e-5)`), then scaled and shifted by learned per-column weights, then
    /// `activation` (none unless given). Put after an MLP of `activation: none`, it is
    /// that MLP's layer norm.
    LayerNorm {
        /// The value it reads (at least 2 wide).
        input: String,
        /// After the scale and shift.
        #[serde(default = "no_activation")]
        activation: Activation,
    },
    /// One task's gate over a mixture of experts (MMoE): the softmax of a linear map of
    /// `input` weights the `experts`' values (all of one width), summed. Gates over the
    /// same experts, one per task, each feeding that task's tower, make an MMoE layer.
    Gate {
        /// The value the gate reads (the shared input, as in MMoE).
        input: String,
        /// The experts: values of one width (MLP blocks, typically).
        experts: Vec<String>,
    },
    /// DIN's target attention: each position `k` of `sequence` is weighted by an MLP of
    /// `[q, k, q - k, q * k]` (hidden layers of `widths` with ReLU, then one linear output)
    /// and the weighted positions summed, unnormalised as in DIN. Empty positions add
    /// nothing; an empty sequence gives zeros.
    Attention {
        /// The value attending (the candidate item's embedding), as wide as one position.
        query: String,
        /// A `sequence` input.
        sequence: String,
        /// The hidden layers' widths of the weighting MLP.
        widths: Vec<u32>,
    },
    /// A DCN-v2 cross network: `x(l+1) = x0 * (W x(l) + b) + x(l)`, W full or of rank `rank`.
    Cross {
        /// The value it reads (`x0`).
        input: String,
        /// How many cross layers.
        layers: u32,
        /// W as `U V^T` of this rank; unset: full.
        #[serde(default)]
        rank: Option<u32>,
    },
}

/// A task: the value that predicts it, its label and its loss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Head {
    /// A value of width 1: the logit of a binary head, the prediction of a regression head.
    pub input: String,
    /// The Dataset's column holding this head's label.
    pub label: String,
    /// What it minimises.
    #[serde(default)]
    pub loss: Loss,
    /// Its share of the total loss.
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

fn no_activation() -> Activation {
    Activation::None
}

/// A head's loss.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Binary cross-entropy of the sigmoid of the logit (0/1 labels).
    #[default]
    BinaryCrossEntropy,
    /// Squared error of the prediction (a regression).
    SquaredError,
}

impl Block {
    /// The names of the values it reads, with each one's field name.
    pub fn reads(&self) -> Vec<(String, &str)> {
        match self {
            Block::Mlp { input, .. }
            | Block::Fm { input }
            | Block::Cross { input, .. }
            | Block::LayerNorm { input, .. } => vec![("input".to_owned(), input.as_str())],
            Block::Concat { inputs } | Block::Add { inputs } | Block::Dot { inputs } => {
                (inputs.iter().enumerate())
                    .map(|(i, name)| (index("inputs", i), name.as_str()))
                    .collect()
            }
            Block::Attention {
                query, sequence, ..
            } => vec![
                ("query".to_owned(), query.as_str()),
                ("sequence".to_owned(), sequence.as_str()),
            ],
            Block::Gate { input, experts } => {
                let experts = (experts.iter().enumerate())
                    .map(|(i, name)| (index("experts", i), name.as_str()));
                std::iter::once(("input".to_owned(), input.as_str()))
                    .chain(experts)
                    .collect()
            }
        }
    }
}

impl GraphSpec {
    /// The blocks in an order where each comes after every block it reads; `Err` names a
    /// cycle's blocks in order.
    pub fn block_order(&self) -> Result<Vec<&str>, Vec<String>> {
        let mut order = Vec::with_capacity(self.blocks.len());
        let mut done = BTreeSet::new();
        for name in self.blocks.keys() {
            let mut path = Vec::new();
            self.visit(name, &mut path, &mut done, &mut order)?;
        }
        Ok(order)
    }

    /// Depth-first: `name` after what it reads; `path` holds the blocks being visited.
    fn visit<'a>(
        &'a self,
        name: &'a str,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        order: &mut Vec<&'a str>,
    ) -> Result<(), Vec<String>> {
        if done.contains(name) {
            return Ok(());
        }
        if let Some(start) = path.iter().position(|n| *n == name) {
            let mut cycle: Vec<String> = path[start..].iter().map(|n| (*n).to_owned()).collect();
            cycle.push(name.to_owned());
            return Err(cycle);
        }
        let Some((key, block)) = self.blocks.get_key_value(name) else {
            return Ok(());
        };
        path.push(key);
        for (_, read) in block.reads() {
            self.visit(read, path, done, order)?;
        }
        path.pop();
        done.insert(key);
        order.push(key);
        Ok(())
    }

    fn names_value(&self, name: &str) -> bool {
        self.inputs.contains_key(name) || self.blocks.contains_key(name)
    }
}

impl Validate for GraphSpec {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        let inputs = field(path, "inputs");
        for name in self.inputs.keys() {
            check_name(errors, field(&inputs, name), name, true);
        }
        let blocks = field(path, "blocks");
        for (name, block) in &self.blocks {
            let at = field(&blocks, name);
            check_name(errors, at.clone(), name, true);
            if self.inputs.contains_key(name) {
                fail(errors, at.clone(), "an input has the same name");
            }
            block.validate(&at, errors);
            for (read_field, read) in block.reads() {
                if !self.names_value(read) {
                    fail(
                        errors,
                        field(&at, &read_field),
                        format!("{read:?} is neither an input nor a block"),
                    );
                }
            }
        }
        if let Err(cycle) = self.block_order() {
            fail(
                errors,
                field(&blocks, &cycle[0]),
                format!(
                    "the blocks read each other in a cycle: {}",
                    cycle.join(" -> ")
                ),
            );
        }
        let heads = field(path, "heads");
        if self.heads.is_empty() {
            fail(errors, heads.clone(), "a graph needs at least one head");
        }
        for (name, head) in &self.heads {
            let at = field(&heads, name);
            check_name(errors, at.clone(), name, true);
            if !self.names_value(&head.input) {
                fail(
                    errors,
                    field(&at, "input"),
                    format!("{:?} is neither an input nor a block", head.input),
                );
            }
            if head.label.is_empty() {
                fail(errors, field(&at, "label"), "must name the label column");
            }
            if !(head.weight.is_finite() && head.weight > 0.0) {
                fail(errors, field(&at, "weight"), "must be a positive number");
            }
        }
    }
}

impl Validate for Block {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        match self {
            Block::Attention { widths, .. } => {
                for (i, width) in widths.iter().enumerate() {
                    if *width == 0 {
                        fail(
                            errors,
                            index(&field(path, "widths"), i),
                            "must be at least 1",
                        );
                    }
                }
            }
            Block::Mlp { widths, .. } => {
                if widths.is_empty() {
                    fail(errors, field(path, "widths"), "needs at least one layer");
                }
                for (i, width) in widths.iter().enumerate() {
                    if *width == 0 {
                        fail(
                            errors,
                            index(&field(path, "widths"), i),
                            "must be at least 1",
                        );
                    }
                }
            }
            Block::Concat { inputs } | Block::Add { inputs } | Block::Dot { inputs } => {
                if inputs.is_empty() {
                    fail(errors, field(path, "inputs"), "needs at least one input");
                }
            }
            Block::Gate { experts, .. } => {
                if experts.is_empty() {
                    fail(errors, field(path, "experts"), "needs at least one expert");
                }
            }
            Block::Fm { .. } | Block::LayerNorm { .. } => {}
            Block::Cross { layers, rank, .. } => {
                if *layers == 0 {
                    fail(errors, field(path, "layers"), "must be at least 1");
                }
                if *rank == Some(0) {
                    fail(errors, field(path, "rank"), "must be at least 1 when set");
                }
            }
        }
    }
}
