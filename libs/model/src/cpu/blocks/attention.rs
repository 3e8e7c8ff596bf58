//! DIN's target attention (Zhou et al., 2018): per row, each position `k` of a sequence
//! gets a weight `s = MLP([q, k, q - k, q * k])` from the query `q`, and the output is
//! `sum_k s k`. The weights are not normalised (DIN keeps the intensity of a user's
//! interest), so an empty position (a zero embedding) adds nothing and sends no gradient
//! to the MLP: no mask is needed, and an empty sequence gives zeros.
//!
//! The MLP is layers `{prefix}.{i}` (`weight [in, out]`, `bias [1, out]`): the hidden
//! widths with ReLU, then one linear output, run over all `rows x length` positions at
//! once.

use crate::ModelError;
use crate::cpu::mlp::{Activations, GradBuffers, InputGrad, Stack};
use crate::params::{ParamSet, ParamTensor};

use super::{ParamInit, ParamShape};

/// An attention block's shape and its MLP's prefix.
#[derive(Debug, Clone)]
pub(crate) struct Attention {
    prefix: String,
    /// Floats per position and of the query.
    dim: usize,
    /// Positions per row.
    length: usize,
    /// The MLP's hidden widths.
    hidden: Vec<usize>,
}

/// What the backward needs of the forward, kept across steps.
#[derive(Default)]
pub(crate) struct AttentionActs {
    /// `rows x length x 4 dim`: each position's MLP input.
    features: Vec<f32>,
    mlp: Activations,
}

/// Where an attention block's input gradients go: written over, not added.
pub(crate) struct AttentionGrads<'a> {
    /// `rows x dim`.
    pub(crate) query: &'a mut [f32],
    /// `rows x length x dim`.
    pub(crate) sequence: &'a mut [f32],
}

impl Attention {
    pub(crate) fn new(prefix: &str, dim: usize, length: usize, hidden: Vec<usize>) -> Self {
        Self {
            prefix: prefix.to_owned(),
            dim,
            length,
            hidden,
        }
    }

    /// Its MLP's prefix and its layers' output widths (the last is 1).
    pub(crate) fn layers(&self) -> (&str, Vec<usize>) {
        let mut widths = self.hidden.clone();
        widths.push(1);
        (&self.prefix, widths)
    }

    /// Floats per position, and positions per row.
    pub(crate) fn shape(&self) -> (usize, usize) {
        (self.dim, self.length)
    }

    pub(crate) fn param_shapes(&self) -> Vec<ParamShape> {
        let mut shapes = Vec::new();
        let mut inputs = 4 * self.dim;
        for (i, outputs) in self.layers().1.into_iter().enumerate() {
            shapes.push(ParamShape {
                name: format!("{}.{i}.weight", self.prefix),
                shape: vec![inputs, outputs],
                init: ParamInit::Glorot(inputs + outputs),
            });
            shapes.push(ParamShape {
                name: format!("{}.{i}.bias", self.prefix),
                shape: vec![1, outputs],
                init: ParamInit::Zeros,
            });
            inputs = outputs;
        }
        shapes
    }

    fn stack<'p>(&self, params: &'p ParamSet) -> Result<Stack<'p>, ModelError> {
        Stack::new(params, &self.prefix, self.hidden.len() + 1, false)
    }

    /// `out (rows x dim)` from the `query (rows x dim)` and the `sequence (rows x length x
    /// dim)`, keeping what the backward needs in `acts`.
    pub(crate) fn forward(
        &self,
        params: &ParamSet,
        (query, sequence): (&[f32], &[f32]),
        acts: &mut AttentionActs,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let stack = self.stack(params)?;
        let (d, l) = (self.dim, self.length);
        let rows = query.len() / d;
        acts.features.resize(rows * l * 4 * d, 0.0);
        let positions = sequence.chunks_exact(d);
        let features = acts.features.chunks_exact_mut(4 * d);
        for (p, (k, f)) in positions.zip(features).enumerate() {
            let q = &query[p / l * d..][..d];
            let (fq, rest) = f.split_at_mut(d);
            let (fk, rest) = rest.split_at_mut(d);
            let (fdiff, fprod) = rest.split_at_mut(d);
            fq.copy_from_slice(q);
            fk.copy_from_slice(k);
            for (j, (diff, prod)) in fdiff.iter_mut().zip(fprod).enumerate() {
                *diff = q[j] - k[j];
                *prod = q[j] * k[j];
            }
        }
        stack.forward(&acts.features, rows * l, &mut acts.mlp);
        let scores = acts.mlp.last();
        for (r, out) in out.chunks_exact_mut(d).enumerate() {
            out.fill(0.0);
            for (s, k) in scores[r * l..][..l]
                .iter()
                .zip(sequence[r * l * d..][..l * d].chunks_exact(d))
            {
                for (o, kj) in out.iter_mut().zip(k) {
                    *o += s * kj;
                }
            }
        }
        Ok(())
    }

    /// From the output's gradient, the MLP's parameter gradients (returned) and the
    /// query's and sequence's gradients (written into `grads`).
    pub(crate) fn backward(
        &self,
        params: &ParamSet,
        (query, sequence): (&[f32], &[f32]),
        acts: &AttentionActs,
        grad_output: &[f32],
        buffers: &mut GradBuffers,
        grads: AttentionGrads<'_>,
    ) -> Result<Vec<ParamTensor>, ModelError> {
        let stack = self.stack(params)?;
        let (d, l) = (self.dim, self.length);
        let rows = query.len() / d;
        let scores = acts.mlp.last();
        // Each position's weight's gradient `k . dy`, and the direct part of its own: `s dy`.
        let mut grad_scores = vec![0.0; rows * l];
        for (p, (k, gk)) in (sequence.chunks_exact(d))
            .zip(grads.sequence.chunks_exact_mut(d))
            .enumerate()
        {
            let dy = &grad_output[p / l * d..][..d];
            grad_scores[p] = k.iter().zip(dy).map(|(a, b)| a * b).sum();
            for (g, dyj) in gk.iter_mut().zip(dy) {
                *g = scores[p] * dyj;
            }
        }
        let mut grad_features = vec![0.0; rows * l * 4 * d];
        let input_grad = InputGrad {
            into: &mut grad_features,
            accumulate: false,
        };
        let params_grads = stack.backward(
            &acts.features,
            rows * l,
            &acts.mlp,
            &grad_scores,
            buffers,
            Some(input_grad),
        );
        // Through `[q, k, q - k, q * k]` onto the query and the position.
        grads.query.fill(0.0);
        for (p, (gf, (k, gk))) in (grad_features.chunks_exact(4 * d))
            .zip(
                sequence
                    .chunks_exact(d)
                    .zip(grads.sequence.chunks_exact_mut(d)),
            )
            .enumerate()
        {
            let r = p / l;
            let q = &query[r * d..][..d];
            let gq = &mut grads.query[r * d..][..d];
            let (gfq, rest) = gf.split_at(d);
            let (gfk, rest) = rest.split_at(d);
            let (gfdiff, gfprod) = rest.split_at(d);
            for (j, g) in gq.iter_mut().enumerate() {
                *g += gfq[j] + gfdiff[j] + gfprod[j] * k[j];
            }
            for (j, g) in gk.iter_mut().enumerate() {
                *g += gfk[j] - gfdiff[j] + gfprod[j] * q[j];
            }
        }
        Ok(params_grads)
    }
}
