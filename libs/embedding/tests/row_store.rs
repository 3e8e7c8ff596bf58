//! A table whose rows live in row stores (the PS's `device: cuda` path) against the arena
//! table: the same calls give bitwise the same answers, rows, optimizer state, metadata,
//! deltas and snapshots. The stores here are `HostRows`, the CPU reference of the GPU's
//! `DeviceRows` (which primus-gpu's GPU checks compare with it on a device).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use primus_embedding::{EmbeddingError, RowMeta, ShardSnapshot, Table, TableOptions};
use primus_gpu::{GpuError, HostRows, RowStore};
use primus_spec::job::{AdmissionSpec, Initializer, OptimizerSpec, TableSpec};

const DIM: u32 = 8;
const KEYS: u64 = 6000;

fn spec(optimizer: OptimizerSpec, min_count: u32) -> TableSpec {
    TableSpec {
        name: "ads".into(),
        dim: DIM,
        optimizer,
        initializer: Initializer::Uniform { scale: 0.1 },
        admission: AdmissionSpec {
            min_count,
            probability: 1.0,
        },
        ttl_seconds: Some(10),
        ..TableSpec::new("ads", DIM, OptimizerSpec::adagrad(0.05))
    }
}

fn adagrad() -> OptimizerSpec {
    OptimizerSpec::adagrad(0.05)
}

fn adam() -> OptimizerSpec {
    OptimizerSpec::adam(0.01)
}

fn options() -> TableOptions {
    TableOptions {
        shards: 2,
        seed: 5,
        sketch_width: 1 << 12,
    }
}

fn host_rows(dim: u32, stride: u32) -> Result<Box<dyn RowStore>, GpuError> {
    Ok(Box::new(HostRows::new(dim, stride)))
}

fn arena_table(spec: &TableSpec) -> Table {
    Table::with_versions(spec, options(), Arc::new(AtomicU64::new(0))).expect("arena table")
}

fn stored_table(spec: &TableSpec) -> Table {
    Table::with_row_stores(spec, options(), Arc::new(AtomicU64::new(0)), &host_rows)
        .expect("stored table")
}

/// A fixed pseudo-random sequence (the test must not depend on a crate's generator).
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn unit(&mut self) -> f32 {
        (self.below(2001) as f32 - 1000.0) / 1000.0
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn lookup_bits(table: &Table, keys: &[u64]) -> Vec<u32> {
    let mut out = vec![0.0; keys.len() * DIM as usize];
    table.lookup(keys, &mut out).expect("lookup");
    bits(&out)
}

fn reload(source: &Table, into: Table) -> Table {
    for shard in 0..source.shard_count() {
        let bytes = source.snapshot_shard(shard, 0).expect("snapshot").encode();
        let snapshot = ShardSnapshot::decode(&bytes).expect("decode");
        into.restore_shard(&snapshot).expect("restore");
    }
    into
}

/// `Table::read_rows` of `keys`, each key with its row's bits, in key order.
fn read_rows(table: &Table, keys: &[u64]) -> Vec<(u64, Vec<u32>)> {
    let (found, values) = table.read_rows(keys).expect("read rows");
    let width = table.row_width();
    let mut rows: Vec<(u64, Vec<u32>)> = found
        .into_iter()
        .zip(values.chunks_exact(width))
        .map(|(key, row)| (key, bits(row)))
        .collect();
    rows.sort_unstable_by_key(|(key, _)| *key);
    rows
}

/// Every key's row (weights then state, as bits; metadata) in key order.
fn all_rows(table: &Table) -> Vec<(u64, Vec<u32>, RowMeta)> {
    let mut keys = table.export_delta(0).expect("delta").keys;
    keys.sort_unstable();
    keys.iter()
        .map(|&key| {
            let (weights, state, meta) = table.row(key).expect("read").expect("row");
            (key, bits(&[weights, state].concat()), meta)
        })
        .collect()
}

#[test]
fn a_table_over_row_stores_matches_the_arena_table_bit_for_bit() {
    for (optimizer, min_count) in [(adagrad(), 2), (adam(), 0)] {
        let spec = spec(optimizer, min_count);
        let mut arena = arena_table(&spec);
        let mut stored = stored_table(&spec);
        let mut draws = Draws(17);
        let mut now = 0u32;
        for step in 0..30 {
            // Repeats within a push (hot keys), and enough keys that each shard's store
            // grows past its first 1,024 rows several times.
            let keys: Vec<u64> = (0..2500)
                .map(|i| {
                    if i % 5 == 0 {
                        draws.below(50)
                    } else {
                        draws.below(KEYS)
                    }
                })
                .collect();
            let grads: Vec<f32> = (0..keys.len() * DIM as usize)
                .map(|_| draws.unit())
                .collect();
            assert_eq!(
                arena.push(&keys, &grads, now).expect("arena push"),
                stored.push(&keys, &grads, now).expect("stored push"),
                "step {step}: push outcome"
            );
            let reads: Vec<u64> = (0..700).map(|_| draws.below(KEYS + 500)).collect();
            assert_eq!(
                lookup_bits(&arena, &reads),
                lookup_bits(&stored, &reads),
                "step {step}: lookup"
            );
            if step % 10 == 9 {
                now += 6;
                assert_eq!(
                    arena.evict_expired(now),
                    stored.evict_expired(now),
                    "step {step}: evictions"
                );
            }
            if step == 20 {
                // Through the snapshot format, each into a fresh table of its own kind.
                arena = reload(&arena, arena_table(&spec));
                stored = reload(&stored, stored_table(&spec));
            }
        }
        assert_eq!(arena.len(), stored.len());
        assert!(stored.len() > 4 * 1024, "the stores grew past one chunk");
        assert_eq!(all_rows(&arena), all_rows(&stored));
        let (mut want, mut got) = (
            arena.export_delta(0).expect("delta"),
            stored.export_delta(0).expect("delta"),
        );
        for delta in [&mut want, &mut got] {
            let mut order: Vec<usize> = (0..delta.keys.len()).collect();
            order.sort_unstable_by_key(|&i| delta.keys[i]);
            delta.keys = order.iter().map(|&i| delta.keys[i]).collect();
            delta.weights = order
                .iter()
                .flat_map(|&i| delta.weights[i * DIM as usize..][..DIM as usize].to_vec())
                .collect();
            delta.versions.clear();
            delta.evicted.sort_unstable();
            delta.evicted_versions.clear();
        }
        assert_eq!(want.keys, got.keys);
        assert_eq!(bits(&want.weights), bits(&got.weights));
        assert_eq!(want.evicted, got.evicted);
        let asked: Vec<u64> = (0..KEYS + 100).step_by(7).collect();
        let read = read_rows(&stored, &asked);
        assert_eq!(read_rows(&arena, &asked), read);
        let by_row: Vec<(u64, Vec<u32>)> = all_rows(&stored)
            .into_iter()
            .filter(|(key, _, _)| key % 7 == 0)
            .map(|(key, values, _)| (key, values))
            .collect();
        assert_eq!(read, by_row, "read_rows agrees with row()");
        assert_eq!(arena.stats().admitted, stored.stats().admitted);
        assert_eq!(arena.stats().rejected, stored.stats().rejected);
    }
}

#[test]
fn a_snapshot_of_a_stored_table_restores_into_an_arena_table_and_back() {
    let spec = spec(adagrad(), 0);
    let stored = stored_table(&spec);
    let keys: Vec<u64> = (0..3000).collect();
    let grads = vec![0.25; keys.len() * DIM as usize];
    stored.push(&keys, &grads, 1).expect("push");
    let arena = reload(&stored, arena_table(&spec));
    let back = reload(&arena, stored_table(&spec));
    assert_eq!(all_rows(&stored), all_rows(&arena));
    assert_eq!(all_rows(&stored), all_rows(&back));
}

#[test]
fn row_stores_refuse_optimizers_without_a_kernel_and_report_a_missing_device() {
    for (optimizer, name) in [
        (OptimizerSpec::Sgd { learning_rate: 0.1 }, "sgd"),
        (
            OptimizerSpec::Ftrl {
                alpha: 0.1,
                beta: 1.0,
                l1: 0.0,
                l2: 0.0,
            },
            "ftrl",
        ),
    ] {
        let refused = Table::with_row_stores(
            &spec(optimizer, 0),
            options(),
            Arc::new(AtomicU64::new(0)),
            &host_rows,
        );
        match refused {
            Err(EmbeddingError::NoKernel { table, optimizer }) => {
                assert_eq!((table.as_str(), optimizer), ("ads", name));
            }
            other => panic!("{name}: expected NoKernel, got {:?}", other.err()),
        }
    }
    let no_device = |_: u32, _: u32| -> Result<Box<dyn RowStore>, GpuError> {
        Err(GpuError::NoDevice("no NVIDIA driver".into()))
    };
    let error = Table::with_row_stores(
        &spec(adam(), 0),
        options(),
        Arc::new(AtomicU64::new(0)),
        &no_device,
    )
    .err()
    .expect("a table without a device is refused");
    assert_eq!(
        error.to_string(),
        "table ads: device: no usable CUDA device: no NVIDIA driver"
    );
}
