//! Serving freshness (Monolith Table 2): how much a serving copy gains from being
//! synced more often. Drift data from the Criteo-like generator (the hidden weights rotate
//! by `PRIMUS_BENCH_DRIFT` radians a day): 5 days of hourly windows trained as batch, then
//! 2 days as a stream. On the stream, each minibatch is first scored by the serving copy
//! and then trained on; the serving copy takes the trainer's touched rows and dense
//! parameters every `interval` (a minibatch, an hour, 6 hours, a day of data, or never:
//! the batch model alone, the baseline). Printed: AUC of the serving copy's scores on each
//! stream day, with the data's best achievable AUC.
//!
//! A second table trains MTRM (memory tower on the batch days, adapt tower on the stream,
//! Primus Alg. 1) and a single-tower DLRM on the same mixture, each served fresh (synced
//! every minibatch); Primus Table 6 reports +0.03% to +0.07% AUC for MTRM.
//!
//! `cargo bench -p primus-benches --bench freshness` (PRIMUS_BENCH_ROWS_PER_HOUR, default
//! 1024; PRIMUS_BENCH_DRIFT, default 0.6).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use primus_batch::{FeaturePipeline, Minibatch};
use primus_datagen::criteo::{Criteo, CriteoOptions};
use primus_model::pooling::{BatchKeys, CpuKernels};
use primus_model::{Inputs, Model, ModelLayout, ParamSet, ParamTensor, Tower};
use primus_proto::v1::SourceKind;
use primus_spec::job::{DenseSpec, ModelKind, ModelSpec, OptimizerSpec, TableSpec};
use primus_trainer::feed::Incoming;
use primus_trainer::store::{LocalStore, ParameterStore};
use primus_trainer::train::Trainer;

const TABLE: &str = "categorical";
const DIM: usize = 16;
const BATCH_DAYS: usize = 5;
const STREAM_DAYS: usize = 2;
const MINIBATCH: usize = 256;
const START: &str = "2026-11-01T00";

fn model_spec(kind: ModelKind) -> ModelSpec {
    ModelSpec {
        kind,
        tables: vec![TableSpec::new(
            TABLE,
            DIM as u32,
            OptimizerSpec::adagrad(0.05),
        )],
        dense: DenseSpec::new(vec![64, 16], vec![64, 1]),
    }
}

/// One hour of data: its minibatches, and the best achievable scores (the hidden model).
struct Hour {
    batches: Vec<Minibatch>,
    best: Vec<f64>,
}

fn generate(rows_per_hour: usize, drift: f64) -> Vec<Hour> {
    let start = primus_spec::time::parse_window_time(START).expect("start");
    let mut criteo = Criteo::new(CriteoOptions {
        cardinality_scale: 0.001,
        drift_radians_per_day: drift,
        epoch_unix_s: start,
        ..CriteoOptions::default()
    })
    .expect("generator");
    let pipeline = FeaturePipeline::new(&primus_datagen::criteo::feature_schema(TABLE));
    (0..(BATCH_DAYS + STREAM_DAYS) * 24)
        .map(|hour| {
            let generated = criteo
                .generate(rows_per_hour, start + hour as i64 * 3600)
                .expect("rows");
            let batch = pipeline.minibatch(&generated.batch).expect("minibatch");
            let batches = (0..batch.rows())
                .step_by(MINIBATCH)
                .map(|at| {
                    batch
                        .slice(at..(at + MINIBATCH).min(batch.rows()))
                        .expect("slice")
                })
                .collect();
            Hour {
                batches,
                best: generated.probabilities,
            }
        })
        .collect()
}

/// The serving copy: the rows and dense parameters of the last sync.
struct Serving {
    rows: HashMap<u64, Vec<f32>>,
    params: ParamSet,
}

impl Serving {
    /// Probabilities of stream minibatch `batch` from the serving copy (its adapt tower,
    /// as serving-sync serves a streaming Job; a row never synced reads as zeros).
    fn score(&self, model: &Model, batch: &Minibatch) -> Vec<f32> {
        let layout = model.layout();
        let kjt = batch.to_kjt().expect("kjt");
        let keys = BatchKeys::collect(layout, &kjt).expect("keys");
        let rows = &self.rows;
        let looked_up: Vec<Vec<f32>> = keys
            .tables
            .iter()
            .map(|keys| {
                keys.iter()
                    .flat_map(|k| rows.get(k).cloned().unwrap_or_else(|| vec![0.0; DIM]))
                    .collect()
            })
            .collect();
        let embedded = keys.pool(&CpuKernels, layout, &looked_up).expect("pool");
        let inputs = Inputs {
            rows: batch.rows(),
            dense: model.dense_inputs(batch).expect("dense"),
            embedded: &embedded,
            wide: &[],
        };
        model
            .predict(&self.params, &inputs, Tower::Adapt)
            .expect("predict")
    }

    /// Takes the trainer's current rows of `touched` and its dense parameters.
    async fn sync(&mut self, store: &LocalStore, touched: &mut HashSet<u64>, names: &[String]) {
        let keys: Vec<u64> = touched.drain().collect();
        let values = store.lookup(TABLE, &keys).await.expect("lookup");
        for (key, row) in keys.iter().zip(values.chunks(DIM)) {
            self.rows.insert(*key, row.to_vec());
        }
        let dense: Vec<ParamTensor> = store.pull_dense(names).await.expect("dense");
        self.params.assign(dense).expect("assign");
    }
}

/// AUC of the serving copy on each stream day, synced every `every` minibatches of the
/// stream (`None`: never).
async fn run(hours: &[Hour], kind: ModelKind, every: Option<usize>) -> Vec<f64> {
    let spec = model_spec(kind);
    let layout =
        &ModelLayout::new(&spec, &primus_datagen::criteo::feature_schema(TABLE)).expect("layout");
    let store = Arc::new(LocalStore::new(&spec.tables, &spec.dense.optimizer, 0).expect("store"));
    let mut trainer = Trainer::start(
        Model::new(layout.clone()).expect("a model of the layout"),
        store.clone(),
        0,
        1,
        10_000,
    )
    .await
    .expect("trainer");
    let model = Model::new(layout.clone()).expect("a model of the layout");
    let names = trainer.params().names();
    let mut touched = HashSet::new();
    let mut serving = Serving {
        rows: HashMap::new(),
        params: trainer.params().clone(),
    };
    // Trains `batch` and notes its keys for the next sync.
    let train = async |trainer: &mut Trainer<LocalStore>,
                       touched: &mut HashSet<u64>,
                       batch: &Minibatch,
                       kind| {
        let incoming = Incoming::new(batch.clone(), kind, "drift", &Default::default());
        let prepared = trainer.prepare(incoming).await.expect("prepare");
        touched.extend(prepared.keys().tables.iter().flatten().copied());
        trainer.step(prepared).await.expect("step");
    };
    let stream_start = BATCH_DAYS * 24;
    for hour in &hours[..stream_start] {
        for batch in &hour.batches {
            train(&mut trainer, &mut touched, batch, SourceKind::Batch).await;
        }
    }
    serving.sync(&store, &mut touched, &names).await;
    let mut aucs = Vec::new();
    let mut step = 0;
    for day in hours[stream_start..].chunks(24) {
        let (mut scores, mut labels) = (Vec::new(), Vec::new());
        for hour in day {
            for batch in &hour.batches {
                scores.extend(serving.score(&model, batch).iter().map(|p| f64::from(*p)));
                labels.extend(batch.labels.iter().map(|l| *l > 0.5));
                train(&mut trainer, &mut touched, batch, SourceKind::Stream).await;
                step += 1;
                if every.is_some_and(|every| step % every == 0) {
                    serving.sync(&store, &mut touched, &names).await;
                }
            }
        }
        aucs.push(primus_metrics::auc(&scores, &labels).unwrap_or(f64::NAN));
    }
    aucs
}

#[tokio::main]
async fn main() {
    let rows_per_hour: usize = primus_benches::env_or("PRIMUS_BENCH_ROWS_PER_HOUR", 1024);
    let drift: f64 = primus_benches::env_or("PRIMUS_BENCH_DRIFT", 0.6);
    let hours = generate(rows_per_hour, drift);
    let per_hour = rows_per_hour.div_ceil(MINIBATCH);
    println!(
        "serving freshness: DLRM on Criteo-like drift data ({drift} rad/day), {rows_per_hour} rows/hour, {BATCH_DAYS} days batch then {STREAM_DAYS} days stream; AUC of the serving copy on each stream day"
    );
    let stream_start = BATCH_DAYS * 24;
    let best: Vec<f64> = hours[stream_start..]
        .chunks(24)
        .map(|day| {
            let mut scores = Vec::new();
            let mut labels = Vec::new();
            for hour in day {
                scores.extend(&hour.best);
                for batch in &hour.batches {
                    labels.extend(batch.labels.iter().map(|l| *l > 0.5));
                }
            }
            primus_metrics::auc(&scores, &labels).unwrap_or(f64::NAN)
        })
        .collect();
    print!("{:>28}", "sync interval");
    for day in 0..STREAM_DAYS {
        print!(" {:>10}", format!("day {}", BATCH_DAYS + day + 1));
    }
    println!();
    let intervals: [(&str, Option<usize>); 5] = [
        ("every minibatch", Some(1)),
        ("hourly", Some(per_hour)),
        ("6 hours", Some(6 * per_hour)),
        ("daily", Some(24 * per_hour)),
        ("never (batch model, baseline)", None),
    ];
    for (name, every) in intervals {
        print_row(name, &run(&hours, ModelKind::Dlrm, every).await);
    }
    print_row("best achievable", &best);
    println!("same mixture, served fresh: MTRM (two towers) vs a single tower");
    for (name, kind) in [
        ("MTRM", ModelKind::Mtrm),
        ("DLRM (single tower)", ModelKind::Dlrm),
    ] {
        print_row(name, &run(&hours, kind, Some(1)).await);
    }
}

fn print_row(name: &str, aucs: &[f64]) {
    print!("{name:>28}");
    for auc in aucs {
        print!(" {auc:>10.4}");
    }
    println!();
}
