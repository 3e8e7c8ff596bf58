//! DCN-v2's cross network (Wang et al. 2021): `x(l+1) = x0 * (W(l) x(l) + b(l)) + x(l)`,
//! W full (`{prefix}.{l}.weight [d, d]`) or low-rank as `V U` (`{prefix}.{l}.v [d, r]`,
//! `{prefix}.{l}.u [r, d]`), forward and backward over the sgemm.

use crate::ModelError;
use crate::cpu::linalg::{Stored, bias_activation, bias_grad, matmul, sized};
use crate::params::{ParamSet, ParamTensor};

use super::{ParamInit, ParamShape};

/// A cross network's shape and parameter names.
#[derive(Debug, Clone)]
pub(crate) struct CrossNet {
    prefix: String,
    dim: usize,
    layers: usize,
    rank: Option<usize>,
}

/// Each layer's values, kept between forward and backward and across steps.
#[derive(Default)]
pub(crate) struct CrossActs {
    /// `x(0) ..= x(layers)`, `rows x dim` each.
    xs: Vec<Vec<f32>>,
    /// `z(l) = W x(l) + b`.
    zs: Vec<Vec<f32>>,
    /// Low rank: `t(l) = x(l) V`, `rows x rank`.
    ts: Vec<Vec<f32>>,
}

impl CrossActs {
    /// The network's output, `rows x dim`.
    pub(crate) fn last(&self) -> &[f32] {
        self.xs.last().map_or(&[], Vec::as_slice)
    }
}

/// One layer's parameters.
struct CrossLayer<'p> {
    /// Full: `W [d, d]`; low rank: `V [d, r]`.
    first: &'p [f32],
    /// Low rank: `U [r, d]`.
    second: Option<&'p [f32]>,
    bias: &'p [f32],
}

impl CrossNet {
    pub(crate) fn new(prefix: &str, dim: usize, layers: usize, rank: Option<usize>) -> Self {
        Self {
            prefix: prefix.to_owned(),
            dim,
            layers,
            rank,
        }
    }

    /// Its parameters' prefix, width, layers and rank (none: full-rank weights).
    pub(super) fn parts(&self) -> (&str, usize, usize, Option<usize>) {
        (&self.prefix, self.dim, self.layers, self.rank)
    }

    pub(crate) fn param_shapes(&self) -> Vec<ParamShape> {
        let d = self.dim;
        let mut shapes = Vec::new();
        for l in 0..self.layers {
            let name = |what: &str| format!("{}.{l}.{what}", self.prefix);
            match self.rank {
                None => shapes.push(ParamShape {
                    name: name("weight"),
                    shape: vec![d, d],
                    init: ParamInit::Glorot(2 * d),
                }),
                Some(r) => {
                    shapes.push(ParamShape {
                        name: name("v"),
                        shape: vec![d, r],
                        init: ParamInit::Glorot(d + r),
                    });
                    shapes.push(ParamShape {
                        name: name("u"),
                        shape: vec![r, d],
                        init: ParamInit::Glorot(d + r),
                    });
                }
            }
            shapes.push(ParamShape {
                name: name("bias"),
                shape: vec![1, d],
                init: ParamInit::Zeros,
            });
        }
        shapes
    }

    fn layers<'p>(&self, params: &'p ParamSet) -> Result<Vec<CrossLayer<'p>>, ModelError> {
        let get = |l: usize, what: &str, len: usize| {
            let name = format!("{}.{l}.{what}", self.prefix);
            match params.get(&name) {
                Some(t) if t.values.len() == len => Ok(t.values.as_slice()),
                Some(t) => Err(ModelError::Params(format!(
                    "{name}: {} values, the cross network needs {len}",
                    t.values.len()
                ))),
                None => Err(ModelError::Params(format!(
                    "the set has no tensor {name:?}"
                ))),
            }
        };
        let d = self.dim;
        (0..self.layers)
            .map(|l| {
                Ok(match self.rank {
                    None => CrossLayer {
                        first: get(l, "weight", d * d)?,
                        second: None,
                        bias: get(l, "bias", d)?,
                    },
                    Some(r) => CrossLayer {
                        first: get(l, "v", d * r)?,
                        second: Some(get(l, "u", r * d)?),
                        bias: get(l, "bias", d)?,
                    },
                })
            })
            .collect()
    }

    /// Runs `x0 (rows x dim)` through every layer into `acts`.
    pub(crate) fn forward(
        &self,
        params: &ParamSet,
        x0: &[f32],
        rows: usize,
        acts: &mut CrossActs,
    ) -> Result<(), ModelError> {
        let layers = self.layers(params)?;
        let d = self.dim;
        acts.xs.resize_with(self.layers + 1, Vec::new);
        acts.zs.resize_with(self.layers, Vec::new);
        acts.ts.resize_with(self.layers, Vec::new);
        sized(&mut acts.xs[0], rows * d).copy_from_slice(x0);
        for (l, layer) in layers.iter().enumerate() {
            let (done, rest) = acts.xs.split_at_mut(l + 1);
            let x = &done[l];
            let z = sized(&mut acts.zs[l], rows * d);
            match (self.rank, layer.second) {
                (Some(r), Some(u)) => {
                    let t = sized(&mut acts.ts[l], rows * r);
                    let v = (layer.first, Stored::AsIs);
                    matmul(t, (x, Stored::AsIs), v, [rows, d, r], false);
                    matmul(z, (t, Stored::AsIs), (u, Stored::AsIs), [rows, r, d], false);
                }
                _ => {
                    let w = (layer.first, Stored::AsIs);
                    matmul(z, (x, Stored::AsIs), w, [rows, d, d], false);
                }
            }
            bias_activation(z, layer.bias, false);
            let next = sized(&mut rest[0], rows * d);
            for (((n, z), x0), x) in next.iter_mut().zip(z.iter()).zip(&done[0]).zip(x) {
                *n = x0 * z + x;
            }
        }
        Ok(())
    }

    /// From the output's gradient, every parameter's gradient (returned) and the input's,
    /// added into `grad_x0`.
    pub(crate) fn backward(
        &self,
        params: &ParamSet,
        rows: usize,
        acts: &CrossActs,
        grad_output: &[f32],
        grad_x0: &mut [f32],
    ) -> Result<Vec<ParamTensor>, ModelError> {
        let layers = self.layers(params)?;
        let d = self.dim;
        let x0 = &acts.xs[0];
        let mut grads = Vec::with_capacity(3 * self.layers);
        // The gradient of x(l+1), then of x(l).
        let mut g = grad_output.to_vec();
        let mut dz = vec![0.0; rows * d];
        for (l, layer) in layers.iter().enumerate().rev() {
            let (x, z) = (&acts.xs[l], &acts.zs[l]);
            for ((((dz, g), x0), z), gx0) in
                dz.iter_mut().zip(&g).zip(x0).zip(z).zip(grad_x0.iter_mut())
            {
                *dz = g * x0;
                *gx0 += g * z;
            }
            let name = |what: &str| format!("{}.{l}.{what}", self.prefix);
            let mut layer_grads = Vec::with_capacity(3);
            match (self.rank, layer.second) {
                (Some(r), Some(u)) => {
                    let t = &acts.ts[l];
                    let mut grad_u = vec![0.0; r * d];
                    matmul(
                        &mut grad_u,
                        (t, Stored::Transposed),
                        (&dz, Stored::AsIs),
                        [r, rows, d],
                        false,
                    );
                    let mut dt = vec![0.0; rows * r];
                    matmul(
                        &mut dt,
                        (&dz, Stored::AsIs),
                        (u, Stored::Transposed),
                        [rows, d, r],
                        false,
                    );
                    let mut grad_v = vec![0.0; d * r];
                    matmul(
                        &mut grad_v,
                        (x, Stored::Transposed),
                        (&dt, Stored::AsIs),
                        [d, rows, r],
                        false,
                    );
                    // x(l+1) = x0 * z + x(l): g already holds the residual's share.
                    let v = (layer.first, Stored::Transposed);
                    matmul(&mut g, (&dt, Stored::AsIs), v, [rows, r, d], true);
                    layer_grads.push(tensor(name("v"), vec![d, r], grad_v));
                    layer_grads.push(tensor(name("u"), vec![r, d], grad_u));
                }
                _ => {
                    let mut grad_w = vec![0.0; d * d];
                    matmul(
                        &mut grad_w,
                        (x, Stored::Transposed),
                        (&dz, Stored::AsIs),
                        [d, rows, d],
                        false,
                    );
                    let w = (layer.first, Stored::Transposed);
                    matmul(&mut g, (&dz, Stored::AsIs), w, [rows, d, d], true);
                    layer_grads.push(tensor(name("weight"), vec![d, d], grad_w));
                }
            }
            layer_grads.push(tensor(
                name("bias"),
                vec![1, d],
                bias_grad(&mut dz, None, d),
            ));
            grads.extend(layer_grads);
        }
        // x(0) is the input itself.
        for (gx0, g) in grad_x0.iter_mut().zip(&g) {
            *gx0 += g;
        }
        Ok(grads)
    }
}

fn tensor(name: String, shape: Vec<usize>, values: Vec<f32>) -> ParamTensor {
    ParamTensor {
        name,
        shape,
        values,
    }
}
