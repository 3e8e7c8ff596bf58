//! Apply and Get per second through the API server on loopback, next to the same number of
//! plain Redis SET/GET round trips of the same payload (the floor any Redis-backed API pays).
//!
//! `cargo bench -p primus-benches --bench api` (PRIMUS_BENCH_SECONDS sets each run's length).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]
#![expect(
    clippy::disallowed_methods,
    reason = "plain Redis SET and GET are the baseline the API server is measured against"
)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use primus_api_client::{ApiClient, ClientSettings};
use primus_config::ApiServerSettings;
use primus_service::Shutdown;
use primus_spec::Kind;
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, RedisServer, free_port};

const TOKEN: &str = "bench-token";
const CONCURRENCY: usize = 16;

const DATASET: &str = r#"
kind: Dataset
metadata: {name: clicks}
spec:
  streams:
    - name: main
      window: {unit: hourly, start: "2026-11-20T00", end: "2026-11-21T00"}
      sources: [{name: logs, parquet: {uri: "memory://clicks"}}]
  schema: {label: label, dense: [{name: i1}], sparse: [{name: c1, table: items}]}
"#;

fn job(name: &str, dim: u64) -> primus_spec::Resource {
    let yaml = format!(
        r#"
kind: Job
metadata: {{name: {name}}}
spec:
  model:
    kind: dlrm
    tables: [{{name: items, dim: {dim}, optimizer: {{kind: adagrad, learning_rate: 0.05}}}}]
    dense: {{bottom: [64, 16], top: [64, 1]}}
  dataset: clicks
  mode: batch
  topology:
    data_executors: {{replicas: 1}}
    trainers: {{replicas: 1}}
    ps: {{replicas: 2}}
    serving: {{replicas: 1}}
"#
    );
    parse(&yaml)
}

fn parse(yaml: &str) -> primus_spec::Resource {
    match primus_spec::parse_documents("bench", yaml) {
        Ok(mut resources) => resources.remove(0),
        Err(e) => panic!("bench resource: {e}"),
    }
}

/// Runs `op(worker, i)` from `workers` tasks for `duration`; returns operations per second.
async fn rate<F, Fut>(workers: usize, duration: Duration, op: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let op = op.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let mut i = 0;
                while start.elapsed() < duration {
                    op(worker, i).await;
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in futures::future::join_all(tasks).await {
        task.expect("bench worker");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn report(name: &str, workers: usize, api: f64, baseline: f64) {
    println!(
        "{name:<6} x{workers:<3} {api:>9.0} ops/s  ({:>7.1} us/op)   redis baseline {baseline:>9.0} ops/s   api/redis {:>5.1}%",
        1e6 / api * workers as f64,
        100.0 * api / baseline
    );
}

#[tokio::main]
async fn main() {
    let seconds: u64 = std::env::var("PRIMUS_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let duration = Duration::from_secs(seconds);
    let nats = NatsServer::start().expect("nats-server");
    let redis = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tokens"), TOKEN).expect("tokens");
    let mut settings = ApiServerSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
    settings.nats.url = nats.url();
    settings.redis.url = redis.url();
    settings.auth.token_file = Some(dir.path().join("tokens"));
    settings.telemetry.log_filter = "warn".into();
    let addr = settings.server.grpc_addr.to_string();
    let shutdown = Shutdown::new();
    let server = tokio::spawn(primus_api_server::run(settings, shutdown.clone()));
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(20))
        .await
        .expect("api-server serving");
    let client = ApiClient::connect(&ClientSettings {
        server: format!("http://{addr}"),
        token: TOKEN.into(),
        ca_file: None,
    })
    .await
    .expect("connect");
    client.apply(&parse(DATASET), 0).await.expect("dataset");
    let redis_client = redis::Client::open(redis.url()).expect("redis url");
    let redis_conn = redis_client
        .get_connection_manager()
        .await
        .expect("redis connection");
    let payload = job("payload", 8).spec_json().expect("json");
    println!(
        "API server on loopback, Redis {} and NATS on loopback; {seconds} s per figure; payload {} bytes",
        redis.url(),
        payload.len()
    );

    // Parsed up front so the figure is the API's, not the bench's YAML parsing.
    let resources: Arc<Vec<Vec<primus_spec::Resource>>> = Arc::new(
        (0..CONCURRENCY)
            .map(|worker| {
                (1..=64)
                    .map(|dim| job(&format!("job-{worker}"), dim))
                    .collect()
            })
            .collect(),
    );
    for workers in [1, CONCURRENCY] {
        // Every Apply changes the spec (the next dim), so every call is a real write.
        let apply_client = client.clone();
        let apply_resources = resources.clone();
        let apply = rate(workers, duration, move |worker, i| {
            let client = apply_client.clone();
            let resources = apply_resources.clone();
            async move {
                let own = &resources[worker];
                let resource = &own[(i % own.len() as u64) as usize];
                client.apply(resource, 0).await.expect("apply");
            }
        })
        .await;
        let set_conn = redis_conn.clone();
        let set_payload = payload.clone();
        let set = rate(workers, duration, move |worker, i| {
            let mut conn = set_conn.clone();
            let value = format!("{i}|{set_payload}");
            async move {
                let _: () = redis::cmd("SET")
                    .arg(format!("bench:{worker}"))
                    .arg(value)
                    .query_async(&mut conn)
                    .await
                    .expect("SET");
            }
        })
        .await;
        report("Apply", workers, apply, set);

        let get_client = client.clone();
        let get = rate(workers, duration, move |worker, _| {
            let client = get_client.clone();
            async move {
                client
                    .get(Kind::Job, &format!("job-{worker}"))
                    .await
                    .expect("get");
            }
        })
        .await;
        let get_conn = redis_conn.clone();
        let redis_get = rate(workers, duration, move |worker, _| {
            let mut conn = get_conn.clone();
            async move {
                let _: Vec<u8> = redis::cmd("GET")
                    .arg(format!("bench:{worker}"))
                    .query_async(&mut conn)
                    .await
                    .expect("GET");
            }
        })
        .await;
        report("Get", workers, get, redis_get);
    }
    let jobs = client.list(Kind::Job, HashMap::new()).await.expect("list");
    println!(
        "(store at version {} after the runs)",
        jobs.resource_version
    );
    shutdown.trigger();
    let _ = server.await;
}
