//! `primus-ps`, training role: serves this process's embedding tables ([`primus_embedding`])
//! and its dense parameters (with a server-side optimizer) over the ParameterServer gRPC API
//! (Lookup, Push, InitDense, PullDense, PushDense, Snapshot, Restore, Open, ExportDelta,
//! Stats), evicts idle rows on a timer. Snapshots go to any object-store URL through
//! primus-storage. With `ps.await_restore` training calls wait for a Restore or Open.
//!
//! With `ps.role = "serving"` the same binary is a serving replica ([`serving`]): table
//! replicas fed by serving-sync's deltas, the dense network in ONNX Runtime, Predict.

mod applied;
mod service;
pub mod serving;
mod snapshots;
mod tables;

use primus_spec::job::Device;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use primus_embedding::DenseStore;
use primus_proto::v1::parameter_server_server::ParameterServerServer;
use primus_service::{Node, ServiceFuture, Services, Shutdown};

use primus_config::{PsRole, PsSettings};

pub const SERVICE: &str = "primus-ps";
pub const ABOUT: &str = concat!(
    "Primus parameter server. Training role (default): embedding tables (from `ps.tables`)",
    " served over gRPC Lookup, Push, dense Init/Pull/Push, Snapshot, Restore, Open, ExportDelta",
    " and Stats. Serving role (`ps.role = \"serving\"`): table replicas fed by ApplyDelta, the dense",
    " network as ONNX (LoadDense), Predict."
);

pub fn default_settings() -> PsSettings {
    PsSettings::default()
}

/// Runs the role of `ps.role` until `shutdown`, then drains and returns.
pub fn run(settings: PsSettings, shutdown: Shutdown) -> ServiceFuture {
    Box::pin(serve(settings, shutdown))
}

async fn serve(settings: PsSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    match settings.ps.role {
        PsRole::Training => run_training(settings, shutdown).await,
        PsRole::Serving if settings.ps.device != Device::Cpu => anyhow::bail!(
            "ps.device: cuda holds a training PS's rows; a serving replica (ps.role = \"serving\") keeps its rows in host memory"
        ),
        PsRole::Serving => serving::run(settings, shutdown).await,
    }
}

async fn run_training(settings: PsSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let tables = Arc::new(tables::Tables::new(&settings.ps)?);
    let mut node = Node::bind(SERVICE, &settings.server).await?;
    let bus = node.connect_nats(&settings.nats).await?;
    let notifier = delta_identity(&settings.ps).map(|(job, shard)| {
        tokio::spawn(announce_deltas(
            bus.clone(),
            tables.clone(),
            job,
            shard,
            Duration::from_millis(settings.ps.delta_notice_interval_ms.max(10)),
        ))
    });
    let evictor = tokio::spawn(evict_periodically(
        tables.clone(),
        Duration::from_millis(settings.ps.eviction_interval_ms.max(100)),
    ));
    let dense = Arc::new(DenseStore::new(&settings.ps.dense_optimizer));
    let memory_limit = Arc::new(AtomicU64::new(settings.ps.memory_limit_bytes.unwrap_or(0)));
    let limiter = tokio::spawn(hold_memory_limit(
        tables.clone(),
        dense.clone(),
        memory_limit.clone(),
    ));
    let ps = ParameterServerServer::new(service::Ps::new(
        tables,
        dense,
        settings.storage.clone(),
        memory_limit,
        settings.ps.await_restore,
    ))
    .max_decoding_message_size(settings.ps.max_request_bytes)
    .max_encoding_message_size(usize::MAX);
    node.serve(Services::new().grpc(ps), shutdown).await?;
    evictor.abort();
    limiter.abort();
    if let Some(notifier) = notifier {
        notifier.abort();
    }
    bus.drain().await?;
    Ok(())
}

async fn evict_periodically(tables: Arc<tables::Tables>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    loop {
        ticks.tick().await;
        let evicted = tables.evict_expired();
        if evicted > 0 {
            tracing::info!(evicted, "evicted rows idle past their TTL");
        }
    }
}

/// How often the bytes held are checked against `ps.memory_limit_bytes`.
const MEMORY_CHECK: Duration = Duration::from_millis(100);

/// Keeps the tables refusing new rows while they and the dense parameters hold `limit`
/// bytes or more (0: no limit): a PS at its limit drops new keys' gradients instead of
/// growing until the system kills it.
async fn hold_memory_limit(
    tables: Arc<tables::Tables>,
    dense: Arc<DenseStore>,
    limit: Arc<AtomicU64>,
) {
    let mut ticks = tokio::time::interval(MEMORY_CHECK);
    let mut refusing = false;
    loop {
        ticks.tick().await;
        let limit = limit.load(Ordering::Acquire);
        if limit == 0 && !refusing {
            continue;
        }
        let bytes = tables.bytes() + dense.bytes();
        let at_limit = limit > 0 && bytes >= limit;
        if at_limit != refusing {
            refusing = at_limit;
            tables.refuse_new_rows(refusing);
            match refusing {
                true => tracing::warn!(
                    bytes,
                    limit,
                    "at ps.memory_limit_bytes ({limit} bytes): new keys are refused, existing rows keep training"
                ),
                false => tracing::info!(
                    bytes,
                    limit,
                    "under ps.memory_limit_bytes again: new keys get rows"
                ),
            }
        }
    }
}

/// The job and shard this PS announces deltas as, from settings or the master's environment.
fn delta_identity(settings: &primus_config::TableSettings) -> Option<(String, String)> {
    let job = primus_service::setting_or_env(&settings.job, "PRIMUS_JOB");
    let shard = primus_service::setting_or_env(&settings.shard_id, "PRIMUS_EXECUTOR_ID");
    match (job, shard) {
        (Some(job), Some(shard)) => Some((job, shard)),
        _ => {
            tracing::info!(
                "no ps.job / ps.shard_id (nor PRIMUS_JOB / PRIMUS_EXECUTOR_ID): no delta notices"
            );
            None
        }
    }
}

/// Publishes a DeltaNotice whenever the tables changed since the last one, at most once per
/// `interval`.
async fn announce_deltas(
    bus: primus_bus::Bus,
    tables: Arc<tables::Tables>,
    job: String,
    shard: String,
    interval: Duration,
) {
    let subject = match bus.subjects().delta(&job, &shard) {
        Ok(subject) => subject,
        Err(e) => return tracing::error!(error = %e, "delta notice subject"),
    };
    let mut announced = tables.version();
    let mut ticks = tokio::time::interval(interval);
    loop {
        ticks.tick().await;
        let version = tables.version();
        if version == announced {
            continue;
        }
        let notice = primus_proto::v1::DeltaNotice {
            job: job.clone(),
            shard: shard.clone(),
            version,
            pushes: tables.take_pushes(),
        };
        match bus.publish(subject.clone(), &notice).await {
            Ok(()) => announced = version,
            Err(e) => tracing::warn!(error = %e, "publishing a delta notice"),
        }
    }
}
