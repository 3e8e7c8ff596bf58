//! The planner against a real Redis that is away: it waits Redis out and plans every
//! window once it is back.

use std::sync::Arc;
use std::time::Duration;

use primus_config::{PlannerSettings, StorageSettings};
use primus_data_tasks::plan::{ListingCache, StoreCatalog};
use primus_data_tasks::planning::{plan_stream, stream_plans};
use primus_data_tasks::queue::TaskQueue;
use primus_harness::partitions::write_partitions;
use primus_harness::resources::{dataset, hourly, parquet};
use primus_testkit::{RedisServer, restartable_port};

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
