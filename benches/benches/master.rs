//! How many Jobs one master drives: the real master (in this process, with its own NATS and
//! Redis) over `primus-scripted`'s executors, which run no process, with the Jobs' status
//! ticks timed. N Jobs of 64 executors each (4 PS shards, 28 data executors, 32 trainers)
//! run at the default intervals (a status tick per Job and a report per executor every 2 s);
//! the bench reports the ticks' duration and how many were on time, and the Redis commands
//! and NATS messages per tick, next to the same for a tenth of the Jobs measured in the
//! same run. A master whose ticks fall behind their interval needs its Jobs sharded over
//! more masters (`master.shard`).
//!
//! `cargo bench -p primus-benches --bench master` (PRIMUS_BENCH_JOBS, default 100;
//! PRIMUS_BENCH_BASELINE_JOBS, default 10; PRIMUS_BENCH_SECONDS, each measurement's length,
//! default 20).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use primus_benches::env_or;
use primus_bus::Bus;
use primus_harness::Sandbox;
use primus_harness::partitions::write_partitions;
use primus_harness::resources::{dataset, hourly, job, parquet, small_wide_deep};
use primus_master::TickTimes;
use primus_master::ticks::TickSummary;
use primus_scripted::{Script, ScriptedBackend};
use primus_service::Shutdown;
use primus_spec::job::TrainingMode;
use primus_spec::status::Phase;
use primus_testkit::{NatsServer, RedisServer};

/// Each Job's executors: (data executors, trainers, PS shards), 64 in all.
const TOPOLOGY: (u32, u32, u32) = (28, 32, 4);

/// What one measurement saw.
struct Measured {
    jobs: usize,
    started_in: Duration,
    ticks: TickSummary,
    expected_ticks: f64,
    redis_per_tick: f64,
    nats_in_per_tick: f64,
    nats_out_per_tick: f64,
    /// Cores this whole process used over the window: the master, its scripted executors
    /// and the API server.
    cpu_cores: f64,
}

#[tokio::main]
async fn main() {
    let jobs: usize = env_or("PRIMUS_BENCH_JOBS", 100);
    let baseline_jobs: usize = env_or("PRIMUS_BENCH_BASELINE_JOBS", 10);
    let seconds: u64 = env_or("PRIMUS_BENCH_SECONDS", 20);
    let window = Duration::from_secs(seconds);
    println!(
        "one master in this process over scripted executors (no processes); {} executors per Job; {seconds} s per measurement",
        TOPOLOGY.0 + TOPOLOGY.1 + TOPOLOGY.2
    );
    let baseline = measure(baseline_jobs, window).await;
    report(&baseline);
    let measured = measure(jobs, window).await;
    report(&measured);
    println!(
        "master: {jobs} Jobs x 64 scripted executors: status tick p50 {:.1} ms, p99 {:.1} ms, {:.0}% of ticks on time, {:.0} Redis commands and {:.0} NATS messages per tick ({baseline_jobs} Jobs: p50 {:.1} ms, p99 {:.1} ms, {:.0}% on time)",
        ms(measured.ticks.p50),
        ms(measured.ticks.p99),
        on_time(&measured),
        measured.redis_per_tick,
        measured.nats_in_per_tick + measured.nats_out_per_tick,
        ms(baseline.ticks.p50),
        ms(baseline.ticks.p99),
        on_time(&baseline),
    );
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Ticks that happened over those the Jobs' intervals asked for, in percent.
fn on_time(measured: &Measured) -> f64 {
    100.0 * (measured.ticks.count as f64 / measured.expected_ticks).min(1.0)
}

fn report(m: &Measured) {
    println!(
        "{:>4} Jobs ({:>5} executors, all Running after {:>5.1} s): {:>6} ticks of {:>6.0} due; tick p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms; per tick: {:>5.1} Redis commands, NATS {:>5.1} in {:>5.1} out; process CPU {:.2} cores",
        m.jobs,
        m.jobs * 64,
        m.started_in.as_secs_f64(),
        m.ticks.count,
        m.expected_ticks,
        ms(m.ticks.p50),
        ms(m.ticks.p99),
        ms(m.ticks.max),
        m.redis_per_tick,
        m.nats_in_per_tick,
        m.nats_out_per_tick,
        m.cpu_cores,
    );
}

/// Runs `jobs` Jobs on a fresh master and measures `window` of their steady state.
async fn measure(jobs: usize, window: Duration) -> Measured {
    // The API server keeps the sandbox's NATS and Redis; the master and its executors get
    // their own, so what the servers count is the master's traffic alone.
    let sandbox = Sandbox::start().await;
    let nats = NatsServer::start().expect("nats-server");
    let redis = RedisServer::start().expect("redis-server");
    let data = sandbox.dir().join("data");
    write_partitions(&data, "2026-01-01", 2).await;
    let mut settings = sandbox.master_settings();
    settings.nats.url = nats.url();
    settings.redis.url = redis.url();
    settings.telemetry.log_filter = "warn".into();
    let defaults = primus_config::MasterSettings::default();
    settings.master.status_interval_ms = defaults.master.status_interval_ms;
    settings.master.planner.poll_interval_ms = defaults.master.planner.poll_interval_ms;
    let interval = Duration::from_millis(settings.master.status_interval_ms);
    let script = Script {
        report_interval: Duration::from_millis(defaults.master.tasks.heartbeat_interval_ms),
        // Tasks that last the whole measurement.
        rows_per_task: u64::MAX / 2,
        ..Script::default()
    };
    let executors_bus = Bus::connect(&settings.nats).await.expect("nats");
    let published_by_executors = executors_bus.client().statistics();
    let backend = ScriptedBackend::new(executors_bus, settings.server.grpc_addr, script);
    let ticks = TickTimes::default();
    let shutdown = Shutdown::new();
    let master = tokio::spawn(primus_master::serve_on(
        settings,
        Arc::new(backend),
        ticks.clone(),
        shutdown.clone(),
    ));
    let published = count_published(&settings_nats(&nats)).await;
    let mut commands = RedisCommands::connect(&redis).await;
    let started = Instant::now();
    sandbox.apply(resources(&data, jobs)).await;
    wait_until_running(&sandbox, jobs).await;
    let started_in = started.elapsed();
    // Two intervals to settle, then the window.
    tokio::time::sleep(2 * interval).await;
    ticks.take();
    let before = (
        commands.count().await,
        published.load(Ordering::Relaxed),
        published_by_executors.out_messages.load(Ordering::Relaxed),
    );
    let mut cpu = primus_service::usage::UsageSampler::new();
    tokio::time::sleep(window).await;
    let cpu_cores = cpu.cpu_cores();
    let summary = ticks.take().expect("status ticks in the window");
    let after = (
        commands.count().await,
        published.load(Ordering::Relaxed),
        published_by_executors.out_messages.load(Ordering::Relaxed),
    );
    shutdown.trigger();
    let _ = master.await;
    let count = summary.count as f64;
    // Every message the executors publish goes to the master; the rest it published.
    let by_executors = (after.2 - before.2) as f64;
    let all = (after.1 - before.1) as f64;
    Measured {
        jobs,
        started_in,
        expected_ticks: jobs as f64 * window.as_secs_f64() / interval.as_secs_f64(),
        // Less the INFO that read the count.
        redis_per_tick: (after.0 - before.0).saturating_sub(1) as f64 / count,
        nats_in_per_tick: by_executors / count,
        nats_out_per_tick: (all - by_executors).max(0.0) / count,
        ticks: summary,
        cpu_cores,
    }
}

/// Dataset `clicks` (48 hourly tasks of the partitions under `data`) and `jobs` batch Jobs
/// over it.
fn resources(data: &std::path::Path, jobs: usize) -> Vec<primus_spec::Resource> {
    let window = hourly("2026-01-01T00", Some("2026-01-03T00"));
    let source = parquet("clicks", data.display());
    let mut resources = vec![
        dataset("clicks")
            .stream("logs", window, vec![source])
            .build(),
    ];
    let (data_executors, trainers, ps) = TOPOLOGY;
    resources.extend((0..jobs).map(|i| {
        job(
            &format!("job-{i:03}"),
            "clicks",
            TrainingMode::Batch,
            small_wide_deep(),
        )
        .replicas(data_executors, trainers, ps)
        .build()
    }));
    resources
}

async fn wait_until_running(sandbox: &Sandbox, jobs: usize) {
    let deadline = Instant::now() + Duration::from_secs(600);
    for i in 0..jobs {
        let name = format!("job-{i:03}");
        let left = deadline.saturating_duration_since(Instant::now());
        sandbox.wait_for_phase(&name, Phase::Running, left).await;
    }
}

fn settings_nats(nats: &NatsServer) -> primus_config::NatsSettings {
    primus_config::NatsSettings {
        url: nats.url(),
        ..primus_config::NatsSettings::default()
    }
}

/// Counts every message published on the NATS of `settings` from now on.
async fn count_published(settings: &primus_config::NatsSettings) -> Arc<AtomicU64> {
    let bus = Bus::connect(settings).await.expect("nats");
    let mut all = bus.client().subscribe(">").await.expect("subscribe");
    bus.client().flush().await.expect("flush");
    let count = Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        let _bus = bus;
        while all.next().await.is_some() {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    count
}

/// Reads how many commands a Redis server processed, over one connection.
struct RedisCommands {
    connection: redis::aio::ConnectionManager,
}

impl RedisCommands {
    async fn connect(redis: &RedisServer) -> Self {
        let client = redis::Client::open(redis.url()).expect("redis url");
        let connection = client.get_connection_manager().await.expect("redis");
        Self { connection }
    }

    /// Commands processed so far, this INFO included.
    #[expect(
        clippy::disallowed_methods,
        reason = "INFO reads the server's counters; it touches no key"
    )]
    async fn count(&mut self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut self.connection)
            .await
            .expect("INFO stats");
        info.lines()
            .find_map(|line| line.strip_prefix("total_commands_processed:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("total_commands_processed")
    }
}
