//! The dense network's launches (cuBLAS's products and dense/kernels.cu) against
//! `primus_gpu::dense::reference` on random input. cuBLAS orders its sums as it likes, so
//! sums are compared by relative norm; element-wise kernels bit for bit.

use cudarc::driver::CudaSlice;
use primus_gpu::dense::{
    Columns, DenseOps, DotShape, FmShape, HeadLoss, Product, Stored, reference,
};
use primus_gpu::{CudaDense, CudaKernels, GpuError};
use rand::rngs::StdRng;

use crate::common::random_floats;
use crate::{bits, first_difference};

/// What cuBLAS's FP32 sums (and the kernels' fused multiply-adds) may differ by.
const SUM_TOLERANCE: f64 = 1e-5;

pub(crate) fn relative_difference(gpu: &[f32], cpu: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (g, c) in gpu.iter().zip(cpu) {
        diff += f64::from(g - c).powi(2);
        norm += f64::from(*c).powi(2);
    }
    if gpu.len() != cpu.len() || gpu.iter().any(|g| !g.is_finite()) {
        return f64::INFINITY;
    }
    (diff / norm.max(1e-30)).sqrt()
}

fn close(what: &str, gpu: &[f32], cpu: &[f32], tolerance: f64) -> Result<(), String> {
    match relative_difference(gpu, cpu) {
        d if d <= tolerance => Ok(()),
        d => Err(format!(
            "{what}: relative difference {d:.3e} > {tolerance:e}"
        )),
    }
}

fn up(kernels: &CudaKernels, values: &[f32]) -> Result<CudaSlice<f32>, String> {
    kernels.upload(values).map_err(|e| e.to_string())
}

fn down(kernels: &CudaKernels, values: &CudaSlice<f32>, len: usize) -> Result<Vec<f32>, String> {
    kernels.download(values, len).map_err(|e| e.to_string())
}

fn dense(kernels: &CudaKernels) -> Result<CudaDense, String> {
    kernels.dense().map_err(|e| e.to_string())
}

pub(crate) fn matmul_close(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    let blas = dense(kernels)?;
    let storages = [Stored::AsIs, Stored::Transposed];
    for [m, k, n] in [[7, 13, 5], [300, 64, 129], [2048, 367, 64], [1, 4099, 3]] {
        for (a_stored, b_stored) in storages.iter().flat_map(|a| storages.map(|b| (*a, b))) {
            for accumulate in [false, true] {
                let product = Product::new([m, k, n])
                    .a(a_stored)
                    .b(b_stored)
                    .accumulate(accumulate);
                let (a, b) = (random_floats(rng, m * k), random_floats(rng, k * n));
                let mut want = random_floats(rng, m * n);
                let mut dst = up(kernels, &want)?;
                blas.matmul(&mut dst, &up(kernels, &a)?, &up(kernels, &b)?, product)
                    .map_err(|e| e.to_string())?;
                reference::matmul(&mut want, &a, &b, product);
                close(
                    &format!("{product:?}"),
                    &down(kernels, &dst, m * n)?,
                    &want,
                    SUM_TOLERANCE,
                )?;
            }
        }
    }
    Ok(())
}

pub(crate) fn elementwise_match(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    let blas = dense(kernels)?;
    let (rows, cols) = (1031, 77);
    for relu in [false, true] {
        let (values, bias) = (random_floats(rng, rows * cols), random_floats(rng, cols));
        let mut device = up(kernels, &values)?;
        blas.bias_activation(&mut device, &up(kernels, &bias)?, [rows, cols], relu)
            .map_err(|e| e.to_string())?;
        let mut want = values;
        reference::bias_activation(&mut want, &bias, relu);
        let got = down(kernels, &device, rows * cols)?;
        if bits(&got) != bits(&want) {
            return Err(format!(
                "bias_activation (relu {relu}): {}",
                first_difference(&got, &want)
            ));
        }
        let grad = random_floats(rng, rows * cols);
        let mut device_grad = up(kernels, &grad)?;
        blas.relu_backward(&mut device_grad, &device, rows * cols)
            .map_err(|e| e.to_string())?;
        let mut want_grad = grad;
        reference::relu_backward(&mut want_grad, &want);
        let got = down(kernels, &device_grad, rows * cols)?;
        if bits(&got) != bits(&want_grad) {
            return Err(format!(
                "relu_backward: {}",
                first_difference(&got, &want_grad)
            ));
        }
    }
    Ok(())
}

pub(crate) fn column_sums_close(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    let mut blas = dense(kernels)?;
    for (rows, cols) in [(3, 5), (65_539, 17), (2048, 512)] {
        let values = random_floats(rng, rows * cols);
        let mut dst = up(kernels, &random_floats(rng, cols))?;
        blas.column_sums(&mut dst, &up(kernels, &values)?, [rows, cols])
            .map_err(|e| e.to_string())?;
        close(
            &format!("{rows} x {cols}"),
            &down(kernels, &dst, cols)?,
            &reference::column_sums(&values, cols),
            SUM_TOLERANCE,
        )?;
    }
    Ok(())
}

pub(crate) fn dots_close(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    let blas = dense(kernels)?;
    for shape in [
        DotShape {
            rows: 1000,
            dim: 16,
            vectors: 27,
        },
        DotShape {
            rows: 33,
            dim: 3,
            vectors: 2,
        },
        DotShape {
            rows: 257,
            dim: 64,
            vectors: 9,
        },
    ] {
        let DotShape { rows, dim, vectors } = shape;
        let (first, rest) = (
            random_floats(rng, rows * dim),
            random_floats(rng, rows * (vectors - 1) * dim),
        );
        let dots = blas.dots(shape).map_err(|e| e.to_string())?;
        let (device_first, device_rest) = (up(kernels, &first)?, up(kernels, &rest)?);
        let mut out = up(kernels, &vec![f32::NAN; rows * shape.width()])?;
        blas.dots_forward(&dots, &device_first, &device_rest, &mut out)
            .map_err(|e| e.to_string())?;
        let mut want = vec![0.0; rows * shape.width()];
        reference::dots_forward(&first, &rest, shape, &mut want);
        close(
            &format!("forward {shape:?}"),
            &down(kernels, &out, want.len())?,
            &want,
            SUM_TOLERANCE,
        )?;
        let grad_out = random_floats(rng, rows * shape.width());
        let device_grad_out = up(kernels, &grad_out)?;
        for accumulate in [false, true] {
            let mut want_first = random_floats(rng, first.len());
            let mut want_rest = random_floats(rng, rest.len());
            let mut grad_first = up(kernels, &want_first)?;
            let mut grad_rest = up(kernels, &want_rest)?;
            blas.dots_backward(
                &dots,
                (&device_first, &device_rest),
                &device_grad_out,
                (&mut grad_first, accumulate),
                (&mut grad_rest, !accumulate),
            )
            .map_err(|e| e.to_string())?;
            reference::dots_backward(
                (&first, &rest),
                &grad_out,
                shape,
                (&mut want_first, accumulate),
                (&mut want_rest, !accumulate),
            );
            let what = format!("backward {shape:?}, first accumulated: {accumulate}");
            close(
                &what,
                &down(kernels, &grad_first, first.len())?,
                &want_first,
                SUM_TOLERANCE,
            )?;
            close(
                &what,
                &down(kernels, &grad_rest, rest.len())?,
                &want_rest,
                SUM_TOLERANCE,
            )?;
        }
    }
    Ok(())
}

pub(crate) fn heads_close(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    let blas = dense(kernels)?;
    let rows = 4099;
    let values: Vec<f32> = random_floats(rng, rows).iter().map(|v| 30.0 * v).collect();
    let labels: Vec<f32> = random_floats(rng, rows)
        .iter()
        .map(|v| f32::from(*v > 0.0))
        .collect();
    for (loss, accumulate) in [
        (HeadLoss::BinaryCrossEntropy, false),
        (HeadLoss::SquaredError, true),
    ] {
        let mut want_grad = random_floats(rng, rows);
        let mut grad = up(kernels, &want_grad)?;
        let mut predictions = up(kernels, &vec![f32::NAN; rows])?;
        let mut losses = up(kernels, &vec![f32::NAN; rows])?;
        blas.head_loss(
            (&up(kernels, &values)?, &up(kernels, &labels)?),
            rows,
            (loss, 0.7),
            (&mut grad, accumulate),
            &mut predictions,
            &mut losses,
        )
        .map_err(|e| e.to_string())?;
        let (want_predictions, want_losses) =
            reference::head_loss(&values, &labels, loss, 0.7, (&mut want_grad, accumulate));
        let what = format!("{loss:?}");
        // expf and log1pf on the device round within 2 ulp of the host's.
        close(
            &what,
            &down(kernels, &predictions, rows)?,
            &want_predictions,
            1e-6,
        )?;
        close(&what, &down(kernels, &losses, rows)?, &want_losses, 1e-6)?;
        close(&what, &down(kernels, &grad, rows)?, &want_grad, 1e-6)?;
    }
    Ok(())
}

/// `write` puts host values over the start of a device buffer, leaving the rest, and
/// refuses more values than the buffer holds.
pub(crate) fn writes_match(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    let mut blas = dense(kernels)?;
    let mut want = random_floats(rng, 1000);
    let mut buffer = up(kernels, &want)?;
    for len in [1000, 517, 1] {
        let values = random_floats(rng, len);
        blas.write(&mut buffer, &values)
            .map_err(|e| e.to_string())?;
        want[..len].copy_from_slice(&values);
        let got = down(kernels, &buffer, want.len())?;
        if bits(&got) != bits(&want) {
            return Err(format!("{len} values: {}", first_difference(&got, &want)));
        }
    }
    match blas.write(&mut buffer, &random_floats(rng, 1001)) {
        Err(_) => Ok(()),
        Ok(()) => Err("1001 values written into a buffer of 1000".into()),
    }
}

pub(crate) fn columns_match(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    let blas = dense(kernels)?;
    for (rows, width, (src_width, src_at), (dst_width, dst_at)) in [
        (1000, 16, (16, 0), (48, 32)),
        (517, 7, (30, 11), (7, 0)),
        (3, 1, (5, 4), (9, 8)),
    ] {
        for accumulate in [false, true] {
            let (from, into) = ((src_width, src_at), (dst_width, dst_at));
            let columns = Columns::new(rows, width, from, into, accumulate);
            let src = random_floats(rng, rows * src_width);
            let mut want = random_floats(rng, rows * dst_width);
            let mut dst = up(kernels, &want)?;
            blas.copy_columns(&mut dst, &up(kernels, &src)?, columns)
                .map_err(|e| e.to_string())?;
            reference::copy_columns(&mut want, &src, columns);
            let got = down(kernels, &dst, want.len())?;
            if bits(&got) != bits(&want) {
                return Err(format!("{columns:?}: {}", first_difference(&got, &want)));
            }
        }
    }
    Ok(())
}

pub(crate) fn fm_and_cross_close(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    let blas = dense(kernels)?;
    for shape in [
        FmShape {
            rows: 1000,
            vectors: 26,
            dim: 16,
        },
        FmShape {
            rows: 7,
            vectors: 3,
            dim: 5,
        },
    ] {
        let e = random_floats(rng, shape.rows * shape.width());
        let device_e = up(kernels, &e)?;
        let mut out = up(kernels, &vec![f32::NAN; shape.rows])?;
        blas.fm_forward(shape, &device_e, &mut out)
            .map_err(|e| e.to_string())?;
        let mut want = vec![0.0; shape.rows];
        reference::fm_forward(&e, shape, &mut want);
        close(
            &format!("fm forward {shape:?}"),
            &down(kernels, &out, shape.rows)?,
            &want,
            SUM_TOLERANCE,
        )?;
        let grad_out = random_floats(rng, shape.rows);
        for accumulate in [false, true] {
            let mut want = random_floats(rng, e.len());
            let mut grad = up(kernels, &want)?;
            blas.fm_backward(
                shape,
                &device_e,
                &up(kernels, &grad_out)?,
                (&mut grad, accumulate),
            )
            .map_err(|e| e.to_string())?;
            reference::fm_backward(&e, &grad_out, shape, (&mut want, accumulate));
            let what = format!("fm backward {shape:?}, accumulate {accumulate}");
            close(&what, &down(kernels, &grad, e.len())?, &want, SUM_TOLERANCE)?;
        }
    }
    let len = 4099;
    let [x0, z, x, g] = [0, 1, 2, 3].map(|_| random_floats(rng, len));
    let device = [&x0, &z, &x, &g].map(|v| up(kernels, v));
    let [dx0, dz_in, dx, dg] = device;
    let (dx0, dz_in, dx, dg) = (dx0?, dz_in?, dx?, dg?);
    let mut next = up(kernels, &vec![f32::NAN; len])?;
    blas.cross_forward(len, (&dx0, &dz_in, &dx), &mut next)
        .map_err(|e| e.to_string())?;
    let mut want = vec![0.0; len];
    reference::cross_forward(&x0, &z, &x, &mut want);
    let got = down(kernels, &next, len)?;
    if bits(&got) != bits(&want) {
        return Err(format!("cross forward: {}", first_difference(&got, &want)));
    }
    let mut want_x0 = random_floats(rng, len);
    let mut grad_x0 = up(kernels, &want_x0)?;
    let mut dz = up(kernels, &vec![f32::NAN; len])?;
    blas.cross_backward(len, (&dg, &dx0, &dz_in), &mut dz, &mut grad_x0)
        .map_err(|e| e.to_string())?;
    let mut want_dz = vec![0.0; len];
    reference::cross_backward(&g, &x0, &z, &mut want_dz, &mut want_x0);
    for (what, got, want) in [
        ("dz", down(kernels, &dz, len)?, want_dz),
        ("grad_x0", down(kernels, &grad_x0, len)?, want_x0),
    ] {
        if bits(&got) != bits(&want) {
            return Err(format!(
                "cross backward {what}: {}",
                first_difference(&got, &want)
            ));
        }
    }
    Ok(())
}

pub(crate) fn dense_input_checks(kernels: &CudaKernels, _: &mut StdRng) -> Result<(), String> {
    let blas = dense(kernels)?;
    let short = up(kernels, &[0.0; 5])?;
    let mut dst = up(kernels, &[0.0; 6])?;
    let refused = |result: Result<(), GpuError>, field: &str| match result {
        Err(GpuError::Invalid { field: got, .. }) if got == field => Ok(()),
        other => Err(format!("expected invalid {field}, got {:?}", other.err())),
    };
    refused(
        blas.matmul(&mut dst, &short, &short, Product::new([2, 3, 2])),
        "a",
    )?;
    refused(blas.bias_activation(&mut dst, &short, [1, 6], true), "bias")?;
    refused(
        blas.dots(DotShape {
            rows: 1,
            dim: 4,
            vectors: 1,
        })
        .map(|_| ()),
        "dots",
    )?;
    let past_the_end = Columns::new(1, 3, (5, 3), (6, 0), false);
    refused(blas.copy_columns(&mut dst, &short, past_the_end), "src")
}
