//! (b) Live PS resharding (DLRover-RM's seamless migration): a table of `rows` rows on two PS
//! shards is resharded to four while `WORKERS` callers keep training against it, each step
//! looking up a minibatch's `KEYS_PER_STEP` distinct keys and pushing their gradients through
//! one client that follows the published shard list. The four PS processes run in this
//! process (real gRPC on loopback). Prints the pause (how long each call that met the fence
//! waited: p50, p99), rows moved per second, and steps per second before, during and after.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use primus_config::PsSettings;
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::topology_service_client::TopologyServiceClient;
use primus_proto::v1::{GetTopologyRequest, Role, StatsRequest};
use primus_ps_client::reshard::reshard;
use primus_ps_client::{PsClient, ShardSource};
use primus_service::Shutdown;
use primus_spec::job::{OptimizerSpec, TableSpec};
use primus_spec::status::{Phase, Status};
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, free_port};

use crate::jobs::{Cluster, ROWS_PER_HOUR, criteo_data_with, resources};

const DIM: usize = 16;
const KEYS_PER_STEP: usize = 4_096;
const WORKERS: usize = 2;
/// How long steps are counted before and after the resharding.
const WINDOW: Duration = Duration::from_secs(3);

/// What (b) measured.
pub(crate) struct Resharding {
    pub(crate) pause_p99: Duration,
}

fn key_of(i: u64) -> u64 {
    (i ^ 0xdead_beef).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

async fn start_shard(nats: &NatsServer, shutdown: &Shutdown) -> String {
    let mut settings = PsSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
    settings.nats.url = nats.url();
    settings.ps.tables = vec![TableSpec::new(
        "items",
        DIM as u32,
        OptimizerSpec::adagrad(0.05),
    )];
    settings.telemetry.log_filter = "warn".into();
    let addr = settings.server.grpc_addr.to_string();
    tokio::spawn(primus_ps::run(settings, shutdown.clone()));
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(20))
        .await
        .expect("ps serving");
    addr
}

/// Steps of `KEYS_PER_STEP` distinct keys drawn uniformly from `rows`, until `stop`.
async fn train(
    client: PsClient,
    rows: u64,
    seed: u64,
    steps: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    let mut state = seed;
    let grads = vec![0.01f32; KEYS_PER_STEP * DIM];
    while !stop.load(Ordering::Acquire) {
        let mut keys: Vec<u64> = (0..KEYS_PER_STEP)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                key_of((state >> 33) % rows)
            })
            .collect();
        keys.sort_unstable();
        keys.dedup();
        client.lookup("items", &keys).await.expect("lookup");
        client
            .push("items", &keys, &grads[..keys.len() * DIM])
            .await
            .expect("push");
        steps.fetch_add(1, Ordering::Relaxed);
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs (b) with `rows` rows.
pub(crate) async fn reshard_two_to_four(rows: u64) -> Resharding {
    let nats = NatsServer::start().expect("nats-server");
    let shutdown = Shutdown::new();
    let mut shards = Vec::new();
    for _ in 0..4 {
        shards.push(start_shard(&nats, &shutdown).await);
    }
    let (from, to) = (shards[..2].to_vec(), shards.clone());
    let published = Arc::new(RwLock::new(from.clone()));
    let source: ShardSource = {
        let published = published.clone();
        Arc::new(move || {
            let addrs = published.read().map(|a| a.clone()).unwrap_or_default();
            Box::pin(async move { Ok(addrs) })
        })
    };
    let client = PsClient::connect(&from)
        .await
        .expect("connect")
        .following(source);
    let all: Vec<u64> = (0..rows).map(key_of).collect();
    let zeros = vec![0.0f32; 16_384 * DIM];
    for chunk in all.chunks(16_384) {
        client
            .push("items", chunk, &zeros[..chunk.len() * DIM])
            .await
            .expect("fill");
    }
    println!(
        "(b) resharding 2 -> 4 PS shards: {rows} rows of dim {DIM} (Adagrad), {WORKERS} callers each looking up and pushing {KEYS_PER_STEP} keys a step"
    );

    let (steps, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let workers: Vec<_> = (0..WORKERS as u64)
        .map(|w| {
            let (steps, stop) = (steps.clone(), stop.clone());
            tokio::spawn(train(client.clone(), rows, 0x1234 + w, steps, stop))
        })
        .collect();
    let rate = |from: u64, to: u64, over: Duration| (to - from) as f64 / over.as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (s0, t0) = (steps.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(WINDOW).await;
    let (s1, t1) = (steps.load(Ordering::Relaxed), Instant::now());
    let report = reshard(&from, &to, || {
        let published = published.clone();
        let to = to.clone();
        async move {
            *published.write().map_err(|e| e.to_string())? = to;
            Ok(())
        }
    })
    .await
    .expect("reshard");
    let (s2, t2) = (steps.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(WINDOW).await;
    let (s3, t3) = (steps.load(Ordering::Relaxed), Instant::now());
    stop.store(true, Ordering::Release);
    for worker in workers {
        worker.await.expect("worker");
    }
    let mut waits = client.take_move_waits();
    waits.sort_unstable();
    let moving = report.copying + report.fenced;
    let (p50, p99) = (percentile(&waits, 50.0), percentile(&waits, 99.0));
    println!(
        "{:<36} {:>10} {:>10} {:>10}",
        "", "before", "during", "after"
    );
    println!(
        "{:<36} {:>10.1} {:>10.1} {:>10.1}",
        "steps/s (lookup + push)",
        rate(s0, s1, t1 - t0),
        rate(s1, s2, t2 - t1),
        rate(s2, s3, t3 - t2)
    );
    println!(
        "rows copied {} in {} rounds over {} ms ({:.0} rows/s), {} dropped from the old shards",
        report.rows_copied,
        report.rounds,
        moving.as_millis(),
        report.rows_copied as f64 / moving.as_secs_f64(),
        report.rows_dropped
    );
    println!(
        "fence to switch {} ms; {} calls met the fence, waiting p50 {} ms, p99 {} ms",
        report.fenced.as_millis(),
        waits.len(),
        p50.as_millis(),
        p99.as_millis()
    );
    shutdown.trigger();
    Resharding { pause_p99: p99 }
}

/// What resharding a running Job measured.
pub(crate) struct JobResharding {
    /// The longest a trainer's PS call waited on the fence.
    pub(crate) pause: Option<Duration>,
}

/// (b) in a Job: the batch DLRM Job of (a) over `hours` files of ids with every Criteo
/// cardinality scaled by `cardinality_scale`, on two PS shards, is applied again with four
/// once its table holds `rows` rows (or two thirds of its data is trained). Prints the rows
/// the shards held then, the trainer's samples/s (from its metrics reports, every 2 s) in
/// the 6 s before, during the resharding (from the apply to the `Resharded` event) and in
/// the 6 s after, and the longest a trainer's PS call waited on the fence
/// (`ps_move_wait_ms` in the Metric resource).
pub(crate) async fn reshard_a_running_job(
    hours: usize,
    cardinality_scale: f64,
    rows: u64,
) -> JobResharding {
    let (_dir, data) = criteo_data_with(hours, cardinality_scale).await;
    let total = (hours * ROWS_PER_HOUR) as u64;
    let cluster = Cluster::start(|_| {}).await;
    let reports = trainer_reports(&cluster).await;
    let job = |ps: u32| {
        resources(&data, hours, 1, |spec| {
            spec.topology.ps.replicas = ps;
        })
    };
    cluster.sandbox.apply(job(2)).await;
    let sample = |status: &Status| status.progress.as_ref().map_or(0, |p| p.samples);
    let rows = loop {
        let status = cluster.sandbox.status("elastic").await;
        let held = rows_held(&cluster.master_addr).await;
        if held >= rows || sample(&status) >= total * 2 / 3 {
            break held;
        }
        tokio::time::sleep(PROGRESS_POLL).await;
    };
    let applied = primus_spec::time::unix_ms();
    cluster.sandbox.apply(job(4)).await;
    let (resharded, message) = loop {
        let status = cluster.sandbox.status("elastic").await;
        let event = status
            .events
            .iter()
            .find(|e| e.reason.starts_with("Reshard"));
        if let Some(event) = event {
            break (
                event.unix_ms,
                format!("{}: {}", event.reason, event.message),
            );
        }
        assert!(
            !status.phase.is_terminal(),
            "ended before resharding: {status:?}"
        );
        tokio::time::sleep(PROGRESS_POLL).await;
    };
    let status = loop {
        let status = cluster.sandbox.status("elastic").await;
        if status.phase.is_terminal() {
            break status;
        }
        tokio::time::sleep(PROGRESS_POLL).await;
    };
    assert_eq!(status.phase, Phase::Succeeded, "{status:?}");
    assert_eq!(sample(&status), total, "every row trained once");
    let pause = longest_trainer_wait(&cluster).await;
    cluster.stop().await;
    let trace = reports.lock().map(|r| r.clone()).unwrap_or_default();
    let window = 6_000;
    println!(
        "(b) in a Job: the DLRM Job of (a) over {total} rows, applied with 4 PS shards instead of 2 once its table held {rows} rows"
    );
    println!(
        "{:<36} {:>10} {:>10} {:>10}",
        "", "before", "during", "after"
    );
    println!(
        "{:<36} {:>10.0} {:>10.0} {:>10.0}",
        "trainer samples/s",
        samples_per_second(&trace, applied - window, applied),
        samples_per_second(&trace, applied, resharded),
        samples_per_second(&trace, resharded, resharded + window)
    );
    println!("  {message}");
    match pause {
        Some(pause) => println!(
            "longest trainer PS call wait on the fence: {} ms",
            pause.as_millis()
        ),
        None => println!("no trainer PS call met the fence"),
    }
    JobResharding { pause }
}

/// How often the Job's status is read.
const PROGRESS_POLL: Duration = Duration::from_millis(250);

/// The trainer's metrics reports as they come: (unix ms, samples trained).
async fn trainer_reports(cluster: &Cluster) -> Arc<std::sync::Mutex<Vec<(i64, u64)>>> {
    let settings = primus_config::NatsSettings {
        url: cluster.sandbox.nats.url(),
        ..primus_config::NatsSettings::default()
    };
    let bus = primus_bus::Bus::connect(&settings).await.expect("nats");
    let subject = bus
        .subjects()
        .metrics("elastic", "trainer", primus_bus::subjects::ANY)
        .expect("subject");
    let mut reports = bus
        .subscribe::<primus_proto::v1::MetricsReport>(subject)
        .await
        .expect("subscribe");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let collected = seen.clone();
    tokio::spawn(async move {
        let _bus = bus;
        while let Some(report) = reports.next().await {
            if let (Ok(report), Ok(mut seen)) = (report, collected.lock()) {
                seen.push((report.message.unix_ms, report.message.samples));
            }
        }
    });
    seen
}

/// Samples per second between `from` and `to` (unix ms), from the reports at or just
/// outside them.
fn samples_per_second(reports: &[(i64, u64)], from: i64, to: i64) -> f64 {
    let before = reports.iter().rfind(|(at, _)| *at <= from);
    let after = reports.iter().find(|(at, _)| *at >= to);
    match (before, after) {
        (Some((t0, s0)), Some((t1, s1))) if t1 > t0 => {
            s1.saturating_sub(*s0) as f64 * 1_000.0 / (t1 - t0) as f64
        }
        _ => 0.0,
    }
}

/// Rows every PS shard of the Job holds (0 before it has shards).
async fn rows_held(master: &str) -> u64 {
    let Ok(mut topology) = TopologyServiceClient::connect(format!("http://{master}")).await else {
        return 0;
    };
    let request = GetTopologyRequest {
        job: "elastic".into(),
    };
    let Ok(answer) = topology.get_topology(request).await else {
        return 0;
    };
    let mut held = 0;
    for shard in primus_proto::role_addrs(&answer.into_inner().endpoints, Role::Ps) {
        let Ok(mut client) = ParameterServerClient::connect(format!("http://{shard}")).await else {
            continue;
        };
        if let Ok(stats) = client.stats(StatsRequest {}).await {
            held += stats
                .into_inner()
                .tables
                .iter()
                .map(|t| t.rows)
                .sum::<u64>();
        }
    }
    held
}

/// The longest wait a trainer reported as `ps_move_wait_ms`.
async fn longest_trainer_wait(cluster: &Cluster) -> Option<Duration> {
    let metric = cluster
        .sandbox
        .client()
        .await
        .get(primus_spec::Kind::Metric, "elastic")
        .await
        .ok()?;
    let spec: primus_spec::metric::MetricSpec = serde_json::from_str(&metric.spec_json).ok()?;
    spec.series
        .iter()
        .filter(|s| s.name == "ps_move_wait_ms")
        .flat_map(|s| s.points.iter().map(|p| p.value))
        .max_by(f64::total_cmp)
        .map(|ms| Duration::from_secs_f64(ms / 1_000.0))
}
