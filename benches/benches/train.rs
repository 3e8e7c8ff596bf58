//! Training figures (issue 7), in-process: the trainer's own step loop (lookup, pooling,
//! burn forward/backward, push) against tables and a dense store in the same process, on
//! Criteo-like rows from `primus datagen`'s generator. Prints samples/s, the time share per
//! stage and the progressive AUC next to the data's best achievable AUC; the baseline is
//! the dense network's forward/backward alone on the same minibatches (no lookups, no
//! pooling, no pushes), measured in the same run.
//!
//! `cargo bench -p primus-benches --bench train` (PRIMUS_BENCH_ROWS, PRIMUS_BENCH_BATCH,
//! PRIMUS_BENCH_MODEL=small|issue change the run).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use primus_batch::{FeaturePipeline, Minibatch};
use primus_datagen::criteo::{Criteo, CriteoOptions};
use primus_metrics::auc;
use primus_model::{Inputs, Model, ModelLayout, ParamSet, Tower};
use primus_proto::v1::SourceKind;
use primus_spec::job::{
    AdmissionSpec, DenseSpec, Initializer, ModelKind, ModelSpec, OptimizerSpec, TableSpec,
};
use primus_trainer::store::LocalStore;
use primus_trainer::train::{Feed, Incoming, Report, Reporter, Trainer};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The DLRM (dim 16, 512-256-64 / 512-256-1) or a small one for quick runs.
fn model_spec(size: &str) -> ModelSpec {
    let (bottom, top) = match size {
        "issue" => (vec![512, 256, 64, 16], vec![512, 256, 1]),
        _ => (vec![64, 16], vec![64, 1]),
    };
    ModelSpec {
        kind: ModelKind::Dlrm,
        tables: vec![TableSpec {
            name: "categorical".into(),
            dim: 16,
            optimizer: OptimizerSpec::Adagrad {
                learning_rate: 0.05,
                initial_accumulator: 0.1,
                epsilon: 1e-8,
            },
            initializer: Initializer::Uniform { scale: 0.01 },
            admission: AdmissionSpec::default(),
            ttl_seconds: None,
        }],
        dense: DenseSpec::new(bottom, top),
    }
}

struct Printer;

impl Reporter for Printer {
    async fn report(&self, report: &Report) {
        println!(
            "  {:>9} samples  {:>8.0} samples/s  loss {:.4}  auc {}",
            report.samples,
            report.samples_per_second,
            report.loss.unwrap_or(f64::NAN),
            report
                .evaluation
                .auc
                .map_or("-".into(), |a| format!("{a:.4}"))
        );
    }

    async fn aligned(&self, checkpoint_id: u64, steps: u64, samples: u64) {
        println!("  checkpoint {checkpoint_id} aligned at step {steps}, {samples} samples");
    }
}

#[tokio::main]
async fn main() {
    let rows = env_or("PRIMUS_BENCH_ROWS", 400_000);
    let batch = env_or("PRIMUS_BENCH_BATCH", 2048);
    let size = std::env::var("PRIMUS_BENCH_MODEL").unwrap_or_else(|_| "issue".into());
    let schema = primus_datagen::criteo::feature_schema("categorical");
    let spec = model_spec(&size);
    let layout = ModelLayout::new(&spec, &schema).expect("layout");
    let pipeline = FeaturePipeline::new(&schema);
    let mut generator = Criteo::new(CriteoOptions {
        cardinality_scale: 0.001,
        ..CriteoOptions::default()
    })
    .expect("generator");
    let (mut probabilities, mut labels) = (Vec::new(), Vec::new());
    let mut batches: Vec<Minibatch> = Vec::new();
    while batches.len() * batch < rows {
        let generated = generator.generate(batch, 0).expect("rows");
        probabilities.extend(generated.probabilities);
        labels.extend(generated.labels);
        batches.push(pipeline.minibatch(&generated.batch).expect("minibatch"));
    }
    let best = auc(&probabilities, &labels).expect("both classes");
    println!(
        "DLRM ({size}: bottom {:?}, top {:?}, dim 16), {} rows in minibatches of {batch}, best achievable AUC {best:.4}",
        spec.dense.bottom,
        spec.dense.top,
        batches.len() * batch
    );

    let model = Model::new(layout.clone());
    let baseline = dense_only(&model, &layout, &batches[..batches.len().min(20)]);

    let store =
        Arc::new(LocalStore::new(&layout.ps_tables(), &spec.dense.optimizer, 0).expect("store"));
    let mut trainer = Trainer::start(model, store, 0, 1, 100_000)
        .await
        .expect("trainer");
    let stream = futures::stream::iter(batches.into_iter().map(|b| {
        Ok(Feed::Batch(Incoming::new(
            b,
            SourceKind::Batch,
            "generated",
            &Default::default(),
        )))
    }));
    let started = Instant::now();
    trainer
        .train(stream.boxed(), Duration::from_secs(5), &Printer)
        .await
        .expect("train");
    let elapsed = started.elapsed().as_secs_f64();
    let report = trainer.meter.report();
    let samples = trainer.meter.samples as f64;
    println!(
        "in-process trainer: {:.0} samples/s over {:.1} s; progressive AUC (last 100k) {:.4} vs best {best:.4}",
        samples / elapsed,
        elapsed,
        report.evaluation.auc.unwrap_or(f64::NAN)
    );
    println!(
        "baseline, dense forward/backward alone: {baseline:.0} samples/s ({:.2}x of the trainer's rate)",
        baseline / (samples / elapsed)
    );
}

/// Samples/s of the dense network's forward/backward alone on pooled zeros.
fn dense_only(model: &Model, layout: &ModelLayout, batches: &[Minibatch]) -> f64 {
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
