//! One task's gate over a mixture of experts (MMoE): per row, the softmax of `x W + b`
//! over the experts (`{prefix}.weight [d, k]`, Glorot; `{prefix}.bias [1, k]`, zeros)
//! weights the experts' values: `sum_i g_i e_i`. Forward and backward over plain row
//! loops: a gate's width is a handful of experts.

use crate::ModelError;
use crate::params::{ParamSet, ParamTensor};

use super::{ParamInit, ParamShape};

/// A gate's input width, its experts and their width, and its parameters' prefix.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    prefix: String,
    input: usize,
    experts: usize,
    width: usize,
}

/// What the backward needs of the forward, kept across steps: each row's expert weights.
#[derive(Default)]
pub(crate) struct GateActs {
    weights: Vec<f32>,
}

impl Gate {
    pub(crate) fn new(prefix: &str, input: usize, experts: usize, width: usize) -> Self {
        Self {
            prefix: prefix.to_owned(),
            input,
            experts,
            width,
        }
    }

    /// Its parameters' prefix (a linear layer's: `{prefix}.weight`, `{prefix}.bias`).
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn param_shapes(&self) -> Vec<ParamShape> {
        vec![
            ParamShape {
                name: format!("{}.weight", self.prefix),
                shape: vec![self.input, self.experts],
                init: ParamInit::Glorot(self.input + self.experts),
            },
            ParamShape {
                name: format!("{}.bias", self.prefix),
                shape: vec![1, self.experts],
                init: ParamInit::Zeros,
            },
        ]
    }

    fn weights<'p>(&self, params: &'p ParamSet) -> Result<(&'p [f32], &'p [f32]), ModelError> {
        let get = |what: &str, len: usize| {
            let name = format!("{}.{what}", self.prefix);
            match params.get(&name) {
                Some(t) if t.values.len() == len => Ok(t.values.as_slice()),
                Some(t) => Err(ModelError::Params(format!(
                    "{name}: {} values, the gate needs {len}",
                    t.values.len()
                ))),
                None => Err(ModelError::Params(format!(
                    "the set has no tensor {name:?}"
                ))),
            }
        };
        let k = self.experts;
        Ok((get("weight", self.input * k)?, get("bias", k)?))
    }

    /// `out (rows x width)` from the gate's input `x` and the `experts`' values, keeping
    /// each row's expert weights in `acts`.
    pub(crate) fn forward(
        &self,
        params: &ParamSet,
        x: &[f32],
        experts: &[&[f32]],
        acts: &mut GateActs,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let (weight, bias) = self.weights(params)?;
        let (d, k, w) = (self.input, self.experts, self.width);
        let rows = x.len() / d;
        acts.weights.resize(rows * k, 0.0);
        for (r, (x, g)) in x
            .chunks_exact(d)
            .zip(acts.weights.chunks_exact_mut(k))
            .enumerate()
        {
            g.copy_from_slice(bias);
            for (xj, weight_row) in x.iter().zip(weight.chunks_exact(k)) {
                for (gi, wji) in g.iter_mut().zip(weight_row) {
                    *gi += xj * wji;
                }
            }
            softmax(g);
            let out = &mut out[r * w..(r + 1) * w];
            out.fill(0.0);
            for (gi, expert) in g.iter().zip(experts) {
                for (o, e) in out.iter_mut().zip(&expert[r * w..(r + 1) * w]) {
                    *o += gi * e;
                }
            }
        }
        Ok(())
    }

    /// From the output's gradient, the parameters' gradients (returned), the input's
    /// (written into `grad_x`) and each expert's (written into `grad_experts`).
    pub(crate) fn backward(
        &self,
        params: &ParamSet,
        (x, experts): (&[f32], &[&[f32]]),
        acts: &GateActs,
        grad_output: &[f32],
        (grad_x, grad_experts): (&mut [f32], &mut [Vec<f32>]),
    ) -> Result<Vec<ParamTensor>, ModelError> {
        let (weight, _) = self.weights(params)?;
        let (d, k, w) = (self.input, self.experts, self.width);
        let mut grad_weight = vec![0.0; d * k];
        let mut grad_bias = vec![0.0; k];
        let mut grad_logits = vec![0.0; k];
        let rows = x.len() / d;
        for r in 0..rows {
            let g = &acts.weights[r * k..(r + 1) * k];
            let dy = &grad_output[r * w..(r + 1) * w];
            for (i, expert) in experts.iter().enumerate() {
                let e = &expert[r * w..(r + 1) * w];
                grad_logits[i] = dy.iter().zip(e).map(|(a, b)| a * b).sum();
                for (de, dy) in grad_experts[i][r * w..(r + 1) * w].iter_mut().zip(dy) {
                    *de = g[i] * dy;
                }
            }
            // Through the softmax: dl_i = g_i (dg_i - sum_j g_j dg_j).
            let mean: f32 = g.iter().zip(&grad_logits).map(|(a, b)| a * b).sum();
            for (dl, gi) in grad_logits.iter_mut().zip(g) {
                *dl = gi * (*dl - mean);
            }
            let x = &x[r * d..(r + 1) * d];
            let dx = &mut grad_x[r * d..(r + 1) * d];
            for (j, (xj, dxj)) in x.iter().zip(dx.iter_mut()).enumerate() {
                let weight_row = &weight[j * k..(j + 1) * k];
                *dxj = weight_row
                    .iter()
                    .zip(&grad_logits)
                    .map(|(a, b)| a * b)
                    .sum();
                for (gw, dl) in grad_weight[j * k..(j + 1) * k].iter_mut().zip(&grad_logits) {
                    *gw += xj * dl;
                }
            }
            for (gb, dl) in grad_bias.iter_mut().zip(&grad_logits) {
                *gb += dl;
            }
        }
        let tensor = |what: &str, shape, values| ParamTensor {
            name: format!("{}.{what}", self.prefix),
            shape,
            values,
        };
        Ok(vec![
            tensor("weight", vec![d, k], grad_weight),
            tensor("bias", vec![1, k], grad_bias),
        ])
    }
}

/// `values` replaced by their softmax, shifted by their maximum so no exponent overflows.
fn softmax(values: &mut [f32]) {
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in values.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in values.iter_mut() {
        *v /= sum;
    }
}
