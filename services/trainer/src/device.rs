//! Where a trainer's embedding work runs (`trainer.device`): pooling, its backward and the
//! hot set's rows. On `cpu`, the kernels' CPU references and rows in the trainer's memory;
//! on `cuda`, primus-gpu's CUDA kernels and the hot rows in GPU memory, trained by the
//! fused optimizer kernels. The dense network is not placed here: it follows the device
//! too only in a build with the `cuda` feature (`dense_model` in lib.rs).

use std::sync::Arc;

use anyhow::Context;
use primus_embedding::{EmbeddingError, HotRows};
use primus_gpu::{CudaKernels, DeviceRows, RowStore};
use primus_model::pooling::{CpuKernels, EmbeddingKernels};
use primus_spec::job::{Device, TableSpec};

#[derive(Clone)]
pub enum EmbeddingDevice {
    Cpu,
    Cuda(Arc<CudaKernels>),
}

impl EmbeddingDevice {
    /// The device the settings name; a GPU that cannot be used is an error saying why.
    pub fn open(device: Device, cuda_device: usize) -> anyhow::Result<Self> {
        match device {
            Device::Cpu => Ok(Self::Cpu),
            Device::Cuda => CudaKernels::new(cuda_device)
                .map(|kernels| Self::Cuda(Arc::new(kernels)))
                .with_context(|| format!("trainer.device is cuda (device {cuda_device})")),
        }
    }

    pub fn kernels(&self) -> &dyn EmbeddingKernels {
        match self {
            Self::Cpu => &CpuKernels,
            Self::Cuda(kernels) => kernels.as_ref(),
        }
    }

    /// An empty replica of `spec`'s hot rows, in this device's memory.
    pub fn replica(&self, spec: &TableSpec) -> Result<HotRows, EmbeddingError> {
        match self {
            Self::Cpu => HotRows::new(spec),
            Self::Cuda(kernels) => HotRows::in_store(spec, |dim, stride| {
                let rows = DeviceRows::new(kernels.clone(), dim, stride)?;
                Ok(Box::new(rows) as Box<dyn RowStore>)
            }),
        }
    }
}

impl std::fmt::Debug for EmbeddingDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::Cuda(_) => "cuda",
        })
    }
}
