//! Runs every kernel on the GPU and compares it with its CPU reference on random input
//! (repeated ids, empty bags, ids at the end of a 1M-row table, shared tables, IKJT bags),
//! and the dense network's launches (`dense`) with theirs.
//! Without a CUDA device it prints that each check was SKIPPED, and why, and passes.
//! Not a libtest harness, so that the skip lines are always printed.

#![allow(
    clippy::print_stdout,
    reason = "a check that cannot run here says so on stdout, beside the test's name"
)]

mod common;
mod dense;

use common::{distinct_ids, random_case, random_floats, random_optimizer_table};
use std::sync::Arc;

use primus_gpu::{
    Accumulation, CpuKernels, CudaKernels, CudaStatus, DeviceRows, EmbeddingKernels, GpuError,
    HostRows, Pooling, RowOptimizer, RowStore, cuda_status,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

type Check = fn(&CudaKernels, &mut StdRng) -> Result<(), String>;

const CHECKS: [(&str, Check); 16] = [
    (
        "gather_pool: every output written, bitwise equal to the reference",
        gather_pool_matches,
    ),
    (
        "pool_backward deterministic: bitwise equal to the reference, twice",
        backward_sorted_matches,
    ),
    (
        "pool_backward atomic: within 1e-5 (relative norm) of the reference",
        backward_atomic_close,
    ),
    (
        "adagrad_update: 3 steps bitwise equal to the reference",
        |k, r| updates_match(k, r, ADAGRAD),
    ),
    (
        "adam_update: 3 steps bitwise equal to the reference",
        |k, r| updates_match(k, r, ADAM),
    ),
    (
        "device input checks: duplicate and out-of-range ids refused",
        device_input_checks,
    ),
    (
        "row store: DeviceRows bitwise equal to HostRows through growth, writes, reads, updates",
        row_stores_match,
    ),
    (
        "dense matmul (cuBLAS): every storage of a and b, written and added, within 1e-5 of the reference",
        dense::matmul_close,
    ),
    (
        "dense bias_activation and relu_backward: bitwise equal to the reference",
        dense::elementwise_match,
    ),
    (
        "dense column sums: within 1e-5 of the reference up to 65,539 rows",
        dense::column_sums_close,
    ),
    (
        "dense dots forward and backward (DLRM interaction): within 1e-5 of the reference",
        dense::dots_close,
    ),
    (
        "dense head_loss: binary cross-entropy and squared error within 1e-6 of the reference",
        dense::heads_close,
    ),
    (
        "dense copy_columns: written and added, bitwise equal to the reference",
        dense::columns_match,
    ),
    (
        "dense fm (within 1e-5) and cross layer kernels (bitwise) against the reference",
        dense::fm_and_cross_close,
    ),
    (
        "dense input checks: short buffers, one-vector interactions, columns past a row refused",
        dense::dense_input_checks,
    ),
    (
        "dense write: host values over the start of a device buffer, bitwise; too many refused",
        dense::writes_match,
    ),
];

const ADAGRAD: RowOptimizer = RowOptimizer::Adagrad {
    lr: 0.05,
    epsilon: 1e-8,
};
const ADAM: RowOptimizer = RowOptimizer::Adam {
    lr: 0.01,
    beta1: 0.9,
    beta2: 0.999,
    epsilon: 1e-8,
};

/// (dims, rows, samples, max bag, ikjt): vec4 and scalar paths, jagged and inverse bags.
const SHAPES: [(&[u32], u32, usize, usize, bool); 5] = [
    (&[16, 64], 1000, 300, 4, false),
    (&[16, 64], 1000, 300, 4, true),
    (&[10, 3, 33], 500, 257, 6, false),
    (&[8], 1 << 20, 4096, 1, false),
    (&[12, 5], 64, 100, 20, true),
];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn first_difference(gpu: &[f32], cpu: &[f32]) -> String {
    match gpu
        .iter()
        .zip(cpu)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        Some(i) => format!("element {i}: gpu {} cpu {}", gpu[i], cpu[i]),
        None => format!("lengths {} vs {}", gpu.len(), cpu.len()),
    }
}

fn gather_pool_matches(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    for (dims, rows, samples, max_bag, ikjt) in SHAPES {
        let case = random_case(rng, dims, rows, samples, max_bag, ikjt);
        for pooling in [Pooling::Sum, Pooling::Mean] {
            let weights = case.weight_slices();
            let cpu = CpuKernels
                .gather_pool(&case.tables, &weights, &case.input, pooling)
                .map_err(|e| e.to_string())?;
            let tables = kernels
                .upload_tables(&case.tables, &weights)
                .map_err(|e| e.to_string())?;
            let batch = kernels
                .upload_pooling(&tables, &case.input, Accumulation::Atomic)
                .map_err(|e| e.to_string())?;
            let mut out = kernels
                .upload(&vec![f32::NAN; cpu.len()])
                .map_err(|e| e.to_string())?;
            kernels
                .gather_pool_on_device(&tables, &batch, pooling, &mut out)
                .map_err(|e| e.to_string())?;
            let gpu = kernels
                .download(&out, cpu.len())
                .map_err(|e| e.to_string())?;
            if gpu.iter().any(|x| x.is_nan()) {
                return Err(format!(
                    "dims {dims:?} {pooling:?}: an output element was not written"
                ));
            }
            if bits(&gpu) != bits(&cpu) {
                return Err(format!(
                    "dims {dims:?} ikjt {ikjt} {pooling:?}: {}",
                    first_difference(&gpu, &cpu)
                ));
            }
        }
    }
    Ok(())
}

fn backward_sorted_matches(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    for (dims, rows, samples, max_bag, ikjt) in SHAPES {
        let case = random_case(rng, dims, rows, samples, max_bag, ikjt);
        let g = random_floats(rng, samples * case.input.out_width(&case.tables));
        for pooling in [Pooling::Sum, Pooling::Mean] {
            let run = |k: &dyn EmbeddingKernels| {
                k.pool_backward(
                    &case.tables,
                    &case.input,
                    pooling,
                    &g,
                    Accumulation::Deterministic,
                )
                .map(|grads| grads.concat())
                .map_err(|e| e.to_string())
            };
            let cpu = run(&CpuKernels)?;
            let (first, second) = (run(kernels)?, run(kernels)?);
            if bits(&first) != bits(&cpu) {
                return Err(format!(
                    "dims {dims:?} ikjt {ikjt} {pooling:?}: {}",
                    first_difference(&first, &cpu)
                ));
            }
            if bits(&first) != bits(&second) {
                return Err(format!(
                    "dims {dims:?}: two runs differ: {}",
                    first_difference(&second, &first)
                ));
            }
        }
    }
    Ok(())
}

fn backward_atomic_close(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    for (dims, rows, samples, max_bag, ikjt) in SHAPES {
        let case = random_case(rng, dims, rows, samples, max_bag, ikjt);
        let g = random_floats(rng, samples * case.input.out_width(&case.tables));
        let run = |k: &dyn EmbeddingKernels, accumulation| {
            k.pool_backward(&case.tables, &case.input, Pooling::Mean, &g, accumulation)
                .map(|grads| grads.concat())
                .map_err(|e| e.to_string())
        };
        let cpu = run(&CpuKernels, Accumulation::Deterministic)?;
        let gpu = run(kernels, Accumulation::Atomic)?;
        let (mut diff, mut norm) = (0.0f64, 0.0f64);
        for (a, b) in gpu.iter().zip(&cpu) {
            diff += (f64::from(*a) - f64::from(*b)).powi(2);
            norm += f64::from(*b).powi(2);
        }
        let relative = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
        if gpu.len() != cpu.len() || relative.is_nan() || relative > 1e-5 {
            return Err(format!(
                "dims {dims:?} ikjt {ikjt}: relative error {relative:e}"
            ));
        }
    }
    Ok(())
}

fn updates_match(
    kernels: &CudaKernels,
    rng: &mut StdRng,
    optimizer: RowOptimizer,
) -> Result<(), String> {
    for (rows, dim, n) in [
        (1000u32, 16u32, 300usize),
        (300, 7, 300),
        (1 << 20, 64, 5000),
    ] {
        let (shape, start) = random_optimizer_table(rng, rows, dim, optimizer);
        let mut cpu = start.clone();
        let mut device = kernels
            .upload_table(shape, &start)
            .map_err(|e| e.to_string())?;
        for _ in 0..3 {
            let ids = distinct_ids(rng, rows, n);
            let grads = random_floats(rng, ids.len() * dim as usize);
            CpuKernels
                .update_rows(shape, optimizer, &mut cpu, &ids, &grads)
                .map_err(|e| e.to_string())?;
            let device_ids = kernels.upload_ids(shape, &ids).map_err(|e| e.to_string())?;
            let device_grads = kernels.upload(&grads).map_err(|e| e.to_string())?;
            kernels
                .update_rows_on_device(&mut device, optimizer, &device_ids, &device_grads)
                .map_err(|e| e.to_string())?;
        }
        let gpu = kernels.download_table(&device).map_err(|e| e.to_string())?;
        if bits(&gpu) != bits(&cpu) {
            return Err(format!(
                "rows {rows} dim {dim}: {}",
                first_difference(&gpu, &cpu)
            ));
        }
    }
    Ok(())
}

/// Drives a device store and the host reference with the same operations: the PS's
/// tables grow, write new rows, read weights (with repeats) and apply both optimizers.
fn row_stores_match(_: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    let kernels = Arc::new(CudaKernels::new(0).map_err(|e| e.to_string())?);
    for (optimizer, dim) in [(ADAGRAD, 16u32), (ADAM, 7)] {
        let stride = dim + optimizer.state_len(dim);
        let mut device =
            DeviceRows::new(kernels.clone(), dim, stride).map_err(|e| e.to_string())?;
        let mut host = HostRows::new(dim, stride);
        let mut rows = 0u32;
        for round in 0..4u32 {
            let grown = 1000 << round;
            for store in [&mut device as &mut dyn RowStore, &mut host] {
                store.resize(grown).map_err(|e| e.to_string())?;
            }
            let new_ids: Vec<u32> = (rows..grown).collect();
            let (_, values) = common::random_optimizer_table(rng, grown - rows, dim, optimizer);
            let ids = distinct_ids(rng, grown, 500);
            let grads = random_floats(rng, ids.len() * dim as usize);
            for store in [&mut device as &mut dyn RowStore, &mut host] {
                store.write(&new_ids, &values).map_err(|e| e.to_string())?;
                store
                    .update(optimizer, &ids, &grads)
                    .map_err(|e| e.to_string())?;
            }
            rows = grown;
            let mut reads: Vec<u32> = ids.iter().chain(&ids).copied().collect();
            reads.push(rows - 1);
            for floats in [dim, stride] {
                let gpu = device.read(&reads, floats).map_err(|e| e.to_string())?;
                let cpu = host.read(&reads, floats).map_err(|e| e.to_string())?;
                if bits(&gpu) != bits(&cpu) {
                    return Err(format!(
                        "round {round}, {floats} floats: {}",
                        first_difference(&gpu, &cpu)
                    ));
                }
            }
        }
        let all: Vec<u32> = (0..rows).collect();
        let gpu = device.read(&all, stride).map_err(|e| e.to_string())?;
        let cpu = host.read(&all, stride).map_err(|e| e.to_string())?;
        if bits(&gpu) != bits(&cpu) {
            return Err(format!("every row: {}", first_difference(&gpu, &cpu)));
        }
    }
    Ok(())
}

fn device_input_checks(kernels: &CudaKernels, rng: &mut StdRng) -> Result<(), String> {
    let (shape, _) = random_optimizer_table(rng, 10, 4, ADAGRAD);
    for (ids, field) in [(vec![1, 2, 1], "ids[2]"), (vec![10], "ids[0]")] {
        match kernels.upload_ids(shape, &ids) {
            Err(GpuError::Invalid { field: got, .. }) if got == field => {}
            other => {
                return Err(format!(
                    "{ids:?}: expected invalid {field}, got {:?}",
                    other.err()
                ));
            }
        }
    }
    Ok(())
}

fn main() {
    let kernels = match cuda_status() {
        CudaStatus::Ready { .. } => match CudaKernels::new(0) {
            Ok(kernels) => kernels,
            Err(e) => {
                eprintln!("FAILED: a CUDA device is present but the kernels did not load: {e}");
                std::process::exit(1);
            }
        },
        status => {
            let why = match status {
                CudaStatus::NoDriver => "no NVIDIA driver (libcuda.so) on this machine".to_string(),
                CudaStatus::NoDevice(why) => why,
                CudaStatus::Ready { .. } => unreachable!(),
            };
            for (name, _) in CHECKS {
                println!("SKIPPED (no CUDA device: {why}): {name}");
            }
            return;
        }
    };
    println!(
        "running {} GPU kernel checks on {}",
        CHECKS.len(),
        kernels.device_name().unwrap_or_default()
    );
    let mut failed = 0;
    for (i, (name, check)) in CHECKS.iter().enumerate() {
        let mut rng = StdRng::seed_from_u64(1000 + i as u64);
        match check(&kernels, &mut rng) {
            Ok(()) => println!("ok      {name}"),
            Err(why) => {
                failed += 1;
                println!("FAILED  {name}: {why}");
            }
        }
    }
    if failed > 0 {
        eprintln!("{failed} GPU kernel check(s) failed");
        std::process::exit(1);
    }
}
