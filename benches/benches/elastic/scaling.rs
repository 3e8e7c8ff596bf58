//! (a) Horizontal scaling by load (Primus Eq. 1): a batch Job on Criteo-like hourly Parquet
//! files starts with one data executor that cannot keep its trainer busy, because every
//! Parquet read waits `READ_DELAY_MS` as from a slow object store
//! (`master.fault_injection.data_read_delay_ms`, a fault injected for tests and benchmarks).
//! It runs twice in this process's sandbox (NATS, Redis, the API server and the master here;
//! the executors as processes of the binaries built beside this bench): with
//! `spec.scaling` off, the baseline, and on (1 to `MAX_DATA_EXECUTORS` data executors). Each
//! run prints its time from apply to Succeeded, the data executors it ended with and this
//! machine's mean CPU utilisation meanwhile.

use std::path::Path;
use std::time::{Duration, Instant};

use primus_config::StorageSettings;
use primus_datagen::criteo::CriteoOptions;
use primus_datagen::write::Layout;
use primus_harness::Sandbox;
use primus_harness::resources::{dataset, hourly, job, parquet};
use primus_service::Shutdown;
use primus_spec::Resource;
use primus_spec::dataset::WindowUnit;
use primus_spec::job::{DenseSpec, ModelKind, ModelSpec, OptimizerSpec, TableSpec, TrainingMode};
use primus_spec::status::{Phase, Status};

const ROWS_PER_HOUR: usize = 16_384;
const ROW_GROUP_ROWS: usize = 8_192;
const READ_DELAY_MS: u64 = 2_000;
const MAX_DATA_EXECUTORS: u32 = 4;
const START: &str = "2026-11-01T00";

/// Busy and total jiffies of all cores (`/proc/stat`).
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    // idle and iowait are the 4th and 5th fields.
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// What one run measured.
struct Run {
    seconds: f64,
    cpu_utilisation: f64,
    data_executors: u32,
    samples: u64,
    status: Status,
}

fn resources(data: &Path, hours: usize, scaling: bool) -> [Resource; 2] {
    let end = format!("2026-11-{:02}T{:02}", 1 + hours / 24, hours % 24);
    let criteo = dataset("criteo")
        .schema(primus_datagen::criteo::feature_schema("categorical"))
        .stream(
            "clicks",
            hourly(START, Some(&end)),
            vec![parquet("criteo", data.display())],
        );
    let model = ModelSpec {
        kind: ModelKind::Dlrm,
        tables: vec![TableSpec::new(
            "categorical",
            16,
            OptimizerSpec::adagrad(0.05),
        )],
        dense: DenseSpec::new(vec![64, 16], vec![64, 1]),
    };
    let trained = job("elastic", "criteo", TrainingMode::Batch, model)
        .replicas(1, 1, 2)
        .batch_size(1024)
        .with(|spec| {
            let policy = &mut spec.scaling;
            policy.enabled = scaling;
            policy.min_data_executors = 1;
            policy.max_data_executors = MAX_DATA_EXECUTORS;
            policy.cooldown_seconds = 3;
        });
    [criteo.build(), trained.build()]
}

async fn run(bin_dir: &Path, data: &Path, hours: usize, scaling: bool) -> Run {
    let sandbox = Sandbox::start().await;
    let mut settings = sandbox.master_settings();
    settings.local.bin_dir = Some(bin_dir.to_path_buf());
    settings.master.status_interval_ms = 500;
    // One task per row group, so that more executors have more to read at once.
    settings.master.planner.target_task_bytes = 64 << 10;
    settings.master.fault_injection.data_read_delay_ms = READ_DELAY_MS;
    let shutdown = Shutdown::new();
    let master = tokio::spawn(primus_master::run(settings, shutdown.clone()));
    let (busy, total) = cpu_jiffies();
    let started = Instant::now();
    sandbox.apply(resources(data, hours, scaling)).await;
    let status = sandbox
        .wait_for_phase("elastic", Phase::Succeeded, Duration::from_secs(3600))
        .await;
    let seconds = started.elapsed().as_secs_f64();
    let (busy_after, total_after) = cpu_jiffies();
    shutdown.trigger();
    master
        .await
        .expect("master task")
        .expect("master stops cleanly");
    Run {
        seconds,
        cpu_utilisation: (busy_after - busy) as f64 / (total_after - total).max(1) as f64,
        data_executors: status.replicas.map_or(0, |r| r.data_executors),
        samples: status.progress.as_ref().map_or(0, |p| p.samples),
        status,
    }
}

fn row(name: &str, run: &Run) {
    println!(
        "{name:<28} {:>8.1} s {:>14} {:>12.0}% {:>10}",
        run.seconds,
        run.data_executors,
        100.0 * run.cpu_utilisation,
        run.samples
    );
}

/// Runs (a) on `hours` hourly files; returns the speed-up of scaling on over off.
pub(crate) async fn scale_out(hours: usize) -> f64 {
    let bin_dir = primus_benches::service_bin_dir();
    primus_benches::require_service_binaries(&bin_dir, "");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("criteo");
    let location = primus_storage::open(data.to_str().expect("utf-8"), &StorageSettings::default())
        .expect("location");
    let layout = Layout {
        unit: WindowUnit::Hourly,
        start_unix_s: primus_spec::time::parse_window_time(START).expect("start"),
        windows: hours,
        files_per_window: 1,
        row_group_rows: ROW_GROUP_ROWS,
    };
    let options = CriteoOptions {
        cardinality_scale: 0.001,
        ..CriteoOptions::default()
    };
    primus_datagen::write::criteo(&location, &layout, ROWS_PER_HOUR, options)
        .await
        .expect("generate");
    let rows = (hours * ROWS_PER_HOUR) as u64;
    println!(
        "(a) horizontal scaling by load: {rows} rows, one data executor at the start, each Parquet read of {ROW_GROUP_ROWS} rows delayed {READ_DELAY_MS} ms"
    );
    let off = run(&bin_dir, &data, hours, false).await;
    let on = run(&bin_dir, &data, hours, true).await;
    println!(
        "{:<28} {:>10} {:>14} {:>13} {:>10}",
        "run", "finished", "data executors", "mean CPU", "samples"
    );
    row("scaling off (baseline)", &off);
    row("scaling on (1..=4)", &on);
    for (name, run) in [("off", &off), ("on", &on)] {
        assert_eq!(run.samples, rows, "scaling {name}: every row trained once");
    }
    for event in &on.status.events {
        println!("  {}: {}", event.reason, event.message);
    }
    off.seconds / on.seconds
}
