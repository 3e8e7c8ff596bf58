//! What the master's end-to-end tests share: Parquet partitions of numbered rows, the
//! master's settings for a sandbox, the small Jobs over those rows, JetStream rows, the
//! Criteo-like DLRM Job, and waiting for checkpoints.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, RecordBatch, UInt64Array};
use primus_bus::jetstream::JetStream;
use primus_config::{MasterSettings, StorageSettings};
use primus_data_tasks::plan::{ListingCache, StoreCatalog};
use primus_data_tasks::queue::TaskQueue;
use primus_harness::resources::{
    JobBuilder, dataset, hourly, jetstream, job, parquet, small_wide_deep,
};
use primus_harness::{MasterProcess, Sandbox, binary};
use primus_master::checkpoint::{self, CheckpointRecord};
use primus_spec::Resource;
use primus_spec::dataset::DatasetSpec;
use primus_spec::job::{ModelSpec, TrainingMode};
use primus_spec::status::{Phase, Progress, Status};

pub(crate) use primus_harness::partitions::{FILES_PER_HOUR, ROWS_PER_FILE, write_partitions};

/// Plans every window of `dataset` into `queue` as tasks of about 1 MiB.
pub(crate) async fn plan_dataset(queue: &TaskQueue, dataset: &DatasetSpec, job: &str) {
    let cache = Arc::new(ListingCache::new(
        Arc::new(StoreCatalog::new(StorageSettings::default())),
        8,
    ));
    let settings = primus_config::PlannerSettings {
        target_task_bytes: 1 << 20,
        parallelism: 4,
        poll_interval_ms: 100,
        ..primus_config::PlannerSettings::default()
    };
    for plan in primus_data_tasks::planning::stream_plans(dataset).expect("plans") {
        primus_data_tasks::planning::plan_stream(
            queue.clone(),
            cache.clone(),
            Arc::from(job),
            Arc::new(plan),
            settings.clone(),
        )
        .await
        .expect("planned");
    }
}

/// The task queue `job` of the Redis at `url`.
pub(crate) async fn queue_at(url: &str, job: &str) -> TaskQueue {
    let client = redis::Client::open(url).expect("redis url");
    TaskQueue::new(
        client.get_connection_manager().await.expect("redis"),
        "primus",
        job,
    )
}

/// A master whose data executors are `data_executor`: tasks of about 1 MiB, quick
/// heartbeats (an executor silent for 2 s is lost), five attempts per task.
pub(crate) fn master_settings(sandbox: &Sandbox, data_executor: &Path) -> MasterSettings {
    assert!(
        data_executor.is_file(),
        "{} is not built",
        data_executor.display()
    );
    let mut settings = sandbox.recovering_master_settings();
    settings
        .local
        .binaries
        .insert("data_executor".into(), data_executor.to_path_buf());
    for needed in ["primus-ps", "primus-trainer"] {
        binary(needed);
    }
    settings
}

/// The `task_reader` example: a data executor that records the ids it reads.
pub(crate) fn task_reader() -> PathBuf {
    binary("examples/task_reader")
}

pub(crate) fn data_executor() -> PathBuf {
    binary("primus-data-executor")
}

/// Starts the master with `settings`; the task reader reads a row every 40 ms.
pub(crate) fn start(sandbox: &Sandbox, settings: &MasterSettings) -> MasterProcess {
    MasterProcess::start(sandbox, settings, &[("PRIMUS_TASK_READER_DELAY_MS", "40")])
}

/// A master whose data executors are the task reader.
pub(crate) fn start_master(sandbox: &Sandbox) -> MasterProcess {
    start(sandbox, &master_settings(sandbox, &task_reader()))
}

/// A master whose data executors are `data_executor`.
pub(crate) fn start_master_with(sandbox: &Sandbox, data_executor: &Path) -> MasterProcess {
    start(sandbox, &master_settings(sandbox, data_executor))
}

/// Dataset `<job>-data` (hourly windows from `start` up to `end` of the Parquet files
/// under `uri`) and batch Job `job` training the smallest model on it with `executors`
/// data executors.
pub(crate) fn id_job(
    job: &str,
    uri: &Path,
    (start, end): (&str, &str),
    executors: u32,
) -> [Resource; 2] {
    id_job_with(job, uri, (start, end), executors, small_wide_deep())
}

/// [`id_job`] training `model`.
pub(crate) fn id_job_with(
    name: &str,
    uri: &Path,
    (start, end): (&str, &str),
    executors: u32,
    model: ModelSpec,
) -> [Resource; 2] {
    let data = format!("{name}-data");
    [
        dataset(&data)
            .stream(
                "logs",
                hourly(start, Some(end)),
                vec![parquet("clicks", uri.display())],
            )
            .build(),
        job(name, &data, TrainingMode::Batch, model)
            .replicas(executors, 1, 1)
            .build(),
    ]
}

/// Publishes rows with c1 ids `ids` (label: odd ids) on `subject` as `SampleRows`.
pub(crate) async fn publish_rows(js: &JetStream, subject: &str, ids: std::ops::Range<u64>) {
    let labels: ArrayRef = Arc::new(UInt64Array::from_iter_values(ids.clone().map(|i| i % 2)));
    let values: ArrayRef = Arc::new(UInt64Array::from_iter_values(ids));
    let rows = RecordBatch::try_from_iter([("label", labels), ("c1", values)]).expect("rows");
    let message = primus_proto::v1::SampleRows {
        arrow_ipc: primus_batch::ipc::encode_rows(&rows).expect("encode"),
    };
    js.publish(subject.into(), &message).await.expect("publish");
}

/// Publishes rows 0..500 on `clicks.live` (stream CLICKS) and applies a stream-mode
/// Job `job` over them (Dataset `live-data`, the smallest model, batches of 64, one of
/// each executor) after `change`. Returns the JetStream context for later rows.
pub(crate) async fn apply_online_job(
    sandbox: &Sandbox,
    name: &str,
    change: impl FnOnce(&mut primus_spec::job::JobSpec),
) -> JetStream {
    let js = sandbox.jetstream().await;
    js.ensure_stream("CLICKS", vec!["clicks.>".into()])
        .await
        .expect("stream");
    for i in 0..10 {
        publish_rows(&js, "clicks.live", i * 50..(i + 1) * 50).await;
    }
    let live = dataset("live-data").stream(
        "live",
        hourly("2026-11-01T00", None),
        vec![jetstream("clicks", "CLICKS", "clicks.>")],
    );
    sandbox
        .apply([live.build(), online_job(name, change).build()])
        .await;
    js
}

/// The stream Job of [`apply_online_job`], changed by `change` (to apply again).
pub(crate) fn online_job(
    name: &str,
    change: impl FnOnce(&mut primus_spec::job::JobSpec),
) -> JobBuilder {
    job(name, "live-data", TrainingMode::Stream, small_wide_deep())
        .label("team", "ads")
        .batch_size(64)
        .with(change)
}

pub(crate) use primus_harness::criteo::{DLRM_ROWS, apply_criteo_dataset, dlrm_job};
pub(crate) use primus_harness::topology;

/// Applies a small DLRM Job on Dataset `criteo` with `trainers` trainers and waits for it
/// to succeed: every row trained on once.
pub(crate) async fn train_dlrm(sandbox: &Sandbox, job: &str, trainers: u32) -> Status {
    sandbox
        .apply([dlrm_job(sandbox, job, trainers, 3600).build()])
        .await;
    let status = sandbox
        .wait_for_phase(job, Phase::Succeeded, Duration::from_secs(600))
        .await;
    let progress = status.progress.clone().expect("trainer progress");
    assert_eq!(progress.samples, DLRM_ROWS, "{job}: {progress:?}");
    status
}

/// The task queue of `job` in the sandbox's Redis.
pub(crate) async fn job_queue(sandbox: &Sandbox, job: &str) -> TaskQueue {
    queue_at(&sandbox.redis.url(), job).await
}

/// Waits until the Job's trainers reported more than `samples` samples.
pub(crate) async fn wait_for_samples_past(sandbox: &Sandbox, job: &str, samples: u64) {
    loop {
        let status = sandbox.status(job).await;
        let reported = status.progress.map_or(0, |p| p.samples);
        assert!(!status.phase.is_terminal(), "{job} ended early");
        if reported > samples {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `job`'s status every 100 ms until `found` finds something in it; fails naming
/// `what`, with the status and the executors' logs, when `within` passes first.
pub(crate) async fn wait_for_status<T>(
    sandbox: &Sandbox,
    job: &str,
    within: Duration,
    what: &str,
    found: impl Fn(&Status) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let status = sandbox.status(job).await;
        if let Some(found) = found(&status) {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} not within {within:?}: {status:?}\n{}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for a committed checkpoint of a running job that `wanted` accepts.
pub(crate) async fn checkpoint_where(
    sandbox: &Sandbox,
    queue: &TaskQueue,
    job: &str,
    wanted: impl Fn(&CheckpointRecord) -> bool,
) -> CheckpointRecord {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(record) = checkpoint::latest(queue).await.expect("record")
            && wanted(&record)
        {
            return record;
        }
        let status = sandbox.status(job).await;
        assert!(
            !status.phase.is_terminal() && tokio::time::Instant::now() < deadline,
            "no checkpoint committed: {status:?}\n{}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the applied `job` to the end under a master that starts a window's tasks only
/// after the previous window's (so the last window is trained last), checks that it
/// trained `samples` samples, and returns its reported AUC.
pub(crate) async fn train_in_window_order(sandbox: &Sandbox, job: &str, samples: u64) -> f64 {
    (train_in_window_order_to_the_end(sandbox, job, samples)
        .await
        .auc)
        .expect("an AUC")
}

/// [`train_in_window_order`]'s run; the Job's progress at its end.
pub(crate) async fn train_in_window_order_to_the_end(
    sandbox: &Sandbox,
    job: &str,
    samples: u64,
) -> Progress {
    let mut settings = master_settings(sandbox, &data_executor());
    settings.master.tasks.max_lead_hours = 1;
    let master = start(sandbox, &settings);
    let status = sandbox
        .wait_for_phase(job, Phase::Succeeded, Duration::from_secs(600))
        .await;
    let progress = status.progress.expect("trainer progress");
    assert_eq!(progress.samples, samples, "{progress:?}");
    master.stop();
    progress
}
