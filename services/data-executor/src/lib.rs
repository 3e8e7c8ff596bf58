//! `primus-data-executor`. Runs data tasks (Parquet and stream sources), turns rows into minibatches and serves them to trainers.
//!
//! Built so far: the service process (settings, NATS connection, gRPC health that follows
//! the NATS connection, graceful SIGTERM). Its own RPCs arrive with later steps.

use primus_config::{DEFAULT_PORTS, NodeSettings};
use primus_service::{Node, Shutdown};
use tonic::service::Routes;

pub const SERVICE: &str = "primus-data-executor";
pub const ABOUT: &str =
    "Primus data executor: reads data tasks and serves minibatches to trainers.";

pub fn default_settings() -> NodeSettings {
    NodeSettings::on_port(DEFAULT_PORTS.data_executor)
}

/// Runs until `shutdown`, then drains and returns.
pub async fn run(settings: NodeSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let mut node = Node::bind(SERVICE, &settings.server).await?;
    let bus = node.connect_nats(&settings.nats).await?;
    node.serve(Routes::default(), shutdown).await?;
    bus.drain().await?;
    Ok(())
}
