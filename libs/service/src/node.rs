use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use futures::future::BoxFuture;
use primus_bus::Bus;
use primus_config::{NatsSettings, NodeSettings, RedisSettings, ServerSettings, TlsSettings};
use redis::aio::ConnectionManager;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, ServerTlsConfig};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::{Services, Shutdown};

/// gRPC health's service name, which every node serves.
const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

const DEPENDENCY_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// A check that does not answer within this is a dependency that is down.
const DEPENDENCY_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

type Check = Box<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// A service's gRPC listener, bound before serving so its address is known (port 0 works).
pub struct Node {
    service: &'static str,
    listener: TcpListener,
    drain_timeout: Duration,
    tls: Option<ServerTlsConfig>,
    advertise_ip: Option<std::net::IpAddr>,
    dependencies: Vec<(&'static str, Check)>,
}

impl Node {
    /// Binds the listener of `service` (health NOT_SERVING until serving starts).
    /// `server.http_addr` is refused: a service with web pages opens that listener itself
    /// and binds its node without it.
    pub async fn bind(service: &'static str, settings: &ServerSettings) -> anyhow::Result<Self> {
        if let Some(addr) = settings.http_addr {
            anyhow::bail!(
                "server.http_addr ({addr}): {service} serves no web pages; only primus-api-server opens that listener (its dashboard)"
            );
        }
        let tls = settings.tls.as_ref().map(load_tls).transpose()?;
        let listener = TcpListener::bind(settings.grpc_addr)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {} (setting `server.grpc_addr`)",
                    settings.grpc_addr
                )
            })?;
        Ok(Self {
            service,
            listener,
            drain_timeout: Duration::from_millis(settings.drain_timeout_ms),
            tls,
            advertise_ip: settings.advertise_ip,
            dependencies: Vec::new(),
        })
    }

    /// The address bound (the port chosen when 0 was asked).
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// The address others reach this listener at: the bound one, with the IP of
    /// `server.advertise_ip` when that is set.
    pub fn advertised_addr(&self) -> anyhow::Result<SocketAddr> {
        let mut addr = self.local_addr()?;
        if let Some(ip) = self.advertise_ip {
            addr.set_ip(ip);
        }
        Ok(addr)
    }

    /// Health reports NOT_SERVING whenever `check` says the dependency `name` is down.
    pub fn depends_on<F, Fut>(&mut self, name: &'static str, check: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = bool> + Send + 'static,
    {
        self.dependencies
            .push((name, Box::new(move || Box::pin(check()))));
    }

    /// Connects to NATS and makes the connection a health dependency.
    pub async fn connect_nats(&mut self, settings: &NatsSettings) -> anyhow::Result<Bus> {
        let bus = Bus::connect(settings).await?;
        let probe = bus.clone();
        self.depends_on("nats", move || {
            let connected = probe.is_connected();
            async move { connected }
        });
        Ok(bus)
    }

    /// Connects to Redis (checked with PING) and makes the connection a health dependency.
    #[expect(
        clippy::disallowed_methods,
        reason = "a PING checks the connection; it reads and writes no store's keys"
    )]
    pub async fn connect_redis(
        &mut self,
        settings: &RedisSettings,
    ) -> anyhow::Result<ConnectionManager> {
        let context = || {
            format!(
                "cannot connect to Redis at {} (setting `redis.url`)",
                primus_config::redact_url(&settings.url)
            )
        };
        let client = redis::Client::open(settings.url.as_str()).with_context(context)?;
        let mut redis = client
            .get_connection_manager()
            .await
            .with_context(context)?;
        redis::cmd("PING")
            .query_async::<String>(&mut redis)
            .await
            .with_context(context)?;
        let probe = redis.clone();
        self.depends_on("redis", move || {
            let mut probe = probe.clone();
            async move {
                redis::cmd("PING")
                    .query_async::<String>(&mut probe)
                    .await
                    .is_ok()
            }
        });
        Ok(redis)
    }

    /// Serves `services` plus gRPC health and reflection until `shutdown`, then drains
    /// in-flight calls for at most `server.drain_timeout_ms`.
    pub async fn serve(self, services: Services, shutdown: Shutdown) -> anyhow::Result<()> {
        let (reporter, health_service) = tonic_health::server::health_reporter();
        let reflection = reflection(services.names())?;
        let routes = services.into_routes();
        let addr = self.local_addr()?;
        let service = self.service;
        let monitor = tokio::spawn(monitor_dependencies(
            service,
            reporter.clone(),
            self.dependencies,
            shutdown.clone(),
        ));
        let stop = shutdown.clone();
        let incoming = TcpIncoming::from(self.listener);
        let tls_enabled = self.tls.is_some();
        // HTTP/1.1 too, for the plain HTTP routes; gRPC itself stays on h2.
        let mut builder = tonic::transport::Server::builder()
            .accept_http1(true)
            .max_frame_size(primus_proto::MAX_FRAME_SIZE);
        if let Some(tls) = self.tls {
            builder = builder
                .tls_config(tls)
                .context("TLS settings (`server.tls`)")?;
        }
        let server = builder
            .trace_fn(primus_telemetry::propagation::grpc_server_span)
            .add_routes(routes.add_service(health_service).add_service(reflection))
            // No Nagle: small gRPC replies would otherwise wait ~40 ms for the peer's delayed ACK.
            .serve_with_incoming_shutdown(incoming.with_nodelay(Some(true)), async move {
                stop.wait().await;
                set_status(&reporter, service, ServingStatus::NotServing).await;
            });
        let mut server = tokio::spawn(server);
        tracing::info!(service, %addr, tls = tls_enabled, "serving gRPC");
        let served = tokio::select! {
            result = &mut server => result,
            _ = shutdown.wait() => match tokio::time::timeout(self.drain_timeout, &mut server).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!(service, timeout = ?self.drain_timeout, "drain timed out; closing open calls");
                    server.abort();
                    Ok(Ok(()))
                }
            },
        };
        monitor.abort();
        served
            .context("gRPC server task")?
            .with_context(|| format!("gRPC server on {addr}"))
    }
}

/// gRPC reflection (v1) describing `names` and health, so grpcurl, grpcui and Postman
/// discover what this listener serves.
fn reflection(
    names: &[&'static str],
) -> anyhow::Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
> {
    let mut builder = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(primus_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(HEALTH_SERVICE);
    for name in names {
        builder = builder.with_service_name(*name);
    }
    builder
        .build_v1()
        .context("gRPC reflection over the compiled descriptors")
}

/// Reads the PEM files named by `server.tls`; an unreadable file fails start naming it.
fn load_tls(settings: &TlsSettings) -> anyhow::Result<ServerTlsConfig> {
    let read = |path: &std::path::Path, key: &str| {
        std::fs::read(path).with_context(|| {
            format!(
                "cannot read {} (setting `server.tls.{key}`)",
                path.display()
            )
        })
    };
    let cert = read(&settings.cert_file, "cert_file")?;
    let key = read(&settings.key_file, "key_file")?;
    // rustls is built with ring only; tonic, like reqwest, takes the process-wide provider.
    // An earlier install is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
}

/// The whole life of a service whose only dependency is NATS: bind, connect, serve
/// `services` until `shutdown`, drain the listener, then drain NATS.
pub async fn serve_nats_node(
    service: &'static str,
    settings: &NodeSettings,
    services: Services,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let mut node = Node::bind(service, &settings.server).await?;
    let bus = node.connect_nats(&settings.nats).await?;
    node.serve(services, shutdown).await?;
    bus.drain().await?;
    Ok(())
}

async fn set_status(reporter: &HealthReporter, service: &str, status: ServingStatus) {
    reporter.set_service_status("", status).await;
    reporter.set_service_status(service, status).await;
}

/// Keeps health in step with the dependencies; logs every transition.
async fn monitor_dependencies(
    service: &'static str,
    reporter: HealthReporter,
    dependencies: Vec<(&'static str, Check)>,
    shutdown: Shutdown,
) {
    let mut last: Option<Vec<&'static str>> = None;
    loop {
        let mut down = Vec::new();
        for (name, check) in &dependencies {
            let up = tokio::time::timeout(DEPENDENCY_CHECK_TIMEOUT, check()).await;
            if !matches!(up, Ok(true)) {
                down.push(*name);
            }
        }
        if shutdown.is_triggered() {
            return;
        }
        if last.as_ref() != Some(&down) {
            if down.is_empty() {
                tracing::info!(service, "healthy");
                set_status(&reporter, service, ServingStatus::Serving).await;
            } else {
                tracing::warn!(service, unreachable = ?down, "unhealthy");
                set_status(&reporter, service, ServingStatus::NotServing).await;
            }
            last = Some(down);
        }
        tokio::time::sleep(DEPENDENCY_CHECK_INTERVAL).await;
    }
}
