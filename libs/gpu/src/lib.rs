//! primus-gpu: embedding work on NVIDIA GPUs, and its CPU references.
//!
//! Owns the CUDA C kernels (kernels.cu), their compilation by NVRTC at first use (PTX
//! cached per architecture, modules per device), and the host side that validates input
//! and launches them: table-batched gather + sum/mean pooling over jagged and inverse
//! jagged (RecD IKJT) bags, the pooling backward into unique-row gradients (atomic, or
//! deterministic), and fused sparse Adagrad and Adam updates of device-resident rows laid
//! out as the CPU arena lays them out (weights, then optimizer state). [`RowStore`]s hold
//! one table's rows on a GPU ([`DeviceRows`]) or, as its CPU reference, in host memory
//! ([`HostRows`]), read, written and updated in batches by row id. A dense network's parts
//! ([`dense`], launched by [`CudaDense`] on the same stream): cuBLAS's products, the bias
//! and ReLU, DLRM's dot interaction, FM, DCN-v2's cross layers, column-block copies and
//! the heads' losses, forward and backward.
//!
//! CUDA is loaded dynamically (cudarc `dynamic-loading`): this crate builds and runs on
//! machines without a GPU. [`cuda_status`] says whether a device can be used; the NVRTC
//! library alone (PyPI `nvidia-cuda-nvrtc-cu12`) is enough for [`compile_ptx`].

#![warn(missing_docs)]

mod compile;
pub mod dense;
// Kernel launches are `unsafe` in cudarc; this is the only module that launches.
#[allow(unsafe_code)]
mod device;
pub mod layout;
pub mod reference;
mod rows;

pub use compile::{KERNEL_NAMES, KERNEL_SOURCE, compile_ptx, cublas_available, nvrtc_available};
pub use device::{
    CudaDense, CudaKernels, CudaStatus, DeviceDots, DeviceIds, DevicePooling, DeviceTable,
    DeviceTables, cuda_status,
};
pub use layout::{
    Accumulation, FeatureBags, Pooling, PoolingInput, RowContributions, RowOptimizer, TableShape,
};
pub use reference::{CpuKernels, EmbeddingKernels, update_row};
pub use rows::{DeviceRows, HostRows, RowStore};

/// Why a kernel call or a device could not be used.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// Input the host-side checks refused (before any launch).
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The input field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// NVRTC cannot be loaded, so no kernel can be compiled.
    #[error(
        "the NVRTC library (libnvrtc.so) was not found: run scripts/install-deps.sh and source scripts/env.sh, or put a CUDA toolkit's lib64 on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// cuBLAS cannot be loaded, so no dense product can run.
    #[error(
        "the cuBLAS library (libcublas.so) was not found: put a CUDA toolkit's lib64 (or PyPI nvidia-cublas's lib) on LD_LIBRARY_PATH"
    )]
    NoCublas,
    /// cuBLAS failed a call.
    #[error("cuBLAS: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),
    /// No device can be used (the reason).
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    /// NVRTC refused the kernels.
    #[error("NVRTC could not compile the kernels for {arch}: {log}")]
    Compile {
        /// The target architecture (`compute_90`).
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// The CUDA driver failed a call.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

impl GpuError {
    /// A buffer `field` of `have` elements where `need` are needed.
    pub(crate) fn check_len(field: &str, have: usize, need: usize) -> Result<(), Self> {
        if have < need {
            return Err(Self::invalid(
                field,
                format!("{have} elements, {need} needed"),
            ));
        }
        Ok(())
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
