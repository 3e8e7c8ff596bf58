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
use primus_ps_client::reshard::reshard;
use primus_ps_client::{PsClient, ShardSource};
use primus_service::Shutdown;
use primus_spec::job::{OptimizerSpec, TableSpec};
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, free_port};

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
