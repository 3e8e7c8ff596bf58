//! A flash snapshot (`in_background`): the answer comes once the rows are copied, pushes go
//! on while it is written, and what AwaitSnapshot names restores the rows of the moment of
//! the copy, not those pushed after.

use primus_config::StorageSettings;
use primus_proto::v1::{AwaitSnapshotRequest, RestoreRequest, SnapshotRequest};
use primus_ps_client::PsClient;
use primus_testkit::NatsServer;
use tonic::Code;

use super::{push_batch, raw_client, start_shard_with, table_spec};

#[tokio::test(flavor = "multi_thread")]
async fn a_background_snapshot_holds_the_rows_of_its_copy_while_pushes_go_on() {
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let uri = format!("file://{}/flash", dir.path().display());
    let storage = StorageSettings::default();
    let original = start_shard_with(&nats, vec![table_spec("items")], storage.clone()).await;
    let client = PsClient::connect(std::slice::from_ref(&original.addr))
        .await
        .expect("connect");
    let mut raw = raw_client(&original.addr).await;
    let mut keys = Vec::new();
    for step in 0..5 {
        keys.extend(push_batch(&client, step).await);
    }
    let (at_copy, _) = client.lookup("items", &keys).await.expect("lookup");
    let copied = raw
        .snapshot(SnapshotRequest {
            uri: uri.clone(),
            base_manifest_uri: String::new(),
            in_background: true,
        })
        .await
        .expect("snapshot")
        .into_inner();
    assert!(
        copied.manifest_uri.is_empty(),
        "answered before it is written"
    );
    assert!(copied.rows > 0);
    for step in 0..5 {
        push_batch(&client, step).await;
    }
    let (after, _) = client.lookup("items", &keys).await.expect("lookup");
    assert_ne!(after, at_copy, "the pushes changed the rows");

    let written = raw
        .await_snapshot(AwaitSnapshotRequest { uri: uri.clone() })
        .await
        .expect("written")
        .into_inner();
    assert!(
        written.manifest_uri.ends_with("manifest.json"),
        "{written:?}"
    );
    assert_eq!(
        (written.version, written.rows),
        (copied.version, copied.rows)
    );
    let again = raw
        .await_snapshot(AwaitSnapshotRequest { uri })
        .await
        .expect_err("awaited once");
    assert_eq!(again.code(), Code::NotFound, "{again:?}");

    let copy = start_shard_with(&nats, vec![table_spec("items")], storage).await;
    raw_client(&copy.addr)
        .await
        .restore(RestoreRequest {
            manifest_uri: written.manifest_uri,
            ..RestoreRequest::default()
        })
        .await
        .expect("restore");
    let restored = PsClient::connect(std::slice::from_ref(&copy.addr))
        .await
        .expect("connect");
    let (got, _) = restored.lookup("items", &keys).await.expect("lookup");
    assert_eq!(got, at_copy, "the rows of the moment of the copy");
    original.shutdown.trigger();
    copy.shutdown.trigger();
}
