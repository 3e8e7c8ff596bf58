//! `primus-api-server`. Stores Job, Dataset and Metric resources in Redis and publishes
//! their changes on NATS.
//!
//! Built so far: the service process (settings, NATS and Redis connections, gRPC health that
//! follows both, graceful SIGTERM). The resource API arrives with the next step.

use anyhow::Context;
use primus_config::{ApiServerSettings, RedisSettings};
use primus_service::{Node, Shutdown};
use redis::aio::ConnectionManager;
use tonic::service::Routes;

pub const SERVICE: &str = "primus-api-server";
pub const ABOUT: &str = concat!(
    "Primus API server: Job, Dataset and Metric resources (in Redis; changes on NATS).",
    " This build runs the service shell only: settings, connections, gRPC health."
);

pub fn default_settings() -> ApiServerSettings {
    ApiServerSettings::default()
}

/// Runs until `shutdown`, then drains and returns.
pub async fn run(settings: ApiServerSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let mut node = Node::bind(SERVICE, &settings.server).await?;
    let bus = node.connect_nats(&settings.nats).await?;
    let redis = connect_redis(&settings.redis).await?;
    node.depends_on("redis", move || {
        let mut redis = redis.clone();
        async move {
            redis::cmd("PING")
                .query_async::<String>(&mut redis)
                .await
                .is_ok()
        }
    });
    node.serve(Routes::default(), shutdown).await?;
    bus.drain().await?;
    Ok(())
}

async fn connect_redis(settings: &RedisSettings) -> anyhow::Result<ConnectionManager> {
    let context = || {
        format!(
            "cannot connect to Redis at {} (setting `redis.url`)",
            primus_config::redact_url(&settings.url)
        )
    };
    let client = redis::Client::open(settings.url.as_str()).with_context(context)?;
    let mut connection = client
        .get_connection_manager()
        .await
        .with_context(context)?;
    redis::cmd("PING")
        .query_async::<String>(&mut connection)
        .await
        .with_context(context)?;
    Ok(connection)
}
