//! Serving freshness and Predict latency with the real services on loopback: two training
//! PS shards, one serving replica, serving-sync's `JobSync`, NATS delta notices; the model
//! is examples/criteo-like.yaml (DLRM, 13 dense + 26 sparse features, dim 16).
//!
//! - Freshness: while the training PS updates 100k distinct keys per minute, a probe trains
//!   one new sample's keys and polls Predict until its probability changes (PS update ->
//!   visible in Predict). With delta notices, next to the sparse interval alone (baseline,
//!   same run). Also bytes moved per sync next to a whole-table copy.
//! - Predict over gRPC, while the background updates keep syncing: batch 1 on one caller (latency) and on `CALLERS` callers at once
//!   (requests/s), batch 256 on `CALLERS` callers (samples/s); next to the limit, ONNX
//!   Runtime alone in-process on the same model and inputs (its sessions as the replica's),
//!   and the dense network alone on the CPU networks (same run).
//!
//! `cargo bench -p primus-benches --bench serving` (PRIMUS_BENCH_SECONDS per phase, default
//! 15). The last line:
//! `serving: batch-1 p99 N.N ms, N req/s; batch-256 N samples/s; onnxruntime alone N samples/s`.

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use primus_batch::FeaturePipeline;
use primus_config::PsRole;
use primus_config::PsSettings;
use primus_model::pooling::BatchKeys;
use primus_model::{Inputs, Model, ModelLayout, ParamSet, Tower};
use primus_proto::v1::feature_value::Value;
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::{DeltaNotice, ExportDeltaRequest, FeatureValue, PredictRequest, Sample};
use primus_ps::serving::{DenseInputs, DenseModel};
use primus_ps_client::PsClient;
use primus_service::Shutdown;
use primus_serving_sync::sync::{JobSync, SyncReport, SyncTarget, Topology};
use primus_spec::dataset::FeatureSchema;
use primus_spec::job::JobSpec;
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, free_port};
use tokio::sync::mpsc;
use tonic::transport::Channel;

const JOB: &str = "bench";
const KEYS_PER_MINUTE: usize = 100_000;
/// Concurrent Predict callers for the throughput figures.
const CALLERS: usize = 4;

fn example() -> (JobSpec, FeatureSchema) {
    let path = primus_testkit::repo_root().join("examples/criteo-like.yaml");
    let text = std::fs::read_to_string(&path).expect("examples/criteo-like.yaml");
    let (mut job, mut schema) = (None, None);
    for resource in primus_spec::parse_documents("criteo-like", &text).expect("valid") {
        match resource {
            primus_spec::Resource::Job(j) => job = Some(j.spec),
            primus_spec::Resource::Dataset(d) => schema = Some(d.spec.schema),
            _ => {}
        }
    }
    let mut job = job.expect("job");
    // Admission would hold back the probe's fresh keys; freshness is about sync, not admission.
    for table in &mut job.model.tables {
        table.admission = Default::default();
    }
    (job, schema.expect("dataset"))
}

async fn start(settings: PsSettings) -> String {
    let addr = settings.server.grpc_addr.to_string();
    tokio::spawn(primus_ps::run(settings, Shutdown::new()));
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(30))
        .await
        .expect("serving");
    addr
}

fn settings(nats: &str, job: &JobSpec, layout: &ModelLayout) -> PsSettings {
    let mut settings = PsSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
    settings.nats.url = nats.to_owned();
    settings.ps.tables = layout.ps_tables();
    settings.ps.dense_optimizer = job.model.dense.optimizer.clone();
    settings
}

fn sample(schema: &FeatureSchema, id: i64) -> Sample {
    let mut features = HashMap::new();
    for (i, dense) in schema.dense.iter().enumerate() {
        let value = Value::Number((id % 97 + i as i64) as f64);
        features.insert(dense.name.clone(), FeatureValue { value: Some(value) });
    }
    for (i, sparse) in schema.sparse.iter().enumerate() {
        let value = Value::Number((id * 31 + i as i64) as f64);
        features.insert(sparse.name.clone(), FeatureValue { value: Some(value) });
    }
    Sample { features }
}

fn keys_of(
    schema: &FeatureSchema,
    layout: &ModelLayout,
    sample: &Sample,
) -> Vec<(String, Vec<u64>)> {
    let batch =
        primus_ps::serving::record_batch(schema, std::slice::from_ref(sample)).expect("batch");
    let minibatch = FeaturePipeline::new(schema)
        .minibatch(&batch)
        .expect("minibatch");
    let keys = BatchKeys::collect(layout, &minibatch.to_kjt().expect("kjt")).expect("keys");
    layout
        .tables
        .iter()
        .zip(keys.tables)
        .map(|(t, k)| (t.name.clone(), k))
        .collect()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

async fn predict(client: &mut ServingServiceClient<Channel>, samples: Vec<Sample>) -> Vec<f32> {
    client
        .predict(PredictRequest {
            job: JOB.into(),
            samples,
        })
        .await
        .expect("predict")
        .into_inner()
        .probabilities
}

/// Background training updates and the sync loop that carries them to the replica.
struct Syncing {
    done: Arc<AtomicBool>,
    syncer: tokio::task::JoinHandle<SyncReport>,
    updates: tokio::task::JoinHandle<()>,
}

impl Syncing {
    async fn stop(self) -> SyncReport {
        self.done.store(true, Ordering::Release);
        self.updates.await.expect("updates");
        self.syncer.await.expect("syncer")
    }
}

struct Bench {
    job: JobSpec,
    schema: FeatureSchema,
    layout: ModelLayout,
    nats_url: String,
    shards: Vec<String>,
    replica: String,
    training: PsClient,
}

impl Bench {
    async fn start(nats: &NatsServer) -> Self {
        let (job, schema) = example();
        let layout = ModelLayout::new(&job.model, &schema).expect("layout");
        let mut shards = Vec::new();
        for i in 0..2 {
            let mut s = settings(&nats.url(), &job, &layout);
            s.ps.job = JOB.into();
            s.ps.shard_id = format!("ps-{i}");
            shards.push(start(s).await);
        }
        let mut replica = settings(&nats.url(), &job, &layout);
        replica.ps.role = PsRole::Serving;
        replica.serving.job = JOB.into();
        replica.serving.model = Some(job.model.clone());
        replica.serving.schema = Some(schema.clone());
        let replica = start(replica).await;
        let training = PsClient::connect(&shards).await.expect("training client");
        let tensors: Vec<primus_embedding::DenseValues> = ParamSet::init(&layout, 3)
            .tensors()
            .iter()
            .cloned()
            .map(Into::into)
            .collect();
        training.init_dense(&tensors).await.expect("init dense");
        Self {
            job,
            schema,
            layout,
            nats_url: nats.url(),
            shards,
            replica,
            training,
        }
    }

    fn sync(&self) -> JobSync {
        let mut sync = JobSync::new(SyncTarget {
            job: JOB.into(),
            layout: self.layout.clone(),
            tower: Tower::Memory,
            sparse_interval: Duration::from_millis(self.job.serving_sync.sparse_interval_ms),
            dense_interval: Duration::from_secs(3600),
        });
        let topology = Topology {
            shards: self
                .shards
                .iter()
                .enumerate()
                .map(|(i, a)| (format!("ps-{i}"), a.clone()))
                .collect(),
            replicas: vec![("serving-0".into(), self.replica.clone())],
        };
        sync.set_topology(&topology).expect("topology");
        sync
    }

    /// Pushes 100k distinct keys a minute to the first table until `done`.
    fn background_updates(&self, done: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
        let training = self.training.clone();
        let table = self.layout.tables[0].name.clone();
        let dim = self.layout.tables[0].dim;
        tokio::spawn(async move {
            let per_tick = KEYS_PER_MINUTE / 600;
            let mut ticks = tokio::time::interval(Duration::from_millis(100));
            let mut next = 1u64 << 40;
            while !done.load(Ordering::Acquire) {
                ticks.tick().await;
                let keys: Vec<u64> = (0..per_tick as u64).map(|i| next + i).collect();
                next += per_tick as u64;
                let grads = vec![0.01f32; keys.len() * dim];
                training.push(&table, &keys, &grads).await.expect("push");
            }
        })
    }

    /// The replica kept in sync with the background updates until [`Syncing::stop`]: every
    /// sparse interval, and on every delta notice when `notices` is set.
    async fn start_syncing(&self, notices: bool) -> Syncing {
        let mut sync = self.sync();
        sync.sync_sparse().await;
        sync.sync_dense().await.expect("dense");
        let (notice_tx, mut notice_rx) = mpsc::channel::<DeltaNotice>(1);
        if notices {
            let bus = primus_bus::Bus::connect(&primus_config::NatsSettings {
                url: self.nats_url.clone(),
                ..Default::default()
            })
            .await
            .expect("nats");
            let subject = bus.subjects().delta(JOB, "*").expect("subject");
            let mut subscription = bus.subscribe::<DeltaNotice>(subject).await.expect("sub");
            tokio::spawn(async move {
                while let Some(Ok(notice)) = subscription.next().await {
                    let _ = notice_tx.try_send(notice.message);
                }
            });
        }
        let done = Arc::new(AtomicBool::new(false));
        let interval = sync.target().sparse_interval;
        let stop = done.clone();
        let syncer = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            while !stop.load(Ordering::Acquire) {
                tokio::select! {
                    Some(notice) = notice_rx.recv() => sync.note(&notice),
                    _ = ticks.tick() => {}
                }
                sync.sync_sparse().await;
            }
            sync.take_report()
        });
        let updates = self.background_updates(done.clone());
        Syncing {
            done,
            syncer,
            updates,
        }
    }

    /// Freshness samples (ms) for `seconds`, syncing on notices when `notices` is set.
    async fn freshness(&self, notices: bool, seconds: u64, first_id: i64) -> (Vec<f64>, u64, u64) {
        let syncing = self.start_syncing(notices).await;
        let mut client = ServingServiceClient::connect(format!("http://{}", self.replica))
            .await
            .expect("replica");
        let mut samples = Vec::new();
        let started = Instant::now();
        let mut id = first_id;
        while started.elapsed() < Duration::from_secs(seconds) {
            id += 1;
            let probe = sample(&self.schema, id);
            let before = predict(&mut client, vec![probe.clone()]).await[0];
            for (table, keys) in keys_of(&self.schema, &self.layout, &probe) {
                let dim = self
                    .layout
                    .tables
                    .iter()
                    .find(|t| t.name == table)
                    .map_or(0, |t| t.dim);
                self.training
                    .push(&table, &keys, &vec![0.5; keys.len() * dim])
                    .await
                    .expect("push");
            }
            let trained = Instant::now();
            while predict(&mut client, vec![probe.clone()]).await[0] == before {
                tokio::time::sleep(Duration::from_millis(2)).await;
                if trained.elapsed() > Duration::from_secs(10) {
                    panic!("probe {id} never became visible");
                }
            }
            samples.push(trained.elapsed().as_secs_f64() * 1e3);
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let report = syncing.stop().await;
        samples.sort_by(f64::total_cmp);
        (samples, report.delta_bytes, report.cycles)
    }

    async fn whole_table_bytes(&self) -> u64 {
        let mut bytes = 0;
        for shard in &self.shards {
            let mut client = ParameterServerClient::connect(format!("http://{shard}"))
                .await
                .expect("shard")
                .max_decoding_message_size(usize::MAX);
            let all = client
                .export_delta(ExportDeltaRequest {
                    since_version: 0,
                    update_counts: false,
                })
                .await
                .expect("export")
                .into_inner();
            bytes += all
                .tables
                .iter()
                .map(|t| (t.keys.len() + t.rows.len() + t.versions.len()) as u64)
                .sum::<u64>();
        }
        bytes
    }

    /// Predicts of `batch` samples from `callers` callers at once for `seconds`: every
    /// latency (ms, sorted) and requests per second.
    async fn predict_latency(&self, batch: usize, callers: usize, seconds: u64) -> (Vec<f64>, f64) {
        let samples: Vec<Sample> = (0..batch as i64).map(|i| sample(&self.schema, i)).collect();
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..callers {
            let (replica, samples) = (self.replica.clone(), samples.clone());
            tasks.push(tokio::spawn(async move {
                let mut client = ServingServiceClient::connect(format!("http://{replica}"))
                    .await
                    .expect("replica");
                let mut latencies = Vec::new();
                while started.elapsed() < Duration::from_secs(seconds) {
                    let at = Instant::now();
                    predict(&mut client, samples.clone()).await;
                    latencies.push(at.elapsed().as_secs_f64() * 1e3);
                }
                latencies
            }));
        }
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.expect("caller"));
        }
        let per_second = latencies.len() as f64 / started.elapsed().as_secs_f64();
        latencies.sort_by(f64::total_cmp);
        (latencies, per_second)
    }

    /// ONNX Runtime alone on the replica's model (as serving-sync exports it) and inputs of
    /// `batch` rows, from `callers` threads on as many sessions: samples per second.
    #[expect(
        clippy::disallowed_methods,
        reason = "ONNX Runtime's library is named by scripts/env.sh"
    )]
    fn onnxruntime_alone(&self, batch: usize, callers: usize, seconds: u64) -> f64 {
        let library = std::env::var_os("ORT_DYLIB_PATH").expect("ORT_DYLIB_PATH (scripts/env.sh)");
        let params = ParamSet::init(&self.layout, 3);
        let onnx =
            primus_model::onnx::export(&self.layout, &params, Tower::Memory, 1).expect("export");
        let model = DenseModel::load(std::path::Path::new(&library), 1, &onnx, callers)
            .expect("ONNX Runtime");
        let (dense_width, embedded_width) = (self.layout.dense_inputs, self.layout.embedding_width);
        let started = Instant::now();
        let runs: usize = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..callers)
                .map(|_| {
                    let model = &model;
                    scope.spawn(move || {
                        let mut runs = 0;
                        while started.elapsed() < Duration::from_secs(seconds) {
                            let inputs = DenseInputs {
                                rows: batch,
                                dense: vec![0.5; batch * dense_width],
                                dense_width,
                                embedded: vec![0.01; batch * embedded_width],
                                embedded_width,
                                wide: Vec::new(),
                                wide_width: 0,
                            };
                            model.predict(inputs).expect("onnxruntime");
                            runs += 1;
                        }
                        runs
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("thread")).sum()
        });
        (runs * batch) as f64 / started.elapsed().as_secs_f64()
    }

    /// The dense network alone, in-process on the CPU networks (Predict's compute).
    fn dense_alone_latency(&self, batch: usize, seconds: u64) -> Vec<f64> {
        let model = Model::new(self.layout.clone()).expect("a model of the layout");
        let params = ParamSet::init(&self.layout, 3);
        let dense = vec![0.5f32; batch * self.layout.dense_inputs];
        let embedded = vec![0.01f32; batch * self.layout.embedding_width];
        let mut latencies = Vec::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(seconds) {
            let at = Instant::now();
            let inputs = Inputs {
                rows: batch,
                dense: &dense,
                embedded: &embedded,
                wide: &[],
            };
            model
                .predict(&params, &inputs, Tower::Memory)
                .expect("dense network");
            latencies.push(at.elapsed().as_secs_f64() * 1e3);
        }
        latencies.sort_by(f64::total_cmp);
        latencies
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let nats = NatsServer::start().expect("nats-server");
        let bench = Bench::start(&nats).await;
        let seconds: u64 = primus_benches::env_or("PRIMUS_BENCH_SECONDS", 15);
        println!(
            "serving bench: examples/criteo-like.yaml (DLRM, 26 sparse, dim 16), 2 training shards, 1 replica, sparse interval {} ms, background {} distinct keys/min",
            bench.job.serving_sync.sparse_interval_ms, KEYS_PER_MINUTE
        );
        for (label, notices, first) in [
            ("delta notices + interval", true, 1_000_000),
            ("interval only (baseline)", false, 2_000_000),
        ] {
            let (samples, bytes, cycles) = bench.freshness(notices, seconds, first).await;
            println!(
                "freshness, {label:26}: p50 {:7.1} ms  p99 {:7.1} ms  ({} probes); {:.0} bytes per sync over {cycles} syncs",
                quantile(&samples, 0.5),
                quantile(&samples, 0.99),
                samples.len(),
                bytes as f64 / cycles.max(1) as f64,
            );
        }
        println!(
            "whole-table copy (what a full sync would move): {} bytes",
            bench.whole_table_bytes().await
        );
        let phase = seconds.min(10);
        // Predicts while the replica keeps taking the background updates, as it does in a
        // Job that trains.
        let syncing = bench.start_syncing(true).await;
        let mut figures = Vec::new();
        for (batch, callers) in [(1usize, 1usize), (1, CALLERS), (256, CALLERS)] {
            let (latencies, per_second) = bench.predict_latency(batch, callers, phase).await;
            let cpu = bench.dense_alone_latency(batch, seconds.min(5));
            println!(
                "Predict batch {batch:3}, {callers} callers: p50 {:6.2} ms  p99 {:6.2} ms  {per_second:7.0} req/s ({:8.0} samples/s) | dense network alone in-process: p50 {:6.2} ms",
                quantile(&latencies, 0.5),
                quantile(&latencies, 0.99),
                per_second * batch as f64,
                quantile(&cpu, 0.5),
            );
            figures.push((quantile(&latencies, 0.99), per_second * batch as f64));
        }
        let report = syncing.stop().await;
        println!(
            "(those Predicts ran while {} syncs applied {} bytes of deltas to the replica)",
            report.cycles, report.delta_bytes
        );
        let alone = bench.onnxruntime_alone(256, CALLERS, phase);
        println!(
            "onnxruntime alone, batch 256, {CALLERS} threads on {CALLERS} sessions: {alone:.0} samples/s (the limit of batch-256 Predict)"
        );
        println!(
            "serving: batch-1 p99 {:.1} ms, {:.0} req/s; batch-256 {:.0} samples/s; onnxruntime alone {alone:.0} samples/s",
            figures[0].0, figures[1].1, figures[2].1
        );
    });
}
