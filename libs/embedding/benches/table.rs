//! Lookup, Adagrad push and insert against baselines measured in the same run: a raw
//! gather of rows by precomputed position (the memory-bandwidth limit), from a heap `Vec`,
//! from huge-page-backed memory as the table's arena uses, and from that memory with
//! prefetching (the machine's random cache-line rate: a lookup reads at least two lines, a
//! bucket and a row, so it can reach at most half of that figure at dim 16); and a
//! `HashMap<u64, Vec<f32>>`. Keys are uniform or Zipf(1.05) over the table.
//!
//! Deltas: a push of a batch, then the export of the rows it changed (serving sync's work
//! per notice), next to the push alone.
//!
//! With a CUDA device, the same table with its rows in GPU memory (the PS's `device: cuda`,
//! 4 shards) runs the same lookups and pushes beside the host table; without one, that part
//! prints SKIPPED.
//!
//! `PRIMUS_BENCH_KEYS=1000000,10000000 PRIMUS_BENCH_DIMS=16,64 cargo bench -p primus-embedding`
//! (defaults: 1M keys, dims 16 and 64). Figures are elements (keys) per second.

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use primus_embedding::{Region, Table, TableOptions};
use primus_gpu::{CudaKernels, CudaStatus, DeviceRows, RowStore, cuda_status};
use primus_prefetch::prefetch;
use primus_spec::job::{OptimizerSpec, TableSpec};

const BATCH: usize = 4096;
const BATCHES: usize = 64;

#[expect(clippy::disallowed_methods, reason = "a bench's size knobs")]
fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

fn spec(dim: usize) -> TableSpec {
    TableSpec::new("bench", dim as u32, OptimizerSpec::adagrad(0.05))
}

/// A deterministic generator (splitmix64) so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Positions 0..n drawn uniformly or by Zipf(s) (rank 0 most frequent).
fn positions(n: usize, zipf: Option<f64>, count: usize, rng: &mut Rng) -> Vec<usize> {
    match zipf {
        None => (0..count)
            .map(|_| (rng.next() % n as u64) as usize)
            .collect(),
        Some(s) => {
            let mut cdf = Vec::with_capacity(n);
            let mut total = 0.0;
            for rank in 1..=n {
                total += (rank as f64).powf(-s);
                cdf.push(total);
            }
            (0..count)
                .map(|_| {
                    let u = rng.unit() * total;
                    cdf.partition_point(|c| *c < u).min(n - 1)
                })
                .collect()
        }
    }
}

/// Copies the rows at `positions` (of `dim` floats each) into `out`, in order.
fn gather(rows: &[f32], positions: &[usize], dim: usize, out: &mut [f32]) {
    for (slot, p) in positions.iter().enumerate() {
        out[slot * dim..(slot + 1) * dim].copy_from_slice(&rows[p * dim..(p + 1) * dim]);
    }
}

/// [`gather`] with every row's lines prefetched `PREFETCH_AHEAD` rows early: as many misses
/// in flight as the core allows, so its figure is this machine's random line rate (times
/// lines per row), the ceiling for anything that reads rows at random.
fn gather_prefetched(rows: &[f32], positions: &[usize], dim: usize, out: &mut [f32]) {
    const PREFETCH_AHEAD: usize = 64;
    for (slot, p) in positions.iter().enumerate() {
        if let Some(ahead) = positions.get(slot + PREFETCH_AHEAD) {
            for line in (ahead * dim..(ahead + 1) * dim).step_by(16) {
                prefetch(&rows[line]);
            }
        }
        out[slot * dim..(slot + 1) * dim].copy_from_slice(&rows[p * dim..(p + 1) * dim]);
    }
}

fn key_of(i: usize) -> u64 {
    // Keys look like hashed feature ids, not a dense range.
    (i as u64 ^ 0xdead_beef).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn bench(c: &mut Criterion) {
    for &n in &env_list("PRIMUS_BENCH_KEYS", &[1_000_000]) {
        for &dim in &env_list("PRIMUS_BENCH_DIMS", &[16, 64]) {
            run(c, n, dim);
        }
    }
}

/// The table with its rows on GPU 0 (as a `device: cuda` PS builds it), or why not.
fn gpu_table(dim: usize) -> Result<Table, String> {
    if !matches!(cuda_status(), CudaStatus::Ready { .. }) {
        return Err(format!("no CUDA device ({:?})", cuda_status()));
    }
    let kernels = Arc::new(CudaKernels::new(0).map_err(|e| e.to_string())?);
    let on_device = |dim, stride| {
        DeviceRows::new(kernels.clone(), dim, stride)
            .map(|rows| Box::new(rows) as Box<dyn RowStore>)
    };
    let options = TableOptions {
        shards: 4,
        ..TableOptions::default()
    };
    Table::with_row_stores(&spec(dim), options, Arc::new(AtomicU64::new(0)), &on_device)
        .map_err(|e| e.to_string())
}

fn filled(table: Table, keys: &[u64], dim: usize) -> Table {
    let zero = vec![0.0f32; BATCH * dim];
    for chunk in keys.chunks(BATCH) {
        table
            .push(chunk, &zero[..chunk.len() * dim], 1)
            .expect("fill");
    }
    table
}

fn run(c: &mut Criterion, n: usize, dim: usize) {
    let keys: Vec<u64> = (0..n).map(key_of).collect();
    let table = filled(
        Table::new(&spec(dim), TableOptions::default()).expect("table"),
        &keys,
        dim,
    );
    let on_gpu = gpu_table(dim).map(|t| filled(t, &keys, dim));
    if let Err(why) = &on_gpu {
        println!("SKIPPED table_on_gpu (lookup and push with rows in GPU memory): {why}");
    }
    let arena: Vec<f32> = (0..n * dim).map(|i| i as f32).collect();
    let mut huge_arena = Region::zeroed((n * dim).div_ceil(2));
    let huge_floats: &mut [f32] = bytemuck::cast_slice_mut(huge_arena.words_mut());
    for (i, x) in huge_floats.iter_mut().enumerate() {
        *x = i as f32;
    }
    let huge_floats: &[f32] = bytemuck::cast_slice(huge_arena.words());
    let map: HashMap<u64, Vec<f32>> = keys.iter().map(|k| (*k, vec![0.5; dim])).collect();
    let mut rng = Rng(7);
    let stats = table.stats();
    let payload = (n * dim * 2 * 4) as f64; // weights + Adagrad state
    println!(
        "{n} keys, dim {dim}: table holds {} bytes, {:.1} bytes/key beyond weights+state",
        stats.bytes,
        (stats.bytes as f64 - payload) / n as f64
    );

    for (label, zipf) in [("uniform", None), ("zipf1.05", Some(1.05))] {
        let batches: Vec<Vec<usize>> = (0..BATCHES)
            .map(|_| positions(n, zipf, BATCH, &mut rng))
            .collect();
        let key_batches: Vec<Vec<u64>> = batches
            .iter()
            .map(|b| b.iter().map(|p| keys[*p]).collect())
            .collect();
        let mut group = c.benchmark_group(format!("lookup/{n}/dim{dim}/{label}"));
        group.throughput(Throughput::Elements(BATCH as u64));
        let mut out = vec![0.0f32; BATCH * dim];
        let mut i = 0;
        type Gather = fn(&[f32], &[usize], usize, &mut [f32]);
        for (name, rows, gather) in [
            ("raw_gather", &arena[..], gather as Gather),
            ("raw_gather_huge_pages", huge_floats, gather),
            (
                "raw_gather_huge_pages_prefetched",
                huge_floats,
                gather_prefetched,
            ),
        ] {
            group.bench_function(name, |b| {
                b.iter(|| {
                    gather(rows, &batches[i % BATCHES], dim, &mut out);
                    i += 1;
                    black_box(&out);
                })
            });
        }
        group.bench_function("hashmap", |b| {
            b.iter(|| {
                let batch = &key_batches[i % BATCHES];
                i += 1;
                for (slot, k) in batch.iter().enumerate() {
                    if let Some(row) = map.get(k) {
                        out[slot * dim..(slot + 1) * dim].copy_from_slice(row);
                    }
                }
                black_box(&out);
            })
        });
        group.bench_function("table_lookup", |b| {
            b.iter(|| {
                let batch = &key_batches[i % BATCHES];
                i += 1;
                table.lookup(batch, &mut out).expect("lookup");
                black_box(&out);
            })
        });
        let grads = vec![0.001f32; BATCH * dim];
        group.bench_function("table_push_adagrad", |b| {
            b.iter(|| {
                let batch = &key_batches[i % BATCHES];
                i += 1;
                table.push(batch, &grads, 2).expect("push");
            })
        });
        if let Ok(on_gpu) = &on_gpu {
            group.bench_function("table_on_gpu_lookup", |b| {
                b.iter(|| {
                    let batch = &key_batches[i % BATCHES];
                    i += 1;
                    on_gpu.lookup(batch, &mut out).expect("gpu lookup");
                    black_box(&out);
                })
            });
            group.bench_function("table_on_gpu_push_adagrad", |b| {
                b.iter(|| {
                    let batch = &key_batches[i % BATCHES];
                    i += 1;
                    on_gpu.push(batch, &grads, 2).expect("gpu push");
                })
            });
        }
        group.finish();
    }

    // Serving sync's cost per delta: a batch of updates, then the rows changed since just
    // before it (what a replica that was current asks for). "push" alone is the baseline;
    // the difference is the export, which reads the shards' change logs, not every row.
    let mut group = c.benchmark_group(format!("delta/{n}/dim{dim}"));
    group.throughput(Throughput::Elements(BATCH as u64));
    let batches: Vec<Vec<u64>> = (0..BATCHES)
        .map(|_| {
            positions(n, None, BATCH, &mut rng)
                .iter()
                .map(|p| keys[*p])
                .collect()
        })
        .collect();
    let grads = vec![0.001f32; BATCH * dim];
    let mut i = 0;
    group.bench_function("push", |b| {
        b.iter(|| {
            table.push(&batches[i % BATCHES], &grads, 4).expect("push");
            i += 1;
        })
    });
    group.bench_function("push_then_export_its_changes", |b| {
        b.iter(|| {
            let since = table.version();
            table.push(&batches[i % BATCHES], &grads, 4).expect("push");
            i += 1;
            black_box(table.export_delta(since).expect("delta"))
        })
    });
    group.finish();

    let mut group = c.benchmark_group(format!("insert/{n}/dim{dim}"));
    group.throughput(Throughput::Elements(BATCH as u64));
    group.sample_size(10);
    let grads = vec![0.001f32; BATCH * dim];
    group.bench_function(BenchmarkId::new("hashmap", "new keys"), |b| {
        b.iter_batched(
            || {
                (
                    HashMap::<u64, Vec<f32>>::new(),
                    (0..BATCH).map(|i| key_of(n + i)).collect::<Vec<_>>(),
                )
            },
            |(mut map, new_keys)| {
                for k in new_keys {
                    map.insert(k, vec![0.0; dim]);
                }
                black_box(map)
            },
            criterion::BatchSize::LargeInput,
        )
    });
    let mut next = n;
    group.bench_function(BenchmarkId::new("table", "new keys"), |b| {
        b.iter(|| {
            let new_keys: Vec<u64> = (next..next + BATCH).map(key_of).collect();
            next += BATCH;
            table.push(&new_keys, &grads, 3).expect("insert");
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
