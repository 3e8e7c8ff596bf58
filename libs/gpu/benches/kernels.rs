//! Embedding kernels: gather + pool as a share of the device's own device-to-device copy
//! bandwidth (measured in the same run, bytes read + written), and fused sparse update
//! rates, with the CPU references and a raw CPU gather as baselines. GPU timings use CUDA
//! events. Without a CUDA device the GPU part prints SKIPPED and the CPU part still runs.
//!
//! `cargo bench -p primus-gpu --bench kernels` (PRIMUS_BENCH_QUICK=1 for smaller tables).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use primus_gpu::{
    Accumulation, CpuKernels, CudaKernels, CudaStatus, EmbeddingKernels, FeatureBags, GpuError,
    Pooling, PoolingInput, RowOptimizer, TableShape, cuda_status,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// The ceiling for random row reads: copy rows by precomputed index, 16 bytes per thread,
/// four rows per thread in flight, nothing else (no offsets, no pooling, no metadata).
const RAW_GATHER: &str = r#"
extern "C" __global__ void raw_gather(const float4* table, const unsigned int* ids,
                                      unsigned int n, unsigned int quads, float4* out) {
    unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long row = (t / quads) * 4;
    unsigned int q = (unsigned int)(t % quads);
    float4 v[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (row + k < n) v[k] = __ldg(table + (unsigned long long)ids[row + k] * quads + q);
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (row + k < n) out[(row + k) * quads + q] = v[k];
}
"#;

fn raw_gather_function(kernels: &CudaKernels) -> Result<CudaFunction, GpuError> {
    let ptx = cudarc::nvrtc::compile_ptx(RAW_GATHER).map_err(|e| GpuError::Compile {
        arch: "default".into(),
        log: format!("{e:?}"),
    })?;
    let module = kernels.stream().context().load_module(ptx)?;
    Ok(module.load_function("raw_gather")?)
}

fn raw_gather_on_device(
    kernels: &CudaKernels,
    function: &CudaFunction,
    table: &CudaSlice<f32>,
    ids: &CudaSlice<u32>,
    dim: u32,
    out: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    let n = ids.len() as u32;
    let quads = dim / 4;
    let threads = u64::from(n.div_ceil(4)) * u64::from(quads);
    let config = LaunchConfig {
        grid_dim: (threads.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = kernels.stream().launch_builder(function);
    launch.arg(table).arg(ids).arg(&n).arg(&quads).arg(out);
    // SAFETY: ids are rows of `table` (drawn below its row count), dim is a multiple of 4,
    // `out` holds n x dim floats; the arguments match raw_gather's parameters.
    #[allow(unsafe_code)]
    unsafe { launch.launch(config) }?;
    Ok(())
}

/// One figure of the closing table: what, the measured value, and its baseline.
struct Row {
    name: String,
    value: String,
    baseline: String,
}

#[expect(clippy::disallowed_methods, reason = "a bench's size knobs")]
fn quick() -> bool {
    std::env::var_os("PRIMUS_BENCH_QUICK").is_some()
}

#[derive(Clone, Copy, Debug)]
enum Keys {
    Uniform,
    Zipf,
}

/// `features` features over one table of `rows` rows, `bag` ids per sample each.
fn pooling_input(
    rng: &mut StdRng,
    rows: u32,
    features: usize,
    samples: usize,
    bag: usize,
    keys: Keys,
) -> PoolingInput {
    let zipf = Zipf::new(f64::from(rows), 1.05).expect("valid Zipf parameters");
    let draw = |rng: &mut StdRng| match keys {
        Keys::Uniform => rng.random_range(0..rows),
        // Rank r -> a scattered row, so hot rows are not neighbours.
        Keys::Zipf => {
            ((zipf.sample(rng) as u64 - 1).wrapping_mul(2_654_435_761) % u64::from(rows)) as u32
        }
    };
    let features = (0..features)
        .map(|_| FeatureBags {
            table: 0,
            offsets: (0..=samples).map(|b| (b * bag) as u32).collect(),
            rows: (0..samples * bag).map(|_| draw(rng)).collect(),
            inverse: None,
        })
        .collect();
    PoolingInput { samples, features }
}

fn patterned(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 997) as f32 * 1e-3 - 0.5).collect()
}

fn cpu_benches(criterion: &mut Criterion, report: &mut Vec<Row>) {
    let mut rng = StdRng::seed_from_u64(1);
    let rows = if quick() { 100_000 } else { 1_000_000 };
    let dim = 16u32;
    let table = patterned(rows as usize * dim as usize);
    let tables = [TableShape::dense(rows, dim)];
    let input = pooling_input(&mut rng, rows, 26, 4096, 1, Keys::Uniform);
    let ids: Vec<u32> = input
        .features
        .iter()
        .flat_map(|f| f.rows.iter().copied())
        .collect();
    let mut group = criterion.benchmark_group("cpu");
    group.throughput(Throughput::Elements(ids.len() as u64));
    group.bench_function("raw gather (baseline)", |b| {
        b.iter(|| raw_gather(&table, dim as usize, &ids))
    });
    group.bench_function("gather_pool reference", |b| {
        b.iter(|| CpuKernels.gather_pool(&tables, &[&table], &input, Pooling::Sum))
    });
    group.finish();
    let raw = per_second(ids.len(), || {
        black_box(raw_gather(&table, dim as usize, &ids));
    });
    let pooled = per_second(ids.len(), || {
        black_box(
            CpuKernels
                .gather_pool(&tables, &[&table], &input, Pooling::Sum)
                .ok(),
        );
    });
    report.push(Row {
        name: format!("CPU gather_pool reference, {rows} rows dim {dim}, every core"),
        value: format!("{:.1}M rows/s", pooled / 1e6),
        baseline: format!(
            "raw gather {:.1}M rows/s ({:.0}%)",
            raw / 1e6,
            100.0 * pooled / raw
        ),
    });
}

fn raw_gather(table: &[f32], dim: usize, ids: &[u32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * dim);
    for &id in ids {
        out.extend_from_slice(&table[id as usize * dim..][..dim]);
    }
    out
}

/// Items per second over the median of 7 runs.
fn per_second(items: usize, mut run: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    items as f64 / times[3]
}

/// Device time of `iters` runs of `work`, by CUDA events.
fn device_time(
    kernels: &CudaKernels,
    iters: u64,
    mut work: impl FnMut() -> Result<(), GpuError>,
) -> Result<Duration, GpuError> {
    let stream = kernels.stream();
    let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    for _ in 0..iters {
        work()?;
    }
    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    end.synchronize()?;
    Ok(Duration::from_secs_f64(
        f64::from(start.elapsed_ms(&end)?) / 1e3,
    ))
}

/// Median seconds of one run of `work` over 15 event-timed runs, after 3 warm-ups.
fn median_seconds(
    kernels: &CudaKernels,
    mut work: impl FnMut() -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    device_time(kernels, 3, &mut work)?;
    let mut times = (0..15)
        .map(|_| device_time(kernels, 1, &mut work).map(|d| d.as_secs_f64()))
        .collect::<Result<Vec<_>, _>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[7])
}

fn gpu_benches(
    criterion: &mut Criterion,
    kernels: &CudaKernels,
    report: &mut Vec<Row>,
) -> Result<(), GpuError> {
    let quick = quick();
    // Baseline: a device-to-device copy of 1 GiB, bytes read + written.
    let copy_floats = if quick { 1 << 26 } else { 1 << 28 };
    let source = kernels.zeros::<f32>(copy_floats)?;
    let mut target = kernels.zeros::<f32>(copy_floats)?;
    let stream = kernels.stream().clone();
    let copy_bytes = 2.0 * copy_floats as f64 * 4.0;
    let copy_seconds = median_seconds(kernels, || Ok(stream.memcpy_dtod(&source, &mut target)?))?;
    let copy_bandwidth = copy_bytes / copy_seconds;
    drop((source, target));
    report.push(Row {
        name: "device-to-device copy (baseline)".into(),
        value: format!("{:.0} GB/s", copy_bandwidth / 1e9),
        baseline: "read + written".into(),
    });

    let mut rng = StdRng::seed_from_u64(2);
    let rows: u32 = if quick { 1_000_000 } else { 10_000_000 };
    let mut group = criterion.benchmark_group("gpu");
    for dim in [16u32, 64] {
        let shape = TableShape::dense(rows, dim);
        let table = patterned(shape.rows as usize * dim as usize);
        let tables = kernels.upload_tables(&[shape], &[&table])?;
        drop(table);
        let raw_gather = raw_gather_function(kernels)?;
        for (features, samples, bag) in [(26usize, 1usize << 18, 1usize), (8, 1 << 16, 16)] {
            for keys in [Keys::Uniform, Keys::Zipf] {
                let input = pooling_input(&mut rng, rows, features, samples, bag, keys);
                let batch = kernels.upload_pooling(&tables, &input, Accumulation::Atomic)?;
                let mut out = kernels.zeros::<f32>(batch.out_floats())?;
                let nnz = features * samples * bag;
                let bytes = (nnz * dim as usize * 4
                    + nnz * 4
                    + (features * samples + 1) * 4
                    + batch.out_floats() * 4) as f64;
                let name =
                    format!("gather_pool sum dim {dim} {keys:?} {features}x{samples} bag {bag}");
                group.throughput(Throughput::Bytes(bytes as u64));
                group.bench_function(&name, |b| {
                    b.iter_custom(|iters| {
                        device_time(kernels, iters, || {
                            kernels.gather_pool_on_device(&tables, &batch, Pooling::Sum, &mut out)
                        })
                        .unwrap_or(Duration::MAX)
                    })
                });
                let seconds = median_seconds(kernels, || {
                    kernels.gather_pool_on_device(&tables, &batch, Pooling::Sum, &mut out)
                })?;
                let ids: Vec<u32> = input
                    .features
                    .iter()
                    .flat_map(|f| f.rows.iter().copied())
                    .collect();
                let device_ids = kernels.upload(&ids)?;
                let mut rows_out = kernels.zeros::<f32>(nnz * dim as usize)?;
                let raw_seconds = median_seconds(kernels, || {
                    raw_gather_on_device(
                        kernels,
                        &raw_gather,
                        &tables.data,
                        &device_ids,
                        dim,
                        &mut rows_out,
                    )
                })?;
                let raw_bytes = (2 * nnz * dim as usize * 4 + nnz * 4) as f64;
                report.push(Row {
                    name,
                    value: format!(
                        "{:.0} GB/s, {:.0}M rows/s",
                        bytes / seconds / 1e9,
                        nnz as f64 / seconds / 1e6
                    ),
                    baseline: format!(
                        "{:.0}% of copy; raw row gather {:.0} GB/s ({:.0}% of copy), {:.0}M rows/s",
                        100.0 * bytes / seconds / copy_bandwidth,
                        raw_bytes / raw_seconds / 1e9,
                        100.0 * raw_bytes / raw_seconds / copy_bandwidth,
                        nnz as f64 / raw_seconds / 1e6
                    ),
                });
            }
        }
        drop(tables);
        update_benches(
            kernels,
            &mut group,
            report,
            &mut rng,
            rows,
            dim,
            copy_bandwidth,
        )?;
    }
    group.finish();
    Ok(())
}

fn update_benches(
    kernels: &CudaKernels,
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    report: &mut Vec<Row>,
    rng: &mut StdRng,
    rows: u32,
    dim: u32,
    copy_bandwidth: f64,
) -> Result<(), GpuError> {
    let n = (rows / 10) as usize;
    let ids: Vec<u32> = rand::seq::index::sample(rng, rows as usize, n)
        .into_iter()
        .map(|i| i as u32)
        .collect();
    let grads = kernels.upload(&patterned(n * dim as usize))?;
    for optimizer in [
        RowOptimizer::Adagrad {
            lr: 0.01,
            epsilon: 1e-8,
        },
        RowOptimizer::Adam {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        },
    ] {
        let stride = dim + optimizer.state_len(dim);
        let shape = TableShape { rows, dim, stride };
        let mut host = patterned(rows as usize * stride as usize);
        if let RowOptimizer::Adam { .. } = optimizer {
            host.chunks_exact_mut(stride as usize).for_each(|row| {
                row[3 * dim as usize] = 1.0;
                row[3 * dim as usize + 1] = 1.0;
            });
        }
        let mut table = kernels.upload_table(shape, &host)?;
        drop(host);
        let device_ids = kernels.upload_ids(shape, &ids)?;
        let name = format!(
            "{} update dim {dim}, {n} distinct of {rows} rows",
            if matches!(optimizer, RowOptimizer::Adagrad { .. }) {
                "adagrad"
            } else {
                "adam"
            }
        );
        // Each touched row's weights and state read and written, its gradient and id read.
        let bytes = (n * (2 * stride as usize * 4 + dim as usize * 4 + 4)) as f64;
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(&name, |b| {
            b.iter_custom(|iters| {
                device_time(kernels, iters, || {
                    kernels.update_rows_on_device(&mut table, optimizer, &device_ids, &grads)
                })
                .unwrap_or(Duration::MAX)
            })
        });
        let seconds = median_seconds(kernels, || {
            kernels.update_rows_on_device(&mut table, optimizer, &device_ids, &grads)
        })?;
        let cpu_rate = cpu_update_rate(optimizer, dim);
        report.push(Row {
            name,
            value: format!(
                "{:.0}M rows/s, {:.0} GB/s ({:.0}% of copy)",
                n as f64 / seconds / 1e6,
                bytes / seconds / 1e9,
                100.0 * bytes / seconds / copy_bandwidth
            ),
            baseline: format!("CPU reference {:.1}M rows/s, 1 core", cpu_rate / 1e6),
        });
    }
    Ok(())
}

fn cpu_update_rate(optimizer: RowOptimizer, dim: u32) -> f64 {
    let mut rng = StdRng::seed_from_u64(3);
    let rows = 1_000_000u32;
    let stride = dim + optimizer.state_len(dim);
    let shape = TableShape { rows, dim, stride };
    let mut table = patterned(rows as usize * stride as usize);
    let ids: Vec<u32> = rand::seq::index::sample(&mut rng, rows as usize, 100_000)
        .into_iter()
        .map(|i| i as u32)
        .collect();
    let grads = patterned(ids.len() * dim as usize);
    per_second(ids.len(), || {
        black_box(
            CpuKernels
                .update_rows(shape, optimizer, &mut table, &ids, &grads)
                .ok(),
        );
    })
}

fn main() {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let mut report = Vec::new();
    cpu_benches(&mut criterion, &mut report);
    match cuda_status() {
        CudaStatus::Ready { .. } => {
            let result = CudaKernels::new(0).and_then(|kernels| {
                println!("GPU: {}", kernels.device_name()?);
                gpu_benches(&mut criterion, &kernels, &mut report)
            });
            if let Err(e) = result {
                eprintln!("GPU benchmarks failed: {e}");
                std::process::exit(1);
            }
        }
        CudaStatus::NoDriver => {
            println!("GPU benchmarks SKIPPED: no NVIDIA driver on this machine")
        }
        CudaStatus::NoDevice(why) => println!("GPU benchmarks SKIPPED: {why}"),
    }
    criterion.final_summary();
    println!("\n{:<62} {:<44} baseline", "benchmark", "measured");
    for row in report {
        println!("{:<62} {:<44} {}", row.name, row.value, row.baseline);
    }
}
