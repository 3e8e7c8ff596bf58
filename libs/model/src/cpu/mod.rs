//! Dense networks on the CPU: a model graph's blocks ([`blocks`]) forward and backward,
//! written out over a tuned sgemm (the `gemm` crate: AVX-512 or AVX2 kernels, every core)
//! instead of burn's graph. Bias and activation are one pass over each product, transposes
//! are read through strides, and activations live in a workspace reused across steps, so
//! a step allocates little beyond what it returns. MTRM runs on burn (`crate::on_burn`),
//! which is also the reference these networks are tested against; `blocks::on_device`
//! places a compiled graph on primus-gpu's dense operations instead of these kernels.

pub(crate) mod blocks;
mod interaction;
mod linalg;
mod mlp;

use crate::params::{ParamSet, ParamTensor};

pub(crate) fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// Gradients in the parameter set's order (the order a PS push lists them in).
pub(crate) fn in_set_order(params: &ParamSet, mut grads: Vec<ParamTensor>) -> Vec<ParamTensor> {
    let position = |name: &str| params.tensors.iter().position(|t| t.name == name);
    grads.sort_by_key(|g| position(&g.name));
    grads
}
