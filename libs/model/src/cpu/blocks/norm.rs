//! Layer normalisation of a graph's value: each row to mean 0 and variance 1, then a learned
//! per-column scale (`{prefix}.scale [1, d]`, from ones) and shift (`{prefix}.shift [1, d]`,
//! from zeros), then an optional ReLU; forward and backward over plain row loops.

use crate::ModelError;
use crate::params::{ParamSet, ParamTensor};

use super::{ParamInit, ParamShape};

/// Added to each row's variance before its square root.
pub(crate) const EPSILON: f32 = 1e-5;

/// A layer norm's width, parameter names and activation.
#[derive(Debug, Clone)]
pub(crate) struct LayerNorm {
    prefix: String,
    dim: usize,
    relu: bool,
}

/// What the backward needs of the forward, kept across steps.
#[derive(Default)]
pub(crate) struct NormActs {
    /// Each row normalised, before the scale and shift (`rows x dim`).
    normalized: Vec<f32>,
    /// Each row's `1 / sqrt(var + EPSILON)`.
    inv_std: Vec<f32>,
}

impl LayerNorm {
    pub(crate) fn new(prefix: &str, dim: usize, relu: bool) -> Self {
        Self {
            prefix: prefix.to_owned(),
            dim,
            relu,
        }
    }

    /// Its parameters' prefix and whether a ReLU follows.
    pub(crate) fn parts(&self) -> (&str, bool) {
        (&self.prefix, self.relu)
    }

    pub(crate) fn param_shapes(&self) -> Vec<ParamShape> {
        let shape = |what: &str, init| ParamShape {
            name: format!("{}.{what}", self.prefix),
            shape: vec![1, self.dim],
            init,
        };
        vec![
            shape("scale", ParamInit::Ones),
            shape("shift", ParamInit::Zeros),
        ]
    }

    fn weights<'p>(&self, params: &'p ParamSet) -> Result<(&'p [f32], &'p [f32]), ModelError> {
        let get = |what: &str| {
            let name = format!("{}.{what}", self.prefix);
            match params.get(&name) {
                Some(t) if t.values.len() == self.dim => Ok(t.values.as_slice()),
                Some(t) => Err(ModelError::Params(format!(
                    "{name}: {} values, the layer norm needs {}",
                    t.values.len(),
                    self.dim
                ))),
                None => Err(ModelError::Params(format!(
                    "the set has no tensor {name:?}"
                ))),
            }
        };
        Ok((get("scale")?, get("shift")?))
    }

    /// `out (rows x dim)` from `x`, keeping what the backward needs in `acts`.
    pub(crate) fn forward(
        &self,
        params: &ParamSet,
        x: &[f32],
        acts: &mut NormActs,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let (scale, shift) = self.weights(params)?;
        let d = self.dim;
        let rows = x.len() / d;
        acts.normalized.resize(rows * d, 0.0);
        acts.inv_std.resize(rows, 0.0);
        let rows_of = x
            .chunks_exact(d)
            .zip(acts.normalized.chunks_exact_mut(d))
            .zip(out.chunks_exact_mut(d))
            .zip(acts.inv_std.iter_mut());
        for (((x, n), y), inv_std) in rows_of {
            let mean = x.iter().sum::<f32>() / d as f32;
            let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
            *inv_std = 1.0 / (var + EPSILON).sqrt();
            for ((((n, y), x), g), b) in n.iter_mut().zip(y.iter_mut()).zip(x).zip(scale).zip(shift)
            {
                *n = (x - mean) * *inv_std;
                let z = *n * g + b;
                *y = if self.relu { z.max(0.0) } else { z };
            }
        }
        Ok(())
    }

    /// From the output's gradient (`output` the forward's result), the scale's and
    /// shift's gradients (returned) and the input's, written into `grad_x`.
    pub(crate) fn backward(
        &self,
        params: &ParamSet,
        acts: &NormActs,
        output: &[f32],
        grad_output: &[f32],
        grad_x: &mut [f32],
    ) -> Result<Vec<ParamTensor>, ModelError> {
        let (scale, _) = self.weights(params)?;
        let d = self.dim;
        let mut grad_scale = vec![0.0; d];
        let mut grad_shift = vec![0.0; d];
        let mut dn = vec![0.0; d];
        let rows_of = (acts.normalized.chunks_exact(d))
            .zip(output.chunks_exact(d))
            .zip(grad_output.chunks_exact(d))
            .zip(grad_x.chunks_exact_mut(d))
            .zip(&acts.inv_std);
        for ((((n, y), dy), dx), inv_std) in rows_of {
            for j in 0..d {
                // Through the ReLU: no gradient where the output was cut to 0.
                let g = if self.relu && y[j] <= 0.0 { 0.0 } else { dy[j] };
                grad_scale[j] += g * n[j];
                grad_shift[j] += g;
                dn[j] = g * scale[j];
            }
            let mean_dn = dn.iter().sum::<f32>() / d as f32;
            let mean_dn_n = dn.iter().zip(n).map(|(a, b)| a * b).sum::<f32>() / d as f32;
            for j in 0..d {
                dx[j] = inv_std * (dn[j] - mean_dn - n[j] * mean_dn_n);
            }
        }
        let tensor = |what: &str, values| ParamTensor {
            name: format!("{}.{what}", self.prefix),
            shape: vec![1, d],
            values,
        };
        Ok(vec![
            tensor("scale", grad_scale),
            tensor("shift", grad_shift),
        ])
    }
}
