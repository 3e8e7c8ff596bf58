//! Resharding a Job's PS shards while a client keeps pushing: every row ends up on the shard
//! the new layout names, equal (weights and optimizer state) to a table that got the same
//! pushes without resharding; a checkpoint restores into another shard count.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use primus_embedding::DenseStore;
use primus_proto::v1::{DenseTensor, Layout as WireLayout};
use primus_ps_client::reshard::reshard;
use primus_ps_client::{DenseValues, ShardSource, StoredRows, TableGrads, TableKeys, layout};

use super::*;

/// Keys the pusher draws from: enough that each shard holds thousands of rows.
const KEY_SPACE: u64 = 20_000;
const STEPS: u64 = 240;
const DENSE_NAMES: [&str; 4] = [
    "bottom.0.weight",
    "bottom.0.bias",
    "top.0.weight",
    "top.1.bias",
];

fn keys_at(step: u64) -> Vec<u64> {
    (0..400u64)
        .map(|i| ((step * 7_919 + i * 104_729) % KEY_SPACE).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect()
}

fn dense_grads(step: u64) -> Vec<DenseValues> {
    DENSE_NAMES
        .iter()
        .map(|name| DenseValues {
            name: (*name).into(),
            shape: vec![3],
            values: vec![0.1 * (step % 5) as f32 - 0.2, 0.05, -0.03],
        })
        .collect()
}

/// A client that follows the shard list the test publishes.
fn following(client: PsClient, published: &Arc<RwLock<Vec<String>>>) -> PsClient {
    let published = published.clone();
    let source: ShardSource = Arc::new(move || {
        let addrs = published.read().map(|a| a.clone()).unwrap_or_default();
        Box::pin(async move { Ok(addrs) })
    });
    client.following(source)
}

/// Pushes batches one after another through `client`, and the same into `reference`:
/// `STEPS`, and on until `done` and `STEPS / 4` more; `halfway` fires after a third of
/// `STEPS`. Returns the client and the steps pushed.
async fn push_all(
    client: PsClient,
    reference: Arc<Table>,
    halfway: tokio::sync::oneshot::Sender<()>,
    progress: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
) -> (PsClient, u64) {
    let mut halfway = Some(halfway);
    let mut last = STEPS;
    let mut step = 0;
    while step < last {
        if !done.load(Ordering::Acquire) {
            last = last.max(step + STEPS / 4);
        }
        let keys = keys_at(step);
        let grads = grads_for(step, keys.len());
        // Every other step goes as a push of several tables (the table twice), with some
        // of the pushed rows read back in the same calls (by a call of their own after a
        // move): they must carry this push.
        if step % 2 == 0 {
            client.push("items", &keys, &grads).await.expect("push");
            reference.push(&keys, &grads, 1).expect("reference push");
        } else {
            let half = keys.len() / 2;
            let parts = [
                TableGrads {
                    table: "items",
                    keys: &keys[..half],
                    grads: &grads[..half * DIM],
                },
                TableGrads {
                    table: "items",
                    keys: &keys[half..],
                    grads: &grads[half * DIM..],
                },
            ];
            let read_back = &keys[..keys.len().min(8)];
            let read = [TableKeys {
                table: "items",
                keys: read_back,
            }];
            let (_, rows) = (client.push_tables_then_lookup(&parts, &read, step + 1))
                .await
                .expect("push tables");
            reference.push(&keys, &grads, 1).expect("reference push");
            let mut expected = vec![0.0; read_back.len() * DIM];
            reference
                .lookup(read_back, &mut expected)
                .expect("reference");
            assert_eq!(
                rows[0].rows, expected,
                "rows read after the push of step {step}"
            );
        }
        progress.store(step + 1, Ordering::Release);
        if step == STEPS / 3 {
            halfway.take().map(|h| h.send(()));
        }
        step += 1;
    }
    progress.store(u64::MAX, Ordering::Release);
    (client, last)
}

/// Pushes a dense gradient through `client` for each step the sparse pusher makes, and the
/// same into `reference`.
async fn push_all_dense(client: PsClient, reference: Arc<DenseStore>, progress: Arc<AtomicU64>) {
    for step in 0.. {
        while progress.load(Ordering::Acquire) < step {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if progress.load(Ordering::Acquire) == u64::MAX {
            return;
        }
        client
            .push_dense(dense_grads(step), step + 1)
            .await
            .expect("push dense");
        reference
            .push(&dense_grads(step))
            .expect("reference dense push");
    }
}

/// The dense tensors both sides start from.
fn initial_dense() -> Vec<DenseValues> {
    DENSE_NAMES
        .iter()
        .map(|name| DenseValues {
            name: (*name).into(),
            shape: vec![3],
            values: vec![0.5, -0.5, 0.25],
        })
        .collect()
}

fn reference_tables() -> (Arc<Table>, Arc<DenseStore>) {
    let options = TableOptions {
        shards: 1,
        seed: SEED,
        ..TableOptions::default()
    };
    let table = Table::new(&table_spec("items"), options).expect("table");
    let dense = DenseStore::new(&PsSettings::default().ps.dense_optimizer);
    dense.init(&initial_dense()).expect("reference dense init");
    (Arc::new(table), Arc::new(dense))
}

/// Every key the pusher touched in `steps`, each once.
fn touched_keys(steps: u64) -> Vec<u64> {
    let mut keys: Vec<u64> = (0..steps).flat_map(keys_at).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The reference's rows of `keys` in the same order as `got`'s.
fn assert_rows_equal(got: &StoredRows, reference: &Table) {
    let (keys, values) = reference.read_rows(&got.keys).expect("reference rows");
    let want: std::collections::HashMap<u64, &[f32]> = keys
        .iter()
        .copied()
        .zip(values.chunks_exact(reference.row_width()))
        .collect();
    assert_eq!(got.keys.len(), want.len(), "rows present");
    for (key, row) in got.rows() {
        assert_eq!(
            Some(&row),
            want.get(&key),
            "row {key}, weights and optimizer state"
        );
    }
}

async fn rows_per_shard(addrs: &[String]) -> Vec<u64> {
    let mut rows = Vec::new();
    for addr in addrs {
        let mut raw = raw_client(addr).await;
        let stats = raw
            .stats(StatsRequest {})
            .await
            .expect("stats")
            .into_inner();
        rows.push(stats.tables[0].rows);
    }
    rows
}

/// Starts `before` shards and `added` more, reshards from `from(shards)` to `to(shards)`
/// while pushing, and checks the outcome row for row.
async fn reshard_while_pushing(shard_count: usize, from: &[usize], to: &[usize]) {
    let nats = NatsServer::start().expect("nats-server");
    let mut shards = Vec::new();
    for _ in 0..shard_count {
        shards.push(start_shard(&nats, vec![table_spec("items")]).await);
    }
    let addrs = |picks: &[usize]| -> Vec<String> {
        picks.iter().map(|i| shards[*i].addr.clone()).collect()
    };
    let (from, to) = (addrs(from), addrs(to));
    let published = Arc::new(RwLock::new(from.clone()));
    let client = following(PsClient::connect(&from).await.expect("connect"), &published);
    let (reference, dense_reference) = reference_tables();
    client
        .init_dense(&initial_dense())
        .await
        .expect("init dense");

    let (halfway_tx, halfway) = tokio::sync::oneshot::channel();
    let progress = Arc::new(AtomicU64::new(0));
    let dense_pusher = tokio::spawn(push_all_dense(
        client.clone(),
        dense_reference.clone(),
        progress.clone(),
    ));
    let done = Arc::new(AtomicBool::new(false));
    let pusher = tokio::spawn(push_all(
        client,
        reference.clone(),
        halfway_tx,
        progress,
        done.clone(),
    ));
    halfway.await.expect("pusher reached a third");
    let report = reshard(&from, &to, || {
        let (published, to) = (published.clone(), to.clone());
        async move {
            // A slow switch: the pusher meets the fence for a while.
            tokio::time::sleep(Duration::from_millis(150)).await;
            *published.write().map_err(|e| e.to_string())? = to;
            Ok(())
        }
    })
    .await
    .expect("reshard");
    done.store(true, Ordering::Release);
    let (client, steps) = pusher.await.expect("pusher");
    dense_pusher.await.expect("dense pusher");
    assert!(report.rows_copied > 0 && report.rounds >= 2, "{report:?}");
    assert!(
        !client.take_move_waits().is_empty(),
        "the pusher met the fence"
    );
    assert_eq!(client.addrs(), to, "the client follows the published list");

    // Row for row, optimizer state included, against the table without resharding.
    let keys = touched_keys(steps);
    let got = client.read_rows("items", &keys).await.expect("read rows");
    assert_eq!(got.keys.len(), keys.len(), "no row lost");
    assert_rows_equal(&got, &reference);
    // Each row is held once, by the shard the new layout names.
    let held: u64 = rows_per_shard(&to).await.iter().sum();
    assert_eq!(held, keys.len() as u64, "no row held twice");
    for (index, addr) in to.iter().enumerate() {
        let on_shard = PsClient::connect(std::slice::from_ref(addr))
            .await
            .expect("connect");
        let mine: Vec<u64> = keys
            .iter()
            .copied()
            .filter(|k| layout::key_shard(*k, to.len() as u32) == index as u32)
            .collect();
        let rows = on_shard.read_rows("items", &mine).await.expect("read");
        assert_eq!(rows.keys.len(), mine.len(), "shard {index} holds its keys");
    }
    let names: Vec<String> = DENSE_NAMES.iter().map(|n| (*n).to_owned()).collect();
    let dense = client.pull_dense(&names).await.expect("pull dense");
    let (want, _) = dense_reference.pull(&names).expect("reference pull");
    assert_eq!(dense, want, "dense parameters, pushed once each");
    for shard in shards {
        shard.shutdown.trigger();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn growing_two_shards_to_four_while_pushing_loses_and_repeats_no_gradient() {
    reshard_while_pushing(4, &[0, 1], &[0, 1, 2, 3]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shrinking_three_shards_to_two_with_one_on_a_fresh_process_loses_nothing() {
    // Shard 1 goes to a fresh process (3), shard 2 leaves.
    reshard_while_pushing(4, &[0, 1, 2], &[0, 3]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_of_two_shards_restores_into_three() {
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut shards = Vec::new();
    for _ in 0..5 {
        shards.push(start_shard(&nats, vec![table_spec("items")]).await);
    }
    let (old, new) = (&shards[..2], &shards[2..]);
    let old_addrs: Vec<String> = old.iter().map(|s| s.addr.clone()).collect();
    let client = PsClient::connect(&old_addrs).await.expect("connect");
    let tensor = |name: &str| DenseTensor {
        name: name.into(),
        shape: vec![2],
        values: [0.5f32, -1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    };
    for step in 0..20 {
        push_batch(&client, step).await;
    }
    let mut manifests = Vec::new();
    for (i, shard) in old.iter().enumerate() {
        let mut raw = raw_client(&shard.addr).await;
        let name = DENSE_NAMES[i];
        raw.init_dense(primus_proto::v1::InitDenseRequest {
            tensors: vec![tensor(name)],
        })
        .await
        .expect("init dense");
        let uri = format!("file://{}/ckpt/ps-{i}", dir.path().display());
        let taken = raw
            .snapshot(SnapshotRequest {
                uri,
                base_manifest_uri: String::new(),
                in_background: false,
            })
            .await
            .expect("snapshot")
            .into_inner();
        manifests.push(taken.manifest_uri);
    }
    for (index, shard) in new.iter().enumerate() {
        let mut raw = raw_client(&shard.addr).await;
        let request = RestoreRequest {
            manifest_uri: manifests[0].clone(),
            more_manifest_uris: manifests[1..].to_vec(),
            layout: Some(WireLayout {
                shard_count: 3,
                index: Some(index as u32),
            }),
        };
        raw.restore(request).await.expect("restore into three");
    }
    let new_addrs: Vec<String> = new.iter().map(|s| s.addr.clone()).collect();
    let restored = PsClient::connect(&new_addrs).await.expect("connect");
    let keys: Vec<u64> = {
        let mut keys: Vec<u64> = (0..20).flat_map(|s| batch(s, 500)).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    };
    let want = client.read_rows("items", &keys).await.expect("rows before");
    let got = restored
        .read_rows("items", &keys)
        .await
        .expect("rows after");
    let sorted = |rows: &StoredRows| {
        let mut all: Vec<(u64, Vec<f32>)> = rows.rows().map(|(k, r)| (k, r.to_vec())).collect();
        all.sort_by_key(|(k, _)| *k);
        all
    };
    assert_eq!(sorted(&got), sorted(&want), "every row, on its new shard");
    assert_eq!(
        rows_per_shard(&new_addrs).await.iter().sum::<u64>(),
        keys.len() as u64,
        "each row once"
    );
    let names: Vec<String> = DENSE_NAMES[..2].iter().map(|n| (*n).to_owned()).collect();
    let dense = restored.pull_dense(&names).await.expect("dense restored");
    assert!(dense.iter().all(|t| t.values == [0.5, -1.0]), "{dense:?}");
    // One manifest of several without a layout is refused, naming the field.
    let mut raw = raw_client(&new[0].addr).await;
    let status = raw
        .restore(RestoreRequest {
            manifest_uri: manifests[0].clone(),
            more_manifest_uris: manifests[1..].to_vec(),
            layout: None,
        })
        .await
        .expect_err("no layout");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("layout"), "{}", status.message());
    for shard in shards {
        shard.shutdown.trigger();
    }
}
