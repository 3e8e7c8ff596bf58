//! `primus replay` against a real NATS server: every row arrives, in time order, and with
//! `--actions-subject` as a joiner's two logs.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array, ArrayRef, RecordBatch, UInt64Array};
use primus_bus::Bus;
use primus_config::NatsSettings;
use primus_proto::v1::SampleRows;
use primus_testkit::NatsServer;

fn primus() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_primus"))
}

/// Writes rows with ids `ids` (column `id`; `label` 1 for every third id) to
/// `<dir>/<partition>/part-00000.parquet`.
async fn write_rows(dir: &Path, partition: &str, ids: std::ops::Range<u64>) {
    let location =
        primus_storage::open(dir.to_str().expect("utf-8"), &Default::default()).expect("location");
    let labels: ArrayRef = Arc::new(UInt64Array::from_iter_values(
        ids.clone().map(|id| u64::from(id % 3 == 0)),
    ));
    let column: ArrayRef = Arc::new(UInt64Array::from_iter_values(ids));
    let batch = RecordBatch::try_from_iter([("id", column), ("label", labels)]).expect("batch");
    let path = location.path(&format!("{partition}/part-00000.parquet"));
    primus_storage::parquet::write(&location, &path, batch.schema(), [batch], None)
        .await
        .expect("write");
}

/// Runs `primus replay ARGS --nats-url NATS --from FROM`.
fn replay(nats: &NatsServer, from: &Path, args: &[&str]) -> Output {
    Command::new(primus())
        .arg("replay")
        .args(args)
        .args(["--nats-url", &nats.url(), "--from"])
        .arg(from)
        .output()
        .expect("run primus")
}

/// The rows of every message published on `subject` of `stream`, in order.
async fn published(nats: &NatsServer, stream: &str, subject: &str) -> Vec<RecordBatch> {
    let settings = NatsSettings {
        url: nats.url(),
        ..Default::default()
    };
    let js = Bus::connect(&settings).await.expect("connect").jetstream();
    let durable = format!("check-{}", subject.replace('.', "-"));
    let consumer = js
        .durable_consumer::<SampleRows>(
            stream,
            &durable,
            Some(subject.into()),
            Duration::from_secs(5),
        )
        .await
        .expect("consumer");
    let fetched = consumer
        .fetch(100, Duration::from_secs(1))
        .await
        .expect("fetch");
    fetched
        .deliveries
        .iter()
        .map(|d| primus_batch::ipc::decode_rows(&d.received.message.arrow_ipc).expect("rows"))
        .collect()
}

fn u64s(rows: &RecordBatch, column: &str) -> Vec<u64> {
    let values = rows.column_by_name(column).expect(column);
    let values = arrow_cast::cast(values, &arrow_schema::DataType::UInt64).expect("u64");
    let values = values
        .as_any()
        .downcast_ref::<UInt64Array>()
        .expect("u64")
        .clone();
    values.values().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_publishes_every_row_in_time_order() {
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // Written out of order: replay goes by partition path, which is time order.
    write_rows(&data, "date=2026-11-01/hour=01", 25..50).await;
    write_rows(&data, "date=2026-11-01/hour=00", 0..25).await;
    let args = ["--stream", "REPLAY", "--subject", "replay.clicks"];
    let run = replay(
        &nats,
        &data,
        &[&args[..], &["--rows-per-message", "7"]].concat(),
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{run:?}");
    assert!(
        stdout.contains("published 50 rows in 8 messages from 2 files to replay.clicks"),
        "{stdout}"
    );

    let mut ids = Vec::new();
    for rows in published(&nats, "REPLAY", "replay.clicks").await {
        assert!(rows.num_rows() <= 7);
        ids.extend(u64s(&rows, "id"));
    }
    assert_eq!(ids, (0..50).collect::<Vec<_>>());

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("dir");
    let run = replay(&nats, &empty, &args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no .parquet file"), "{stderr}");
}

/// `--actions-subject` splits the rows into a joiner's two logs: every row's features with
/// a request id, and an action (request id, label) for every positive row only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_publishes_a_joiners_features_and_actions_logs() {
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    write_rows(&data, "date=2026-11-01/hour=00", 0..30).await;
    let run = replay(
        &nats,
        &data,
        &[
            "--stream",
            "LOG",
            "--subject",
            "log.features",
            "--actions-subject",
            "log.actions",
            "--action-delay-ms",
            "100",
            "--rows-per-message",
            "8",
        ],
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{run:?}");
    assert!(
        stdout.contains("published 4 action messages (the positive rows) to log.actions"),
        "{stdout}"
    );

    let mut by_request = std::collections::HashMap::new();
    for rows in published(&nats, "LOG", "log.features").await {
        assert!(
            rows.column_by_name("label").is_none(),
            "features carry no label"
        );
        by_request.extend(u64s(&rows, "request_id").into_iter().zip(u64s(&rows, "id")));
    }
    assert_eq!(by_request.len(), 30, "one request id per row");
    let mut clicked = Vec::new();
    for rows in published(&nats, "LOG", "log.actions").await {
        let requests = u64s(&rows, "request_id");
        assert_eq!(u64s(&rows, "label"), vec![1; requests.len()]);
        clicked.extend(requests.iter().map(|r| by_request[r]));
    }
    assert_eq!(clicked, (0..30).step_by(3).collect::<Vec<_>>());
}
