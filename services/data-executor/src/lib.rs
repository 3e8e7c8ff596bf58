//! `primus-data-executor` (Primus §4.3.2, §5.2): registers with the job's master, runs
//! several data tasks at once (Parquet row groups of the task's files, only the schema's
//! columns, from the task's offset; or a stream source's JetStream subject through a
//! durable consumer, acking each message once its rows are buffered, so an executor that
//! dies loses nothing unbuffered; or an online joiner pairing a features subject with an
//! actions subject by request id, `join`; with `rebalance` loading, also other
//! executors' partitions that are behind, `rebalance`), turns rows into minibatches with the Dataset's
//! feature pipeline, holds them in bounded per-source serving buffers, and serves them to
//! trainers over `DatasetService.StreamMinibatches`, choosing the source by Algorithm 2.
//! A task's offset as reported to the master counts rows *served*, so a crash loses no
//! buffered row. Heartbeats (CPU, memory) and metrics (buffer fill, rows served) go to NATS.

mod barrier;
pub mod buffer;
mod executor;
mod held;
mod join;
pub mod ledger;
mod position;
mod rebalance;
mod runner;
mod server;
mod stream;

use std::sync::Arc;

use anyhow::Context;
use primus_proto::v1::dataset_service_server::DatasetServiceServer;
use primus_service::{ExecutorIdentity, Node, ServiceFuture, Services, Shutdown};

pub use buffer::priority;

use primus_config::DataExecutorSettings;

pub const SERVICE: &str = "primus-data-executor";
pub const ABOUT: &str = concat!(
    "Primus data executor: runs a job's data tasks (Parquet files, JetStream subjects) and",
    " serves minibatches to",
    " trainers. Identity from data.job/executor_id/master_addr or else PRIMUS_JOB,",
    " PRIMUS_EXECUTOR_ID and PRIMUS_MASTER_ADDR (set by the master); the Dataset from",
    " `data.dataset` (written by the master)."
);

pub fn default_settings() -> DataExecutorSettings {
    DataExecutorSettings::default()
}

/// How long the work loop has, after the server stopped, to report its final offsets.
const WORKER_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Runs until `shutdown` (or until the work loop fails), then drains and returns.
pub fn run(settings: DataExecutorSettings, shutdown: Shutdown) -> ServiceFuture {
    Box::pin(serve(settings, shutdown))
}

async fn serve(settings: DataExecutorSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let data = &settings.data;
    let identity =
        ExecutorIdentity::resolve("data", &data.job, &data.executor_id, &data.master_addr)?;
    let dataset = settings
        .data
        .dataset
        .clone()
        .context("data.dataset is not set: the master writes the Job's Dataset there")?;
    let mut node = Node::bind(SERVICE, &settings.server).await?;
    let grpc_addr = node.advertised_addr()?.to_string();
    let bus = node.connect_nats(&settings.nats).await?;
    let executor = Arc::new(executor::Executor::new(
        identity,
        &dataset,
        settings.storage.clone(),
        settings.data.clone(),
        shutdown.clone(),
    ));
    let mut worker = {
        let (executor, bus, shutdown) = (executor.clone(), bus.clone(), shutdown.clone());
        tokio::spawn(async move {
            let result = executor.work(grpc_addr, bus).await;
            if result.is_err() {
                shutdown.trigger();
            }
            result
        })
    };
    let services = Services::new().grpc(DatasetServiceServer::new(server::DatasetServer {
        executor,
    }));
    node.serve(services, shutdown).await?;
    bus.drain().await?;
    // The work loop reports the final served offsets once the streams have ended.
    match tokio::time::timeout(WORKER_STOP_WAIT, &mut worker).await {
        // A failed work loop is the process's failure; a finished one is not.
        Ok(finished) => finished??,
        Err(_) => {
            tracing::warn!("the work loop did not stop in time");
            worker.abort();
        }
    }
    Ok(())
}
