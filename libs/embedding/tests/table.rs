//! The table against a reference model (a HashMap), over random interleavings of lookups,
//! pushes and evictions; admission and expiry as configured; concurrent use.
use std::collections::HashMap;
use std::sync::Arc;

use primus_embedding::{EmbeddingError, ShardSnapshot, SnapshotError, Table, TableOptions};
use primus_spec::job::{AdmissionSpec, Initializer, OptimizerSpec, TablePooling, TableSpec};
use proptest::prelude::*;

const DIM: usize = 4;
const LR: f32 = 0.5;
const TTL: u64 = 10;

fn spec(min_count: u32, probability: f64, ttl: Option<u64>) -> TableSpec {
    TableSpec {
        name: "t".into(),
        dim: DIM as u32,
        optimizer: OptimizerSpec::Sgd {
            learning_rate: f64::from(LR),
        },
        initializer: Initializer::Uniform { scale: 0.1 },
        admission: AdmissionSpec {
            min_count,
            probability,
        },
        ttl_seconds: ttl,
        pooling: TablePooling::Sum,
    }
}

fn table(shards: usize, spec: &TableSpec) -> Table {
    Table::new(
        spec,
        TableOptions {
            shards,
            seed: 11,
            sketch_width: 1 << 10,
        },
    )
    .expect("table")
}

#[derive(Debug, Clone)]
enum Op {
    Lookup(Vec<u64>),
    Push(Vec<u64>, Vec<f32>),
    /// Advance the clock by this many seconds, then evict.
    Evict(u32),
    /// Snapshot every shard (through the byte format) and restore into a new table with
    /// this many shards, which replaces the old one.
    Reload(usize),
}

fn op() -> impl Strategy<Value = Op> {
    // A small key space so keys repeat, collide in buckets and come back after eviction.
    let keys = prop::collection::vec(0u64..300, 1..40);
    prop_oneof![
        keys.clone().prop_map(Op::Lookup),
        keys.prop_flat_map(|keys| {
            let n = keys.len() * DIM;
            (Just(keys), prop::collection::vec(-1.0f32..1.0, n))
        })
        .prop_map(|(keys, grads)| Op::Push(keys, grads)),
        (1u32..8).prop_map(Op::Evict),
        prop::sample::select(vec![1usize, 2, 16]).prop_map(Op::Reload),
    ]
}

/// What the table should hold: weights and last update per key.
#[derive(Default)]
struct Model {
    rows: HashMap<u64, (Vec<f32>, u32)>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matches_a_hashmap_model(ops in prop::collection::vec(op(), 1..60), shards in prop::sample::select(vec![1usize, 4, 64])) {
        let spec = spec(0, 1.0, Some(TTL));
        let mut subject = table(shards, &spec);
        // Initial values come from an untouched table with the same seed.
        let fresh = table(1, &spec);
        let initial = |key: u64| {
            let mut row = vec![0.0; DIM];
            fresh.lookup(&[key], &mut row).expect("lookup");
            row
        };
        let mut model = Model::default();
        let mut now = 1_000u32;
        for op in ops {
            match op {
                Op::Lookup(keys) => {
                    let mut got = vec![0.0; keys.len() * DIM];
                    subject.lookup(&keys, &mut got).expect("lookup");
                    for (i, key) in keys.iter().enumerate() {
                        let want = model.rows.get(key).map_or_else(|| initial(*key), |r| r.0.clone());
                        prop_assert_eq!(&got[i * DIM..(i + 1) * DIM], &want[..], "key {}", key);
                    }
                }
                Op::Push(keys, grads) => {
                    subject.push(&keys, &grads, now).expect("push");
                    for (i, key) in keys.iter().enumerate() {
                        let row = model.rows.entry(*key).or_insert_with(|| (initial(*key), now));
                        for (w, g) in row.0.iter_mut().zip(&grads[i * DIM..(i + 1) * DIM]) {
                            *w -= LR * g;
                        }
                        row.1 = now;
                    }
                }
                Op::Evict(seconds) => {
                    now += seconds;
                    let evicted = subject.evict_expired(now);
                    let before = model.rows.len();
                    model.rows.retain(|_, (_, updated)| u64::from(now - *updated) < TTL);
                    prop_assert_eq!(evicted, before - model.rows.len());
                }
                Op::Reload(new_shards) => {
                    let restored = table(new_shards, &spec);
                    for shard in 0..subject.shard_count() {
                        let bytes = subject.snapshot_shard(shard, 0).expect("snapshot").encode();
                        let snapshot = ShardSnapshot::decode(&bytes).expect("decode");
                        restored.restore_shard(&snapshot).expect("restore");
                    }
                    prop_assert!(restored.version() >= subject.version());
                    subject = restored;
                }
            }
            prop_assert_eq!(subject.len(), model.rows.len());
        }
        // Every row is there once, under its own key, with its own weights.
        let delta = subject.export_delta(0).expect("delta");
        let mut exported: Vec<u64> = delta.keys.clone();
        exported.sort_unstable();
        let mut expected: Vec<u64> = model.rows.keys().copied().collect();
        expected.sort_unstable();
        prop_assert_eq!(exported, expected);
        for (i, key) in delta.keys.iter().enumerate() {
            prop_assert_eq!(&delta.weights[i * DIM..(i + 1) * DIM], &model.rows[key].0[..]);
        }
    }
}

#[test]
fn keys_below_the_count_threshold_read_initial_and_drop_gradients() {
    let table = table(4, &spec(3, 1.0, None));
    let mut initial = vec![0.0; DIM];
    table.lookup(&[42], &mut initial).expect("lookup");
    let grad = vec![1.0; DIM];
    table.push(&[42], &grad, 1).expect("push");
    table.push(&[42], &grad, 2).expect("push");
    let mut row = vec![0.0; DIM];
    table.lookup(&[42], &mut row).expect("lookup");
    assert_eq!(row, initial, "not admitted after 2 occurrences");
    table.push(&[42], &grad, 3).expect("push");
    table.lookup(&[42], &mut row).expect("lookup");
    let expected: Vec<f32> = initial.iter().map(|w| w - LR).collect();
    assert_eq!(
        row, expected,
        "admitted on the 3rd, and that gradient applied"
    );
    let stats = table.stats();
    assert_eq!((stats.admitted, stats.rejected, stats.rows), (1, 2, 1));
    assert_eq!(stats.missing_reads, 2);
}

#[test]
fn a_table_refusing_new_rows_keeps_training_the_rows_it_has() {
    let table = table(4, &spec(0, 1.0, None));
    let grad = vec![1.0; DIM];
    table
        .push(&[1, 2], &[grad.clone(), grad.clone()].concat(), 1)
        .expect("push");
    table.refuse_new_rows(true);
    let outcome = table
        .push(
            &[1, 3, 4],
            &[grad.clone(), grad.clone(), grad.clone()].concat(),
            2,
        )
        .expect("push");
    assert_eq!((outcome.applied, outcome.refused), (1, 2));
    let stats = table.stats();
    assert_eq!((stats.rows, stats.refused), (2, 2));
    table.refuse_new_rows(false);
    let outcome = table.push(&[3], &grad, 3).expect("push");
    assert_eq!((outcome.applied, outcome.refused), (1, 0), "new rows again");
}

#[test]
fn admission_probability_admits_about_that_share() {
    let table = table(4, &spec(0, 0.2, None));
    let keys: Vec<u64> = (0..10_000).collect();
    table
        .push(&keys, &vec![0.1; keys.len() * DIM], 1)
        .expect("push");
    let stats = table.stats();
    assert!((1_500..2_500).contains(&stats.admitted), "{stats:?}");
    assert_eq!(stats.admitted + stats.rejected, 10_000);
}

#[test]
fn expired_rows_are_evicted_and_their_slots_reused() {
    let table = table(1, &spec(0, 1.0, Some(60)));
    let keys: Vec<u64> = (0..1_000).collect();
    let grads = vec![0.1; keys.len() * DIM];
    table.push(&keys, &grads, 100).expect("push");
    table
        .push(&keys[..10], &grads[..10 * DIM], 150)
        .expect("refresh ten");
    let bytes = table.stats().bytes;
    assert_eq!(table.evict_expired(159), 0, "not yet");
    assert_eq!(table.evict_expired(160), 990);
    assert_eq!(table.len(), 10);
    assert_eq!(table.export_delta(0).expect("delta").evicted.len(), 990);
    let fresh: Vec<u64> = (5_000..5_990).collect();
    table
        .push(&fresh, &vec![0.1; fresh.len() * DIM], 170)
        .expect("push");
    assert_eq!(table.len(), 1_000);
    // No arena row or metadata was added; only the change log holds the 990 new keys, 8
    // bytes each.
    assert_eq!(
        table.stats().bytes - bytes,
        990 * 8,
        "new keys took the evicted rows' slots"
    );
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let table = table(4, &spec(0, 1.0, None));
    let err = table.push(&[1, 2], &[0.0; DIM], 1).expect_err("width");
    assert!(
        matches!(err, EmbeddingError::Width { keys: 2, .. }),
        "{err}"
    );
    let mut grads = vec![0.5; 2 * DIM];
    grads[DIM + 1] = f32::NAN;
    let err = table.push(&[1, 2], &grads, 1).expect_err("nan");
    assert_eq!(
        err,
        EmbeddingError::NonFinite {
            key: 2,
            position: 1
        }
    );
    assert!(table.is_empty(), "nothing applied, not even key 1");
    let mut out = vec![0.0; DIM];
    assert!(table.lookup(&[1, 2], &mut out).is_err());
}

#[test]
fn deltas_hold_rows_changed_since_a_version() {
    let table = table(8, &spec(0, 1.0, None));
    let grad = vec![0.1; DIM];
    table.push(&[1], &grad, 1).expect("push");
    let first = table.export_delta(0).expect("delta");
    assert_eq!(first.keys, vec![1]);
    table.push(&[2], &grad, 2).expect("push");
    let second = table.export_delta(first.version).expect("delta");
    assert_eq!(second.keys, vec![2]);
    assert!(
        table
            .export_delta(second.version)
            .expect("delta")
            .keys
            .is_empty()
    );
}

#[test]
fn concurrent_pushes_and_lookups_lose_nothing() {
    let table = Arc::new(table(16, &spec(0, 1.0, None)));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let table = table.clone();
            std::thread::spawn(move || {
                // Each thread owns its keys; each key gets 100 unit gradients.
                let keys: Vec<u64> = (0..500).map(|k| k * 4 + t).collect();
                let grads = vec![1.0; keys.len() * DIM];
                let mut out = vec![0.0; keys.len() * DIM];
                for step in 0..100 {
                    table.push(&keys, &grads, step).expect("push");
                    table.lookup(&keys, &mut out).expect("lookup");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("thread");
    }
    assert_eq!(table.len(), 2_000);
    let fresh = self::table(1, &spec(0, 1.0, None));
    for key in [0u64, 1, 2, 3, 1_999] {
        let (mut got, mut initial) = (vec![0.0; DIM], vec![0.0; DIM]);
        table.lookup(&[key], &mut got).expect("lookup");
        fresh.lookup(&[key], &mut initial).expect("lookup");
        let mut expected = initial.clone();
        for _ in 0..100 {
            for w in &mut expected {
                *w -= LR;
            }
        }
        assert_eq!(got, expected, "key {key}");
        let (_, _, meta) = table.row(key).expect("read").expect("row");
        assert_eq!(meta.count, 100);
    }
}

fn adagrad_spec() -> TableSpec {
    TableSpec {
        optimizer: OptimizerSpec::Adagrad {
            learning_rate: 0.05,
            initial_accumulator: 0.1,
            epsilon: 1e-8,
        },
        ..spec(0, 1.0, None)
    }
}

/// Snapshots every shard through the byte format and restores into a fresh table.
fn reload(source: &Table, since: u64, into: &Table) -> u64 {
    let mut version = u64::MAX;
    for shard in 0..source.shard_count() {
        let snapshot = ShardSnapshot::decode(
            &source
                .snapshot_shard(shard, since)
                .expect("snapshot")
                .encode(),
        )
        .expect("decode");
        version = version.min(snapshot.version);
        into.restore_shard(&snapshot).expect("restore");
    }
    version
}

#[test]
fn a_snapshot_taken_during_pushes_pairs_each_weight_with_its_own_optimizer_state() {
    let source = Arc::new(table(8, &adagrad_spec()));
    let keys: Vec<u64> = (0..2_000).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pushers: Vec<_> = (0..2)
        .map(|t| {
            let (source, stop) = (source.clone(), stop.clone());
            let keys: Vec<u64> = keys.iter().copied().filter(|k| k % 2 == t).collect();
            std::thread::spawn(move || {
                let grads = vec![1.0; keys.len() * DIM];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    source.push(&keys, &grads, 1).expect("push");
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let restored = table(8, &adagrad_spec());
    reload(&source, 0, &restored);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for pusher in pushers {
        pusher.join().expect("pusher");
    }
    // Replaying `count` unit gradients from the initial row must give exactly the saved
    // weights and accumulators: a weight saved with another moment's state would not.
    let mut checked = 0;
    for key in keys.iter().step_by(97) {
        let Some((weights, state, meta)) = restored.row(*key).expect("read") else {
            continue;
        };
        let replay = table(1, &adagrad_spec());
        for _ in 0..meta.count {
            replay.push(&[*key], &[1.0; DIM], 1).expect("replay");
        }
        let (want_weights, want_state, _) = replay.row(*key).expect("read").expect("replayed row");
        assert_eq!(
            weights, want_weights,
            "key {key} after {} pushes",
            meta.count
        );
        assert_eq!(state, want_state, "key {key}");
        checked += 1;
    }
    assert!(checked > 10, "{checked} rows checked");
}

#[test]
fn a_full_then_incremental_snapshot_restores_the_table() {
    let source = table(4, &spec(0, 1.0, Some(100)));
    let grads = vec![0.25; 500 * DIM];
    let first: Vec<u64> = (0..500).collect();
    source.push(&first, &grads, 10).expect("push");
    let restored = table(2, &spec(0, 1.0, Some(100)));
    let base = reload(&source, 0, &restored);

    let second: Vec<u64> = (400..900).collect();
    source.push(&second, &grads, 60).expect("push");
    assert_eq!(
        source.evict_expired(110),
        400,
        "keys 0..400 idle since t=10"
    );
    let incremental = reload(&source, base, &restored);
    assert!(incremental > base);

    let mut want = source.export_delta(0).expect("delta");
    let mut got = restored.export_delta(0).expect("delta");
    for delta in [&mut want, &mut got] {
        let mut rows: Vec<(u64, Vec<f32>)> = delta
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, delta.weights[i * DIM..(i + 1) * DIM].to_vec()))
            .collect();
        rows.sort_by_key(|r| r.0);
        delta.keys = rows.iter().map(|r| r.0).collect();
        delta.weights = rows.into_iter().flat_map(|r| r.1).collect();
    }
    assert_eq!(got.keys, want.keys);
    assert_eq!(got.weights, want.weights);
    assert_eq!(restored.len(), 500);
}

#[test]
fn a_damaged_snapshot_is_refused() {
    let source = table(1, &spec(0, 1.0, None));
    source.push(&[1, 2, 3], &[0.5; 3 * DIM], 1).expect("push");
    let bytes = source.snapshot_shard(0, 0).expect("snapshot").encode();
    let mut flipped = bytes.clone();
    flipped[60] ^= 1;
    assert!(matches!(
        ShardSnapshot::decode(&flipped),
        Err(SnapshotError::Checksum { .. })
    ));
    assert!(ShardSnapshot::decode(&bytes[..bytes.len() - 9]).is_err());
    let snapshot = ShardSnapshot::decode(&bytes).expect("intact");
    let wider = Table::new(
        &TableSpec {
            dim: 8,
            ..spec(0, 1.0, None)
        },
        TableOptions::default(),
    )
    .expect("table");
    assert!(matches!(
        wider.restore_shard(&snapshot),
        Err(SnapshotError::Shape { .. })
    ));
}

/// Every row whose version is above `since`, found by reading every key of `universe`:
/// what a delta must hold, whichever way the table finds its changed rows.
fn changed_rows_by_scan(table: &Table, universe: u64, since: u64) -> Vec<(u64, u64, Vec<f32>)> {
    (0..universe)
        .filter_map(|key| {
            let (weights, _, meta) = table.row(key).expect("read")?;
            (meta.version > since).then_some((key, meta.version, weights))
        })
        .collect()
}

fn delta_rows(table: &Table, since: u64) -> Vec<(u64, u64, Vec<f32>)> {
    let delta = table.export_delta(since).expect("delta");
    let mut rows: Vec<(u64, u64, Vec<f32>)> = delta
        .keys
        .iter()
        .zip(&delta.versions)
        .zip(delta.weights.chunks_exact(DIM))
        .map(|((key, version), weights)| (*key, *version, weights.to_vec()))
        .collect();
    rows.sort_unstable_by_key(|(key, _, _)| *key);
    rows
}

#[test]
fn deltas_and_incremental_snapshots_from_the_change_log_match_a_scan_of_every_row() {
    // One shard with more rows than the log's minimum, so the log starts over many times;
    // evictions recycle rows (a key may come back to the row it left).
    const UNIVERSE: u64 = 20_000;
    let table = table(1, &spec(0, 1.0, Some(TTL)));
    let mut draws = 99u64;
    let mut next = move |n: u64| {
        draws = draws
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (draws >> 33) % n
    };
    let mut watermarks = vec![0u64];
    let mut now = 0u32;
    for step in 0..60 {
        let hot = step % 3 == 0;
        let keys: Vec<u64> = (0..3000)
            .map(|_| if hot { next(300) } else { next(UNIVERSE) })
            .collect();
        let grads = vec![0.01f32; keys.len() * DIM];
        table.push(&keys, &grads, now).expect("push");
        if step % 7 == 6 {
            now += TTL as u32 / 2 + 1;
            table.evict_expired(now);
        }
        if step % 11 == 10 {
            // A restore of the table's own snapshot rewrites rows with their own metadata.
            let bytes = table.snapshot_shard(0, 0).expect("snapshot").encode();
            let snapshot = ShardSnapshot::decode(&bytes).expect("decode");
            table.restore_shard(&snapshot).expect("restore");
        }
        watermarks.push(table.export_delta(u64::MAX).expect("watermark").version);
        let count = watermarks.len();
        for since in [
            0,
            watermarks[count / 2],
            watermarks[count - 2],
            watermarks[count - 1],
        ] {
            let want = changed_rows_by_scan(&table, UNIVERSE, since);
            assert_eq!(
                delta_rows(&table, since),
                want,
                "step {step}, since {since}"
            );
            let mut snapshot_keys = table.snapshot_shard(0, since).expect("snapshot").keys;
            snapshot_keys.sort_unstable();
            let want_keys: Vec<u64> = want.iter().map(|(key, _, _)| *key).collect();
            assert_eq!(
                snapshot_keys, want_keys,
                "step {step}, since {since}: snapshot"
            );
        }
    }
}

#[test]
fn a_delta_names_a_recycled_row_by_its_new_key_only() {
    let table = table(1, &spec(0, 1.0, Some(TTL)));
    let grads = vec![0.5f32; DIM];
    table.push(&[7], &grads, 0).expect("push 7");
    let before = table.export_delta(0).expect("delta").version;
    assert_eq!(table.evict_expired(TTL as u32), 1);
    // Key 8 gets the row key 7 left.
    table.push(&[8], &grads, TTL as u32).expect("push 8");
    let delta = table.export_delta(before).expect("delta");
    assert_eq!(delta.keys, [8]);
    assert_eq!(delta.evicted, [7]);
    assert_eq!(delta_rows(&table, 0), changed_rows_by_scan(&table, 10, 0));
}

#[test]
fn deltas_that_follow_each_other_read_the_change_log_not_the_shards() {
    // 4 shards of 10,000 rows: a log holds at most 4,096 entries a shard, so it starts
    // over again and again while rows are pushed and nothing exports.
    const KEYS: u64 = 40_000;
    let table = table(4, &spec(0, 1.0, None));
    let grads = vec![0.1f32; 4096 * DIM];
    let batch = |round: u64, len: u64| -> Vec<u64> {
        (0..len)
            .map(|i| (i * 7919 + round * 104_729) % KEYS)
            .collect()
    };
    for round in 0..60 {
        table.push(&batch(round, 4096), &grads, 1).expect("push");
    }
    let mut scans = table.stats().change_scans;
    for round in 0..20u64 {
        let since = table.version();
        let keys = batch(1_000 + round, 256);
        table
            .push(&keys, &grads[..keys.len() * DIM], 2)
            .expect("push");
        let mut got = table.export_delta(since).expect("delta").keys;
        got.sort_unstable();
        let mut want = keys.clone();
        want.sort_unstable();
        want.dedup();
        assert_eq!(got, want, "round {round}");
        let now = table.stats().change_scans;
        // Only the first round may scan (the log started over during the pushes before).
        assert!(
            round == 0 || now == scans,
            "round {round} scanned {} shards",
            now - scans
        );
        scans = now;
    }
}
