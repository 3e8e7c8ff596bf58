//! The dense networks on burn, written as functions of named parameter tensors so that the same
//! code trains (autodiff device), predicts (plain device) and is exported, and so that the
//! parameters can live on the PS rather than in a module.

use primus_spec::job::ModelKind;

use super::backend::{Device, Int, Tensor, TensorData, relu};
use crate::inputs::{Inputs, Tower};
use crate::layout::ModelLayout;
use crate::params::ParamSet;

/// The parameters and inputs as tensors on one device.
pub(crate) struct Graph {
    pub params: Vec<(String, Tensor<2>)>,
    pub dense: Tensor<2>,
    pub embedded: Tensor<2>,
    pub wide: Option<Tensor<2>>,
}

pub(crate) fn matrix(values: &[f32], rows: usize, cols: usize, device: &Device) -> Tensor<2> {
    Tensor::<2>::from_data(TensorData::new(values.to_vec(), [rows, cols]), device)
}

impl Graph {
    /// Places everything on `device`; with `track` the parameters and the sparse inputs
    /// record gradients.
    pub(crate) fn new(
        layout: &ModelLayout,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        device: &Device,
        track: bool,
    ) -> Self {
        let leaf = |t: Tensor<2>| if track { t.require_grad() } else { t };
        let params = params
            .tensors
            .iter()
            .map(|p| {
                let (rows, cols) = (p.shape[0], p.shape[1]);
                (p.name.clone(), leaf(matrix(&p.values, rows, cols, device)))
            })
            .collect();
        let features = layout.features.len();
        Self {
            params,
            dense: matrix(inputs.dense, inputs.rows, layout.dense_inputs, device),
            embedded: leaf(matrix(
                inputs.embedded,
                inputs.rows,
                layout.embedding_width,
                device,
            )),
            wide: layout
                .has_wide()
                .then(|| leaf(matrix(inputs.wide, inputs.rows, features, device))),
        }
    }

    fn param(&self, name: &str) -> Tensor<2> {
        // Names come from `linear_layers`, the same list `ParamSet::init` builds from.
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| panic!("parameter {name} is missing from the set"))
    }

    fn linear(&self, x: Tensor<2>, layer: &str) -> Tensor<2> {
        x.matmul(self.param(&format!("{layer}.weight"))) + self.param(&format!("{layer}.bias"))
    }

    /// A stack of linear layers with ReLU after each (after the last too with `relu_last`).
    fn mlp(&self, mut x: Tensor<2>, prefix: &str, layers: usize, relu_last: bool) -> Tensor<2> {
        for i in 0..layers {
            x = self.linear(x, &format!("{prefix}.{i}"));
            if i + 1 < layers || relu_last {
                x = relu(x);
            }
        }
        x
    }

    /// Logits `[rows, 1]` of `layout`'s model for minibatches of `tower`.
    pub(crate) fn logits(&self, layout: &ModelLayout, tower: Tower) -> Tensor<2> {
        let spec = &layout.dense_spec;
        match layout.kind {
            ModelKind::Dlrm => {
                let bottom = self.mlp(self.dense.clone(), "bottom", spec.bottom.len(), true);
                let interactions = dot_interactions(&bottom, &self.embedded, layout);
                let top_in = Tensor::cat(vec![bottom, interactions], 1);
                self.mlp(top_in, "top", spec.top.len(), false)
            }
            ModelKind::WideDeep => {
                let deep = self.mlp(self.deep_inputs(), "deep", spec.top.len(), false);
                deep + self.first_order(layout)
            }
            ModelKind::Deepfm => {
                let deep = self.mlp(self.deep_inputs(), "deep", spec.top.len(), false);
                deep + self.first_order(layout) + self.factorisation_machine(layout)
            }
            ModelKind::Mtrm => self.mtrm(layout, tower),
            ModelKind::Graph => unreachable!("burn runs the presets only (Model::burn_cpu)"),
        }
    }

    fn deep_inputs(&self) -> Tensor<2> {
        Tensor::cat(vec![self.dense.clone(), self.embedded.clone()], 1)
    }

    /// Sum of the features' first-order weights plus a linear term of the dense features.
    fn first_order(&self, layout: &ModelLayout) -> Tensor<2> {
        let sparse = match &self.wide {
            Some(wide) => wide.clone().sum_dim(1),
            None => self.embedded.clone().sum_dim(1).zeros_like(),
        };
        if layout.dense_inputs > 0 {
            sparse + self.linear(self.dense.clone(), "wide_dense.0")
        } else {
            sparse
        }
    }

    /// Rendle's pairwise term: 0.5 * sum_k ((sum_f e_fk)^2 - sum_f e_fk^2).
    fn factorisation_machine(&self, layout: &ModelLayout) -> Tensor<2> {
        let rows = self.embedded.dims()[0];
        let features = layout.features.len();
        let dim = layout.features[0].dim;
        let e = self.embedded.clone().reshape([rows, features, dim]);
        let sum = e.clone().sum_dim(1);
        let square_of_sum = sum.clone() * sum;
        let sum_of_squares = (e.clone() * e).sum_dim(1);
        (square_of_sum - sum_of_squares)
            .sum_dim(2)
            .reshape([rows, 1])
            .mul_scalar(0.5)
    }

    /// Memory tower on batch data; the adapt tower corrects the detached memory logit from
    /// the inputs and the detached memory hidden layer (gradients never reach memory).
    fn mtrm(&self, layout: &ModelLayout, tower: Tower) -> Tensor<2> {
        let spec = &layout.dense_spec;
        let bottom = self.mlp(self.dense.clone(), "bottom", spec.bottom.len(), true);
        let memory_in = Tensor::cat(vec![bottom, self.embedded.clone()], 1);
        let hidden_layers = spec.top.len() - 1;
        let hidden = self.mlp(memory_in, "memory", hidden_layers, true);
        let memory = self.linear(hidden.clone(), &format!("memory.{hidden_layers}"));
        match tower {
            Tower::Memory => memory,
            Tower::Adapt => {
                let adapt_in = Tensor::cat(
                    vec![self.dense.clone(), self.embedded.clone(), hidden.detach()],
                    1,
                );
                memory.detach() + self.mlp(adapt_in, "adapt", spec.top.len(), false)
            }
        }
    }
}

/// DLRM's dot interaction: the pairwise dot products (i < j) among the bottom MLP's
/// output and every feature's embedding.
fn dot_interactions(bottom: &Tensor<2>, embedded: &Tensor<2>, layout: &ModelLayout) -> Tensor<2> {
    let rows = bottom.dims()[0];
    let dim = bottom.dims()[1];
    let vectors = layout.features.len() + 1;
    let stacked =
        Tensor::cat(vec![bottom.clone(), embedded.clone()], 1).reshape([rows, vectors, dim]);
    let products = stacked
        .clone()
        .matmul(stacked.transpose())
        .reshape([rows, vectors * vectors]);
    let upper: Vec<i64> = (0..vectors)
        .flat_map(|i| ((i + 1)..vectors).map(move |j| (i * vectors + j) as i64))
        .collect();
    let count = upper.len();
    let indices = Tensor::<1, Int>::from_data(TensorData::new(upper, [count]), &products.device());
    products.select(1, indices)
}

/// Mean binary cross-entropy of `logits` against `labels` (`[rows, 1]`), computed stably:
/// max(z, 0) - z*y + log(1 + exp(-|z|)).
pub(crate) fn bce_with_logits(logits: Tensor<2>, labels: Tensor<2>) -> Tensor<1> {
    let stable = (logits.clone().abs().neg().exp() + 1.0).log();
    (relu(logits.clone()) - logits * labels + stable).mean()
}
