//! `primus-ps`. Holds embedding tables and dense parameters; the serving role answers Predict.
//!
//! Built so far: the service process (settings, NATS connection, gRPC health that follows
//! the NATS connection, graceful SIGTERM). Its own RPCs arrive with later steps.

use primus_config::{DEFAULT_PORTS, NodeSettings};
use primus_service::Shutdown;
use tonic::service::Routes;

pub const SERVICE: &str = "primus-ps";
pub const ABOUT: &str = concat!(
    "Primus parameter server: embedding tables and dense parameters (training or serving role).",
    " This build runs the service shell only: settings, connections, gRPC health."
);

pub fn default_settings() -> NodeSettings {
    NodeSettings::on_port(DEFAULT_PORTS.ps)
}

/// Runs until `shutdown`, then drains and returns.
pub async fn run(settings: NodeSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    primus_service::serve_nats_node(SERVICE, &settings, Routes::default(), shutdown).await
}
