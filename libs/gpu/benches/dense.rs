//! The reference DLRM's dense network (13 dense features and 26 pooled embeddings of 16;
//! bottom MLP 512-256-64-16, DLRM's dot interaction, top MLP 512-256-1, binary
//! cross-entropy) forward and backward on one GPU through `CudaDense`: every value, weight
//! and gradient resident on the device, one stream, no copy to or from the host inside a
//! step. Printed beside it, from the same run: the FLOP/s of one large cuBLAS product, the
//! device's own matrix throughput in FP32, and the step's share of it; then the same with
//! the products on TF32 tensor cores (the summary line stays the FP32 one). The dense
//! parameters' optimizer is not part of the step timed here.
//! Without a CUDA device (or cuBLAS) it prints SKIPPED.
//!
//! `cargo bench -p primus-gpu --bench dense` (PRIMUS_BENCH_BATCHES=2048,65536 by default).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::time::Instant;

use cudarc::driver::CudaSlice;
use primus_gpu::dense::{DotShape, HeadLoss, Product, Stored};
use primus_gpu::{CudaDense, CudaKernels, CudaStatus, DeviceDots, GpuError, cuda_status};

const DENSE: usize = 13;
const FEATURES: usize = 26;
const DIM: usize = 16;
const BOTTOM: [usize; 4] = [512, 256, 64, 16];
const TOP: [usize; 3] = [512, 256, 1];

/// One linear layer on the device and its gradients.
struct Layer {
    inputs: usize,
    outputs: usize,
    relu: bool,
    weight: CudaSlice<f32>,
    bias: CudaSlice<f32>,
    weight_grad: CudaSlice<f32>,
    bias_grad: CudaSlice<f32>,
    output: CudaSlice<f32>,
}

struct Stack {
    layers: Vec<Layer>,
}

impl Stack {
    fn new(
        kernels: &CudaKernels,
        inputs: usize,
        widths: &[usize],
        relu_last: bool,
        rows: usize,
    ) -> Result<Self, GpuError> {
        let mut layers = Vec::new();
        let mut fan_in = inputs;
        for (i, &outputs) in widths.iter().enumerate() {
            let scale = (6.0 / (fan_in + outputs) as f32).sqrt();
            let weight: Vec<f32> = (0..fan_in * outputs)
                .map(|j| scale * (((j * 7919) % 2001) as f32 / 1000.0 - 1.0))
                .collect();
            layers.push(Layer {
                inputs: fan_in,
                outputs,
                relu: i + 1 < widths.len() || relu_last,
                weight: kernels.upload(&weight)?,
                bias: kernels.zeros(outputs)?,
                weight_grad: kernels.zeros(fan_in * outputs)?,
                bias_grad: kernels.zeros(outputs)?,
                output: kernels.zeros(rows * outputs)?,
            });
            fan_in = outputs;
        }
        Ok(Self { layers })
    }

    fn forward(
        &mut self,
        dense: &CudaDense,
        input: &CudaSlice<f32>,
        rows: usize,
    ) -> Result<(), GpuError> {
        for i in 0..self.layers.len() {
            let (done, rest) = self.layers.split_at_mut(i);
            let layer = &mut rest[0];
            let x = done.last().map_or(input, |l| &l.output);
            let product = Product::new([rows, layer.inputs, layer.outputs]);
            dense.matmul(&mut layer.output, x, &layer.weight, product)?;
            dense.bias_activation(
                &mut layer.output,
                &layer.bias,
                [rows, layer.outputs],
                layer.relu,
            )?;
        }
        Ok(())
    }

    /// From `grad` (the last output's gradient, overwritten) back to `grad_input`.
    fn backward(
        &mut self,
        dense: &mut CudaDense,
        input: &CudaSlice<f32>,
        rows: usize,
        grads: &mut [CudaSlice<f32>; 2],
        grad_input: Option<&mut CudaSlice<f32>>,
    ) -> Result<(), GpuError> {
        let mut grad_input = grad_input;
        for i in (0..self.layers.len()).rev() {
            let (before, rest) = self.layers.split_at_mut(i);
            let layer = &mut rest[0];
            let [current, next] = grads;
            if layer.relu {
                dense.relu_backward(current, &layer.output, rows * layer.outputs)?;
            }
            dense.column_sums(&mut layer.bias_grad, current, [rows, layer.outputs])?;
            let x = before.last().map_or(input, |l| &l.output);
            let weight_grad =
                Product::new([layer.inputs, rows, layer.outputs]).a(Stored::Transposed);
            dense.matmul(&mut layer.weight_grad, x, current, weight_grad)?;
            let input_grad =
                Product::new([rows, layer.outputs, layer.inputs]).b(Stored::Transposed);
            if i > 0 {
                dense.matmul(next, current, &layer.weight, input_grad)?;
                grads.swap(0, 1);
            } else if let Some(into) = grad_input.take() {
                dense.matmul(into, current, &layer.weight, input_grad)?;
            }
        }
        Ok(())
    }

    fn flops_per_row(&self) -> f64 {
        self.layers
            .iter()
            .map(|l| 2.0 * (l.inputs * l.outputs) as f64)
            .sum()
    }
}

struct Step {
    rows: usize,
    dense_input: CudaSlice<f32>,
    embedded: CudaSlice<f32>,
    labels: CudaSlice<f32>,
    bottom: Stack,
    dots: DeviceDots,
    interaction: CudaSlice<f32>,
    top: Stack,
    predictions: CudaSlice<f32>,
    losses: CudaSlice<f32>,
    grads: [CudaSlice<f32>; 2],
    interaction_grad: CudaSlice<f32>,
    embedded_grad: CudaSlice<f32>,
}

impl Step {
    fn new(kernels: &CudaKernels, dense: &CudaDense, rows: usize) -> Result<Self, GpuError> {
        let shape = DotShape {
            rows,
            dim: DIM,
            vectors: FEATURES + 1,
        };
        let widest = BOTTOM.iter().chain(&TOP).max().copied().unwrap_or(1);
        let labels: Vec<f32> = (0..rows).map(|r| (r % 4 == 0) as u8 as f32).collect();
        let values = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5)
                .collect()
        };
        Ok(Self {
            rows,
            dense_input: kernels.upload(&values(rows * DENSE))?,
            embedded: kernels.upload(&values(rows * FEATURES * DIM))?,
            labels: kernels.upload(&labels)?,
            bottom: Stack::new(kernels, DENSE, &BOTTOM, true, rows)?,
            dots: dense.dots(shape)?,
            interaction: kernels.zeros(rows * shape.width())?,
            top: Stack::new(kernels, shape.width(), &TOP, false, rows)?,
            predictions: kernels.zeros(rows)?,
            losses: kernels.zeros(rows)?,
            grads: [kernels.zeros(rows * widest)?, kernels.zeros(rows * widest)?],
            interaction_grad: kernels.zeros(rows * shape.width())?,
            embedded_grad: kernels.zeros(rows * FEATURES * DIM)?,
        })
    }

    fn run(&mut self, dense: &mut CudaDense) -> Result<(), GpuError> {
        let rows = self.rows;
        self.bottom.forward(dense, &self.dense_input, rows)?;
        let bottom_out = &self.bottom.layers[BOTTOM.len() - 1].output;
        dense.dots_forward(
            &self.dots,
            bottom_out,
            &self.embedded,
            &mut self.interaction,
        )?;
        self.top.forward(dense, &self.interaction, rows)?;
        let logits = &self.top.layers[TOP.len() - 1].output;
        dense.head_loss(
            (logits, &self.labels),
            rows,
            (HeadLoss::BinaryCrossEntropy, 1.0),
            (&mut self.grads[0], false),
            &mut self.predictions,
            &mut self.losses,
        )?;
        self.top.backward(
            dense,
            &self.interaction,
            rows,
            &mut self.grads,
            Some(&mut self.interaction_grad),
        )?;
        let bottom_out = &self.bottom.layers[BOTTOM.len() - 1].output;
        dense.dots_backward(
            &self.dots,
            (bottom_out, &self.embedded),
            &self.interaction_grad,
            (&mut self.grads[0], false),
            (&mut self.embedded_grad, false),
        )?;
        self.bottom
            .backward(dense, &self.dense_input, rows, &mut self.grads, None)?;
        Ok(())
    }

    fn flops_per_row(&self) -> f64 {
        let dots = (self.dots.shape().pairs() * DIM) as f64 * 2.0;
        // Backward: each product twice (weights and input), the interaction twice.
        3.0 * (self.bottom.flops_per_row() + self.top.flops_per_row() + dots)
    }
}

/// FP32 FLOP/s of one large square cuBLAS product: the device's matrix throughput.
fn matrix_peak(kernels: &CudaKernels, dense: &CudaDense) -> Result<f64, GpuError> {
    let n = 8192;
    let a = kernels.upload(&vec![0.5f32; n * n])?;
    let b = kernels.upload(&vec![0.25f32; n * n])?;
    let mut c = kernels.zeros(n * n)?;
    let product = Product::new([n, n, n]);
    dense.matmul(&mut c, &a, &b, product)?;
    dense.synchronize()?;
    let rounds = 10;
    let start = Instant::now();
    for _ in 0..rounds {
        dense.matmul(&mut c, &a, &b, product)?;
    }
    dense.synchronize()?;
    Ok(rounds as f64 * 2.0 * (n as f64).powi(3) / start.elapsed().as_secs_f64())
}

#[expect(clippy::disallowed_methods, reason = "a bench's size knobs")]
fn batches() -> String {
    std::env::var("PRIMUS_BENCH_BATCHES").unwrap_or_else(|_| "2048,65536".into())
}

fn run() -> Result<(), GpuError> {
    let kernels = CudaKernels::new(0)?;
    let mut dense = kernels.dense()?;
    let peak = matrix_peak(&kernels, &dense)?;
    println!(
        "{}: one 8192^3 FP32 cuBLAS product at {:.1} TFLOP/s (the baseline below)",
        kernels.device_name()?,
        peak / 1e12
    );
    let batches = batches();
    println!("products in FP32:");
    let summary = timed_batches(&kernels, &mut dense, &batches, peak)?;
    println!("products on TF32 tensor cores (shares still of the FP32 product's):");
    dense.set_tf32(true)?;
    timed_batches(&kernels, &mut dense, &batches, peak)?;
    dense.set_tf32(false)?;
    println!("{summary}");
    Ok(())
}

/// Each batch size's step rate; the summary of the last.
fn timed_batches(
    kernels: &CudaKernels,
    dense: &mut CudaDense,
    batches: &str,
    peak: f64,
) -> Result<String, GpuError> {
    let mut last = String::new();
    for batch in batches.split(',') {
        let rows: usize = batch.trim().parse().map_err(|_| GpuError::Invalid {
            field: "PRIMUS_BENCH_BATCHES".into(),
            reason: format!("{batch:?} is not a row count"),
        })?;
        let mut step = Step::new(kernels, dense, rows)?;
        for _ in 0..5 {
            step.run(dense)?;
        }
        dense.synchronize()?;
        let steps = (20_000_000 / rows).clamp(20, 2000);
        let start = Instant::now();
        for _ in 0..steps {
            step.run(dense)?;
        }
        dense.synchronize()?;
        let seconds = start.elapsed().as_secs_f64();
        let samples = (steps * rows) as f64 / seconds;
        let flops = samples * step.flops_per_row();
        println!(
            "batch {rows:>6}: {:.3} ms a step, {:.2}M samples/s, {:.1} TFLOP/s = {:.0}% of the product's",
            1e3 * seconds / steps as f64,
            samples / 1e6,
            flops / 1e12,
            100.0 * flops / peak
        );
        last = format!(
            "dense (cuda): batch {rows} at {:.2}M samples/s, {:.0}% of cuBLAS FP32 matrix throughput",
            samples / 1e6,
            100.0 * flops / peak
        );
    }
    Ok(last)
}

fn main() {
    match cuda_status() {
        CudaStatus::Ready { .. } => {}
        CudaStatus::NoDriver => {
            println!("dense (cuda): SKIPPED (no NVIDIA driver on this machine)");
            return;
        }
        CudaStatus::NoDevice(why) => {
            println!("dense (cuda): SKIPPED (no CUDA device: {why})");
            return;
        }
    }
    if let Err(e) = run() {
        eprintln!("dense (cuda): FAILED: {e}");
        std::process::exit(1);
    }
}
