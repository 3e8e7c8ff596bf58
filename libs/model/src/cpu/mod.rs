//! DLRM, DeepFM and Wide&Deep on the CPU, forward and backward written out over a tuned
//! sgemm (the `gemm` crate: AVX-512 or AVX2 kernels, every core) instead of burn's graph.
//! Bias and activation are one pass over each product, transposes are read through strides,
//! and activations live in a [`Workspace`] reused across steps, so a step allocates only
//! what it returns. MTRM and the GPU run on burn (`crate::graph`), which is also the
//! reference these networks are tested against.

pub(crate) mod blocks;
mod interaction;
mod linalg;
mod mlp;

use primus_spec::job::ModelKind;
use rayon::prelude::*;

use crate::inputs::Inputs;
use crate::layout::ModelLayout;
use crate::params::{ParamSet, ParamTensor};
use crate::{EmbeddingGrads, ModelError, StepOutput};

use interaction::{Dots, fm_backward, fm_forward};
use linalg::{ROW_BLOCK, sized};
use mlp::{Activations, GradBuffers, Stack};

/// Whether `kind` runs here.
pub(crate) fn supports(kind: ModelKind) -> bool {
    matches!(
        kind,
        ModelKind::Dlrm | ModelKind::Deepfm | ModelKind::WideDeep
    )
}

/// Everything a step computes between its forward and backward passes, kept for the next
/// step (same batch size: no allocation, no page faults).
#[derive(Default)]
pub(crate) struct Workspace {
    bottom: Activations,
    top: Activations,
    wide_dense: Activations,
    /// DLRM: the top MLP's input; DeepFM and Wide&Deep: the deep MLP's input.
    joined: Vec<f32>,
    grad_joined: Vec<f32>,
    grad_bottom: Vec<f32>,
    fm: Vec<f32>,
    logits: Vec<f32>,
    buffers: GradBuffers,
}

/// One of the networks this module computes, bound to a parameter set.
enum Net<'p> {
    Dlrm {
        bottom: Stack<'p>,
        top: Stack<'p>,
        dots: Dots,
    },
    /// Wide&Deep, and DeepFM with `fm` (the factorisation machine's `(features, dim)`).
    Deep {
        deep: Stack<'p>,
        wide_dense: Option<Stack<'p>>,
        fm: Option<(usize, usize)>,
    },
}

impl<'p> Net<'p> {
    fn new(layout: &ModelLayout, params: &'p ParamSet) -> Result<Self, ModelError> {
        let spec = &layout.dense_spec;
        let features = layout.features.len();
        match layout.kind {
            ModelKind::Dlrm => {
                let bottom = Stack::new(params, "bottom", spec.bottom.len(), true)?;
                let dots = Dots {
                    dim: bottom.outputs(),
                    features,
                };
                Ok(Self::Dlrm {
                    bottom,
                    top: Stack::new(params, "top", spec.top.len(), false)?,
                    dots,
                })
            }
            ModelKind::Deepfm | ModelKind::WideDeep => Ok(Self::Deep {
                deep: Stack::new(params, "deep", spec.top.len(), false)?,
                wide_dense: (layout.dense_inputs > 0)
                    .then(|| Stack::new(params, "wide_dense", 1, false))
                    .transpose()?,
                fm: (layout.kind == ModelKind::Deepfm).then(|| (features, layout.features[0].dim)),
            }),
            ModelKind::Mtrm => Err(ModelError::Spec {
                field: "model.kind".into(),
                message: "mtrm runs on burn, not the CPU networks".into(),
            }),
        }
    }

    /// Logits `rows x 1` into `ws.logits`.
    fn forward(&self, layout: &ModelLayout, inputs: &Inputs<'_>, ws: &mut Workspace) {
        let rows = inputs.rows;
        match self {
            Self::Dlrm { bottom, top, dots } => {
                bottom.forward(inputs.dense, rows, &mut ws.bottom);
                let joined = sized(&mut ws.joined, rows * dots.width());
                dots.forward(ws.bottom.last(), inputs.embedded, joined);
                top.forward(joined, rows, &mut ws.top);
                sized(&mut ws.logits, rows).copy_from_slice(ws.top.last());
            }
            Self::Deep {
                deep,
                wide_dense,
                fm,
            } => {
                let joined = join(inputs, layout, &mut ws.joined);
                deep.forward(joined, rows, &mut ws.top);
                let logits = sized(&mut ws.logits, rows);
                logits.copy_from_slice(ws.top.last());
                if layout.has_wide() {
                    let features = layout.features.len();
                    for (l, w) in logits.iter_mut().zip(inputs.wide.chunks_exact(features)) {
                        *l += w.iter().sum::<f32>();
                    }
                }
                if let Some(linear) = wide_dense {
                    linear.forward(inputs.dense, rows, &mut ws.wide_dense);
                    add(logits, ws.wide_dense.last());
                }
                if let Some((features, dim)) = *fm {
                    let out = sized(&mut ws.fm, rows);
                    fm_forward(inputs.embedded, features, dim, out);
                    add(logits, out);
                }
            }
        }
    }

    /// Gradients from `grad_logits` (`rows x 1`) after [`Net::forward`] on the same inputs;
    /// the embeddings' go to `on_embedding_grads` before the layers that do not lead to
    /// them (DLRM's bottom MLP) run their backward.
    fn backward(
        &self,
        layout: &ModelLayout,
        inputs: &Inputs<'_>,
        grad_logits: &[f32],
        ws: &mut Workspace,
        on_embedding_grads: impl FnOnce(EmbeddingGrads<'_>),
    ) -> (Vec<ParamTensor>, Vec<f32>, Vec<f32>) {
        let rows = inputs.rows;
        let mut grads = Vec::new();
        let mut grad_embedded = vec![0.0; rows * layout.embedding_width];
        let mut grad_wide = Vec::new();
        match self {
            Self::Dlrm { bottom, top, dots } => {
                let grad_joined = sized(&mut ws.grad_joined, rows * dots.width());
                let joined = &ws.joined;
                grads.extend(top.backward(
                    joined,
                    rows,
                    &ws.top,
                    grad_logits,
                    &mut ws.buffers,
                    Some(grad_joined),
                ));
                let grad_bottom = sized(&mut ws.grad_bottom, rows * dots.dim);
                let bottom_out = ws.bottom.last();
                dots.backward(
                    bottom_out,
                    inputs.embedded,
                    grad_joined,
                    grad_bottom,
                    &mut grad_embedded,
                );
                on_embedding_grads(EmbeddingGrads {
                    embedded: &grad_embedded,
                    wide: &grad_wide,
                });
                let grad_bottom = &ws.grad_bottom;
                grads.extend(bottom.backward(
                    inputs.dense,
                    rows,
                    &ws.bottom,
                    grad_bottom,
                    &mut ws.buffers,
                    None,
                ));
            }
            Self::Deep {
                deep,
                wide_dense,
                fm,
            } => {
                let width = layout.dense_inputs + layout.embedding_width;
                let grad_joined = sized(&mut ws.grad_joined, rows * width);
                grads.extend(deep.backward(
                    &ws.joined,
                    rows,
                    &ws.top,
                    grad_logits,
                    &mut ws.buffers,
                    Some(grad_joined),
                ));
                split_embedded(grad_joined, layout, &mut grad_embedded);
                if let Some(linear) = wide_dense {
                    grads.extend(linear.backward(
                        inputs.dense,
                        rows,
                        &ws.wide_dense,
                        grad_logits,
                        &mut ws.buffers,
                        None,
                    ));
                }
                if let Some((features, dim)) = *fm {
                    fm_backward(
                        inputs.embedded,
                        features,
                        dim,
                        grad_logits,
                        &mut grad_embedded,
                    );
                }
                if layout.has_wide() {
                    let features = layout.features.len();
                    grad_wide = grad_logits
                        .iter()
                        .flat_map(|g| std::iter::repeat_n(*g, features))
                        .collect();
                }
                on_embedding_grads(EmbeddingGrads {
                    embedded: &grad_embedded,
                    wide: &grad_wide,
                });
            }
        }
        (grads, grad_embedded, grad_wide)
    }
}

/// `[dense | embedded]` per row, the deep MLP's input.
fn join<'w>(inputs: &Inputs<'_>, layout: &ModelLayout, out: &'w mut Vec<f32>) -> &'w [f32] {
    let (dense, embedded) = (layout.dense_inputs, layout.embedding_width);
    let out = sized(out, inputs.rows * (dense + embedded));
    out.par_chunks_mut((dense + embedded) * ROW_BLOCK)
        .enumerate()
        .for_each(|(block, out)| {
            for (r, row) in out.chunks_exact_mut(dense + embedded).enumerate() {
                let r = block * ROW_BLOCK + r;
                row[..dense].copy_from_slice(&inputs.dense[r * dense..(r + 1) * dense]);
                row[dense..].copy_from_slice(&inputs.embedded[r * embedded..(r + 1) * embedded]);
            }
        });
    out
}

/// The embedded part of each row of the deep input's gradient.
fn split_embedded(grad_joined: &[f32], layout: &ModelLayout, grad_embedded: &mut [f32]) {
    let (dense, embedded) = (layout.dense_inputs, layout.embedding_width);
    for (out, row) in grad_embedded
        .chunks_exact_mut(embedded)
        .zip(grad_joined.chunks_exact(dense + embedded))
    {
        out.copy_from_slice(&row[dense..]);
    }
}

fn add(into: &mut [f32], values: &[f32]) {
    for (a, b) in into.iter_mut().zip(values) {
        *a += b;
    }
}

pub(crate) fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// Forward and backward of one minibatch: the mean binary cross-entropy's gradients, the
/// embeddings' handed to `on_embedding_grads` as soon as they are known.
pub(crate) fn train_step(
    layout: &ModelLayout,
    params: &ParamSet,
    inputs: &Inputs<'_>,
    labels: &[f32],
    ws: &mut Workspace,
    on_embedding_grads: impl FnOnce(EmbeddingGrads<'_>),
) -> Result<StepOutput, ModelError> {
    let net = Net::new(layout, params)?;
    net.forward(layout, inputs, ws);
    let rows = inputs.rows as f32;
    let mut loss = 0.0f64;
    let mut probabilities = Vec::with_capacity(inputs.rows);
    let mut grad_logits = Vec::with_capacity(inputs.rows);
    for (z, y) in ws.logits.iter().zip(labels) {
        // max(z, 0) - z*y + log(1 + exp(-|z|)), stable for any z.
        loss += f64::from(z.max(0.0) - z * y + (-z.abs()).exp().ln_1p());
        let p = sigmoid(*z);
        probabilities.push(p);
        grad_logits.push((p - y) / rows);
    }
    let (grads, embedded_grad, wide_grad) =
        net.backward(layout, inputs, &grad_logits, ws, on_embedding_grads);
    Ok(StepOutput {
        loss: (loss / f64::from(rows)) as f32,
        probabilities,
        dense_grads: in_set_order(params, grads),
        embedded_grad,
        wide_grad,
    })
}

/// Probabilities of one minibatch.
pub(crate) fn predict(
    layout: &ModelLayout,
    params: &ParamSet,
    inputs: &Inputs<'_>,
    ws: &mut Workspace,
) -> Result<Vec<f32>, ModelError> {
    let net = Net::new(layout, params)?;
    net.forward(layout, inputs, ws);
    Ok(ws.logits.iter().map(|z| sigmoid(*z)).collect())
}

/// Gradients in the parameter set's order (the order a PS push lists them in).
pub(crate) fn in_set_order(params: &ParamSet, mut grads: Vec<ParamTensor>) -> Vec<ParamTensor> {
    let position = |name: &str| params.tensors.iter().position(|t| t.name == name);
    grads.sort_by_key(|g| position(&g.name));
    grads
}
