//! Training figures: the reference DLRM (13 dense + 26 sparse features, dim 16,
//! bottom 512-256-64-16, top 512-256-1, batch 2048) on the same Criteo-like rows, three
//! ways in one run, each with samples/s, the share of time per stage and the progressive
//! AUC next to the data's best achievable AUC:
//!
//! 1. baseline: the dense network's forward/backward alone (no lookups, pooling, pushes);
//! 2. in-process: the trainer's own step loop against tables and a dense store in this
//!    process (lookup, pooling, forward/backward, push); then the same with pooling and
//!    its backward on a GPU (`trainer.device: cuda`) and the dense network on cuBLAS,
//!    printed as SKIPPED where no GPU is present;
//!    the peer, right after on the same minibatches and as many threads as cores: TorchRec's
//!    DLRM of the same shape, optimizers and initialisation ([`peer`]), where
//!    `benches/peer/install-torchrec.sh` installed it (said plainly where it did not);
//! 3. through the services: NATS and Redis (testkit), the API server and the master in
//!    this process; the master starts the data executor, two PS shards and the trainer as
//!    processes from the release binaries, which read the rows as hourly Parquet files.
//!    Its ratio to (2) is the overhead of distribution. Everything shares this machine's
//!    cores. (2), the peer and (3) run in turn, PRIMUS_BENCH_ROUNDS times (default 3), and
//!    each side's best round is compared, so the machine's noise weighs on all alike; the
//!    ratio of (3) to (2) is printed round by round too, each pair run back to back, with
//!    the CPU time a minibatch costs each way, per process ([`cpu`]): where the cores are
//!    the limit, in-process CPU over the services' CPU is the rate ratio they allow;
//! 4. the same through the services with the Job's hot set on (HypeReca 2FP, size chosen
//!    by the trainer's cost model): the rows it replicates skip the PS lookups.
//!
//! `cargo build --release --bins && cargo bench -p primus-benches --bench train`
//! (PRIMUS_BENCH_ROWS, default 204,800; PRIMUS_BENCH_MODEL=small for a quick run;
//! PRIMUS_BENCH_SERVICES=0 skips (3) and needs no binaries). The last line:
//! `train: in-process X samples/s = R.RRx TorchRec (AUC a vs b), services S.SSx in-process`,
//! and where a GPU is present, after it: `train (cuda): N samples/s = Rx the CPU trainer,
//! AUC a vs b` (the GPU trainer against the in-process CPU trainer).
//! The machine's load average is printed beside each figure: the peer's OpenMP threads
//! spin, and on a busy machine it slows several times over.
#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

mod cpu;
mod peer;

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
use primus_model::{DenseDevice, Inputs, Model, ModelLayout, ParamSet, StepTimes, Tower};
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
use primus_trainer::feed::{Feed, Incoming};
use primus_trainer::meter::{Report, Reporter};
use primus_trainer::store::LocalStore;
use primus_trainer::train::{Trainer, TrainerTotals};

use peer::PeerFigures;

const JOB: &str = "train-bench";
const HOURS: usize = 4;
const EVAL_WINDOW: u32 = 100_000;
const CARDINALITY_SCALE: f64 = 0.001;
const START: &str = "2026-11-01T00";
/// Minibatches the dense network alone is timed on (after one to warm up).
const DENSE_RUNS: usize = 20;

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
    /// The compute's parts, summed (in-process trainers report them).
    times: StepTimes,
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
            "step loop: compute {compute:.0}%, push {push:.0}% (with the next minibatch's rows where no hot set is on), rest {:.0}% (dense pulls, waiting for the next minibatch); lookups {:.0}% (the prefetcher's, beside compute){}",
            (100.0 - compute - push).max(0.0),
            of(self.lookup),
            self.compute_parts(),
        )
    }

    /// The compute's parts as shares of it, where the trainer reported them.
    fn compute_parts(&self) -> String {
        let t = &self.times;
        let total = (t.pooling + t.dense + t.scatter).as_secs_f64();
        if total <= 0.0 {
            return String::new();
        }
        let of = |d: Duration| 100.0 * d.as_secs_f64() / total;
        let copies = match t.dense_copies.is_zero() {
            true => String::new(),
            false => format!(" (copies to and from the GPU {:.0}%)", of(t.dense_copies)),
        };
        format!(
            "; compute: pooling {:.0}%, dense network {:.0}%{copies}, scatter {:.0}%",
            of(t.pooling),
            of(t.dense),
            of(t.scatter),
        )
    }
}

#[derive(Default)]
struct Collect(Mutex<Stages>);

impl Reporter for Collect {
    async fn report(&self, report: &Report) {
        let shares = [report.lookup_share, report.compute_share, report.push_share];
        let mut stages = self.0.lock().expect("stages");
        stages.times += &report.step_times;
        stages.add(
            report.samples,
            report.samples_per_second,
            shares,
            report.evaluation.auc,
        );
    }

    async fn aligned(&self, _checkpoint_id: u64, _totals: &TrainerTotals) {}
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
#[expect(clippy::disallowed_methods, reason = "a bench's knobs")]
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
    let dense = dense_only(&model_layout, &batches[..batches.len().min(DENSE_RUNS)]);
    let baseline = 1000.0 * batch as f64 / dense.step_ms;
    println!(
        "baseline, dense network alone: forward {:.1} ms, forward+backward {:.1} ms per minibatch (median of {DENSE_RUNS}), {baseline:.0} samples/s",
        dense.forward_ms, dense.step_ms
    );
    // Each side `rounds` times, alternating, best of each: the machine's noise shows as the
    // spread between rounds.
    let rounds: usize = primus_benches::env_or("PRIMUS_BENCH_ROUNDS", 3).max(1);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut ours: Vec<Stages> = Vec::with_capacity(rounds);
    let mut theirs: Vec<PeerFigures> = Vec::with_capacity(rounds);
    let mut distributed: Vec<(Stages, f64)> = Vec::with_capacity(rounds);
    let mut cpu_ratios: Vec<f64> = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        let on_cpu = (
            EmbeddingDevice::Cpu,
            Model::new(model_layout.clone()).expect("a model of the layout"),
        );
        let cpu_before = cpu::own_seconds();
        let run = train_in_process(&spec, batches.clone(), on_cpu).await;
        let in_process_cpu = cpu::own_seconds()
            .zip(cpu_before)
            .map(|(end, start)| end - start);
        println!(
            "round {round}: in-process trainer: {:.0} samples/s ({:.2}x of the dense network alone), AUC {:.4} vs best {best:.4}; {}; load {}",
            run.rate(),
            run.rate() / baseline,
            run.auc.unwrap_or(f64::NAN),
            run.shares(),
            load_average()
        );
        ours.push(run);
        match peer::run(&spec, &batches, EVAL_WINDOW, cores) {
            Some(peer) => {
                println!(
                    "round {round}: peer, TorchRec ({}): {:.0} samples/s, AUC {:.4}; its dense network alone: forward {:.1} ms, forward+backward {:.1} ms per minibatch; load {}",
                    peer.describe,
                    peer.samples_per_second,
                    peer.auc,
                    peer.dense_forward_ms,
                    peer.dense_step_ms,
                    load_average()
                );
                theirs.push(peer);
            }
            None if round == 1 => println!(
                "peer, TorchRec: NOT INSTALLED, not run (benches/peer/install-torchrec.sh installs it into .tools/torchrec)"
            ),
            None => {}
        }
        if services {
            let children = cpu::ChildrenCpu::start();
            let (through, wall) =
                train_through_services(&bin_dir, &data, &spec, batch, false).await;
            let services_cpu = children.stop();
            println!(
                "round {round}: through the services (1 data executor, 2 PS shards, 1 trainer): {:.0} samples/s while training ({:.0} over the Job's {wall:.1} s from apply to Succeeded), AUC {:.4} vs best {best:.4}; {}; load {}",
                through.rate(),
                through.samples as f64 / wall,
                through.auc.unwrap_or(f64::NAN),
                through.shares(),
                load_average()
            );
            if let Some(in_process_cpu) = in_process_cpu {
                let minibatches = |samples: u64| samples as f64 / batch as f64;
                let alone = 1000.0 * in_process_cpu / minibatches(ours[round - 1].samples);
                let (parts, total) =
                    cpu::per_minibatch(&services_cpu, minibatches(through.samples));
                println!(
                    "round {round}: CPU a minibatch: in-process {alone:.1} ms; through the services {total:.1} ms ({parts}): {:.2}x, the services' rate against in-process where the cores are the limit",
                    alone / total
                );
                cpu_ratios.push(alone / total);
            }
            distributed.push((through, wall));
        }
    }
    // Each round's services run against the in-process run just before it: a shared
    // machine's speed drifts over minutes, and the two runs of a round see about the same.
    let paired: Vec<f64> = ours
        .iter()
        .zip(&distributed)
        .map(|(alone, (through, _))| through.rate() / alone.rate())
        .collect();
    let in_process = best_of(ours, Stages::rate).expect("at least one round");
    let peer = best_of(theirs, |p| p.samples_per_second);
    let peak = primus_model::peak::fma_peak_gflops(cores);
    let flops = step_flops(&model_layout, batch);
    let share = |ms: f64| format!("{:.0}% of peak", 100.0 * flops / (ms / 1000.0) / 1e9 / peak);
    let whole_ms = 1000.0 * batch as f64 / in_process.rate();
    println!(
        "FMA peak {peak:.0} GFLOP/s ({cores} cores, measured); a minibatch's dense forward+backward is {:.2} GFLOP: ours {:.1} ms ({}), whole step {whole_ms:.1} ms ({})",
        flops / 1e9,
        dense.step_ms,
        share(dense.step_ms),
        share(whole_ms)
    );
    if let Some(peer) = &peer {
        let peer_whole_ms = 1000.0 * batch as f64 / peer.samples_per_second;
        println!(
            "against TorchRec: dense forward {:.1} vs {:.1} ms, forward+backward {:.1} vs {:.1} ms ({}), whole step {whole_ms:.1} vs {peer_whole_ms:.1} ms ({})",
            dense.forward_ms,
            peer.dense_forward_ms,
            dense.step_ms,
            peer.dense_step_ms,
            share(peer.dense_step_ms),
            share(peer_whole_ms)
        );
    }
    let on_gpu_line = match EmbeddingDevice::open(Device::Cuda, 0) {
        Ok(gpu) => {
            // The dense network too: the DLRM graph on cuBLAS (MTRM's would need the
            // `primus-trainer/cuda` build; the reference model is DLRM).
            let model =
                Model::on(model_layout.clone(), DenseDevice::Cuda(0)).unwrap_or_else(|_| {
                    Model::new(model_layout.clone()).expect("a model of the layout")
                });
            let dense = model.device();
            let on_gpu = train_in_process(&spec, batches, (gpu, model)).await;
            println!(
                "in-process trainer, pooling on the GPU, dense network on {dense:?}: {:.0} samples/s ({:.2}x the CPU trainer), AUC {:.4} vs best {best:.4}; {}",
                on_gpu.rate(),
                on_gpu.rate() / in_process.rate(),
                on_gpu.auc.unwrap_or(f64::NAN),
                on_gpu.shares()
            );
            Some(format!(
                "train (cuda): {:.0} samples/s = {:.2}x the CPU trainer, AUC {:.4} vs {:.4}",
                on_gpu.rate(),
                on_gpu.rate() / in_process.rate(),
                on_gpu.auc.unwrap_or(f64::NAN),
                in_process.auc.unwrap_or(f64::NAN)
            ))
        }
        Err(e) => {
            println!("in-process trainer, pooling on the GPU: SKIPPED ({e:#})");
            None
        }
    };
    if !services {
        last_line(&in_process, peer.as_ref(), None);
        on_gpu_line.into_iter().for_each(|line| println!("{line}"));
        return;
    }
    let (through, wall) =
        best_of(distributed, |(run, _)| run.rate()).expect("a services run per round");
    println!(
        "through the services (1 data executor, 2 PS shards, 1 trainer), best of {rounds}: {:.0} samples/s while training ({:.0} over the Job's {:.1} s from apply to Succeeded), AUC {:.4} vs best {best:.4}; {}",
        through.rate(),
        through.samples as f64 / wall,
        wall,
        through.auc.unwrap_or(f64::NAN),
        through.shares()
    );
    println!(
        "overhead of distribution: the services train at {:.2}x the in-process rate (best against best); round by round {}",
        through.rate() / in_process.rate(),
        round_by_round(&paired)
    );
    if !cpu_ratios.is_empty() {
        println!(
            "CPU a minibatch, in-process against through the services: round by round {}",
            round_by_round(&cpu_ratios)
        );
    }
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
    last_line(&in_process, peer.as_ref(), Some(&through));
    on_gpu_line.into_iter().for_each(|line| println!("{line}"));
}

/// The bench's last line.
fn last_line(in_process: &Stages, peer: Option<&PeerFigures>, through: Option<&Stages>) {
    let against_peer = match peer {
        Some(peer) => format!(
            "{:.2}x TorchRec (AUC {:.4} vs {:.4})",
            in_process.rate() / peer.samples_per_second,
            in_process.auc.unwrap_or(f64::NAN),
            peer.auc
        ),
        None => "TorchRec NOT RUN (peer not installed)".into(),
    };
    let services = match through {
        Some(through) => format!("{:.2}x in-process", through.rate() / in_process.rate()),
        None => "NOT RUN (PRIMUS_BENCH_SERVICES=0)".into(),
    };
    println!(
        "train: in-process {:.0} samples/s = {against_peer}, services {services}",
        in_process.rate()
    );
}

/// The run with the highest `rate`.
fn best_of<T>(runs: Vec<T>, rate: impl Fn(&T) -> f64) -> Option<T> {
    runs.into_iter().max_by(|a, b| rate(a).total_cmp(&rate(b)))
}

/// The middle value (the mean of the two middle ones for an even count); NaN when empty.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `ratios` as `0.86x, 0.83x (median 0.85x)`.
fn round_by_round(ratios: &[f64]) -> String {
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}x")).collect();
    format!("{} (median {:.2}x)", each.join(", "), median(ratios))
}

/// The 1-minute load average, to judge whether the machine was quiet.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
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
        Ok(Feed::batch(Incoming::new(
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

/// Floating-point operations of one minibatch's dense forward and backward: per linear
/// layer, 2 x rows x inputs x outputs for the forward, the weights' gradient and the
/// inputs' gradient (none for the first bottom layer, whose inputs are data); and the dot
/// interaction's pairs, forward (one dot product each) and backward (two).
fn step_flops(layout: &ModelLayout, rows: usize) -> f64 {
    let spec = &layout.dense_spec;
    let mut products = 0.0;
    for (widths, inputs) in [(&spec.bottom, layout.dense_inputs), (&spec.top, 0)] {
        let vectors = layout.features.len() + 1;
        let dim = spec.bottom.last().copied().unwrap_or(0) as usize;
        let mut fan_in = if inputs > 0 {
            inputs
        } else {
            dim + vectors * (vectors - 1) / 2
        };
        for (i, width) in widths.iter().enumerate() {
            let passes = if i == 0 && inputs > 0 { 2.0 } else { 3.0 };
            products += passes * (fan_in * *width as usize) as f64;
            fan_in = *width as usize;
        }
    }
    let vectors = layout.features.len() + 1;
    let pairs = (vectors * (vectors - 1) / 2) as f64;
    let dim = layout.features.first().map_or(0, |f| f.dim) as f64;
    2.0 * rows as f64 * (products + 3.0 * pairs * dim)
}

/// The dense network alone on pooled constants, milliseconds per minibatch.
struct DenseTimes {
    forward_ms: f64,
    step_ms: f64,
}

/// Median forward and forward+backward times of the dense network alone (no lookups,
/// pooling or optimizer) over `batches`, after one of each to warm up.
fn dense_only(layout: &ModelLayout, batches: &[Minibatch]) -> DenseTimes {
    let model = Model::new(layout.clone()).expect("a model of the layout");
    let params = ParamSet::init(layout, 0);
    let (mut forward, mut step) = (Vec::new(), Vec::new());
    for (i, batch) in batches.iter().enumerate() {
        let embedded = vec![0.01f32; batch.rows() * layout.embedding_width];
        let inputs = Inputs {
            rows: batch.rows(),
            dense: &batch.dense.values,
            embedded: &embedded,
            wide: &[],
        };
        let started = Instant::now();
        model
            .predict(&params, &inputs, Tower::Memory)
            .expect("predict");
        let predicted = Instant::now();
        model
            .train_step(&params, &inputs, &[&batch.labels], Tower::Memory)
            .expect("step");
        if i > 0 {
            forward.push(predicted - started);
            step.push(predicted.elapsed());
        }
    }
    let median_ms = |times: Vec<Duration>| {
        median(
            &times
                .iter()
                .map(|t| t.as_secs_f64() * 1000.0)
                .collect::<Vec<_>>(),
        )
    };
    DenseTimes {
        forward_ms: median_ms(forward),
        step_ms: median_ms(step),
    }
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
    // The sandbox ticks the master's status loop 10x as often as the product does, so that
    // tests react quickly; a training run is measured at the cadence a deployment has.
    settings.master.status_interval_ms = (primus_config::MasterSettings::default())
        .master
        .status_interval_ms;
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
