//! What (a) and (c) share: Criteo-like hourly Parquet data, a DLRM Job on it, and one run
//! of it in a fresh sandbox (NATS, Redis, the API server and the master in this process; the
//! executors as processes of the binaries built beside this bench).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use primus_config::{MasterSettings, StorageSettings};
use primus_datagen::criteo::CriteoOptions;
use primus_datagen::write::Layout;
use primus_harness::Sandbox;
use primus_harness::resources::{dataset, hourly, job, parquet};
use primus_service::Shutdown;
use primus_spec::Resource;
use primus_spec::dataset::WindowUnit;
use primus_spec::job::{
    DenseSpec, JobSpec, ModelKind, ModelSpec, OptimizerSpec, TableSpec, TrainingMode,
};
use primus_spec::status::{Phase, Status};

pub(crate) const ROWS_PER_HOUR: usize = 16_384;
pub(crate) const ROW_GROUP_ROWS: usize = 8_192;
/// Far enough in the past that every window of the longest run (1,152 hours) has ended:
/// the master plans a window only once its hour is over.
const START: &str = "2025-01-01T00";

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

/// `hours` hourly files of `ROWS_PER_HOUR` rows under a temporary folder (kept while the
/// returned guard lives), with few distinct ids.
pub(crate) async fn criteo_data(hours: usize) -> (tempfile::TempDir, PathBuf) {
    criteo_data_with(hours, 0.001).await
}

/// [`criteo_data`] with every column's cardinality scaled by `cardinality_scale`.
pub(crate) async fn criteo_data_with(
    hours: usize,
    cardinality_scale: f64,
) -> (tempfile::TempDir, PathBuf) {
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
        cardinality_scale,
        ..CriteoOptions::default()
    };
    primus_datagen::write::criteo(&location, &layout, ROWS_PER_HOUR, options)
        .await
        .expect("generate");
    (dir, data)
}

/// The Dataset over `data` and a DLRM batch Job `elastic` on it with `data_executors` data
/// executors, one trainer and two PS shards, changed by `change`.
pub(crate) fn resources(
    data: &Path,
    hours: usize,
    data_executors: u32,
    change: impl FnOnce(&mut JobSpec),
) -> [Resource; 2] {
    let start = primus_spec::time::parse_window_time(START).unwrap_or(0);
    let end_unix = start + 3_600 * hours as i64;
    let end = format!(
        "{}T{:02}",
        primus_spec::time::date_of(end_unix),
        end_unix.rem_euclid(86_400) / 3_600
    );
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
        .replicas(data_executors, 1, 2)
        .batch_size(1024)
        .with(change);
    [criteo.build(), trained.build()]
}

/// What one run measured.
pub(crate) struct Run {
    pub(crate) seconds: f64,
    pub(crate) cpu_utilisation: f64,
    pub(crate) data_executors: u32,
    pub(crate) samples: u64,
    pub(crate) status: Status,
}

/// A sandbox and a master running in this process, its executors as processes of the
/// binaries built beside this bench.
pub(crate) struct Cluster {
    pub(crate) sandbox: Sandbox,
    shutdown: Shutdown,
    master: tokio::task::JoinHandle<()>,
    pub(crate) master_addr: String,
}

impl Cluster {
    /// Starts a master with one task per row group, its settings changed by `faults`.
    pub(crate) async fn start(faults: impl FnOnce(&mut MasterSettings)) -> Self {
        let bin_dir = primus_benches::service_bin_dir();
        primus_benches::require_service_binaries(&bin_dir, "");
        let sandbox = Sandbox::start().await;
        let mut settings = sandbox.master_settings();
        settings.local.bin_dir = Some(bin_dir);
        settings.master.status_interval_ms = 500;
        // One task per row group, so that more executors have more to read at once.
        settings.master.planner.target_task_bytes = 64 << 10;
        faults(&mut settings);
        let master_addr = settings.server.grpc_addr.to_string();
        let shutdown = Shutdown::new();
        let run = primus_master::run(settings, shutdown.clone());
        let master = tokio::spawn(async move { run.await.expect("master stops cleanly") });
        Self {
            sandbox,
            shutdown,
            master,
            master_addr,
        }
    }

    pub(crate) async fn stop(self) {
        self.shutdown.trigger();
        self.master.await.expect("master task");
    }
}

/// Runs `resources` to Succeeded under a [`Cluster`] whose settings `faults` changes.
pub(crate) async fn run(resources: [Resource; 2], faults: impl FnOnce(&mut MasterSettings)) -> Run {
    let cluster = Cluster::start(faults).await;
    let (busy, total) = cpu_jiffies();
    let started = Instant::now();
    cluster.sandbox.apply(resources).await;
    let status = cluster
        .sandbox
        .wait_for_phase("elastic", Phase::Succeeded, Duration::from_secs(3600))
        .await;
    let seconds = started.elapsed().as_secs_f64();
    let (busy_after, total_after) = cpu_jiffies();
    cluster.stop().await;
    Run {
        seconds,
        cpu_utilisation: (busy_after - busy) as f64 / (total_after - total).max(1) as f64,
        data_executors: status.replicas.map_or(0, |r| r.data_executors),
        samples: status.progress.as_ref().map_or(0, |p| p.samples),
        status,
    }
}

/// Prints runs as a table: time to finish, data executors at the end, mean CPU, samples.
pub(crate) fn table(runs: &[(&str, &Run)]) {
    println!(
        "{:<32} {:>10} {:>14} {:>13} {:>10}",
        "run", "finished", "data executors", "mean CPU", "samples"
    );
    for (name, run) in runs {
        println!(
            "{name:<32} {:>8.1} s {:>14} {:>12.0}% {:>10}",
            run.seconds,
            run.data_executors,
            100.0 * run.cpu_utilisation,
            run.samples
        );
    }
}
