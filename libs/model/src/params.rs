//! The dense parameters of a model as named flat tensors: what the PS holds, what trainers
//! pull and push, what a checkpoint and the ONNX export read.

use primus_embedding::DenseValues;
use primus_spec::job::ModelKind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::ModelError;
use crate::cpu::blocks::{ParamInit, ParamShape};
use crate::layout::ModelLayout;

/// One dense parameter: row-major values of `shape`.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamTensor {
    /// The parameter's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its values, row-major.
    pub values: Vec<f32>,
}

/// A tensor as the PS's dense store holds and sends it.
impl From<DenseValues> for ParamTensor {
    fn from(tensor: DenseValues) -> Self {
        Self {
            name: tensor.name,
            shape: tensor.shape.iter().map(|d| *d as usize).collect(),
            values: tensor.values,
        }
    }
}

/// The tensor as the PS's dense store takes it.
impl From<ParamTensor> for DenseValues {
    fn from(tensor: ParamTensor) -> Self {
        Self {
            name: tensor.name,
            shape: tensor.shape.iter().map(|d| *d as u64).collect(),
            values: tensor.values,
        }
    }
}

/// A linear layer's weight `[inputs, outputs]` and bias `[1, outputs]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinearShape {
    pub inputs: usize,
    pub outputs: usize,
}

/// The linear layers of a stack of widths fed with `inputs` features.
pub(crate) fn stack(prefix: &str, inputs: usize, widths: &[u32]) -> Vec<(String, LinearShape)> {
    let mut layers = Vec::with_capacity(widths.len());
    let mut fan_in = inputs;
    for (i, width) in widths.iter().enumerate() {
        let outputs = *width as usize;
        layers.push((
            format!("{prefix}.{i}"),
            LinearShape {
                inputs: fan_in,
                outputs,
            },
        ));
        fan_in = outputs;
    }
    layers
}

/// Every linear layer of the model, in a fixed order (the order of [`ParamSet`]).
pub(crate) fn linear_layers(layout: &ModelLayout) -> Vec<(String, LinearShape)> {
    let spec = &layout.dense_spec;
    let dense = layout.dense_inputs;
    let embedded = layout.embedding_width;
    match layout.kind {
        ModelKind::Dlrm => {
            let bottom = stack("bottom", dense, &spec.bottom);
            let d = spec.bottom.last().copied().unwrap_or(0) as usize;
            let vectors = layout.features.len() + 1;
            let interactions = vectors * (vectors - 1) / 2;
            let mut layers = bottom;
            layers.extend(stack("top", d + interactions, &spec.top));
            layers
        }
        ModelKind::WideDeep | ModelKind::Deepfm => {
            let mut layers = stack("deep", dense + embedded, &spec.top);
            if dense > 0 {
                layers.extend(stack("wide_dense", dense, &[1]));
            }
            layers
        }
        // A graph's parameters are its blocks' (`ModelLayout::graph_params`).
        ModelKind::Graph => Vec::new(),
        ModelKind::Mtrm => {
            let mut layers = stack("bottom", dense, &spec.bottom);
            let bottom_out = spec.bottom.last().copied().unwrap_or(0) as usize;
            let memory = stack("memory", bottom_out + embedded, &spec.top);
            // The adapt tower also reads the memory tower's last hidden layer.
            let hidden = memory_hidden_width(layout, bottom_out + embedded);
            layers.extend(memory);
            layers.extend(stack("adapt", dense + embedded + hidden, &spec.top));
            layers
        }
    }
}

/// Width of the memory tower's last hidden layer (its input when the tower has only the
/// output layer).
pub(crate) fn memory_hidden_width(layout: &ModelLayout, memory_inputs: usize) -> usize {
    let top = &layout.dense_spec.top;
    if top.len() >= 2 {
        top[top.len() - 2] as usize
    } else {
        memory_inputs
    }
}

/// A model's dense parameters, in the order the model reads them. Built only by
/// [`ParamSet::init`] and changed only by [`ParamSet::assign`], so it always holds exactly
/// the tensors its layout needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSet {
    pub(crate) tensors: Vec<ParamTensor>,
}

impl ParamSet {
    /// Glorot-uniform weights and zero biases (a graph's parameters as its blocks start
    /// them), the same for the same seed.
    pub fn init(layout: &ModelLayout, seed: u64) -> Self {
        if layout.kind == ModelKind::Graph {
            return Self::init_shapes(&layout.graph_params, seed);
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut tensors = Vec::new();
        for (name, shape) in linear_layers(layout) {
            let limit = (6.0 / (shape.inputs + shape.outputs) as f64).sqrt() as f32;
            let weights = (0..shape.inputs * shape.outputs)
                .map(|_| rng.random_range(-limit..=limit))
                .collect();
            tensors.push(ParamTensor {
                name: format!("{name}.weight"),
                shape: vec![shape.inputs, shape.outputs],
                values: weights,
            });
            tensors.push(ParamTensor {
                name: format!("{name}.bias"),
                shape: vec![1, shape.outputs],
                values: vec![0.0; shape.outputs],
            });
        }
        Self { tensors }
    }

    /// A model graph's parameters `shapes`, each started as it says.
    pub(crate) fn init_shapes(shapes: &[ParamShape], seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let tensors = (shapes.iter().cloned())
            .map(|p| {
                let len = p.shape.iter().product();
                let values = match p.init {
                    ParamInit::Glorot(fans) => {
                        let limit = (6.0 / fans as f64).sqrt() as f32;
                        (0..len).map(|_| rng.random_range(-limit..=limit)).collect()
                    }
                    ParamInit::Zeros => vec![0.0; len],
                    ParamInit::Ones => vec![1.0; len],
                };
                ParamTensor {
                    name: p.name,
                    shape: p.shape,
                    values,
                }
            })
            .collect();
        Self { tensors }
    }

    /// Every tensor, in the network's order.
    pub fn tensors(&self) -> &[ParamTensor] {
        &self.tensors
    }

    /// Every tensor's name, in order (what a dense pull asks for).
    pub fn names(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.name.clone()).collect()
    }

    /// Tensor `name`.
    pub fn get(&self, name: &str) -> Option<&ParamTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Values over all tensors.
    pub fn values(&self) -> usize {
        self.tensors.iter().map(|t| t.values.len()).sum()
    }

    /// Replaces every tensor by the one of the same name in `other`, which must hold
    /// exactly this set's names and shapes (a pull from the PS, a restored checkpoint).
    pub fn assign(&mut self, other: Vec<ParamTensor>) -> Result<(), ModelError> {
        if other.len() != self.tensors.len() {
            return Err(ModelError::Params(format!(
                "{} tensors given, the model has {}",
                other.len(),
                self.tensors.len()
            )));
        }
        // Checked whole before any tensor changes: a refused set leaves the values as they were.
        let mut slots = Vec::with_capacity(other.len());
        for tensor in &other {
            let slot = (self.tensors.iter())
                .position(|t| t.name == tensor.name)
                .ok_or_else(|| {
                    ModelError::Params(format!("the model has no tensor {:?}", tensor.name))
                })?;
            let mine = &self.tensors[slot];
            if mine.shape != tensor.shape || tensor.values.len() != mine.values.len() {
                return Err(ModelError::Params(format!(
                    "tensor {:?}: shape {:?} given, the model's is {:?}",
                    tensor.name, tensor.shape, mine.shape
                )));
            }
            slots.push(slot);
        }
        for (slot, tensor) in slots.into_iter().zip(other) {
            self.tensors[slot].values = tensor.values;
        }
        Ok(())
    }
}
