//! `primus-serving-sync`. Moves touched-key deltas from training PS shards to serving replicas, dense parameters less often.
//!
//! Built so far: the service process (settings, NATS connection, gRPC health that follows
//! the NATS connection, graceful SIGTERM). Its own RPCs arrive with later steps.

use primus_config::{DEFAULT_PORTS, NodeSettings};
use primus_service::Shutdown;
use tonic::service::Routes;

pub const SERVICE: &str = "primus-serving-sync";
pub const ABOUT: &str = concat!(
    "Primus serving-sync: moves training deltas to serving replicas.",
    " This build runs the service shell only: settings, connections, gRPC health."
);

pub fn default_settings() -> NodeSettings {
    NodeSettings::on_port(DEFAULT_PORTS.serving_sync)
}

/// Runs until `shutdown`, then drains and returns.
pub async fn run(settings: NodeSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    primus_service::serve_nats_node(SERVICE, &settings, Routes::default(), shutdown).await
}
