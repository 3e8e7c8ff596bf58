//! `primus-master`. Watches Jobs and drives each one: resource controller, data task planner, task service, scaling.
//!
//! Built so far: the service process (settings, NATS connection, gRPC health that follows
//! the NATS connection, graceful SIGTERM). Its own RPCs arrive with later steps.

use primus_config::{DEFAULT_PORTS, NodeSettings};
use primus_service::{Node, Shutdown};
use tonic::service::Routes;

pub const SERVICE: &str = "primus-master";
pub const ABOUT: &str =
    "Primus master: the per-cluster job driver (job controller, resource controller, data driver).";

pub fn default_settings() -> NodeSettings {
    NodeSettings::on_port(DEFAULT_PORTS.master)
}

/// Runs until `shutdown`, then drains and returns.
pub async fn run(settings: NodeSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let mut node = Node::bind(SERVICE, &settings.server).await?;
    let bus = node.connect_nats(&settings.nats).await?;
    node.serve(Routes::default(), shutdown).await?;
    bus.drain().await?;
    Ok(())
}
