//! The planner against a real Redis and a real S3 store that are away: it waits each out
//! and plans every window once it is back, and gives up on a store away for too long.

use std::sync::Arc;
use std::time::Duration;

use primus_config::{PlannerSettings, StorageSettings};
use primus_data_tasks::plan::{ListingCache, StoreCatalog};
use primus_data_tasks::planning::{
    PlanningError, SourceError, check_sources, plan_stream, stream_plans,
};
use primus_data_tasks::queue::TaskQueue;
use primus_harness::partitions::write_partitions;
use primus_harness::resources::{dataset, hourly, parquet};
use primus_harness::stores::{copy_files, s3_settings};
use primus_spec::dataset::DatasetSpec;
use primus_testkit::{MinioS3, RedisServer, restartable_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_waits_redis_out_and_then_plans_every_window() {
    let store = tempfile::tempdir().expect("tempdir");
    let port = restartable_port().expect("a port");
    let redis = RedisServer::start_with(port, None).expect("redis-server");
    let data = store.path().join("data");
    write_partitions(&data, "2026-01-01", 1).await;
    let window = hourly("2026-01-01T00", Some("2026-01-02T00"));
    let spec = dataset("clicks")
        .stream("logs", window, vec![parquet("p", data.display())])
        .spec();
    let plan = stream_plans(&spec).expect("plans").remove(0);
    let client = redis::Client::open(redis.url()).expect("redis url");
    let connection = client.get_connection_manager().await.expect("redis");
    let queue = TaskQueue::new(connection, "primus", "planned");
    let cache = Arc::new(ListingCache::new(
        Arc::new(StoreCatalog::new(StorageSettings::default())),
        8,
    ));
    let settings = PlannerSettings {
        poll_interval_ms: 100,
        ..PlannerSettings::default()
    };
    drop(redis);
    let planner = tokio::spawn(plan_stream(
        queue.clone(),
        cache,
        Arc::from("planned"),
        Arc::new(plan),
        settings,
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !planner.is_finished(),
        "the planner gave up: {:?}",
        planner.await
    );

    let _redis = RedisServer::start_with(port, None).expect("redis-server again");
    let planned = tokio::time::timeout(Duration::from_secs(30), planner)
        .await
        .expect("the planner ends once Redis is back");
    planned
        .expect("the planner task")
        .expect("every window planned");
    // A task per hour of the day.
    let counts = queue.counts().await.expect("the queue's counts");
    assert_eq!(counts.total, 24, "{counts:?}");
}

/// A day of hourly partitions in a bucket of `minio`, as a Dataset of one stream reading
/// them, and the settings that open the bucket.
async fn day_on_s3(minio: &MinioS3) -> (DatasetSpec, StorageSettings) {
    let bucket = minio.bucket("outage").expect("a bucket");
    let settings = s3_settings(&bucket);
    let local = tempfile::tempdir().expect("tempdir");
    write_partitions(local.path(), "2026-01-01", 1).await;
    let uri = format!("{}/data", bucket.url());
    let from = primus_storage::open(&local.path().display().to_string(), &settings);
    let to = primus_storage::open(&uri, &settings);
    copy_files(&from.expect("the local files"), &to.expect("the bucket")).await;
    let window = hourly("2026-01-01T00", Some("2026-01-02T00"));
    let spec = dataset("clicks")
        .stream("logs", window, vec![parquet("p", uri)])
        .spec();
    (spec, settings)
}

/// Plans `spec`'s stream into a new queue in `redis`, waiting out a store away for up to
/// `outage_timeout_s`.
async fn planner(
    redis: &RedisServer,
    spec: &DatasetSpec,
    storage: StorageSettings,
    outage_timeout_s: u64,
) -> (
    TaskQueue,
    tokio::task::JoinHandle<Result<(), PlanningError>>,
) {
    let plan = stream_plans(spec).expect("plans").remove(0);
    let client = redis::Client::open(redis.url()).expect("redis url");
    let connection = client.get_connection_manager().await.expect("redis");
    let queue = TaskQueue::new(connection, "primus", "planned");
    let cache = Arc::new(ListingCache::new(Arc::new(StoreCatalog::new(storage)), 8));
    let settings = PlannerSettings {
        poll_interval_ms: 100,
        store_outage_timeout_s: outage_timeout_s,
        ..PlannerSettings::default()
    };
    let planner = tokio::spawn(plan_stream(
        queue.clone(),
        cache,
        Arc::from("planned"),
        Arc::new(plan),
        settings,
    ));
    (queue, planner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_waits_its_store_out_and_then_plans_every_window() {
    let redis = RedisServer::start().expect("redis-server");
    let mut minio = MinioS3::start().expect("minio");
    let (spec, storage) = day_on_s3(&minio).await;
    let catalog = StoreCatalog::new(storage.clone());
    check_sources(&catalog, &spec)
        .await
        .expect("the source holds data");
    minio.stop();
    let away = check_sources(&catalog, &spec).await;
    assert!(
        away.as_ref().is_err_and(SourceError::is_transient),
        "a store out of reach: {away:?}"
    );

    let (queue, planner) = planner(&redis, &spec, storage, 300).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        !planner.is_finished(),
        "the planner gave up: {:?}",
        planner.await
    );
    minio.start_again().expect("minio again");
    let planned = tokio::time::timeout(Duration::from_secs(60), planner)
        .await
        .expect("the planner ends once the store is back");
    planned
        .expect("the planner task")
        .expect("every window planned");
    let counts = queue.counts().await.expect("the queue's counts");
    assert_eq!(counts.total, 24, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_gives_up_on_a_store_away_longer_than_its_timeout() {
    let redis = RedisServer::start().expect("redis-server");
    let mut minio = MinioS3::start().expect("minio");
    let (spec, storage) = day_on_s3(&minio).await;
    minio.stop();
    let (queue, planner) = planner(&redis, &spec, storage, 1).await;
    let planned = tokio::time::timeout(Duration::from_secs(60), planner)
        .await
        .expect("the planner gives up");
    let error = planned.expect("the planner task").expect_err("no store");
    let message = error.to_string();
    assert!(
        matches!(error, PlanningError::StoreOutOfReach { waited_s, .. } if waited_s >= 1)
            && message.contains("/data")
            && message.contains("master.planner.store_outage_timeout_s"),
        "{message}"
    );
    let counts = queue.counts().await.expect("the queue's counts");
    assert_eq!(counts.total, 0, "{counts:?}");
}
