//! `primus-trainer` (Primus §5.1, Monolith §2.2): trains a job's model. It finds the job's
//! PS shards and data executors in the master's topology, offers its initial dense
//! parameters to the PS (the first trainer's win), then for every minibatch looks up the
//! unique keys of each table, pools them (on the CPU or a GPU, `trainer.device`), runs
//! the dense network forward and backward (burn, CPU) and pushes sparse gradients of unique keys and dense gradients to the PS,
//! whose optimizers apply them. Dense parameters are pulled every `dense_pull_every`
//! steps; while the trainer is their only writer the pulls read its own exact copy and the
//! pushes go out in the background (`mirror`). Progressive-validation metrics (AUC, logloss, calibration over the last
//! `eval_window` samples, each scored before it was trained on), samples/s and the time
//! shares of lookup/compute/push go to NATS. The process exits 0 when the data ends.
//!
//! Membership: data executors that join the job (the topology is polled) are read too; one
//! that leaves ends its stream. On SIGTERM the trainer leaves: it asks every executor to
//! end its streams, trains on what they had already sent, reports its totals and exits 0,
//! so a trainer scaled in loses no minibatch.
//!
//! Checkpoint barrier: once every data executor's stream has delivered checkpoint N's
//! marker and every minibatch before it is trained and pushed, the trainer tells the
//! master (`CheckpointService.TrainerAligned`) its step and sample totals, so the PS
//! snapshot the master then takes and the recorded data offsets describe the same moment.
//! Each minibatch is confirmed consumed to its data executor once its pushes have landed
//! (with the trainer's totals); one not confirmed when the trainer dies is served again. A
//! trainer of a restored job continues its totals in the checkpoint; one restarted after a
//! crash, the highest of those the master last saw and those it confirmed.
//!
//! With `trainer.hot_set.enabled`, the job's trainers replicate its most accessed rows
//! and train them in lockstep over NATS ([`hot`], HypeReca §5); the rest stays on the PS.

pub mod device;
pub mod feed;
mod fresh;
pub mod hot;
pub mod meter;
mod mirror;
mod prefetch;
pub mod store;
pub mod train;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::FutureExt;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use primus_bus::Bus;
use primus_data_client::{Membership, ReaderOptions, Received, TrainerTotals};
use primus_model::{DenseDevice, Model, ModelError, ModelLayout};
use primus_proto::v1::checkpoint_service_client::CheckpointServiceClient;
use primus_proto::v1::topology_service_client::TopologyServiceClient;
use primus_proto::v1::{
    Endpoint, GetTopologyRequest, MetricsReport, Role, TrainerAlignedRequest, TrainerTotalsRequest,
    TrainerTotalsResponse,
};
use primus_ps_client::{PsClient, ShardSource};
use primus_service::{ExecutorIdentity, Node, ServiceFuture, Services, Shutdown};
use primus_spec::job::Device;
use tonic::transport::Channel;

use device::EmbeddingDevice;
use feed::{Feed, Incoming};
use hot::{HotSync, RingEndpoint, RingInbox, TrainerDirectory};
use meter::{HeadReport, Report, Reporter};
use primus_config::TrainerSettings;
use store::RemoteStore;
use train::Trainer;

pub const SERVICE: &str = "primus-trainer";
pub const ABOUT: &str = concat!(
    "Primus trainer: trains a job's dense network on minibatches from its data executors,",
    " embeddings and dense parameters on its PS shards. Identity from",
    " trainer.job/executor_id/master_addr or else PRIMUS_JOB, PRIMUS_EXECUTOR_ID and",
    " PRIMUS_MASTER_ADDR; model and schema from trainer.model/trainer.schema (written by",
    " the master)."
);

pub fn default_settings() -> TrainerSettings {
    TrainerSettings::default()
}

/// Runs until the job's data ends (then exits cleanly) or `shutdown`.
pub fn run(settings: TrainerSettings, shutdown: Shutdown) -> ServiceFuture {
    Box::pin(serve(settings, shutdown))
}

async fn serve(settings: TrainerSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let train = &settings.trainer;
    let identity = ExecutorIdentity::resolve(
        "trainer",
        &train.job,
        &train.executor_id,
        &train.master_addr,
    )?;
    let model_spec = train
        .model
        .as_ref()
        .context("trainer.model is not set: the master writes the Job's model there")?;
    let schema = train
        .schema
        .as_ref()
        .context("trainer.schema is not set: the master writes the Dataset's schema there")?;
    let layout = ModelLayout::new(model_spec, schema)?;
    let device = EmbeddingDevice::open(train.device, train.cuda_device)?;
    let model = dense_model(layout, train)?;
    tracing::info!(embedding = ?device, dense = ?model.device(), "devices");
    let mut node = Node::bind(SERVICE, &settings.server).await?;
    let grpc_addr = node.advertised_addr()?.to_string();
    let bus = node.connect_nats(&settings.nats).await?;
    // The hot set's ring exchange reaches this trainer at its gRPC address.
    let ring = RingEndpoint {
        inbox: Arc::default(),
        addr: grpc_addr.clone(),
    };
    let max_pass = RingInbox::max_pass_bytes(train.hot_set.max_rows, &model.layout().ps_tables());
    let services = Services::new().grpc(ring.inbox.service(max_pass));
    let worker = {
        let (bus, shutdown, settings) = (bus.clone(), shutdown.clone(), settings.clone());
        tokio::spawn(async move {
            let result = work(&identity, model, device, &settings, &bus, ring, &shutdown).await;
            // Done or failed, the process ends: the master sees its exit status.
            shutdown.trigger();
            result
        })
    };
    node.serve(services, shutdown).await?;
    // A leaving trainer trains on what was sent to it and reports before the bus closes.
    let result = match tokio::time::timeout(LEAVE_TIMEOUT, worker).await {
        Ok(joined) => joined.context("the training task")?,
        Err(_) => Err(anyhow::anyhow!(
            "the trainer did not finish leaving within {}s",
            LEAVE_TIMEOUT.as_secs()
        )),
    };
    bus.drain().await?;
    result
}

/// How long a stopping trainer has to train on what it was sent and report.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a trainer looks for data executors that joined the job.
const TOPOLOGY_POLL: Duration = Duration::from_secs(1);

/// The dense network on the trainer's device. MTRM's network runs on a GPU through burn,
/// which needs the `cuda` feature: a GPU trainer built without it keeps MTRM's network on
/// the CPU and says so.
fn dense_model(layout: ModelLayout, train: &primus_config::TrainSettings) -> anyhow::Result<Model> {
    let gpu = match train.device {
        Device::Cpu => return Model::new(layout).context("the trainer's dense network"),
        Device::Cuda => DenseDevice::Cuda(train.cuda_device),
    };
    match Model::on(layout.clone(), gpu) {
        Ok(model) => Ok(model),
        Err(ModelError::NoCudaBuild) => {
            tracing::warn!(
                "trainer.device is cuda, but model.kind mtrm's network needs the cuda feature, which this binary was built without: the dense network runs on the CPU"
            );
            Model::new(layout).context("the trainer's dense network")
        }
        Err(e) => Err(e).context("trainer.device is cuda"),
    }
}

/// The job's PS shards (in shard order) and data executors, once the master lists them.
async fn topology(identity: &ExecutorIdentity) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let url = format!("http://{}", identity.master_addr);
    let mut last_error = None;
    for _ in 0..120 {
        match TopologyServiceClient::connect(url.clone()).await {
            Ok(mut client) => {
                let request = GetTopologyRequest {
                    job: identity.job.clone(),
                };
                match client.get_topology(request).await {
                    Ok(response) => {
                        let endpoints = response.into_inner().endpoints;
                        let ps = primus_proto::role_addrs(&endpoints, Role::Ps);
                        let data = primus_proto::role_addrs(&endpoints, Role::DataExecutor);
                        if !ps.is_empty() && !data.is_empty() {
                            return Ok((ps, data));
                        }
                        last_error = Some(anyhow::anyhow!(
                            "the topology lists no PS or no data executor yet"
                        ));
                    }
                    Err(status) => last_error = Some(status.into()),
                }
            }
            Err(e) => last_error = Some(e.into()),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no topology"))).with_context(|| {
        format!(
            "asking the master at {} for the job's topology",
            identity.master_addr
        )
    })
}

/// The Job's endpoints as the master's topology lists them now.
async fn endpoints_now(master: String, job: String) -> anyhow::Result<Vec<Endpoint>> {
    let mut client = TopologyServiceClient::connect(master).await?;
    let request = GetTopologyRequest { job };
    Ok(client.get_topology(request).await?.into_inner().endpoints)
}

/// The Job's PS shards as the master's topology lists them now: a resharded Job's new list,
/// asked for when a shard refuses parameters that moved.
fn ps_shard_source(identity: &ExecutorIdentity) -> ShardSource {
    let (url, job) = (
        format!("http://{}", identity.master_addr),
        identity.job.clone(),
    );
    Arc::new(move || {
        let endpoints = endpoints_now(url.clone(), job.clone());
        Box::pin(async move {
            let endpoints = endpoints.await.map_err(|e| format!("{e:#}"))?;
            Ok(primus_proto::role_addrs(&endpoints, Role::Ps))
        })
    })
}

/// The job's trainers as the master's topology lists them (the hot set's members).
fn trainer_directory(identity: &ExecutorIdentity) -> TrainerDirectory {
    let (url, job) = (
        format!("http://{}", identity.master_addr),
        identity.job.clone(),
    );
    Arc::new(move || {
        let endpoints = endpoints_now(url.clone(), job.clone());
        Box::pin(async move {
            let trainers = primus_proto::role_endpoints(&endpoints.await?, Role::Trainer);
            Ok(trainers.into_iter().map(|e| e.id).collect())
        })
    })
}

/// The totals (steps, samples, samples per source) this trainer continues from: zero for a new job, its totals
/// in the checkpoint a job was restored from, or, after a crash, the highest of the last
/// ones the master saw of it and those it confirmed to the data executors at `data_addrs`
/// with its minibatches (so a restart resets no counter and loses no count: a minibatch
/// it did not confirm is served again and counted by whoever trains it).
async fn starting_totals(
    identity: &ExecutorIdentity,
    data_addrs: &[String],
) -> anyhow::Result<TrainerTotals> {
    let master = master_totals(identity).await?;
    let mut totals = TrainerTotals {
        steps: master.steps,
        samples: master.samples,
        sources: master.source_samples.into_iter().collect(),
    };
    for addr in data_addrs {
        let (job, trainer) = (&identity.job, &identity.executor_id);
        match primus_data_client::confirmed_totals(addr, job, trainer).await {
            Ok(confirmed) => totals = totals.max(confirmed),
            Err(e) => {
                tracing::warn!(%addr, error = %e, "asking a data executor for this trainer's confirmed totals")
            }
        }
    }
    Ok(totals)
}

async fn master_totals(identity: &ExecutorIdentity) -> anyhow::Result<TrainerTotalsResponse> {
    let mut master =
        CheckpointServiceClient::connect(format!("http://{}", identity.master_addr)).await?;
    let request = TrainerTotalsRequest {
        job: identity.job.clone(),
        trainer_id: identity.executor_id.clone(),
    };
    Ok(master.trainer_totals(request).await?.into_inner())
}

/// Executors start together; retry until each answers.
async fn retry<T, F, Fut>(what: &str, mut attempt: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let mut last = None;
    for _ in 0..120 {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("gave up"))).with_context(|| what.to_owned())
}

/// Addresses of data executors that join the job after `initial`, polled from the master's
/// topology (an address that left and comes back joins again).
fn joined_data_executors(
    identity: &ExecutorIdentity,
    initial: &[String],
) -> BoxStream<'static, String> {
    struct Polling {
        master_addr: String,
        job: String,
        known: std::collections::HashSet<String>,
        found: std::collections::VecDeque<String>,
    }
    let polling = Polling {
        master_addr: identity.master_addr.clone(),
        job: identity.job.clone(),
        known: initial.iter().cloned().collect(),
        found: Default::default(),
    };
    stream::unfold(polling, |mut polling| async move {
        loop {
            if let Some(addr) = polling.found.pop_front() {
                return Some((addr, polling));
            }
            tokio::time::sleep(TOPOLOGY_POLL).await;
            let listed = primus_data_client::data_executors(&polling.master_addr, &polling.job);
            match listed.await {
                Ok(addrs) => {
                    polling.known.retain(|addr| addrs.contains(addr));
                    for addr in addrs {
                        if polling.known.insert(addr.clone()) {
                            polling.found.push_back(addr);
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "polling the topology"),
            }
        }
    })
    .boxed()
}

async fn work(
    identity: &ExecutorIdentity,
    model: Model,
    device: EmbeddingDevice,
    settings: &TrainerSettings,
    bus: &Bus,
    ring: RingEndpoint,
    shutdown: &Shutdown,
) -> anyhow::Result<()> {
    let train = &settings.trainer;
    let (ps_addrs, data_addrs) = tokio::select! {
        topology = topology(identity) => topology?,
        _ = shutdown.wait() => return Ok(()),
    };
    let client = retry("connecting to the PS shards", || async {
        Ok(PsClient::connect(&ps_addrs).await?)
    })
    .await?
    .following(ps_shard_source(identity));
    let store = Arc::new(RemoteStore::new(client.clone()));
    let hot = if train.hot_set.enabled {
        let directory = trainer_directory(identity);
        let (job, id) = (&identity.job, &identity.executor_id);
        let hot_set = train.hot_set.clone();
        let device = device.clone();
        let layout = model.layout();
        let ring = Some(ring.clone());
        Some(HotSync::join(hot_set, bus, job, id, layout, directory, device, ring).await?)
    } else {
        None
    };
    let mut trainer = Trainer::start(
        model,
        store,
        train.seed,
        train.dense_pull_every,
        train.eval_window,
    )
    .await?
    .on_device(device);
    if let Some(hot) = hot {
        trainer = trainer.with_hot_set(hot);
    }
    let totals = retry("asking the master for this trainer's totals", || {
        starting_totals(identity, &data_addrs)
    })
    .await?;
    trainer.resume_from(totals);
    let options = ReaderOptions {
        job: identity.job.clone(),
        trainer_id: identity.executor_id.clone(),
        batch_size: train.batch_size,
        grouped: (train.schema.iter().flat_map(|s| &s.sparse)).any(|f| f.dedup_group.is_some()),
        master_addr: identity.master_addr.clone(),
    };
    if options.grouped {
        tracing::info!(
            "minibatches come as IKJT: each dedup group's features are resolved once per unique row (RecD)"
        );
    }
    let batches = retry("opening the data executors' minibatch streams", || async {
        let leaving = shutdown.clone();
        let membership = Membership {
            joined: joined_data_executors(identity, &data_addrs),
            leave: async move { leaving.wait().await }.boxed(),
        };
        Ok(primus_data_client::read(&data_addrs, &options, membership).await?)
    })
    .await?
    .map(|item| {
        item.map(|received| match received {
            Received::Batch(received) => Feed::batch(
                Incoming::new(
                    received.batch,
                    received.kind,
                    &received.source,
                    &received.trace,
                )
                .with_receipt(received.receipt),
            ),
            Received::Again(receipt) => Feed::Again(receipt),
            Received::Barrier(id) => Feed::Barrier(id),
        })
        .map_err(anyhow::Error::from)
    });
    let endpoint = Endpoint {
        role: Role::Trainer as i32,
        id: identity.executor_id.clone(),
        grpc_addr: ring.addr,
    };
    let publisher = Publisher::new(bus, identity, endpoint, client)?;
    tracing::info!(ps = ?ps_addrs, data_executors = ?data_addrs, "training");
    let interval = Duration::from_millis(train.metrics_interval_ms.max(100));
    let result = trainer.train(batches, interval, &publisher).await;
    let report = trainer.meter.report();
    publisher.report(&report).await;
    tracing::info!(
        samples = report.samples,
        steps = report.steps,
        auc = ?report.evaluation.auc,
        logloss = ?report.evaluation.logloss,
        calibration = ?report.evaluation.calibration,
        "training ended"
    );
    for head in &report.heads {
        let [loss, auc, logloss, rmse] = head_gauges(head).map(|(_, value)| value);
        tracing::info!(head = %head.name, ?loss, ?auc, ?logloss, ?rmse, "head at the end");
    }
    result
}

/// A head's figures by the names of its gauges (`head.<name>.<figure>`).
fn head_gauges(head: &HeadReport) -> [(&'static str, Option<f64>); 4] {
    [
        ("loss", head.loss),
        ("auc", head.auc),
        ("logloss", head.logloss),
        ("rmse", head.rmse),
    ]
}

/// The longest a PS call waited on a resharding since the last report, in milliseconds.
fn longest_move_wait(ps: &PsClient) -> Option<f64> {
    let longest = ps.take_move_waits().into_iter().max()?;
    Some(longest.as_secs_f64() * 1_000.0)
}

/// Publishes a trainer's reports as `MetricsReport`s on its job's metrics subject and
/// tells the master when a checkpoint barrier is aligned.
pub struct Publisher {
    bus: Bus,
    subject: String,
    job: String,
    endpoint: Endpoint,
    master: CheckpointServiceClient<Channel>,
    /// The PS client the trainer calls through: how long its calls waited on a resharding.
    ps: PsClient,
}

impl Publisher {
    fn new(
        bus: &Bus,
        identity: &ExecutorIdentity,
        endpoint: Endpoint,
        ps: PsClient,
    ) -> anyhow::Result<Self> {
        let subject = bus
            .subjects()
            .metrics(&identity.job, "trainer", &identity.executor_id)?;
        let master = format!("http://{}", identity.master_addr);
        let master = tonic::transport::Endpoint::from_shared(master.clone())
            .with_context(|| format!("master address {master:?}"))?
            .connect_lazy();
        Ok(Self {
            bus: bus.clone(),
            subject,
            job: identity.job.clone(),
            endpoint,
            master: CheckpointServiceClient::new(master),
            ps,
        })
    }
}

impl Reporter for Publisher {
    async fn report(&self, report: &Report) {
        let mut gauges = std::collections::HashMap::new();
        gauges.insert("samples_per_second".to_owned(), report.samples_per_second);
        let evaluation = &report.evaluation;
        for (name, value) in [
            ("loss", report.loss),
            ("auc", evaluation.auc),
            ("logloss", evaluation.logloss),
            ("calibration", evaluation.calibration),
            ("lookup_share", Some(report.lookup_share)),
            ("compute_share", Some(report.compute_share)),
            ("push_share", Some(report.push_share)),
            ("hot_rows", Some(report.hot_rows as f64)),
            ("hot_share", report.hot_share),
            ("ps_move_wait_ms", longest_move_wait(&self.ps)),
        ] {
            if let Some(value) = value {
                gauges.insert(name.to_owned(), value);
            }
        }
        for head in &report.heads {
            for (name, value) in head_gauges(head) {
                if let Some(value) = value {
                    gauges.insert(format!("head.{}.{name}", head.name), value);
                }
            }
        }
        let message = MetricsReport {
            job: self.job.clone(),
            endpoint: Some(self.endpoint.clone()),
            unix_ms: primus_spec::time::unix_ms(),
            gauges,
            samples: report.samples,
            steps: report.steps,
            source_samples: (report.sources.iter())
                .map(|(source, n)| (source.clone(), *n))
                .collect(),
        };
        if let Err(e) = self.bus.publish(self.subject.clone(), &message).await {
            tracing::warn!(error = %e, "publishing metrics");
        }
    }

    async fn aligned(&self, checkpoint_id: u64, totals: &TrainerTotals) {
        let (steps, samples) = (totals.steps, totals.samples);
        let request = TrainerAlignedRequest {
            job: self.job.clone(),
            trainer_id: self.endpoint.id.clone(),
            checkpoint_id,
            steps,
            samples,
            source_samples: (totals.sources.iter())
                .map(|(source, n)| (source.clone(), *n))
                .collect(),
        };
        match self.master.clone().trainer_aligned(request).await {
            Ok(_) => tracing::info!(
                checkpoint = checkpoint_id,
                steps,
                samples,
                "checkpoint barrier aligned"
            ),
            Err(status) => {
                tracing::warn!(checkpoint = checkpoint_id, %status, "reporting an aligned checkpoint barrier")
            }
        }
    }
}
