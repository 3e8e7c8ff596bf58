//! A stack of linear layers (ReLU between them, unless told otherwise) forward and backward, over borrowed
//! parameters and reused activation buffers.

use crate::ModelError;
use crate::params::{ParamSet, ParamTensor};

use super::linalg::{Stored, bias_activation, bias_grad, matmul, sized};

/// One linear layer's parameters: `weight [inputs, outputs]`, `bias [1, outputs]`.
struct Layer<'p> {
    name: String,
    weight: &'p [f32],
    bias: &'p [f32],
    inputs: usize,
    outputs: usize,
}

/// Layers `{prefix}.0 ..` of a parameter set.
pub(crate) struct Stack<'p> {
    layers: Vec<Layer<'p>>,
    relu_hidden: bool,
    relu_last: bool,
}

/// A stack's outputs per layer, kept between forward and backward and across steps.
#[derive(Default)]
pub(crate) struct Activations {
    outputs: Vec<Vec<f32>>,
}

impl Activations {
    /// The last layer's output (`rows x outputs`).
    pub(crate) fn last(&self) -> &[f32] {
        self.outputs.last().map_or(&[], Vec::as_slice)
    }
}

/// Where an MLP's input gradient goes: written over `into`, or added to it with
/// `accumulate`.
pub(crate) struct InputGrad<'a> {
    pub(crate) into: &'a mut [f32],
    pub(crate) accumulate: bool,
}

/// Two buffers the backward pass alternates between.
#[derive(Default)]
pub(crate) struct GradBuffers {
    current: Vec<f32>,
    next: Vec<f32>,
}

impl<'p> Stack<'p> {
    /// `layers` layers named `{prefix}.{i}` from `params`, ReLU after each hidden layer and
    /// after the last with `relu_last`.
    pub(crate) fn new(
        params: &'p ParamSet,
        prefix: &str,
        layers: usize,
        relu_last: bool,
    ) -> Result<Self, ModelError> {
        let mut stack = Vec::with_capacity(layers);
        for i in 0..layers {
            let name = format!("{prefix}.{i}");
            let weight = tensor(params, &format!("{name}.weight"))?;
            let bias = tensor(params, &format!("{name}.bias"))?;
            let (inputs, outputs) = match weight.shape[..] {
                [inputs, outputs] if bias.values.len() == outputs => (inputs, outputs),
                _ => {
                    return Err(ModelError::Params(format!(
                        "{name}: weight {:?} and bias {:?} do not form a layer",
                        weight.shape, bias.shape
                    )));
                }
            };
            stack.push(Layer {
                name,
                weight: &weight.values,
                bias: &bias.values,
                inputs,
                outputs,
            });
        }
        Ok(Self {
            layers: stack,
            relu_hidden: true,
            relu_last,
        })
    }

    /// The same layers without the ReLU between them.
    pub(crate) fn linear_between(self) -> Self {
        Self {
            relu_hidden: false,
            ..self
        }
    }

    fn relu_after(&self, i: usize) -> bool {
        if i + 1 < self.layers.len() {
            self.relu_hidden
        } else {
            self.relu_last
        }
    }

    /// Runs `input (rows x inputs)` through every layer into `acts`.
    pub(crate) fn forward(&self, input: &[f32], rows: usize, acts: &mut Activations) {
        acts.outputs.resize_with(self.layers.len(), Vec::new);
        for (i, layer) in self.layers.iter().enumerate() {
            let (done, rest) = acts.outputs.split_at_mut(i);
            let x = if i == 0 { input } else { &done[i - 1][..] };
            let y = sized(&mut rest[0], rows * layer.outputs);
            matmul(
                y,
                (x, Stored::AsIs),
                (layer.weight, Stored::AsIs),
                [rows, layer.inputs, layer.outputs],
                false,
            );
            bias_activation(y, layer.bias, self.relu_after(i));
        }
    }

    /// Backward from `grad_output (rows x outputs)` through the layers `forward` ran on
    /// `input`: every layer's weight and bias gradient (returned), and the input's gradient
    /// into `grad_input` when one is given.
    pub(crate) fn backward(
        &self,
        input: &[f32],
        rows: usize,
        acts: &Activations,
        grad_output: &[f32],
        buffers: &mut GradBuffers,
        mut grad_input: Option<InputGrad<'_>>,
    ) -> Vec<ParamTensor> {
        let mut grads = Vec::with_capacity(2 * self.layers.len());
        sized(&mut buffers.current, grad_output.len()).copy_from_slice(grad_output);
        for (i, layer) in self.layers.iter().enumerate().rev() {
            let grad = &mut buffers.current[..rows * layer.outputs];
            let relu_output = self.relu_after(i).then(|| &acts.outputs[i][..]);
            let bias_grad = bias_grad(grad, relu_output, layer.outputs);
            let grad = &buffers.current[..rows * layer.outputs];
            let x = if i == 0 {
                input
            } else {
                &acts.outputs[i - 1][..]
            };
            let mut weight_grad = vec![0.0; layer.inputs * layer.outputs];
            matmul(
                &mut weight_grad,
                (x, Stored::Transposed),
                (grad, Stored::AsIs),
                [layer.inputs, rows, layer.outputs],
                false,
            );
            grads.push(ParamTensor {
                name: format!("{}.weight", layer.name),
                shape: vec![layer.inputs, layer.outputs],
                values: weight_grad,
            });
            grads.push(ParamTensor {
                name: format!("{}.bias", layer.name),
                shape: vec![1, layer.outputs],
                values: bias_grad,
            });
            let shape = [rows, layer.outputs, layer.inputs];
            let weight = (layer.weight, Stored::Transposed);
            if i > 0 {
                let next = sized(&mut buffers.next, rows * layer.inputs);
                matmul(next, (grad, Stored::AsIs), weight, shape, false);
                std::mem::swap(&mut buffers.current, &mut buffers.next);
            } else if let Some(dx) = grad_input.take() {
                matmul(dx.into, (grad, Stored::AsIs), weight, shape, dx.accumulate);
            }
        }
        grads
    }
}

fn tensor<'p>(params: &'p ParamSet, name: &str) -> Result<&'p ParamTensor, ModelError> {
    params
        .get(name)
        .ok_or_else(|| ModelError::Params(format!("the set has no tensor {name:?}")))
}
