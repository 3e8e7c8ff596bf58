//! Kernel source to PTX through NVRTC.

use cudarc::nvrtc::{CompileError, CompileOptions};

use crate::GpuError;

/// The CUDA C++ source of every kernel (the embedding kernels, then the dense network's),
/// compiled by NVRTC at first use into one module.
pub const KERNEL_SOURCE: &str =
    concat!(include_str!("kernels.cu"), include_str!("dense/kernels.cu"));

/// Every `extern "C"` kernel in [`KERNEL_SOURCE`].
pub const KERNEL_NAMES: [&str; 18] = [
    "gather_pool_vec4",
    "gather_pool_scalar",
    "pool_backward_atomic",
    "pool_backward_sorted",
    "adagrad_update",
    "adam_update",
    "gather_rows",
    "scatter_rows",
    "bias_activation",
    "relu_backward",
    "dots_forward",
    "dots_backward",
    "head_loss",
    "copy_columns",
    "fm_forward",
    "fm_backward",
    "cross_forward",
    "cross_backward",
];

/// Whether the NVRTC library can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_available() -> bool {
    #[allow(unsafe_code)]
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe {
        cudarc::nvrtc::sys::is_culib_present()
    }
}

/// Whether the cuBLAS library can be loaded (cudarc panics on first use otherwise).
pub fn cublas_available() -> bool {
    #[allow(unsafe_code)]
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe {
        cudarc::cublas::sys::is_culib_present()
    }
}

/// Compiles every kernel for `arch` (`compute_XY`) and returns the PTX text.
pub fn compile_ptx(arch: &str) -> Result<String, GpuError> {
    if !nvrtc_available() {
        return Err(GpuError::NoNvrtc);
    }
    let options = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some("primus_embedding_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, options).map_err(|e| {
        GpuError::Compile {
            arch: arch.into(),
            log: match e {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => format!("{other:?}"),
            },
        }
    })?;
    Ok(ptx.to_src())
}
