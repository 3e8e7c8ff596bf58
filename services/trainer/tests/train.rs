//! The trainer's step loop against in-process tables: it learns Criteo-like data, its
//! pushes reach the tables and the dense store, its reports count only minibatches
//! confirmed consumed, every minibatch is scored before it is trained on, and prefetching
//! changes no parameter.

#![allow(
    clippy::print_stdout,
    reason = "a check that cannot run here says so on stdout, beside the test's name"
)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use primus_batch::{FeaturePipeline, Minibatch};
use primus_config::TrainerSettings;
use primus_data_client::Receipt;
use primus_datagen::criteo::{Criteo, CriteoOptions, feature_schema};
use primus_gpu::{CudaStatus, cuda_status};
use primus_model::pooling::BatchKeys;
use primus_model::{Model, ModelLayout, ParamSet};
use primus_proto::v1::SourceKind;
use primus_service::Shutdown;
use primus_spec::dataset::FeatureSchema;
use primus_spec::job::{DenseSpec, Device, ModelKind, ModelSpec, OptimizerSpec, TableSpec};
use primus_trainer::device::EmbeddingDevice;
use primus_trainer::feed::{Feed, Incoming};
use primus_trainer::meter::{Report, Reporter};
use primus_trainer::store::{LocalStore, ParameterStore};
use primus_trainer::train::{Trainer, TrainerTotals};

#[derive(Default)]
struct Collect {
    reports: std::sync::Mutex<Vec<Report>>,
    /// (checkpoint, steps, samples) of every aligned barrier.
    aligned: std::sync::Mutex<Vec<(u64, u64, u64)>>,
}

impl Reporter for Collect {
    async fn report(&self, report: &Report) {
        self.reports.lock().expect("reports").push(report.clone());
    }

    async fn aligned(&self, checkpoint_id: u64, totals: &TrainerTotals) {
        let mut aligned = self.aligned.lock().expect("aligned");
        aligned.push((checkpoint_id, totals.steps, totals.samples));
    }
}

/// A DLRM over one Criteo-like table (adagrad rows, adam dense).
fn dlrm() -> (ModelSpec, FeatureSchema) {
    let schema = feature_schema("categorical");
    let spec = ModelSpec {
        kind: ModelKind::Dlrm,
        tables: vec![TableSpec::new(
            "categorical",
            8,
            OptimizerSpec::adagrad(0.05),
        )],
        dense: DenseSpec {
            bottom: vec![32, 8],
            top: vec![32, 1],
            optimizer: OptimizerSpec::Adam {
                learning_rate: 0.002,
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8,
            },
            graph: None,
        },
    };
    (spec, schema)
}

/// `count` minibatches of `rows` generated samples, with each sample's true probability
/// and label.
fn generated(
    schema: &FeatureSchema,
    count: usize,
    rows: usize,
) -> (Vec<Minibatch>, Vec<f64>, Vec<bool>) {
    let pipeline = FeaturePipeline::new(schema);
    let mut generator = Criteo::new(CriteoOptions {
        cardinality_scale: 0.0002,
        ..CriteoOptions::default()
    })
    .expect("generator");
    let mut batches = Vec::new();
    let mut probabilities = Vec::new();
    let mut labels = Vec::new();
    for _ in 0..count {
        let generated = generator.generate(rows, 0).expect("rows");
        probabilities.extend(generated.probabilities);
        labels.extend(generated.labels);
        batches.push(pipeline.minibatch(&generated.batch).expect("minibatch"));
    }
    (batches, probabilities, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trainer_learns_criteo_like_data_in_process() {
    let (spec, schema) = dlrm();
    let layout = ModelLayout::new(&spec, &schema).expect("layout");
    let (batches, probabilities, labels) = generated(&schema, 60, 1024);
    let best = primus_metrics::auc(&probabilities, &labels).expect("best");
    let store =
        Arc::new(LocalStore::new(&layout.ps_tables(), &spec.dense.optimizer, 0).expect("store"));
    let mut trainer = Trainer::start(
        Model::new(layout.clone()).expect("a model of the layout"),
        store.clone(),
        0,
        1,
        20_000,
    )
    .await
    .expect("start");
    let initial = trainer.params().clone();
    let reports = Collect::default();
    // A checkpoint barrier after the 30th minibatch: it is aligned only once those 30 are
    // trained and pushed, so the counts it reports are exactly theirs.
    let mut feed: Vec<Feed> = batches
        .into_iter()
        .map(|b| {
            Feed::batch(Incoming::new(
                b,
                SourceKind::Batch,
                "generated",
                &Default::default(),
            ))
        })
        .collect();
    feed.insert(30, Feed::Barrier(4));
    // A minibatch fed before, served again after its stream broke: it is confirmed, and
    // neither trained nor counted nor reported again.
    feed.insert(46, Feed::Again(Receipt::none()));
    let stream = futures::stream::iter(feed.into_iter().map(Ok));
    trainer
        .train(stream.boxed(), Duration::ZERO, &reports)
        .await
        .expect("train");
    let aligned = reports.aligned.into_inner().expect("aligned");
    assert_eq!(aligned, vec![(4, 30, 30 * 1024)]);
    let reports = reports.reports.into_inner().expect("reports");
    assert_eq!(
        reports.len(),
        60,
        "a report after every step with a zero interval"
    );
    assert_eq!(trainer.meter.samples, 60 * 1024);
    assert_eq!(trainer.meter.steps, 60);
    // A report counts only minibatches confirmed consumed: a minibatch's push confirms the
    // one before it, so each report leaves out the minibatch just trained, which the
    // settled trainer's report counts.
    let counted: Vec<(u64, u64)> = reports.iter().map(|r| (r.steps, r.samples)).collect();
    let confirmed: Vec<(u64, u64)> = (0..60).map(|k| (k, k * 1024)).collect();
    assert_eq!(counted, confirmed);
    let settled = trainer.meter.report();
    assert_eq!((settled.steps, settled.samples), (60, 60 * 1024));
    let first = reports[0].evaluation.auc.expect("auc");
    let last = reports[59].evaluation.auc.expect("auc");
    assert!(
        last > first + 0.1,
        "progressive AUC went from {first:.4} to {last:.4}; best achievable {best:.4}"
    );
    // The dense pushes reached the store: every tensor moved.
    let names = initial.names();
    let now = store.pull_dense(&names).await.expect("pull");
    assert!(
        now.iter()
            .zip(initial.tensors())
            .all(|(a, b)| a.values != b.values)
    );
}

/// A trainer's rate counts from its first step: the wait for its first minibatch (data
/// executors opening their files) is not training time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainers_rate_leaves_out_the_wait_for_its_first_minibatch() {
    let (spec, schema) = dlrm();
    let layout = ModelLayout::new(&spec, &schema).expect("layout");
    let (batches, _, _) = generated(&schema, 2, 1024);
    let store =
        Arc::new(LocalStore::new(&layout.ps_tables(), &spec.dense.optimizer, 0).expect("store"));
    let mut trainer = Trainer::start(
        Model::new(layout).expect("a model of the layout"),
        store,
        0,
        1,
        10_000,
    )
    .await
    .expect("start");
    let wait = Duration::from_secs(3);
    let first_minibatch = futures::stream::once(tokio::time::sleep(wait))
        .filter_map(|_| async { None::<anyhow::Result<Feed>> });
    let feed = batches.into_iter().map(|b| {
        Ok(Feed::batch(Incoming::new(
            b,
            SourceKind::Batch,
            "generated",
            &Default::default(),
        )))
    });
    let reports = Collect::default();
    let stream = first_minibatch.chain(futures::stream::iter(feed));
    trainer
        .train(stream.boxed(), Duration::ZERO, &reports)
        .await
        .expect("train");
    let reports = reports.reports.into_inner().expect("reports");
    let waited_rate = 1024.0 / wait.as_secs_f64();
    assert!(
        reports[0].samples_per_second > waited_rate,
        "the first step's rate {:.0} samples/s counts the {wait:?} before it (at most {waited_rate:.0} if it does)",
        reports[0].samples_per_second
    );
}

/// A prefetching trainer prepares a minibatch while the one before computes and reads its
/// rows in the push before it (the first one just before it computes): it trains bit for
/// bit like one that looks each minibatch up only after the last push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefetching_trainer_trains_like_one_that_looks_up_after_each_push() {
    for kind in [ModelKind::Dlrm, ModelKind::Deepfm] {
        let (mut spec, schema) = dlrm();
        spec.kind = kind;
        let layout = ModelLayout::new(&spec, &schema).expect("layout");
        let (batches, _, _) = generated(&schema, 24, 256);
        let mut runs = Vec::new();
        for prefetching in [true, false] {
            let tables = layout.ps_tables();
            let store =
                Arc::new(LocalStore::new(&tables, &spec.dense.optimizer, 0).expect("store"));
            let model = Model::new(layout.clone()).expect("a model of the layout");
            let mut trainer = Trainer::start(model, store.clone(), 0, 1, 10_000)
                .await
                .expect("start");
            let incoming = |batch: &Minibatch| {
                Incoming::new(
                    batch.clone(),
                    SourceKind::Batch,
                    "generated",
                    &Default::default(),
                )
            };
            if prefetching {
                let feed = batches.iter().map(|b| Ok(Feed::batch(incoming(b))));
                let stream = futures::stream::iter(feed.collect::<Vec<_>>());
                (trainer.train(stream.boxed(), Duration::ZERO, &Collect::default()))
                    .await
                    .expect("train");
            } else {
                for batch in &batches {
                    let prepared = trainer.prepare(incoming(batch)).await.expect("prepare");
                    trainer.step(prepared).await.expect("step");
                }
            }
            runs.push(parameters(&store, &layout, &batches).await);
        }
        assert!(
            runs[0] == runs[1],
            "{kind:?}: the prefetching trainer's parameters differ"
        );
    }
}

/// Every dense tensor, and every stored row (with optimizer state) of `batches`' keys, as
/// bits.
async fn parameters(
    store: &LocalStore,
    layout: &ModelLayout,
    batches: &[Minibatch],
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let names = ParamSet::init(layout, 0).names();
    let dense = store.pull_dense(&names).await.expect("pull");
    let mut rows = Vec::new();
    for (t, slot) in layout.tables.iter().enumerate() {
        let mut keys: Vec<u64> = Vec::new();
        for batch in batches {
            let kjt = batch.to_kjt().expect("kjt");
            let batch_keys = BatchKeys::collect(layout, &kjt).expect("keys");
            keys.extend_from_slice(&batch_keys.tables[t]);
        }
        for table in std::iter::once(&slot.name).chain(&slot.wide) {
            let stored = store.read_rows(table, &keys).await.expect("rows");
            assert_eq!(stored.keys.len(), keys.len(), "a row per key of {table}");
            rows.push(bits(&stored.values));
        }
    }
    (dense.iter().map(|t| bits(&t.values)).collect(), rows)
}

/// On a GPU a trainer pools and runs the pooling backward with the CUDA kernels, which on
/// the deterministic path match the CPU references bit for bit: two trainers, one per
/// device, fed the same minibatches, score them alike and leave the same parameters.
/// Without a GPU the service refuses `trainer.device: cuda` and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cuda_trainer_trains_like_a_cpu_trainer_or_refuses_without_a_gpu() {
    let (spec, schema) = dlrm();
    if !matches!(cuda_status(), CudaStatus::Ready { .. }) {
        let mut settings = TrainerSettings::default();
        let train = &mut settings.trainer;
        (train.job, train.executor_id) = ("job".into(), "trainer-0".into());
        train.master_addr = "127.0.0.1:1".into();
        (train.model, train.schema) = (Some(spec), Some(schema));
        train.device = Device::Cuda;
        let err = primus_trainer::run(settings, Shutdown::new())
            .await
            .expect_err("no GPU here");
        let text = format!("{err:#}");
        assert!(
            text.contains("trainer.device is cuda (device 0)") && text.contains("CUDA"),
            "{text}"
        );
        println!("SKIPPED the GPU trainer's steps (no CUDA device): checked the refusal only");
        return;
    }
    let layout = ModelLayout::new(&spec, &schema).expect("layout");
    let (batches, _, _) = generated(&schema, 12, 512);
    let gpu = EmbeddingDevice::open(Device::Cuda, 0).expect("a GPU");
    let mut runs = Vec::new();
    for device in [EmbeddingDevice::Cpu, gpu] {
        let tables = layout.ps_tables();
        let store = Arc::new(LocalStore::new(&tables, &spec.dense.optimizer, 0).expect("store"));
        let model = Model::new(layout.clone()).expect("a model of the layout");
        let mut trainer = Trainer::start(model, store.clone(), 0, 1, 10_000)
            .await
            .expect("start")
            .on_device(device);
        let mut scored = Vec::new();
        let mut keys = Vec::new();
        for batch in &batches {
            let incoming = Incoming::new(
                batch.clone(),
                SourceKind::Batch,
                "generated",
                &Default::default(),
            );
            let prepared = trainer.prepare(incoming).await.expect("prepare");
            keys.extend_from_slice(&prepared.keys().tables[0]);
            let output = trainer.step(prepared).await.expect("step");
            scored.push(bits(output.probabilities()));
        }
        let names = trainer.params().names();
        let dense = store.pull_dense(&names).await.expect("pull");
        let rows = store.read_rows("categorical", &keys).await.expect("rows");
        let dense: Vec<Vec<u32>> = dense.iter().map(|t| bits(&t.values)).collect();
        runs.push((scored, dense, rows.keys, bits(&rows.values)));
    }
    assert!(
        runs[0] == runs[1],
        "the GPU trainer's steps differ from the CPU trainer's"
    );
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}
