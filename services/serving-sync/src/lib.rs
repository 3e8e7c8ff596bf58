//! `primus-serving-sync`: keeps every serving replica of every Job with
//! `serving_sync.enabled` fresh (Monolith §2.2.3).
//!
//! - Discovery (this file): lists Jobs on the API server every `sync.discovery_interval_ms`;
//!   for each Running Job with serving enabled it builds the model layout from the Job and
//!   its Dataset, asks the masters (`sync.master_addrs`) for the topology, and runs one
//!   [`sync::JobSync`] loop, stopped when the Job ends or is deleted.
//! - Delta notices from training PS shards (NATS `<p>.job.<job>.delta.<shard>`) start a
//!   sparse sync at once; otherwise one runs every `sparse_interval_ms` of the Job.
//! - Metrics (freshness, rows and bytes moved, dense loads, failures) go to NATS as the
//!   `serving_sync` role of the Job; the master folds them into the Job's Metric resource.

pub mod sync;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use primus_api_client::{ApiClient, ClientSettings};
use primus_bus::Bus;
use primus_model::{ModelLayout, Tower};
use primus_proto::v1::topology_service_client::TopologyServiceClient;
use primus_proto::v1::{DeltaNotice, Endpoint, GetTopologyRequest, MetricsReport, Role};
use primus_service::{Node, ServiceFuture, Services, Shutdown};
use primus_spec::Kind;
use primus_spec::dataset::DatasetSpec;
use primus_spec::job::{JobSpec, TrainingMode};
use primus_spec::status::{Phase, Status};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use primus_config::ServingSyncSettings;
use sync::{JobSync, SyncReport, SyncTarget, Topology};

pub const SERVICE: &str = "primus-serving-sync";
pub const ABOUT: &str = concat!(
    "Primus serving-sync: moves touched rows from training PS shards to serving replicas on",
    " every delta notice and sparse interval, and the dense network as ONNX on the dense interval."
);

pub fn default_settings() -> ServingSyncSettings {
    ServingSyncSettings::default()
}

/// Runs until `shutdown`, then stops every job's sync and returns.
pub fn run(settings: ServingSyncSettings, shutdown: Shutdown) -> ServiceFuture {
    Box::pin(serve(settings, shutdown))
}

async fn serve(settings: ServingSyncSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let client = ClientSettings::from_settings(&settings.api)?;
    let mut node = Node::bind(SERVICE, &settings.server).await?;
    let bus = node.connect_nats(&settings.nats).await?;
    let api = ApiClient::connect_patiently(&client, 40)
        .await
        .context("setting `api.server`")?;
    let discovery = tokio::spawn(discover(
        api,
        bus.clone(),
        settings.sync.clone(),
        shutdown.clone(),
    ));
    let served = node.serve(Services::new(), shutdown).await;
    discovery.await.context("the discovery task")??;
    bus.drain().await?;
    served
}

/// Delta notices queued per Job between its cycles (their pushes are linked from the next).
const NOTICES_QUEUED: usize = 64;

struct RunningSync {
    topology: watch::Sender<Topology>,
    notices: mpsc::Sender<DeltaNotice>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

async fn discover(
    api: ApiClient,
    bus: Bus,
    settings: primus_config::SyncSettings,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let notice_subject = bus
        .subjects()
        .delta(primus_bus::subjects::ANY, primus_bus::subjects::ANY)?;
    let mut notices = bus.subscribe::<DeltaNotice>(notice_subject).await?;
    let mut running: HashMap<String, RunningSync> = HashMap::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(
        settings.discovery_interval_ms.max(50),
    ));
    loop {
        tokio::select! {
            _ = shutdown.wait() => break,
            _ = ticks.tick() => {
                if let Err(e) = rediscover(&api, &bus, &settings, &mut running).await {
                    tracing::warn!(error = %e, "listing jobs");
                }
            }
            Some(notice) = notices.next() => {
                let Ok(notice) = notice else { continue };
                if let Some(job) = running.get(&notice.message.job) {
                    // A full channel already holds notices that trigger a sync (this one's
                    // version is moved by it too; its pushes go unlinked).
                    let _ = job.notices.try_send(notice.message);
                }
            }
        }
    }
    for (_, job) in running.drain() {
        let _ = job.stop.send(true);
        let _ = job.task.await;
    }
    Ok(())
}

/// Starts syncs of new serving Jobs, updates topologies, stops syncs of ended Jobs.
async fn rediscover(
    api: &ApiClient,
    bus: &Bus,
    settings: &primus_config::SyncSettings,
    running: &mut HashMap<String, RunningSync>,
) -> anyhow::Result<()> {
    let jobs = api.list(Kind::Job, HashMap::new()).await?;
    let mut active = Vec::new();
    for resource in jobs.resources {
        let name = resource.name.clone();
        let status: Status = serde_json::from_str(&resource.status_json).unwrap_or_default();
        let Ok(spec) = serde_json::from_str::<JobSpec>(&resource.spec_json) else {
            continue;
        };
        if !spec.serving_sync.enabled || status.phase != Phase::Running {
            continue;
        }
        let topology = match topology_of(&settings.master_addrs, &name).await {
            Ok(topology) => topology,
            Err(e) => {
                tracing::debug!(job = %name, error = %e, "no topology yet");
                continue;
            }
        };
        active.push(name.clone());
        if let Some(job) = running.get(&name) {
            job.topology.send_if_modified(|held| {
                let changed = *held != topology;
                *held = topology.clone();
                changed
            });
            continue;
        }
        let target = match sync_target(api, &name, &spec).await {
            Ok(target) => target,
            Err(e) => {
                tracing::warn!(job = %name, error = %e, "cannot serve this job");
                continue;
            }
        };
        tracing::info!(job = %name, shards = topology.shards.len(), replicas = topology.replicas.len(), "syncing");
        running.insert(name, start(target, topology, bus.clone(), settings));
    }
    let ended: Vec<String> = running
        .keys()
        .filter(|name| !active.contains(name))
        .cloned()
        .collect();
    for name in ended {
        if let Some(job) = running.remove(&name) {
            let _ = job.stop.send(true);
            let _ = job.task.await;
            tracing::info!(job = %name, "sync stopped: the job ended");
        }
    }
    Ok(())
}

/// The layout and intervals of a Job (its Dataset read from the API server).
async fn sync_target(api: &ApiClient, job: &str, spec: &JobSpec) -> anyhow::Result<SyncTarget> {
    let dataset = api.get(Kind::Dataset, &spec.dataset).await?;
    let dataset: DatasetSpec = serde_json::from_str(&dataset.spec_json)
        .with_context(|| format!("Dataset {:?}", spec.dataset))?;
    let layout = ModelLayout::new(&spec.model, &dataset.schema)?;
    Ok(SyncTarget {
        job: job.to_owned(),
        layout,
        tower: serving_tower(spec.mode),
        sparse_interval: Duration::from_millis(spec.serving_sync.sparse_interval_ms),
        dense_interval: Duration::from_secs(spec.serving_sync.dense_interval_seconds),
    })
}

/// MTRM serves with the adapt tower once the job trains on streams (it adds the adapt
/// correction to the memory tower); on batch data only the memory tower is trained.
pub fn serving_tower(mode: TrainingMode) -> Tower {
    match mode {
        TrainingMode::Batch => Tower::Memory,
        _ => Tower::Adapt,
    }
}

/// The job's training PS shards and serving replicas, from the first master that knows it.
async fn topology_of(masters: &[String], job: &str) -> anyhow::Result<Topology> {
    let mut last_error = anyhow::anyhow!("sync.master_addrs is empty");
    for master in masters {
        let answer = async {
            let mut client = TopologyServiceClient::connect(format!("http://{master}")).await?;
            let response = client
                .get_topology(GetTopologyRequest {
                    job: job.to_owned(),
                })
                .await?;
            anyhow::Ok(response.into_inner().endpoints)
        }
        .await;
        match answer {
            Ok(endpoints) => return topology_from(&endpoints),
            Err(e) => last_error = e.context(format!("master {master}")),
        }
    }
    Err(last_error)
}

fn topology_from(endpoints: &[Endpoint]) -> anyhow::Result<Topology> {
    let pairs = |role| {
        primus_proto::role_endpoints(endpoints, role)
            .into_iter()
            .map(|e| (e.id, e.grpc_addr))
            .collect::<Vec<_>>()
    };
    let topology = Topology {
        shards: pairs(Role::Ps),
        replicas: pairs(Role::Serving),
    };
    if topology.shards.is_empty() || topology.replicas.is_empty() {
        anyhow::bail!("the topology lists no PS shard or no serving replica yet");
    }
    Ok(topology)
}

fn start(
    target: SyncTarget,
    topology: Topology,
    bus: Bus,
    settings: &primus_config::SyncSettings,
) -> RunningSync {
    let (topology_tx, topology_rx) = watch::channel(topology);
    let (notice_tx, notice_rx) = mpsc::channel(NOTICES_QUEUED);
    let (stop_tx, stop_rx) = watch::channel(false);
    let report_every = Duration::from_millis(settings.report_interval_ms.max(100));
    let task = tokio::spawn(follow(
        JobSync::new(target),
        topology_rx,
        notice_rx,
        Some(bus),
        report_every,
        stop_rx,
    ));
    RunningSync {
        topology: topology_tx,
        notices: notice_tx,
        stop: stop_tx,
        task,
    }
}

/// One job's loop: a sparse sync on every notice and interval, the dense sync when due,
/// a metrics report every `report_every` (to `bus` when given).
pub async fn follow(
    mut sync: JobSync,
    mut topology: watch::Receiver<Topology>,
    mut notices: mpsc::Receiver<DeltaNotice>,
    bus: Option<Bus>,
    report_every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let job = sync.target().job.clone();
    if let Err(e) = sync.set_topology(&topology.borrow_and_update()) {
        return tracing::error!(%job, error = %e, "bad topology");
    }
    let mut sparse = tokio::time::interval(sync.target().sparse_interval);
    let mut reports = tokio::time::interval(report_every);
    let mut dense_synced = false;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            changed = topology.changed() => {
                if changed.is_err() {
                    break;
                }
                if let Err(e) = sync.set_topology(&topology.borrow_and_update()) {
                    tracing::error!(%job, error = %e, "bad topology");
                }
                continue;
            }
            _ = reports.tick() => {
                if let Some(bus) = &bus {
                    publish_report(bus, &job, sync.take_report()).await;
                }
                continue;
            }
            Some(notice) = notices.recv() => {
                sync.note(&notice);
                // Notices queued meanwhile are moved by the same cycle.
                while let Ok(queued) = notices.try_recv() {
                    sync.note(&queued);
                }
            }
            _ = sparse.tick() => {}
        }
        let cycle = tracing::info_span!(parent: None, "serving_sync.sparse", primus.job = %job);
        primus_telemetry::propagation::add_links(&cycle, sync.take_pushes());
        sync.sync_sparse().instrument(cycle).await;
        if sync.dense_due() {
            let cycle = tracing::info_span!(parent: None, "serving_sync.dense", primus.job = %job);
            match sync.sync_dense().instrument(cycle).await {
                Ok(version) => {
                    dense_synced = true;
                    tracing::debug!(%job, version, "dense model exported");
                }
                // Until trainers have initialised the dense parameters there is nothing to pull.
                Err(e) if !dense_synced => tracing::debug!(%job, error = %e, "no dense model yet"),
                Err(e) => tracing::warn!(%job, error = %e, "dense sync failed"),
            }
        }
    }
}

async fn publish_report(bus: &Bus, job: &str, report: SyncReport) {
    let Ok(subject) = bus.subjects().metrics(job, "serving_sync", "0") else {
        return;
    };
    let count = |n: u64| n as f64;
    let mut freshness = report.freshness_ms.clone();
    freshness.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        let i = ((freshness.len() as f64 - 1.0) * q).round() as usize;
        freshness.get(i).copied()
    };
    let mut gauges: HashMap<String, f64> = [
        ("sync_cycles", count(report.cycles)),
        ("delta_rows", count(report.delta_rows)),
        ("delta_bytes", count(report.delta_bytes)),
        ("dense_loads", count(report.dense_loads)),
        ("sync_failures", count(report.failures)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if let Some(age) = report.dense_age_ms {
        gauges.insert("dense_age_ms".into(), age);
    }
    if let (Some(p50), Some(p99)) = (quantile(0.5), quantile(0.99)) {
        gauges.insert("freshness_p50_ms".into(), p50);
        gauges.insert("freshness_p99_ms".into(), p99);
    }
    let now_ms = primus_spec::time::unix_ms();
    let message = MetricsReport {
        job: job.to_owned(),
        endpoint: Some(Endpoint {
            role: Role::ServingSync as i32,
            id: "serving-sync".into(),
            grpc_addr: String::new(),
        }),
        unix_ms: now_ms,
        gauges,
        ..MetricsReport::default()
    };
    if let Err(e) = bus.publish(subject, &message).await {
        tracing::warn!(%job, error = %e, "publishing sync metrics");
    }
}
