//! `primus-data-executor`. Runs data tasks (Parquet and stream sources), turns rows into minibatches and serves them to trainers.
//!
//! Built so far: the service process (settings, NATS connection, gRPC health that follows
//! the NATS connection, graceful SIGTERM). Its own RPCs arrive with later steps.

use primus_config::{DEFAULT_PORTS, NodeSettings};
use primus_service::Shutdown;
use tonic::service::Routes;

pub const SERVICE: &str = "primus-data-executor";
pub const ABOUT: &str = concat!(
    "Primus data executor: reads data tasks and serves minibatches to trainers.",
    " This build runs the service shell only: settings, connections, gRPC health."
);

pub fn default_settings() -> NodeSettings {
    NodeSettings::on_port(DEFAULT_PORTS.data_executor)
}

/// Runs until `shutdown`, then drains and returns.
pub async fn run(settings: NodeSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    primus_service::serve_nats_node(SERVICE, &settings, Routes::default(), shutdown).await
}
