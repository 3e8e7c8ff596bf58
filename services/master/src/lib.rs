//! `primus-master`. Watches Jobs and drives each one: resource controller, data task planner, task service, scaling.
//!
//! Built so far: the service process (settings, NATS connection, gRPC health that follows
//! the NATS connection, graceful SIGTERM). Its own RPCs arrive with later steps.

use primus_config::{DEFAULT_PORTS, NodeSettings};
use primus_service::Shutdown;
use tonic::service::Routes;

pub const SERVICE: &str = "primus-master";
pub const ABOUT: &str = concat!(
    "Primus master: the per-cluster job driver (job controller, resource controller, data driver).",
    " This build runs the service shell only: settings, connections, gRPC health."
);

pub fn default_settings() -> NodeSettings {
    NodeSettings::on_port(DEFAULT_PORTS.master)
}

/// Runs until `shutdown`, then drains and returns.
pub async fn run(settings: NodeSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    primus_service::serve_nats_node(SERVICE, &settings, Routes::default(), shutdown).await
}
