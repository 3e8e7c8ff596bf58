//! A delta export never sees a restore half done: while a shard's rows are replaced, an
//! export waits, and answers with every row before or every row after. An export of a
//! table emptied and not yet refilled would give serving a watermark past the rows the
//! refill brings back with their older versions.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use primus_config::StorageSettings;
use primus_proto::v1::{ExportDeltaRequest, RestoreRequest, SnapshotRequest};
use primus_ps_client::PsClient;
use primus_testkit::NatsServer;

use super::{DIM, grads_for, raw_client, start_shard_with, table_spec};

/// Distinct keys the shard holds: enough that a restore takes long enough for exports to
/// meet it.
const ROWS: u64 = 60_000;

#[tokio::test(flavor = "multi_thread")]
async fn every_export_during_restores_holds_every_row() {
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let uri = format!("file://{}/ckpt", dir.path().display());
    let shard =
        start_shard_with(&nats, vec![table_spec("items")], StorageSettings::default()).await;
    let client = PsClient::connect(std::slice::from_ref(&shard.addr))
        .await
        .expect("connect");
    for (step, chunk) in (0..ROWS).collect::<Vec<u64>>().chunks(10_000).enumerate() {
        let keys: Vec<u64> = chunk
            .iter()
            .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        client
            .push("items", &keys, &grads_for(step as u64, keys.len()))
            .await
            .expect("push");
    }
    let mut raw = raw_client(&shard.addr).await;
    let manifest_uri = raw
        .snapshot(SnapshotRequest {
            uri,
            ..SnapshotRequest::default()
        })
        .await
        .expect("snapshot")
        .into_inner()
        .manifest_uri;

    let restoring = Arc::new(AtomicBool::new(true));
    let exports = {
        let (restoring, mut raw) = (restoring.clone(), raw_client(&shard.addr).await);
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while restoring.load(Ordering::Acquire) {
                let delta = raw
                    .export_delta(ExportDeltaRequest::default())
                    .await
                    .expect("export")
                    .into_inner();
                let bytes: usize = delta.tables.iter().map(|t| t.rows.len()).sum();
                seen.push((bytes / (4 * DIM)) as u64);
            }
            seen
        })
    };
    for _ in 0..8 {
        raw.restore(RestoreRequest {
            manifest_uri: manifest_uri.clone(),
            ..RestoreRequest::default()
        })
        .await
        .expect("restore");
    }
    restoring.store(false, Ordering::Release);
    let seen = exports.await.expect("exports");
    assert!(
        seen.len() > 1,
        "{} exports ran beside the restores",
        seen.len()
    );
    let partial: Vec<&u64> = seen.iter().filter(|rows| **rows != ROWS).collect();
    assert!(
        partial.is_empty(),
        "{} of {} exports saw a restore half done (rows: {partial:?})",
        partial.len(),
        seen.len()
    );
}
