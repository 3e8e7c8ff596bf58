//! RecD end to end on `primus datagen sessions` data (user features in dedup group
//! `user`) at several DedupeFactors, each against the same rows without dedup:
//! - storage: time-ordered zstd Parquet (baseline) against the same rows clustered by
//!   session;
//! - reader: rows/s and wire bytes from Parquet to encoded minibatches, time-ordered files
//!   as KJT (baseline) against clustered files as IKJT (one core);
//! - trainer: the in-process trainer (the train bench's reference DLRM, embeddings dim 16)
//!   on the clustered rows' minibatches as KJT (baseline) and as IKJT, alternating, best
//!   of `PRIMUS_BENCH_ROUNDS` (default 2).
//!
//! `cargo bench -p primus-benches --bench dedup` (`PRIMUS_BENCH_SESSIONS` sessions per
//! configuration, default 12,000). The last line:
//! `dedup: trainer X.XXx, reader Y.YYx, storage Z.ZZx at DedupeFactor F` for RecD's
//! default-like configuration (16 samples per session, user features changing with
//! probability 0.3).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use primus_batch::{FeaturePipeline, Minibatch, Sparse, ipc};
use primus_datagen::sessions::{RowOrder, SessionLength, SessionOptions, feature_schema};
use primus_datagen::write::{Layout, Summary, sessions};
use primus_model::{Model, ModelLayout};
use primus_proto::v1::SourceKind;
use primus_spec::dataset::WindowUnit;
use primus_spec::job::{DenseSpec, ModelKind, ModelSpec, OptimizerSpec, TableSpec};
use primus_storage::Location;
use primus_storage::parquet::ReadOptions;
use primus_trainer::feed::{Feed, Incoming};
use primus_trainer::meter::{Report, Reporter};
use primus_trainer::store::LocalStore;
use primus_trainer::train::{Trainer, TrainerTotals};

const MINIBATCH: usize = 2048;

/// One configuration: samples per session and the probability that a session's user
/// features change between two of its samples.
struct Config {
    samples: u32,
    change: f64,
}

impl Config {
    /// RecD's model of the DedupeFactor of whole sessions.
    fn expected_factor(&self) -> f64 {
        let s = f64::from(self.samples);
        1.0 / (1.0 - (s - 1.0) / s * (1.0 - self.change))
    }

    fn options(&self, order: RowOrder) -> SessionOptions {
        SessionOptions {
            length: SessionLength::Fixed(self.samples),
            change_probability: self.change,
            order,
            items: 100_000,
            users: 1_000_000,
            ..SessionOptions::default()
        }
    }
}

struct Figures {
    factor: f64,
    storage: f64,
    reader: f64,
    trainer: f64,
}

fn model_spec() -> ModelSpec {
    ModelSpec {
        kind: ModelKind::Dlrm,
        tables: vec![TableSpec::new("ids", 16, OptimizerSpec::adagrad(0.05))],
        dense: DenseSpec::new(vec![512, 256, 64, 16], vec![512, 256, 1]),
    }
}

fn open(dir: &std::path::Path, name: &str) -> Location {
    let path = dir.join(name);
    primus_storage::open(path.to_str().expect("utf-8"), &Default::default()).expect("location")
}

async fn write(
    location: &Location,
    sessions_per_window: usize,
    options: SessionOptions,
) -> Summary {
    let layout = Layout {
        unit: WindowUnit::Hourly,
        start_unix_s: primus_spec::time::parse_window_time("2026-11-01T00").expect("start"),
        windows: 1,
        files_per_window: 1,
        row_group_rows: 16_384,
    };
    sessions(location, &layout, sessions_per_window, options)
        .await
        .expect("sessions")
}

/// Every file's rows, read `MINIBATCH` at a time.
async fn records(location: &Location, pipeline: &FeaturePipeline) -> Vec<RecordBatch> {
    let options = ReadOptions {
        columns: Some(pipeline.columns()),
        batch_size: MINIBATCH,
        ..Default::default()
    };
    let mut records = Vec::new();
    for file in location.list("").await.expect("list") {
        let read = primus_storage::parquet::read(location, &file.location, &options)
            .await
            .expect("open");
        records.extend(read.try_collect::<Vec<_>>().await.expect("read"));
    }
    records
}

/// Parquet to encoded minibatches: rows/s and wire bytes.
async fn read(location: &Location, pipeline: &FeaturePipeline, grouped: bool) -> (f64, usize) {
    let started = Instant::now();
    let (mut rows, mut bytes) = (0, 0);
    for record in records(location, pipeline).await {
        let mut minibatch = pipeline.minibatch(&record).expect("minibatch");
        if grouped {
            minibatch = minibatch.grouped(pipeline.groups()).expect("group");
        }
        rows += minibatch.rows();
        bytes += ipc::encode(&minibatch).expect("encode").len();
    }
    (rows as f64 / started.elapsed().as_secs_f64(), bytes)
}

struct Quiet;

impl Reporter for Quiet {
    async fn report(&self, _report: &Report) {}
    async fn aligned(&self, _checkpoint_id: u64, _totals: &TrainerTotals) {}
}

/// The in-process trainer's samples/s over `batches`.
async fn train(layout: &ModelLayout, batches: Vec<Minibatch>) -> f64 {
    let spec = model_spec();
    let store =
        Arc::new(LocalStore::new(&layout.ps_tables(), &spec.dense.optimizer, 0).expect("store"));
    let model = Model::new(layout.clone()).expect("a model of the layout");
    let mut trainer = Trainer::start(model, store, 0, 1, 10_000)
        .await
        .expect("trainer");
    let samples: usize = batches.iter().map(Minibatch::rows).sum();
    let stream = futures::stream::iter(batches.into_iter().map(|b| {
        Ok(Feed::batch(Incoming::new(
            b,
            SourceKind::Batch,
            "sessions",
            &Default::default(),
        )))
    }));
    let started = Instant::now();
    trainer
        .train(stream.boxed(), Duration::from_secs(60), &Quiet)
        .await
        .expect("train");
    samples as f64 / started.elapsed().as_secs_f64()
}

fn dedupe_factor(batches: &[Minibatch]) -> f64 {
    let (mut rows, mut unique) = (0, 0);
    for batch in batches {
        if let Sparse::Grouped(ikjt) = &batch.sparse {
            rows += ikjt.rows;
            unique += ikjt.groups.iter().map(|g| g.unique_rows()).sum::<usize>();
        }
    }
    rows as f64 / unique.max(1) as f64
}

async fn measure(config: &Config, sessions_per_window: usize, rounds: usize) -> Figures {
    let dir = tempfile::tempdir().expect("temp dir");
    let (time, clustered) = (open(dir.path(), "time"), open(dir.path(), "clustered"));
    let written = write(&time, sessions_per_window, config.options(RowOrder::Time)).await;
    let packed = write(
        &clustered,
        sessions_per_window,
        config.options(RowOrder::Clustered),
    )
    .await;
    let schema = feature_schema("ids");
    let pipeline = FeaturePipeline::new(&schema);

    let (plain_rate, plain_bytes) = read(&time, &pipeline, false).await;
    let (dedup_rate, dedup_bytes) = read(&clustered, &pipeline, true).await;

    let jagged: Vec<Minibatch> = (records(&clustered, &pipeline).await.iter())
        .map(|r| pipeline.minibatch(r).expect("minibatch"))
        .collect();
    let grouped: Vec<Minibatch> = (jagged.iter())
        .map(|b| b.grouped(pipeline.groups()).expect("group"))
        .collect();
    let factor = dedupe_factor(&grouped);
    let layout = ModelLayout::new(&model_spec(), &schema).expect("layout");
    let (mut plain_train, mut dedup_train) = (0.0_f64, 0.0_f64);
    for _ in 0..rounds {
        plain_train = plain_train.max(train(&layout, jagged.clone()).await);
        dedup_train = dedup_train.max(train(&layout, grouped.clone()).await);
    }
    let rows = written.rows as f64;
    println!(
        "{} samples per session, user features change with p {}: DedupeFactor {factor:.2} in {MINIBATCH}-row minibatches (RecD's model {:.2}), {} rows",
        config.samples,
        config.change,
        config.expected_factor(),
        written.rows
    );
    println!(
        "  storage: time-ordered {:.2} MiB (baseline) vs clustered {:.2} MiB: {:.2}x",
        written.bytes as f64 / 1_048_576.0,
        packed.bytes as f64 / 1_048_576.0,
        written.bytes as f64 / packed.bytes as f64
    );
    println!(
        "  reader: time-ordered KJT {plain_rate:.0} rows/s, {:.0} wire bytes/row (baseline) vs clustered IKJT {dedup_rate:.0} rows/s, {:.0} bytes/row: {:.2}x rows/s, {:.2}x fewer bytes",
        plain_bytes as f64 / rows,
        dedup_bytes as f64 / rows,
        dedup_rate / plain_rate,
        plain_bytes as f64 / dedup_bytes as f64
    );
    println!(
        "  trainer: KJT {plain_train:.0} samples/s (baseline) vs IKJT {dedup_train:.0} samples/s: {:.2}x",
        dedup_train / plain_train
    );
    Figures {
        factor,
        storage: written.bytes as f64 / packed.bytes as f64,
        reader: dedup_rate / plain_rate,
        trainer: dedup_train / plain_train,
    }
}

#[tokio::main]
async fn main() {
    let sessions_per_window: usize = primus_benches::env_or("PRIMUS_BENCH_SESSIONS", 12_000);
    let rounds: usize = primus_benches::env_or("PRIMUS_BENCH_ROUNDS", 2).max(1);
    let configs = [
        Config {
            samples: 16,
            change: 0.3,
        },
        Config {
            samples: 4,
            change: 0.5,
        },
        Config {
            samples: 16,
            change: 0.05,
        },
    ];
    let mut figures = Vec::new();
    for config in &configs {
        figures.push(
            measure(
                config,
                sessions_per_window / config.samples as usize * 16,
                rounds,
            )
            .await,
        );
    }
    println!("RecD on production data: trainer 2.48x, reader 1.79x, storage 3.71x");
    let main = &figures[0];
    println!(
        "dedup: trainer {:.2}x, reader {:.2}x, storage {:.2}x at DedupeFactor {:.2}",
        main.trainer, main.reader, main.storage, main.factor
    );
}
