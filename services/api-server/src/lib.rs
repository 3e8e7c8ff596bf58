//! `primus-api-server`: the one place where Job, Dataset and Metric resources are declared
//! and observed. Resources live in Redis ([`store`]); every change takes the next global
//! version, is logged for Watch replay and is published on `primus.events.<kind>.<name>`.
//! Every call needs a bearer token from `auth.token_file`. With `server.http_addr` it also
//! serves the web dashboard (the `dashboard` module) over the same resources and tokens.

mod dashboard;
mod service;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use primus_bus::Bus;
use primus_config::{ApiServerSettings, DashboardSettings, ResourceSource};
use primus_proto::v1::ResourceEvent;
use primus_proto::v1::api_service_server::ApiServiceServer;
use primus_service::{BearerTokens, Node, ServiceFuture, Services, Shutdown};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;

pub use service::MAX_SPEC_BYTES;

pub const SERVICE: &str = "primus-api-server";
pub const ABOUT: &str = concat!(
    "Primus API server: Job, Dataset and Metric resources in Redis, with compare-and-swap",
    " writes, Watch replay and change events on NATS. Bearer tokens from `auth.token_file`."
);

/// Requests up to this size are decoded, so an oversized spec gets the API's own error
/// naming the limit rather than a transport error.
const MAX_REQUEST_BYTES: usize = 16 << 20;

pub fn default_settings() -> ApiServerSettings {
    ApiServerSettings::default()
}

/// Runs until `shutdown`, then drains and returns.
pub fn run(settings: ApiServerSettings, shutdown: Shutdown) -> ServiceFuture {
    Box::pin(serve(settings, shutdown))
}

async fn serve(settings: ApiServerSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let Some(token_file) = &settings.auth.token_file else {
        anyhow::bail!(
            "no API tokens: set `auth.token_file` to a file with one bearer token per line"
        );
    };
    let tokens = BearerTokens::load(token_file, "auth.token_file")?;
    let mut grpc = settings.server.clone();
    let pages =
        match grpc.http_addr.take() {
            Some(addr) => Some(TcpListener::bind(addr).await.with_context(|| {
                format!("cannot listen on {addr} (setting `server.http_addr`)")
            })?),
            None => None,
        };
    let mut node = Node::bind(SERVICE, &grpc).await?;
    let bus = node.connect_nats(&settings.nats).await?;
    let redis = node.connect_redis(&settings.redis).await?;
    let store = store::Store::new(
        redis.clone(),
        &settings.redis.key_prefix,
        settings.store.event_log_retention,
    );
    let (changes, _) = watch::channel(0);
    let follower = tokio::spawn(follow_changes(bus.clone(), changes.clone()));
    let api = Arc::new(service::Api::new(
        store,
        bus.clone(),
        changes,
        Duration::from_millis(settings.store.watch_poll_interval_ms),
        shutdown.clone(),
    ));
    let dashboard = match pages {
        Some(listener) => {
            tracing::info!(addr = %listener.local_addr()?, "serving the dashboard");
            let jaeger = settings.traces.jaeger_query_url.clone();
            let source = dashboard_source(&settings.dashboard, &api).await?;
            let serving =
                dashboard::serve(listener, source, tokens.clone(), jaeger, shutdown.clone());
            Some(tokio::spawn(serving))
        }
        None => None,
    };
    let grpc = ApiServiceServer::from_arc(api).max_decoding_message_size(MAX_REQUEST_BYTES);
    let grpc = InterceptedService::new(grpc, move |request| tokens.check(request));
    node.serve(Services::new().grpc(grpc), shutdown).await?;
    if let Some(dashboard) = dashboard {
        dashboard.await.context("the dashboard's listener")??;
    }
    follower.abort();
    bus.drain().await?;
    Ok(())
}

/// What `dashboard.resources` names: this server's resources, or Kubernetes' custom ones.
async fn dashboard_source(
    settings: &DashboardSettings,
    api: &Arc<service::Api>,
) -> anyhow::Result<dashboard::Source> {
    Ok(match settings.resources {
        ResourceSource::ApiServer => dashboard::Source::Store(api.clone()),
        #[cfg(not(feature = "kubernetes"))]
        ResourceSource::Kubernetes => anyhow::bail!(
            "dashboard.resources: kubernetes: this primus-api-server was built without its kubernetes feature (cargo build -p primus-api-server --features kubernetes)"
        ),
        #[cfg(feature = "kubernetes")]
        ResourceSource::Kubernetes => {
            let custom = primus_kube_resources::client::CustomResources::connect(
                settings.kubeconfig.as_deref(),
                settings.namespace.as_deref(),
            )
            .await
            .context("dashboard.resources: kubernetes")?;
            tracing::info!(
                namespace = custom.namespace(),
                "the dashboard reads Kubernetes' custom resources"
            );
            dashboard::Source::Kubernetes(custom)
        }
    })
}

/// Wakes local watchers when another API server (same Redis) announces a change.
async fn follow_changes(bus: Bus, changes: watch::Sender<u64>) {
    let subject = bus.subjects().all_events();
    let mut events = match bus.subscribe::<ResourceEvent>(subject).await {
        Ok(events) => events,
        Err(e) => {
            tracing::warn!(error = %e, "not following other API servers' changes; watches poll");
            return;
        }
    };
    while let Some(received) = events.next().await {
        let version = received
            .ok()
            .and_then(|r| r.message.resource)
            .map_or(0, |r| r.resource_version);
        changes.send_modify(|latest| *latest = (*latest).max(version));
    }
}
