//! The dense networks on burn: every model kind, on burn's CPU backend or (the `cuda`
//! feature) an NVIDIA GPU. [`crate::Model`] runs MTRM and the GPU here; on the CPU, the other
//! kinds run on the hand-written networks (`crate::cpu`), which are tested against these.

mod backend;
mod net;

use crate::inputs::{Inputs, Tower};
use crate::layout::ModelLayout;
use crate::params::{ParamSet, ParamTensor};
use crate::{HeadOutput, ModelError, StepOutput, StepTimes};

use backend::{Device, Tensor, sigmoid};
use net::{Graph, bce_with_logits, matrix};

/// burn's devices for one model: an autodiff one to train on, a plain one to predict on.
#[derive(Clone)]
pub(crate) struct BurnNets {
    train_device: Device,
    predict_device: Device,
}

impl BurnNets {
    /// On burn's CPU backend.
    pub(crate) fn cpu() -> Self {
        Self::on(backend::cpu())
    }

    /// On CUDA device `ordinal`, once primus-gpu saw it present (burn would panic on a
    /// missing one at its first operation).
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda(ordinal: usize) -> Result<Self, ModelError> {
        let refused = |reason: String| ModelError::Device {
            device: crate::DenseDevice::Cuda(ordinal),
            reason,
        };
        match primus_gpu::cuda_status() {
            primus_gpu::CudaStatus::Ready { devices } if ordinal < devices => {
                Ok(Self::on(backend::cuda(ordinal)))
            }
            primus_gpu::CudaStatus::Ready { devices } => {
                Err(refused(format!("{devices} CUDA devices present")))
            }
            primus_gpu::CudaStatus::NoDriver => Err(refused("no NVIDIA driver".into())),
            primus_gpu::CudaStatus::NoDevice(reason) => Err(refused(reason)),
        }
    }

    /// Without the `cuda` feature there is no GPU backend to run on.
    #[cfg(not(feature = "cuda"))]
    pub(crate) fn cuda(_ordinal: usize) -> Result<Self, ModelError> {
        Err(ModelError::NoCudaBuild)
    }

    fn on(device: Device) -> Self {
        Self {
            train_device: backend::autodiff(device.clone()),
            predict_device: device,
        }
    }

    /// Forward and backward on one minibatch (checked by the caller).
    pub(crate) fn train_step(
        &self,
        layout: &ModelLayout,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        labels: &[f32],
        tower: Tower,
    ) -> StepOutput {
        let device = &self.train_device;
        let graph = Graph::new(layout, params, inputs, device, true);
        let logits = graph.logits(layout, tower);
        let probabilities = sigmoid(logits.clone().detach());
        let loss = bce_with_logits(logits, matrix(labels, inputs.rows, 1, device));
        let grads = loss.backward();
        let dense_grads = graph
            .params
            .iter()
            .filter_map(|(name, tensor)| {
                let grad = tensor.grad(&grads)?;
                Some(ParamTensor {
                    name: name.clone(),
                    shape: grad.dims().to_vec(),
                    values: to_vec(grad),
                })
            })
            .collect();
        let zeros = |len: usize| vec![0.0; len];
        let embedded_grad = graph
            .embedded
            .grad(&grads)
            .map_or_else(|| zeros(graph.embedded.shape().num_elements()), to_vec);
        let wide_grad = match &graph.wide {
            Some(wide) => wide
                .grad(&grads)
                .map_or_else(|| zeros(wide.shape().num_elements()), to_vec),
            None => Vec::new(),
        };
        let loss = (to_vec(loss.reshape([1])).first().copied()).unwrap_or(f32::NAN);
        StepOutput {
            loss,
            heads: vec![HeadOutput {
                name: layout.heads[0].name.clone(),
                loss,
                predictions: to_vec(probabilities),
            }],
            dense_grads,
            embedded_grad,
            wide_grad,
            times: StepTimes::default(),
        }
    }

    /// Probabilities of one minibatch (checked by the caller).
    pub(crate) fn predict(
        &self,
        layout: &ModelLayout,
        params: &ParamSet,
        inputs: &Inputs<'_>,
        tower: Tower,
    ) -> Vec<f32> {
        let graph = Graph::new(layout, params, inputs, &self.predict_device, false);
        to_vec(sigmoid(graph.logits(layout, tower)))
    }
}

fn to_vec<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
    backend::floats(tensor.into_data())
}
