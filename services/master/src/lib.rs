//! `primus-master`: drives the Jobs of its shard.
//!
//! - [`controller`]: follows Jobs and runs each one through its phases, writing status
//!   conditions and folding metrics into the Metric resource.
//! - [`resources`]: where Jobs and Datasets come from and status, metrics and events go
//!   (`master.resources`): the Primus API server, or the Kubernetes API's PrimusJob,
//!   PrimusDataset and PrimusMetric custom resources (the master as their operator).
//! - [`checkpoint`]: the checkpoint coordinator (barrier, PS snapshots and task offsets
//!   committed together) and the restore of both when a Job starts again.
//! - gRPC: `TaskService` ([`tasks`]) for data executors (and trainers reporting the rows a
//!   dead executor served them), `CheckpointService` for trainers, `TopologyService`
//!   ([`topology`]).
//!
//! The resource backends (`master.backend`: executors as child processes or as pods) are
//! `primus-backend` ([`serve_on`] runs the master over any other, such as
//! `primus-scripted`'s executors that are no processes); the data-task plane (planner, task queue, monitor) is
//! `primus-data-tasks`.

pub mod checkpoint;
mod config_db;
pub mod context;
pub mod controller;
mod job;
pub use job::executors::job_executors;
pub mod metrics;
pub mod resources;
mod shard;
pub mod tasks;
pub mod ticks;
pub mod topology;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use primus_api_client::{ApiClient, ClientSettings};
use primus_proto::v1::checkpoint_service_server::CheckpointServiceServer;
use primus_proto::v1::task_service_server::TaskServiceServer;
use primus_proto::v1::topology_service_server::TopologyServiceServer;
use primus_service::{Node, ServiceFuture, Services, SettingFlag, Shutdown};

use primus_config::{BackendKind, MasterSettings, ResourceSource};
use resources::Resources;
pub use ticks::TickTimes;

pub const SERVICE: &str = "primus-master";
pub const ABOUT: &str = concat!(
    "Primus master: follows Jobs, starts their executors (as processes or Kubernetes pods), plans data tasks",
    " from their Datasets into a Redis task queue, serves the task and topology services."
);

/// `--shard i/n` sets `master.shard`.
pub const FLAGS: &[SettingFlag] = &[SettingFlag {
    long: "shard",
    key: "master.shard",
    help: "Drive only the jobs whose name hashes to i modulo n, as `i/n`",
}];

pub fn default_settings() -> MasterSettings {
    MasterSettings::default()
}

/// Runs until `shutdown`, then stops every executor it started and returns.
pub fn run(settings: MasterSettings, shutdown: Shutdown) -> ServiceFuture {
    Box::pin(serve(settings, shutdown))
}

async fn serve(settings: MasterSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let host_cores = match settings.master.backend {
        BackendKind::Local => std::thread::available_parallelism()
            .ok()
            .map(|n| n.get() as f64),
        BackendKind::Kubernetes => None,
    };
    let (node, parts, master_addr) = connect(settings, host_cores).await?;
    match parts.settings.master.backend {
        BackendKind::Local => {
            let backend = Arc::new(primus_backend::local::LocalBackend::new(
                parts.settings.local.clone(),
                master_addr.to_string(),
            ));
            let leftovers = backend.kill_leftovers();
            if leftovers > 0 {
                tracing::warn!(leftovers, "killed executors left by a previous master");
            }
            let ticks = TickTimes::default();
            let served = drive_jobs(node, parts, backend.clone(), master_addr, shutdown, ticks);
            let served = served.await;
            backend.shutdown().await;
            served
        }
        #[cfg(not(feature = "kubernetes"))]
        BackendKind::Kubernetes => Err(without_kubernetes("master.backend")),
        #[cfg(feature = "kubernetes")]
        BackendKind::Kubernetes => {
            let kubernetes = parts.settings.kubernetes.clone();
            let reach = kubernetes.master_addr.clone();
            let backend = primus_backend::kubernetes::KubernetesBackend::connect(
                kubernetes,
                parts.shard,
                reach.unwrap_or_else(|| master_addr.to_string()),
            )
            .await
            .context("the kubernetes backend")?;
            let ticks = TickTimes::default();
            drive_jobs(node, parts, Arc::new(backend), master_addr, shutdown, ticks).await
        }
    }
}

/// Runs the master until `shutdown` with `backend` in place of the one `master.backend`
/// names, recording each status tick's duration in `ticks`: how the master runs over a
/// backend that starts no process (the in-process test tier and the master's benchmark).
/// The capacity its `policy: auto` Jobs divide is `master.cluster`'s alone.
pub async fn serve_on<B: primus_backend::ResourceBackend>(
    settings: MasterSettings,
    backend: Arc<B>,
    ticks: TickTimes,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let (node, parts, master_addr) = connect(settings, None).await?;
    drive_jobs(node, parts, backend, master_addr, shutdown, ticks).await
}

/// Binds the master's gRPC address and connects to NATS, Redis and its resources' source.
async fn connect(
    settings: MasterSettings,
    host_cores: Option<f64>,
) -> anyhow::Result<(Node, Parts, SocketAddr)> {
    let shard = shard::parse_shard(&settings.master.shard).map_err(anyhow::Error::msg)?;
    let capacity = primus_job_policy::Capacity::from_settings(&settings.master.cluster, host_cores)
        .map_err(anyhow::Error::msg)?;
    let mut node = Node::bind(SERVICE, &settings.server).await?;
    let master_addr = advertised(node.advertised_addr()?);
    let bus = node.connect_nats(&settings.nats).await?;
    let redis = node.connect_redis(&settings.redis).await?;
    let resources = connect_resources(&settings, master_addr).await?;
    let parts = Parts {
        resources,
        bus,
        redis,
        shard,
        capacity,
        settings,
    };
    Ok((node, parts, master_addr))
}

/// The source `master.resources` names.
#[cfg_attr(not(feature = "kubernetes"), allow(unused_variables))]
async fn connect_resources(
    settings: &MasterSettings,
    master_addr: SocketAddr,
) -> anyhow::Result<Resources> {
    Ok(match settings.master.resources {
        ResourceSource::ApiServer => {
            let client = ClientSettings::from_settings(&settings.api)?;
            let api = ApiClient::connect_patiently(&client, API_CONNECT_ATTEMPTS)
                .await
                .context("setting `api.server`")?;
            Resources::ApiServer(api)
        }
        #[cfg(not(feature = "kubernetes"))]
        ResourceSource::Kubernetes => return Err(without_kubernetes("master.resources")),
        #[cfg(feature = "kubernetes")]
        ResourceSource::Kubernetes => {
            let kube = resources::kubernetes::KubeResources::connect(
                &settings.kubernetes,
                master_addr.to_string(),
            )
            .await
            .map_err(anyhow::Error::msg)
            .context("master.resources: kubernetes")?;
            Resources::Kubernetes(Arc::new(kube))
        }
    })
}

/// A setting that names Kubernetes in a master built without it.
#[cfg(not(feature = "kubernetes"))]
fn without_kubernetes(setting: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{setting}: kubernetes: this primus-master was built without its kubernetes feature (cargo build -p primus-master --features kubernetes)"
    )
}

/// What the master connected to before choosing its backend.
struct Parts {
    resources: Resources,
    bus: primus_bus::Bus,
    redis: redis::aio::ConnectionManager,
    shard: (u32, u32),
    capacity: primus_job_policy::Capacity,
    settings: MasterSettings,
}

/// Serves the master's gRPC services and drives its Jobs on `backend` until `shutdown`.
async fn drive_jobs<B: primus_backend::ResourceBackend>(
    node: Node,
    parts: Parts,
    backend: Arc<B>,
    master_addr: SocketAddr,
    shutdown: Shutdown,
    ticks: TickTimes,
) -> anyhow::Result<()> {
    let Parts {
        resources,
        bus,
        redis,
        shard,
        capacity,
        settings,
    } = parts;
    let catalog = Arc::new(primus_data_tasks::plan::StoreCatalog::new(
        settings.storage.clone(),
    ));
    let jobs = tasks::JobRegistry::default();
    let topologies = topology::Topologies::default();
    let tasks = Arc::new(tasks::Tasks::new(
        jobs.clone(),
        topologies.clone(),
        settings.master.tasks.clone(),
    ));
    let services = Services::new()
        .grpc(TaskServiceServer::from_arc(tasks.clone()))
        .grpc(CheckpointServiceServer::from_arc(tasks))
        .grpc(TopologyServiceServer::new(topologies.clone()));
    let context = Arc::new(context::Context {
        capacity,
        cluster: primus_job_policy::ClusterPlans::default(),
        resources,
        bus: bus.clone(),
        redis,
        shard,
        backend,
        cache: Arc::new(primus_data_tasks::plan::ListingCache::new(
            catalog,
            LISTING_CACHE_PARTITIONS,
        )),
        jobs,
        topologies,
        settings,
        ticks,
    });
    tracing::info!(%master_addr, shard = ?shard, "master ready");
    let controller = tokio::spawn(controller::run(context, shutdown.clone()));
    let served = node.serve(services, shutdown).await;
    let _ = controller.await;
    bus.drain().await?;
    served
}

/// 20 s of retries: the API server may start after the master.
const API_CONNECT_ATTEMPTS: u32 = 40;

/// Partition listings kept for the planner (the windows in flight of each source, across jobs).
const LISTING_CACHE_PARTITIONS: usize = 256;

/// The address executors dial: the listener's, with a wildcard IP replaced by loopback.
fn advertised(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], addr.port()))
    } else {
        addr
    }
}
