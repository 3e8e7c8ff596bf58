//! `primus-trainer`. Pulls minibatches, looks up embeddings on the PS shards, trains the dense network, pushes gradients.
//!
//! Built so far: the service process (settings, NATS connection, gRPC health that follows
//! the NATS connection, graceful SIGTERM). Its own RPCs arrive with later steps.

use primus_config::{DEFAULT_PORTS, NodeSettings};
use primus_service::Shutdown;
use tonic::service::Routes;

pub const SERVICE: &str = "primus-trainer";
pub const ABOUT: &str = concat!(
    "Primus trainer: trains the dense network on minibatches, embeddings on the PS.",
    " This build runs the service shell only: settings, connections, gRPC health."
);

pub fn default_settings() -> NodeSettings {
    NodeSettings::on_port(DEFAULT_PORTS.trainer)
}

/// Runs until `shutdown`, then drains and returns.
pub async fn run(settings: NodeSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    primus_service::serve_nats_node(SERVICE, &settings, Routes::default(), shutdown).await
}
