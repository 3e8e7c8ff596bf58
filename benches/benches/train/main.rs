//! Training figures: the reference DLRM (13 dense + 26 sparse features, dim 16,
//! bottom 512-256-64-16, top 512-256-1, batch 2048) on the same Criteo-like rows, three
//! ways in one run, each with samples/s, the share of time per stage and the progressive
//! AUC next to the data's best achievable AUC:
//!
//! 1. baseline: the dense network's forward/backward alone (no lookups, pooling, pushes);
//! 2. in-process: the trainer's own step loop against tables and a dense store in this
//!    process (lookup, pooling, burn forward/backward, push); then the same with pooling and
//!    its backward on a GPU (`trainer.device: cuda`; the dense network stays on the CPU),
//!    printed as SKIPPED where no GPU is present;
//! 3. through the services: NATS and Redis (testkit), the API server and the master in
//!    this process; the master starts the data executor, two PS shards and the trainer as
//!    processes from the release binaries, which read the rows as hourly Parquet files.
//!    Its ratio to (2) is the overhead of distribution. Everything shares this machine's
//!    cores;
//! 4. the same through the services with the Job's hot set on (HypeReca 2FP, size chosen
//!    by the trainer's cost model): the rows it replicates skip the PS lookups.
//!
//! `cargo build --release --bins && cargo bench -p primus-benches --bench train`
//! (PRIMUS_BENCH_ROWS, default 204,800; PRIMUS_BENCH_MODEL=small for a quick run;
//! PRIMUS_BENCH_SERVICES=0 skips (3) and needs no binaries).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use primus_batch::{FeaturePipeline, Minibatch};
use primus_bus::{Bus, Subscription};
use primus_config::StorageSettings;
use primus_datagen::criteo::CriteoOptions;
use primus_datagen::write::Layout;
use primus_harness::Sandbox;
use primus_harness::resources::{dataset, hourly, job, parquet};
use primus_model::{DenseDevice, Inputs, Model, ModelLayout, ParamSet, Tower};
use primus_proto::v1::{MetricsReport, SourceKind};
use primus_service::Shutdown;
use primus_spec::Resource;
use primus_spec::dataset::WindowUnit;
use primus_spec::job::{
    DenseSpec, Device, ModelKind, ModelSpec, OptimizerSpec, TableSpec, TrainingMode,
};
use primus_spec::status::Phase;
use primus_storage::Location;
use primus_storage::parquet::ReadOptions;
use primus_trainer::device::EmbeddingDevice;
use primus_trainer::store::LocalStore;
use primus_trainer::train::{Feed, Incoming, Report, Reporter, Trainer};

const JOB: &str = "train-bench";
const HOURS: usize = 4;
const EVAL_WINDOW: u32 = 100_000;
const CARDINALITY_SCALE: f64 = 0.001;
const START: &str = "2026-11-01T00";

/// The reference DLRM or a small one for quick runs.
fn model_spec(size: &str) -> ModelSpec {
    let (bottom, top) = match size {
        "reference" => (vec![512, 256, 64, 16], vec![512, 256, 1]),
        _ => (vec![64, 16], vec![64, 1]),
    };
    ModelSpec {
        kind: ModelKind::Dlrm,
        tables: vec![TableSpec::new(
            "categorical",
            16,
            OptimizerSpec::adagrad(0.05),
        )],
        dense: DenseSpec::new(bottom, top),
    }
}

/// Time-weighted shares of the trainer's stages over its reports.
#[derive(Debug, Default)]
struct Stages {
    samples: u64,
    seconds: f64,
    lookup: f64,
    compute: f64,
    push: f64,
    auc: Option<f64>,
    /// The latest hot-set size and share of accesses it served.
    hot: Option<(f64, f64)>,
}

impl Stages {
    /// One report: `samples` trained in total, the interval's rate and shares.
    fn add(&mut self, samples: u64, rate: f64, shares: [f64; 3], auc: Option<f64>) {
        let interval = samples.saturating_sub(self.samples);
        self.samples = self.samples.max(samples);
        self.auc = auc.or(self.auc);
        if interval == 0 || rate <= 0.0 {
            return;
        }
        let seconds = interval as f64 / rate;
        self.seconds += seconds;
        self.lookup += shares[0] * seconds;
        self.compute += shares[1] * seconds;
        self.push += shares[2] * seconds;
    }

    fn rate(&self) -> f64 {
        self.samples as f64 / self.seconds.max(1e-9)
    }

    /// Compute and push run one after the other in the step loop; the lookups of the next
    /// minibatch run beside them (prefetched), so their share overlaps the others.
    fn shares(&self) -> String {
        let of = |s: f64| 100.0 * s / self.seconds.max(1e-9);
        let (compute, push) = (of(self.compute), of(self.push));
        format!(
            "step loop: compute {compute:.0}%, push {push:.0}%, rest {:.0}% (dense pulls, waiting for the next looked-up minibatch); lookups {:.0}% (prefetched beside compute)",
            (100.0 - compute - push).max(0.0),
            of(self.lookup),
        )
    }
}

#[derive(Default)]
struct Collect(Mutex<Stages>);

impl Reporter for Collect {
    async fn report(&self, report: &Report) {
        let shares = [report.lookup_share, report.compute_share, report.push_share];
        let mut stages = self.0.lock().expect("stages");
        stages.add(
            report.samples,
            report.samples_per_second,
            shares,
            report.evaluation.auc,
        );
    }

    async fn aligned(&self, _checkpoint_id: u64, _steps: u64, _samples: u64) {}
}

fn layout(rows_per_hour: usize) -> Layout {
    Layout {
        unit: WindowUnit::Hourly,
        start_unix_s: primus_spec::time::parse_window_time(START).expect("start"),
        windows: HOURS,
        files_per_window: 1,
        row_group_rows: rows_per_hour.clamp(1, 16_384),
    }
}

/// The Parquet files under `location` (the rows the services read), in partition order,
/// as minibatches of `batch` (each file's last one may be shorter).
async fn minibatches(location: &Location, batch: usize) -> Vec<Minibatch> {
    let pipeline = FeaturePipeline::new(&primus_datagen::criteo::feature_schema("categorical"));
    let options = ReadOptions {
        columns: Some(pipeline.columns()),
        batch_size: batch,
        ..Default::default()
    };
    let mut files = location.list("").await.expect("list the data");
    files.sort_by(|a, b| a.location.cmp(&b.location));
    let mut batches = Vec::new();
    for file in files {
        let records: Vec<RecordBatch> =
            primus_storage::parquet::read(location, &file.location, &options)
                .await
                .expect("open a data file")
                .try_collect()
                .await
                .expect("read a data file");
        for record in &records {
            batches.push(pipeline.minibatch(record).expect("minibatch"));
        }
    }
    batches
}

fn options() -> CriteoOptions {
    CriteoOptions {
        cardinality_scale: CARDINALITY_SCALE,
        ..CriteoOptions::default()
    }
}

#[tokio::main]
async fn main() {
    let rows: usize = primus_benches::env_or("PRIMUS_BENCH_ROWS", 204_800);
    let batch: usize = primus_benches::env_or("PRIMUS_BENCH_BATCH", 2048);
    let size = std::env::var("PRIMUS_BENCH_MODEL").unwrap_or_else(|_| "reference".into());
    let services = std::env::var("PRIMUS_BENCH_SERVICES").map_or(true, |v| v != "0");
    let bin_dir = primus_benches::service_bin_dir();
    if services {
        primus_benches::require_service_binaries(&bin_dir, " (or PRIMUS_BENCH_SERVICES=0)");
    }
    let rows_per_hour = rows.div_ceil(HOURS);
    let spec = model_spec(&size);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("criteo");
    let location = primus_storage::open(data.to_str().expect("utf-8"), &StorageSettings::default())
        .expect("location");
    let summary =
        primus_datagen::write::criteo(&location, &layout(rows_per_hour), rows_per_hour, options())
            .await
            .expect("generate");
    let best = summary.best_auc.expect("both classes");
    println!(
        "DLRM ({size}: bottom {:?}, top {:?}, dim 16), {} Criteo-like rows (cardinality scale {CARDINALITY_SCALE}) in minibatches of {batch}, best achievable AUC {best:.4}; AUC is progressive over the last {EVAL_WINDOW} samples",
        spec.dense.bottom,
        spec.dense.top,
        rows_per_hour * HOURS
    );

    let batches = minibatches(&location, batch).await;
    let schema = primus_datagen::criteo::feature_schema("categorical");
    let model_layout = ModelLayout::new(&spec, &schema).expect("layout");
    let baseline = dense_only(&model_layout, &batches[..batches.len().min(20)]);
    println!("baseline, dense forward/backward alone: {baseline:.0} samples/s");
    let cpu = (EmbeddingDevice::Cpu, Model::new(model_layout.clone()));
    let in_process = train_in_process(&spec, batches.clone(), cpu).await;
    println!(
        "in-process trainer: {:.0} samples/s ({:.2}x of the dense network alone), AUC {:.4} vs best {best:.4}; {}",
        in_process.rate(),
        in_process.rate() / baseline,
        in_process.auc.unwrap_or(f64::NAN),
        in_process.shares()
    );
    match EmbeddingDevice::open(Device::Cuda, 0) {
        Ok(gpu) => {
            // The dense network too where this build has burn's CUDA backend
            // (`--features primus-trainer/cuda`).
            let model = Model::on(model_layout.clone(), DenseDevice::Cuda(0))
                .unwrap_or_else(|_| Model::new(model_layout.clone()));
            let dense = model.device();
            let on_gpu = train_in_process(&spec, batches, (gpu, model)).await;
            println!(
                "in-process trainer, pooling on the GPU, dense network on {dense:?}: {:.0} samples/s ({:.2}x the CPU trainer), AUC {:.4} vs best {best:.4}; {}",
                on_gpu.rate(),
                on_gpu.rate() / in_process.rate(),
                on_gpu.auc.unwrap_or(f64::NAN),
                on_gpu.shares()
            );
        }
        Err(e) => println!("in-process trainer, pooling on the GPU: SKIPPED ({e:#})"),
    }
    if !services {
        return;
    }
    let (through, wall) = train_through_services(&bin_dir, &data, &spec, batch, false).await;
    println!(
        "through the services (1 data executor, 2 PS shards, 1 trainer): {:.0} samples/s while training ({:.0} over the Job's {:.1} s from apply to Succeeded), AUC {:.4} vs best {best:.4}; {}",
        through.rate(),
        through.samples as f64 / wall,
        wall,
        through.auc.unwrap_or(f64::NAN),
        through.shares()
    );
    println!(
        "overhead of distribution: the services train at {:.2}x the in-process rate",
        through.rate() / in_process.rate()
    );
    let (hot, wall) = train_through_services(&bin_dir, &data, &spec, batch, true).await;
    let (rows, share) = hot.hot.unwrap_or_default();
    println!(
        "through the services with a hot set of {rows:.0} rows (chosen by the cost model; {:.1}% of accesses at the end): {:.0} samples/s while training ({:.0} over {:.1} s), AUC {:.4} vs best {best:.4}; {}; {:.2}x the all-PS services run",
        100.0 * share,
        hot.rate(),
        hot.samples as f64 / wall,
        wall,
        hot.auc.unwrap_or(f64::NAN),
        hot.shares(),
        hot.rate() / through.rate()
    );
}

async fn train_in_process(
    spec: &ModelSpec,
    batches: Vec<Minibatch>,
    (device, model): (EmbeddingDevice, Model),
) -> Stages {
    let tables = model.layout().ps_tables();
    let store = Arc::new(LocalStore::new(&tables, &spec.dense.optimizer, 0).expect("store"));
    let mut trainer = Trainer::start(model, store, 0, 1, EVAL_WINDOW as usize)
        .await
        .expect("trainer")
        .on_device(device);
    let stream = futures::stream::iter(batches.into_iter().map(|b| {
        Ok(Feed::Batch(Incoming::new(
            b,
            SourceKind::Batch,
            "generated",
            &Default::default(),
        )))
    }));
    let collect = Collect::default();
    trainer
        .train(stream.boxed(), Duration::from_secs(2), &collect)
        .await
        .expect("train");
    collect.report(&trainer.meter.report()).await;
    collect.0.into_inner().expect("stages")
}

/// Samples/s of the dense network's forward/backward alone on pooled constants.
fn dense_only(layout: &ModelLayout, batches: &[Minibatch]) -> f64 {
    let model = Model::new(layout.clone());
    let params = ParamSet::init(layout, 0);
    let started = Instant::now();
    let mut samples = 0;
    for batch in batches {
        let embedded = vec![0.01f32; batch.rows() * layout.embedding_width];
        let inputs = Inputs {
            rows: batch.rows(),
            dense: &batch.dense.values,
            embedded: &embedded,
            wide: &[],
        };
        model
            .train_step(&params, &inputs, &batch.labels, Tower::Memory)
            .expect("step");
        samples += batch.rows();
    }
    samples as f64 / started.elapsed().as_secs_f64()
}

/// Runs the Job through the services; returns the trainer's reports folded into stages
/// (AUC from the Job's status) and the seconds from apply to Succeeded.
async fn train_through_services(
    bin_dir: &Path,
    data: &Path,
    spec: &ModelSpec,
    batch: usize,
    hot_set: bool,
) -> (Stages, f64) {
    let sandbox = Sandbox::start().await;
    // The master in this process; its executors are processes of the release binaries.
    let mut settings = sandbox.master_settings();
    settings.local.bin_dir = Some(bin_dir.to_path_buf());
    let shutdown = Shutdown::new();
    let master = tokio::spawn(primus_master::run(settings, shutdown.clone()));

    let bus = Bus::connect(&primus_config::NatsSettings {
        url: sandbox.nats.url(),
        ..Default::default()
    })
    .await
    .expect("nats");
    let subject = bus
        .subjects()
        .metrics(JOB, "trainer", primus_bus::subjects::ANY)
        .expect("subject");
    let reports = bus
        .subscribe::<MetricsReport>(subject)
        .await
        .expect("subscribe");
    let stages = Arc::new(Mutex::new(Stages::default()));
    let folding = tokio::spawn(fold_reports(stages.clone(), reports));

    let started = Instant::now();
    sandbox.apply(resources(data, spec, batch, hot_set)).await;
    let status = sandbox
        .wait_for_phase(JOB, Phase::Succeeded, Duration::from_secs(3600))
        .await;
    let wall = started.elapsed().as_secs_f64();
    let progress = status.progress.expect("trainer progress");
    // The trainer's last report may still be on its way.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stages.lock().expect("stages").samples < progress.samples && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    folding.abort();
    shutdown.trigger();
    master
        .await
        .expect("master task")
        .expect("master stops cleanly");
    let mut stages = std::mem::take(&mut *stages.lock().expect("stages"));
    assert_eq!(
        stages.samples, progress.samples,
        "every trainer report arrived"
    );
    stages.auc = progress.auc;
    (stages, wall)
}

async fn fold_reports(stages: Arc<Mutex<Stages>>, mut reports: Subscription<MetricsReport>) {
    while let Some(Ok(received)) = reports.next().await {
        let report = received.message;
        let gauge = |name: &str| report.gauges.get(name).copied();
        let shares =
            ["lookup_share", "compute_share", "push_share"].map(|n| gauge(n).unwrap_or(0.0));
        let rate = gauge("samples_per_second").unwrap_or(0.0);
        let mut stages = stages.lock().expect("stages");
        stages.add(report.samples, rate, shares, gauge("auc"));
        if let (Some(rows), Some(share)) = (gauge("hot_rows"), gauge("hot_share")) {
            stages.hot = Some((rows, share));
        }
    }
}

/// The Dataset over the hourly Parquet files and the Job training `spec` on it.
fn resources(data: &Path, spec: &ModelSpec, batch: usize, hot_set: bool) -> [Resource; 2] {
    let end = format!("2026-11-01T{HOURS:02}");
    let criteo = dataset("criteo")
        .schema(primus_datagen::criteo::feature_schema("categorical"))
        .stream(
            "clicks",
            hourly(START, Some(&end)),
            vec![parquet("criteo", data.display())],
        );
    let trained = job(JOB, "criteo", TrainingMode::Batch, spec.clone())
        .replicas(1, 1, 2)
        .batch_size(batch as u32)
        .with(|spec| {
            spec.training.eval_window = EVAL_WINDOW;
            spec.training.hot_set.enabled = hot_set;
        });
    [criteo.build(), trained.build()]
}
