//! Stream and mixed Jobs through the real services on a real NATS: every row published to
//! a JetStream subject trained once, joined features and actions, a killed data executor's
//! stream going on in its replacement, a stream Job rolled back to its checkpoint's stream
//! position, rebalanced stream loading, and batch-then-stream and mixture Jobs training
//! every batch and stream row.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, RecordBatch, UInt64Array};
use primus_harness::Sandbox;
use primus_harness::resources::{
    dataset, hourly, jetstream, job, log_join, parquet, small_wide_deep,
};
use primus_harness::rows::update_counts;
use primus_proto::v1::Role;
use primus_spec::Kind;
use primus_spec::job::{
    CheckpointSpec, DenseSpec, JobSpec, StreamLoading, TrainingMode, WorkerFailure,
};
use primus_spec::status::Phase;
use primus_testkit::service::signal;

use crate::common::{
    FILES_PER_HOUR, ROWS_PER_FILE, apply_online_job, checkpoint_where, data_executor, job_queue,
    publish_rows, start_master_with, topology, wait_for_samples_past, write_partitions,
};

/// An online job: a real data executor consumes the JetStream subject (rows published
/// before and while the job runs) and the real trainer trains on every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_online_job_trains_on_every_row_published_to_its_jetstream_subject() {
    let sandbox = Sandbox::start().await;
    let js = apply_online_job(&sandbox, "online", |_| {}).await;
    let master = start_master_with(&sandbox, &data_executor());
    sandbox.wait_for_samples("online", 500).await;
    for i in 10..16 {
        publish_rows(&js, "clicks.live", i * 50..(i + 1) * 50).await;
    }
    sandbox.wait_for_samples("online", 800).await;
    assert_eq!(
        sandbox.status("online").await.phase,
        Phase::Running,
        "a stream job runs on"
    );
    // The Metric resource shows the stream caught up: nothing pending, no lag.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let metric = sandbox.client().await.get(Kind::Metric, "online").await;
        let latest = |name: &str| {
            let spec: primus_spec::metric::MetricSpec =
                serde_json::from_str(&metric.as_ref().ok()?.spec_json).ok()?;
            let series = spec.series.into_iter().find(|s| s.name == name)?;
            series.points.last().map(|p| p.value)
        };
        let caught_up = (
            latest("stream_pending_messages.clicks"),
            latest("stream_lag_seconds.clicks"),
        ) == (Some(0.0), Some(0.0));
        if caught_up {
            let labels = metric.map(|m| m.labels).unwrap_or_default();
            assert_eq!(
                labels.get("team").map(String::as_str),
                Some("ads"),
                "the Job's"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "stream gauges: {metric:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    sandbox.delete_job("online").await;
    master.stop();
}

/// Publishes feature rows with c1 = request id = each of `ids` on `log.features`, and a
/// click (label 1) for each odd id on `log.actions`.
async fn publish_features_and_clicks(
    js: &primus_bus::jetstream::JetStream,
    ids: std::ops::Range<u64>,
) {
    let rids: ArrayRef = Arc::new(UInt64Array::from_iter_values(ids.clone()));
    let rows = RecordBatch::try_from_iter([("rid", rids.clone()), ("c1", rids)]).expect("rows");
    let odd: Vec<u64> = ids.filter(|i| i % 2 == 1).collect();
    let labels: ArrayRef = Arc::new(UInt64Array::from(vec![1; odd.len()]));
    let odd: ArrayRef = Arc::new(UInt64Array::from(odd));
    let clicks = RecordBatch::try_from_iter([("rid", odd), ("label", labels)]).expect("rows");
    for (subject, rows) in [("log.features", rows), ("log.actions", clicks)] {
        let message = primus_proto::v1::SampleRows {
            arrow_ipc: primus_batch::ipc::encode_rows(&rows).expect("encode"),
        };
        js.publish(subject.into(), &message).await.expect("publish");
    }
}

/// An online job over a join source: features and clicks (clicks of the first rows before
/// their features, of the later ones after) join in the real data executor; every feature
/// row is trained once, clicked ones as positives and the rest as negatives after the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_online_job_trains_on_joined_features_and_actions() {
    let sandbox = Sandbox::start().await;
    let js = sandbox.jetstream().await;
    js.ensure_stream("LOG", vec!["log.>".into()])
        .await
        .expect("stream");
    for i in 0..6 {
        publish_features_and_clicks(&js, i * 50..(i + 1) * 50).await;
    }
    let joined = dataset("joined-data").stream(
        "live",
        hourly("2026-11-01T00", None),
        vec![log_join("joined")],
    );
    let online = job(
        "joined",
        "joined-data",
        TrainingMode::Stream,
        small_wide_deep(),
    )
    .batch_size(64);
    sandbox.apply([joined.build(), online.build()]).await;
    let master = start_master_with(&sandbox, &data_executor());
    sandbox.wait_for_samples("joined", 300).await;
    let names = [
        "join_joined_rows.joined",
        "join_negative_rows.joined",
        "join_dropped_actions.joined",
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let latest = sandbox.latest_metrics("joined", &names).await;
        if latest == Some(vec![150.0, 150.0, 0.0]) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "join gauges: {latest:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(sandbox.status("joined").await.phase, Phase::Running);
    sandbox.delete_job("joined").await;
    master.stop();
}

/// Killing an online job's data executor: the backend restarts it, and the stream binding
/// goes to the new process at the position the dead one last reported. The first 500 rows
/// were all trained and their position reported before the kill, so the job ends at
/// exactly every published row: none lost, none trained twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_data_executors_stream_goes_on_in_its_replacement_without_loss_or_repeats() {
    let sandbox = Sandbox::start().await;
    let js = apply_online_job(&sandbox, "online-kill", |_| {}).await;
    let master = start_master_with(&sandbox, &data_executor());
    sandbox.wait_for_samples("online-kill", 500).await;
    let queue = job_queue(&sandbox, "online-kill").await;
    while queue.offsets().await.expect("offsets").get("clicks/stream") != Some(&500) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = sandbox.pids("online-kill")["data_executor-0"];
    signal(pid, "KILL").expect("kill executor");
    // Published while no executor holds the binding: delivered to the replacement.
    for i in 10..16 {
        publish_rows(&js, "clicks.live", i * 50..(i + 1) * 50).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while sandbox.pids("online-kill").get("data_executor-0") == Some(&pid) {
        assert!(tokio::time::Instant::now() < deadline, "not restarted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 16..20 {
        publish_rows(&js, "clicks.live", i * 50..(i + 1) * 50).await;
    }
    sandbox.wait_for_samples("online-kill", 1000).await;
    // Nothing more arrives later (a redelivered duplicate would).
    sandbox.assert_samples_stay("online-kill", 1000).await;
    sandbox.delete_job("online-kill").await;
    master.stop();
}

/// A stream Job's data executor killed while rows still arrive: its replacement takes the
/// binding at the position of the rows its trainer consumed or received, and every
/// published row is trained once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_executor_killed_mid_stream_loses_and_repeats_no_row() {
    let sandbox = Sandbox::start().await;
    let publishing = Publishing {
        rows: 3000,
        per_message: 50,
        pause: Duration::from_millis(30),
    };
    let (job, master) =
        train_through_a_kill_mid_stream(&sandbox, "data_executor-0", publishing, |_| {}).await;
    assert_each_row_trained_once(&sandbox, master.addr(), job, 3000).await;
    sandbox.delete_job(job).await;
    master.stop();
}

/// A stream Job's trainer killed while it trains a backlog: the minibatches it was served
/// and had not confirmed are served again, and the PS shards apply the one it had pushed
/// already only once, so every published row is trained into the model once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_killed_mid_stream_trains_every_row_into_the_model_once() {
    let sandbox = Sandbox::start().await;
    // Published at once, and a wide dense network: the trainer is the bottleneck, always
    // busy, so the kill falls between a push and its confirmation (which waits for the
    // next push) however fast the machine is.
    let publishing = Publishing {
        rows: 120_000,
        per_message: 2000,
        pause: Duration::ZERO,
    };
    let wide =
        |spec: &mut JobSpec| spec.model.dense = DenseSpec::new(Vec::new(), vec![512, 512, 1]);
    let (job, master) =
        train_through_a_kill_mid_stream(&sandbox, "trainer-0", publishing, wide).await;
    assert_each_row_trained_once(&sandbox, master.addr(), job, publishing.rows).await;
    sandbox.delete_job(job).await;
    master.stop();
}

/// How the rows of [`train_through_a_kill_mid_stream`] are published.
#[derive(Clone, Copy)]
struct Publishing {
    rows: u64,
    per_message: u64,
    pause: Duration,
}

/// Runs a stream Job over rows 0..`rows` (`c1` = the row's id), the first 500 published
/// before it starts and the rest while it trains, as `publishing` says; SIGKILLs `killed`
/// a third of the way in, and waits until exactly every row is counted trained. Returns
/// the Job's name and its master.
async fn train_through_a_kill_mid_stream(
    sandbox: &Sandbox,
    killed: &str,
    publishing: Publishing,
    change: fn(&mut JobSpec),
) -> (&'static str, primus_harness::MasterProcess) {
    let Publishing {
        rows,
        per_message,
        pause,
    } = publishing;
    let job = "online-mid-kill";
    let js = apply_online_job(sandbox, job, change).await;
    let master = start_master_with(sandbox, &data_executor());
    let publisher = {
        let js = js.clone();
        tokio::spawn(async move {
            for first in (500..rows).step_by(per_message as usize) {
                publish_rows(&js, "clicks.live", first..rows.min(first + per_message)).await;
                tokio::time::sleep(pause).await;
            }
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while sandbox.status(job).await.progress.map_or(0, |p| p.samples) < rows / 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(sandbox.pids(job)[killed], "KILL").expect("kill");
    let at = sandbox.status(job).await.progress.map_or(0, |p| p.samples);
    eprintln!("{killed} killed at {at} of {rows} samples");
    publisher.await.expect("publisher");
    sandbox.wait_for_samples(job, rows).await;
    sandbox.assert_samples_stay(job, rows).await;
    (job, master)
}

/// Each row 0..`rows` of `job` was trained into the model once: the embedding of its
/// `c1` (the row's id) was updated once in every table it is read from.
async fn assert_each_row_trained_once(sandbox: &Sandbox, master: &str, job: &str, rows: u64) {
    let ids_by_key: HashMap<u64, u64> = {
        let seed = primus_batch::hash::feature_seed("c1");
        (0..rows)
            .map(|id| (primus_batch::hash::int_key(seed, id), id))
            .collect()
    };
    let mut trained: BTreeMap<String, BTreeMap<u64, u64>> = BTreeMap::new();
    for shard in primus_proto::role_addrs(&topology(master, job).await, Role::Ps) {
        for ((table, key), updates) in update_counts(&shard).await {
            if let Some(id) = ids_by_key.get(&key) {
                trained.entry(table).or_default().insert(*id, updates);
            }
        }
    }
    assert!(!trained.is_empty(), "no table holds the rows' ids");
    for (table, ids) in &trained {
        let wrong: Vec<(&u64, &u64)> = ids.iter().filter(|(_, n)| **n != 1).collect();
        assert!(
            ids.len() as u64 == rows && wrong.is_empty(),
            "table {table}: {} of {rows} ids trained, not once: {:?}\n{}",
            ids.len(),
            &wrong[..wrong.len().min(20)],
            sandbox.logs(job)
        );
    }
}

/// `on_worker_failure: rollback` on a stream Job: its data executor killed after rows were
/// served past the latest checkpoint returns the Job to that checkpoint, whose stream
/// position the restarted executor reads from. Every published row is trained into the
/// final model exactly once: by count, and by the update count of each row's own
/// embedding (`c1` is the row's id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_job_rolled_back_to_its_checkpoint_trains_every_row_once() {
    let sandbox = Sandbox::start().await;
    let job = "online-rollback";
    let checkpoints = sandbox.dir().join("checkpoints").join(job);
    let js = apply_online_job(&sandbox, job, |spec| {
        let mut checkpoint = CheckpointSpec::new(&checkpoints.display().to_string(), 1);
        checkpoint.on_worker_failure = WorkerFailure::Rollback;
        spec.checkpoint = Some(checkpoint);
    })
    .await;
    let master = start_master_with(&sandbox, &data_executor());
    let queue = job_queue(&sandbox, job).await;
    let record = checkpoint_where(&sandbox, &queue, job, |r| r.samples() > 0).await;
    for i in 10..30 {
        publish_rows(&js, "clicks.live", i * 50..(i + 1) * 50).await;
    }
    wait_for_samples_past(&sandbox, job, record.samples()).await;
    signal(sandbox.pids(job)["data_executor-0"], "KILL").expect("kill executor");
    for i in 30..40 {
        publish_rows(&js, "clicks.live", i * 50..(i + 1) * 50).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !sandbox
        .status(job)
        .await
        .conditions
        .iter()
        .any(|c| c.kind == "RolledBack")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no rollback: {}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sandbox.wait_for_samples(job, 2000).await;
    sandbox.assert_samples_stay(job, 2000).await;
    assert_each_row_trained_once(&sandbox, master.addr(), job, 2000).await;
    sandbox.delete_job(job).await;
    master.stop();
}

/// `rebalance` stream loading through the services: two executors, a hot partition of
/// many small messages and a cold one. Whoever takes a message (its holder or a helper),
/// every row is trained exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalancing_online_job_trains_every_row_of_a_hot_partition_once() {
    let sandbox = Sandbox::start().await;
    let js = sandbox.jetstream().await;
    js.ensure_stream("CLICKS", vec!["clicks.>".into()])
        .await
        .expect("stream");
    for i in 0..200 {
        publish_rows(&js, "clicks.hot", i * 5..(i + 1) * 5).await;
    }
    publish_rows(&js, "clicks.cold", 0..50).await;
    let skewed = dataset("skewed").stream(
        "live",
        hourly("2026-11-01T00", None),
        vec![
            jetstream("hot", "CLICKS", "clicks.hot"),
            jetstream("cold", "CLICKS", "clicks.cold"),
        ],
    );
    let rebalancing = job(
        "rebalancing",
        "skewed",
        TrainingMode::Stream,
        small_wide_deep(),
    )
    .replicas(2, 1, 1)
    .batch_size(64)
    .with(|spec| spec.training.stream_loading = StreamLoading::Rebalance);
    sandbox.apply([skewed.build(), rebalancing.build()]).await;
    let master = start_master_with(&sandbox, &data_executor());
    sandbox.wait_for_samples("rebalancing", 1050).await;
    for i in 200..300 {
        publish_rows(&js, "clicks.hot", i * 5..(i + 1) * 5).await;
    }
    sandbox.wait_for_samples("rebalancing", 1550).await;
    // Nothing more arrives later (a message taken twice would).
    sandbox.assert_samples_stay("rebalancing", 1550).await;
    sandbox.delete_job("rebalancing").await;
    master.stop();
}

/// `batch-then-stream` and `mixture` Jobs over one Parquet source and one JetStream
/// source: every batch row and every stream row is trained once, and the Job keeps
/// following the stream after the batch data is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_then_stream_and_mixture_jobs_train_every_batch_and_stream_row() {
    let sandbox = Sandbox::start().await;
    let data = sandbox.dir().join("data");
    write_partitions(&data, "2026-11-01", 1).await;
    let batch_rows = 2 * FILES_PER_HOUR * ROWS_PER_FILE;
    let js = sandbox.jetstream().await;
    let master = start_master_with(&sandbox, &data_executor());
    for (mode, training) in [
        ("batch-then-stream", TrainingMode::BatchThenStream),
        ("mixture", TrainingMode::Mixture),
    ] {
        let stream = mode.replace('-', "_").to_uppercase();
        js.ensure_stream(&stream, vec![format!("{mode}.>")])
            .await
            .expect("stream");
        publish_rows(&js, &format!("{mode}.live"), 10_000..10_300).await;
        let data_name = format!("{mode}-data");
        let both = dataset(&data_name)
            .simultaneous()
            .stream(
                "history",
                hourly("2026-11-01T00", Some("2026-11-01T02")),
                vec![parquet("clicks", data.display())],
            )
            .stream(
                "live",
                hourly("2026-11-01T02", None),
                vec![jetstream("live-clicks", &stream, &format!("{mode}.>"))],
            );
        let mixed = job(mode, &data_name, training, small_wide_deep()).batch_size(64);
        sandbox.apply([both.build(), mixed.build()]).await;
        sandbox.wait_for_samples(mode, batch_rows + 300).await;
        publish_rows(&js, &format!("{mode}.live"), 10_300..10_400).await;
        sandbox.wait_for_samples(mode, batch_rows + 400).await;
        assert_eq!(sandbox.status(mode).await.phase, Phase::Running, "{mode}");
        sandbox.delete_job(mode).await;
    }
    master.stop();
}
