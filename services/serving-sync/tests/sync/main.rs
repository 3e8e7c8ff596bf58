//! Serving-sync against real training PS shards and serving replicas (the primus-ps server
//! code on loopback gRPC, NATS from primus-testkit): Predict follows training, a restarted
//! replica converges to the training rows exactly, a training shard restarted empty does not
//! take serving backwards, one restored from a checkpoint serving lagged brings serving its
//! rows, Predicts never fail during syncs; Predict itself in [`predict`].
//! Needs libonnxruntime.so (ORT_DYLIB_PATH).

mod predict;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use primus_batch::FeaturePipeline;
use primus_config::PsRole;
use primus_config::PsSettings;
use primus_harness::rows::{Rows, replica_rows, training_rows};
use primus_model::pooling::BatchKeys;
use primus_model::{ModelLayout, ParamSet, Tower};
use primus_proto::v1::feature_value::Value;
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::{
    DeltaNotice, FeatureValue, PredictRequest, RestoreRequest, Sample, SnapshotRequest,
};
use primus_ps_client::PsClient;
use primus_service::Shutdown;
use primus_serving_sync::sync::{JobSync, SyncTarget, Topology};
use primus_spec::dataset::FeatureSchema;
use primus_spec::job::JobSpec;
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, restartable_port};
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;

const JOB: &str = "ctr";
const RESOURCES: &str = r#"
kind: Dataset
metadata: {name: clicks}
spec:
  streams:
    - name: live
      window: {unit: hourly, start: "2026-11-20T00", end: "2026-11-21T00"}
      sources:
        - {name: p, parquet: {uri: "file:///tmp/none"}}
  schema:
    label: label
    dense:
      - {name: price, transform: {kind: log1p}, missing: 7.0}
      - {name: age, missing: -1.0}
    sparse:
      - {name: item, table: items}
      - {name: shop, table: items}
      - {name: tags, table: tags, multi_hot: true}
---
kind: Job
metadata: {name: ctr}
spec:
  dataset: clicks
  mode: stream
  model:
    kind: dlrm
    tables:
      - {name: items, dim: 4, optimizer: {kind: sgd, learning_rate: 0.5}, ttl_seconds: 3600}
      - {name: tags, dim: 4, optimizer: {kind: sgd, learning_rate: 0.5}}
    dense:
      bottom: [8, 4]
      top: [8, 1]
  topology:
    data_executors: {replicas: 1}
    trainers: {replicas: 1}
    ps: {replicas: 2}
    serving: {replicas: 2}
  serving_sync: {enabled: true, sparse_interval_ms: 500, dense_interval_seconds: 1}
"#;

/// [`RESOURCES`] with a model graph of two heads: a click on the label and a regression
/// on the target `watch`, over one shared layer.
fn two_heads() -> String {
    let graph = r#"kind: graph
    tables:
      - {name: items, dim: 4, optimizer: {kind: sgd, learning_rate: 0.5}, ttl_seconds: 3600}
      - {name: tags, dim: 4, optimizer: {kind: sgd, learning_rate: 0.5}}
    dense:
      graph:
        inputs:
          dense: {kind: dense}
          emb: {kind: embeddings}
        blocks:
          joined: {kind: concat, inputs: [dense, emb]}
          shared: {kind: mlp, input: joined, widths: [8], activate_last: true}
          click_logit: {kind: mlp, input: shared, widths: [1]}
          watch_value: {kind: mlp, input: shared, widths: [1]}
        heads:
          click: {input: click_logit, label: label}
          watch: {input: watch_value, label: watch, loss: squared_error}
"#;
    let (model_start, model_end) = (
        RESOURCES.find("kind: dlrm").expect("the model"),
        RESOURCES.find("  topology:").expect("the topology"),
    );
    let with_graph = format!(
        "{}{graph}{}",
        &RESOURCES[..model_start],
        &RESOURCES[model_end..]
    );
    with_graph.replace(
        "    label: label\n",
        "    label: label\n    targets: [watch]\n",
    )
}

fn specs(resources: &str) -> (JobSpec, FeatureSchema) {
    let resources = primus_spec::parse_documents("test", resources).expect("valid resources");
    let (mut job, mut schema) = (None, None);
    for resource in resources {
        match resource {
            primus_spec::Resource::Job(j) => job = Some(j.spec),
            primus_spec::Resource::Dataset(d) => schema = Some(d.spec.schema),
            _ => {}
        }
    }
    (job.expect("job"), schema.expect("dataset"))
}

struct Process {
    addr: String,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Process {
    async fn start(settings: PsSettings) -> Self {
        let addr = settings.server.grpc_addr.to_string();
        let shutdown = Shutdown::new();
        let mut task = tokio::spawn(primus_ps::run(settings, shutdown.clone()));
        tokio::select! {
            health = wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(20)) => {
                health.expect("serving");
            }
            ended = &mut task => panic!("the PS on {addr} stopped while starting: {ended:?}"),
        }
        Self {
            addr,
            shutdown,
            task,
        }
    }

    async fn stop(self) {
        self.shutdown.trigger();
        self.task.await.expect("joined").expect("clean exit");
    }
}

struct Cluster {
    _nats: NatsServer,
    nats_url: String,
    job: JobSpec,
    schema: FeatureSchema,
    layout: ModelLayout,
    shards: Vec<Process>,
    replicas: Vec<Process>,
    training: PsClient,
}

fn ps_settings(nats: &str, job: &JobSpec, layout: &ModelLayout, port: u16) -> PsSettings {
    let mut settings = PsSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], port).into();
    settings.server.drain_timeout_ms = 1_000;
    settings.nats.url = nats.to_owned();
    settings.ps.tables = layout.ps_tables();
    settings.ps.shards_per_table = 4;
    settings.ps.dense_optimizer = job.model.dense.optimizer.clone();
    settings
}

fn shard_settings(
    nats: &str,
    job: &JobSpec,
    layout: &ModelLayout,
    index: usize,
    port: u16,
) -> PsSettings {
    let mut settings = ps_settings(nats, job, layout, port);
    settings.ps.job = JOB.into();
    settings.ps.shard_id = format!("ps-{index}");
    settings.ps.delta_notice_interval_ms = 50;
    settings
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port")
}

impl Cluster {
    async fn start() -> Self {
        Self::start_with(RESOURCES).await
    }

    /// A cluster of the Job in `resources` (named [`JOB`]).
    async fn start_with(resources: &str) -> Self {
        let nats = NatsServer::start().expect("nats-server");
        let (job, schema) = specs(resources);
        let layout = ModelLayout::new(&job.model, &schema).expect("layout");
        let mut shards = Vec::new();
        for i in 0..2 {
            let port = restartable_port().expect("port");
            let settings = shard_settings(&nats.url(), &job, &layout, i, port);
            shards.push(Process::start(settings).await);
        }
        let addrs: Vec<String> = shards.iter().map(|s| s.addr.clone()).collect();
        let training = PsClient::connect(&addrs).await.expect("training client");
        let params = ParamSet::init(&layout, 7);
        let tensors: Vec<primus_embedding::DenseValues> =
            params.tensors().iter().cloned().map(Into::into).collect();
        training.init_dense(&tensors).await.expect("init dense");
        let mut cluster = Self {
            nats_url: nats.url(),
            _nats: nats,
            job,
            schema,
            layout,
            shards,
            replicas: Vec::new(),
            training,
        };
        for _ in 0..2 {
            let replica = cluster
                .start_replica(restartable_port().expect("port"))
                .await;
            cluster.replicas.push(replica);
        }
        cluster
    }

    /// Stops training shard `index` and starts it again, empty, on the same address;
    /// with `await_restore`, as the master starts it: refusing training calls until a
    /// Restore or an Open.
    async fn restart_shard(&mut self, index: usize, await_restore: bool) {
        let down = self.shards.remove(index);
        let port = port_of(&down.addr);
        down.stop().await;
        let mut settings = shard_settings(&self.nats_url, &self.job, &self.layout, index, port);
        settings.ps.await_restore = await_restore;
        self.shards.insert(index, Process::start(settings).await);
    }

    async fn start_replica(&self, port: u16) -> Process {
        self.start_replica_with(port, None).await
    }

    /// A replica whose Predict requires the bearer tokens of `token_file`, when given.
    async fn start_replica_with(&self, port: u16, token_file: Option<PathBuf>) -> Process {
        let mut settings = ps_settings(&self.nats_url, &self.job, &self.layout, port);
        settings.ps.role = PsRole::Serving;
        settings.serving.job = JOB.into();
        settings.serving.model = Some(self.job.model.clone());
        settings.serving.schema = Some(self.schema.clone());
        settings.serving.token_file = token_file;
        Process::start(settings).await
    }

    fn topology(&self) -> Topology {
        let ids = |prefix: &str, ps: &[Process]| {
            ps.iter()
                .enumerate()
                .map(|(i, p)| (format!("{prefix}-{i}"), p.addr.clone()))
                .collect()
        };
        Topology {
            shards: ids("ps", &self.shards),
            replicas: ids("serving", &self.replicas),
        }
    }

    fn target(&self) -> SyncTarget {
        SyncTarget {
            job: JOB.into(),
            layout: self.layout.clone(),
            tower: Tower::Adapt,
            sparse_interval: Duration::from_millis(self.job.serving_sync.sparse_interval_ms),
            dense_interval: Duration::from_secs(self.job.serving_sync.dense_interval_seconds),
        }
    }

    /// A sync with the dense model and the current rows already on every replica.
    async fn synced(&self) -> JobSync {
        let mut sync = JobSync::new(self.target());
        sync.set_topology(&self.topology()).expect("topology");
        sync.sync_sparse().await;
        sync.sync_dense().await.expect("dense sync");
        sync
    }

    /// Runs the sync loop as serving-sync does, fed by the shards' delta notices.
    async fn follow(&self) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (notice_tx, notice_rx) = mpsc::channel(1);
        let bus = primus_bus::Bus::connect(&primus_config::NatsSettings {
            url: self.nats_url.clone(),
            ..Default::default()
        })
        .await
        .expect("nats");
        let subject = bus.subjects().delta(JOB, "*").expect("subject");
        let mut notices = bus
            .subscribe::<DeltaNotice>(subject)
            .await
            .expect("subscribe");
        tokio::spawn(async move {
            while let Some(Ok(notice)) = notices.next().await {
                let _ = notice_tx.try_send(notice.message);
            }
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let (_topology_tx, topology_rx) = watch::channel(self.topology());
        let sync = self.synced().await;
        let task = tokio::spawn(async move {
            let _keep_topology = _topology_tx;
            primus_serving_sync::follow(
                sync,
                topology_rx,
                notice_rx,
                None,
                Duration::from_secs(1),
                stop_rx,
            )
            .await;
        });
        (stop_tx, task)
    }

    /// The keys a sample's features map to, per model table (as training computes them).
    fn keys_of(&self, sample: &Sample) -> Vec<(String, Vec<u64>)> {
        let batch = primus_ps::serving::record_batch(&self.schema, std::slice::from_ref(sample))
            .expect("batch");
        let minibatch = FeaturePipeline::new(&self.schema)
            .minibatch(&batch)
            .expect("minibatch");
        let keys =
            BatchKeys::collect(&self.layout, &minibatch.to_kjt().expect("kjt")).expect("keys");
        self.layout
            .tables
            .iter()
            .zip(keys.tables)
            .map(|(t, k)| (t.name.clone(), k))
            .collect()
    }

    /// [`Cluster::train_on`] the samples of `items`, one after another.
    async fn train_items(&self, items: std::ops::Range<i64>, step: f32) {
        for item in items {
            self.train_on(&sample(item), step).await;
        }
    }

    /// A raw client of training shard `index`, for snapshots and restores.
    async fn shard_client(&self, index: usize) -> ParameterServerClient<Channel> {
        ParameterServerClient::connect(format!("http://{}", self.shards[index].addr))
            .await
            .expect("connect to a training shard")
    }

    /// Pushes gradients that move every key of `sample` (all tables).
    async fn train_on(&self, sample: &Sample, step: f32) {
        for (table, keys) in self.keys_of(sample) {
            let grads = vec![step; keys.len() * 4];
            self.training
                .push(&table, &keys, &grads)
                .await
                .expect("push");
        }
    }
}

fn number(x: f64) -> FeatureValue {
    FeatureValue {
        value: Some(Value::Number(x)),
    }
}

fn sample(item: i64) -> Sample {
    let mut features: HashMap<String, FeatureValue> = HashMap::new();
    features.insert("price".into(), number(12.5 + item as f64));
    features.insert("age".into(), number(0.3));
    features.insert("item".into(), number(item as f64));
    features.insert("shop".into(), number((item % 7) as f64));
    features.insert(
        "tags".into(),
        FeatureValue {
            value: Some(Value::Texts(primus_proto::v1::StringList {
                values: vec![format!("t{}", item % 5), "sale".into()],
            })),
        },
    );
    Sample { features }
}

async fn serving_client(addr: &str) -> ServingServiceClient<Channel> {
    ServingServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect replica")
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

async fn every_training_row(cluster: &Cluster) -> Rows {
    let mut rows = Rows::new();
    for shard in &cluster.shards {
        rows.extend(training_rows(&shard.addr).await);
    }
    rows
}

#[tokio::test(flavor = "multi_thread")]
async fn predict_follows_training_within_the_sparse_interval() {
    let cluster = Cluster::start().await;
    let (stop, task) = cluster.follow().await;
    let mut clients = Vec::new();
    for replica in &cluster.replicas {
        clients.push(serving_client(&replica.addr).await);
    }
    let interval = Duration::from_millis(cluster.job.serving_sync.sparse_interval_ms);
    for round in 0..5 {
        let probe = sample(100 + round);
        let before: Vec<f32> = {
            let mut all = Vec::new();
            for client in &mut clients {
                all.extend(predict(client, vec![probe.clone()]).await);
            }
            all
        };
        cluster.train_on(&probe, 0.8).await;
        let trained = Instant::now();
        for (r, client) in clients.iter_mut().enumerate() {
            loop {
                let now = predict(client, vec![probe.clone()]).await[0];
                if now != before[r] {
                    break;
                }
                assert!(
                    trained.elapsed() <= interval,
                    "round {round}: replica {r} still predicts {now} after {:?}",
                    trained.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    stop.send(true).expect("stop");
    task.await.expect("sync loop");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_replica_converges_to_the_training_rows_exactly() {
    let mut cluster = Cluster::start().await;
    let mut sync = cluster.synced().await;
    cluster.train_items(0..200, 0.1).await;
    sync.sync_sparse().await;
    let down = cluster.replicas.remove(0);
    let port = port_of(&down.addr);
    down.stop().await;
    // Training goes on while the replica is down; the other replica keeps up.
    cluster.train_items(150..400, -0.2).await;
    sync.sync_sparse().await;
    let restarted = cluster.start_replica(port).await;
    cluster.replicas.insert(0, restarted);
    cluster.train_items(390..420, 0.3).await;
    sync.sync_sparse().await;
    sync.sync_sparse().await;
    let expected = every_training_row(&cluster).await;
    assert!(expected.len() > 400, "{} training rows", expected.len());
    for replica in &cluster.replicas {
        let held = replica_rows(&replica.addr).await;
        assert_eq!(held.len(), expected.len(), "row count of {}", replica.addr);
        for (key, row) in &expected {
            assert_eq!(held.get(key), Some(row), "{key:?} on {}", replica.addr);
        }
    }
    // The restarted replica also got the dense model back: it predicts like the other.
    let probe = vec![sample(3), sample(333)];
    let a = predict(
        &mut serving_client(&cluster.replicas[0].addr).await,
        probe.clone(),
    )
    .await;
    let b = predict(&mut serving_client(&cluster.replicas[1].addr).await, probe).await;
    assert_eq!(a, b);
    // Dense freshness: the model every replica serves was exported moments ago.
    let age = sync.take_report().dense_age_ms;
    assert!(
        age.is_some_and(|ms| (0.0..60_000.0).contains(&ms)),
        "{age:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_training_shard_restarted_empty_does_not_take_serving_backwards() {
    let mut cluster = Cluster::start().await;
    let mut sync = cluster.synced().await;
    cluster.train_items(0..100, 0.1).await;
    sync.sync_sparse().await;
    let before = replica_rows(&cluster.replicas[0].addr).await;
    let shard0 = training_rows(&cluster.shards[0].addr).await;
    assert!(!shard0.is_empty(), "shard 0 holds none of the trained rows");

    cluster.restart_shard(0, false).await;
    sync.sync_sparse().await;
    sync.sync_sparse().await;
    for replica in &cluster.replicas {
        let held = replica_rows(&replica.addr).await;
        for (key, row) in &before {
            assert_eq!(held.get(key), Some(row), "{key:?} on {}", replica.addr);
        }
    }

    // Training goes on against the restarted shard; its new rows reach serving.
    cluster.train_items(1_000..1_100, 0.3).await;
    sync.sync_sparse().await;
    let fresh = training_rows(&cluster.shards[0].addr).await;
    assert!(!fresh.is_empty(), "the restarted shard trained nothing");
    for replica in &cluster.replicas {
        let held = replica_rows(&replica.addr).await;
        for (key, row) in &fresh {
            assert_eq!(held.get(key), Some(row), "{key:?} on {}", replica.addr);
        }
    }
}

/// A shard that crashed soon after a checkpoint comes back from it holding changes serving
/// had not received before the crash; once restored, every replica gets them. Until its
/// restore the shard exports nothing, so serving's watermark of it cannot pass the versions
/// the restore gives those rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_shard_restored_from_a_checkpoint_serving_lagged_brings_every_replica_its_rows() {
    let mut cluster = Cluster::start().await;
    let mut sync = cluster.synced().await;
    cluster.train_items(0..100, 0.1).await;
    sync.sync_sparse().await;
    cluster.train_items(100..200, -0.2).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let checkpoint = format!("file://{}/ckpt", dir.path().display());
    let manifest_uri = cluster
        .shard_client(0)
        .await
        .snapshot(SnapshotRequest {
            uri: checkpoint,
            ..SnapshotRequest::default()
        })
        .await
        .expect("snapshot of shard 0")
        .into_inner()
        .manifest_uri;
    let trained = every_training_row(&cluster).await;
    let replica = replica_rows(&cluster.replicas[0].addr).await;
    assert!(
        unlike(&trained, &replica) > 0,
        "serving already holds the checkpoint's rows"
    );

    cluster.restart_shard(0, true).await;
    sync.sync_sparse().await;
    cluster
        .shard_client(0)
        .await
        .restore(RestoreRequest {
            manifest_uri,
            ..RestoreRequest::default()
        })
        .await
        .expect("restore of shard 0");
    sync.sync_sparse().await;
    assert_eq!(every_training_row(&cluster).await, trained);
    for replica in &cluster.replicas {
        let held = replica_rows(&replica.addr).await;
        assert_eq!(
            unlike(&trained, &held),
            0,
            "rows on {} unlike training",
            replica.addr
        );
    }
}

/// Rows of `trained` that `held` lacks or holds otherwise.
fn unlike(trained: &Rows, held: &Rows) -> usize {
    trained
        .iter()
        .filter(|(key, row)| held.get(*key) != Some(*row))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_predicts_during_continuous_syncs_never_fail() {
    let cluster = Arc::new(Cluster::start().await);
    let (stop, task) = cluster.follow().await;
    let done = Arc::new(AtomicBool::new(false));
    let (answered, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut callers = Vec::new();
    for caller in 0..4 {
        let addr = cluster.replicas[caller % 2].addr.clone();
        let (done, answered, failed) = (done.clone(), answered.clone(), failed.clone());
        callers.push(tokio::spawn(async move {
            let mut client = serving_client(&addr).await;
            let mut i = 0;
            while !done.load(Ordering::Acquire) {
                let samples: Vec<Sample> = (0..16).map(|j| sample(i * 16 + j)).collect();
                i += 1;
                let request = PredictRequest {
                    job: JOB.into(),
                    samples,
                };
                match client.predict(request).await {
                    Ok(r) if r.get_ref().probabilities.len() == 16 => {
                        answered.fetch_add(1, Ordering::Relaxed)
                    }
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    // Training all along: rows change every few ms, dense models swap every second.
    let started = Instant::now();
    let mut item = 0;
    while started.elapsed() < Duration::from_secs(3) {
        cluster.train_on(&sample(item % 500), 0.05).await;
        item += 1;
    }
    done.store(true, Ordering::Release);
    for caller in callers {
        caller.await.expect("caller");
    }
    stop.send(true).expect("stop");
    task.await.expect("sync loop");
    let (answered, failed) = (
        answered.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    assert_eq!(
        failed,
        0,
        "{failed} of {} Predicts failed",
        answered + failed
    );
    assert!(answered > 20, "{answered} Predicts answered");
}
