//! The burn backend the networks run on, and the one place that names a burn version.
//!
//! The `burn` feature builds on burn 0.22 and its flex CPU backend. The `cuda` feature builds
//! on burn 0.21 instead (`burn-cuda-build`), whose run-time dispatch backend adds
//! CUDA: burn 0.22's CUDA backend depends on an LLVM bundle its build script downloads
//! from GitHub, which cannot be fetched here. 0.21's flex path trains the reference DLRM
//! ~25% slower (`cargo bench -p primus-model --bench step`), so it is not the default.
//! The rest of the crate sees only these names.

#[cfg(not(feature = "cuda"))]
mod chosen {
    pub(crate) use burn::tensor::activation::{relu, sigmoid};
    pub(crate) use burn::tensor::{Device, Int, TensorData};

    pub(crate) type Tensor<const D: usize, K = burn::tensor::Float> = burn::tensor::Tensor<D, K>;

    pub(crate) fn cpu() -> Device {
        Device::flex()
    }

    pub(crate) fn autodiff(device: Device) -> Device {
        device.autodiff()
    }

    pub(crate) fn floats(data: TensorData) -> Vec<f32> {
        data.try_to_vec::<f32>().unwrap_or_default()
    }
}

#[cfg(feature = "cuda")]
mod chosen {
    use burn_cuda_build as burn;

    pub(crate) use burn::tensor::activation::{relu, sigmoid};
    pub(crate) use burn::tensor::{Int, TensorData};

    pub(crate) type Device = burn::DispatchDevice;
    pub(crate) type Tensor<const D: usize, K = burn::tensor::Float> =
        burn::tensor::Tensor<burn::Dispatch, D, K>;

    pub(crate) fn cpu() -> Device {
        burn::backend::flex::FlexDevice.into()
    }

    pub(crate) fn autodiff(device: Device) -> Device {
        Device::autodiff(device)
    }

    pub(crate) fn cuda(ordinal: usize) -> Device {
        burn::backend::cuda::CudaDevice { index: ordinal }.into()
    }

    pub(crate) fn floats(data: TensorData) -> Vec<f32> {
        data.to_vec::<f32>().unwrap_or_default()
    }
}

pub(crate) use chosen::*;
