//! The typed settings of every service. Every field has a default, so an empty file is valid.
//! Sections are shared types (`server`, `nats`, `telemetry`, ...); each service's settings
//! type names the sections it reads.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The gRPC listener and how long to drain on shutdown.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct ServerSettings {
    /// host:port to listen on; port 0 picks a free one (logged at start).
    pub grpc_addr: SocketAddr,
    /// After SIGTERM, how long in-flight requests may take before the listener closes.
    pub drain_timeout_ms: u64,
    /// Serve TLS instead of plaintext when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSettings>,
    /// The IP others reach this listener at, when it listens on a wildcard (`0.0.0.0`) or
    /// behind an address it cannot see: a pod's IP on Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise_ip: Option<IpAddr>,
    /// host:port of a plain-HTTP listener for web pages beside gRPC: the API server's
    /// dashboard. Unset: none. Services without web pages refuse it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_addr: Option<SocketAddr>,
}

/// PEM files of the gRPC listener's certificate chain and private key.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM file of the certificate chain.
    pub cert_file: PathBuf,
    /// PEM file of the private key.
    pub key_file: PathBuf,
}

impl ServerSettings {
    fn on_port(port: u16) -> Self {
        Self {
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], port)),
            drain_timeout_ms: 10_000,
            tls: None,
            advertise_ip: None,
            http_addr: None,
        }
    }
}

/// Connection to the NATS server that carries events, heartbeats, metrics and streams.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct NatsSettings {
    /// `nats://host:port` (credentials as `nats://user:password@host:port`, which
    /// `--print-settings` and logs leave out).
    #[serde(serialize_with = "crate::secret::url_with_credentials")]
    pub url: String,
    /// First token of every subject (`primus.events...`), so clusters can share a server.
    pub subject_prefix: String,
    /// How long one connection attempt may take.
    pub connect_timeout_ms: u64,
    /// Attempts before giving up at start (a service waits for NATS, not forever).
    pub connect_attempts: u32,
}

impl Default for NatsSettings {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            subject_prefix: "primus".into(),
            connect_timeout_ms: 2_000,
            connect_attempts: 10,
        }
    }
}

/// Connection to the Redis server holding resources and task queues.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct RedisSettings {
    /// `redis://host:port/db` (password as `redis://:password@host:port`, which
    /// `--print-settings` and logs leave out).
    #[serde(serialize_with = "crate::secret::url_with_credentials")]
    pub url: String,
    /// Every key this cluster writes starts with this.
    pub key_prefix: String,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".into(),
            key_prefix: "primus".into(),
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object a line (for log collectors).
    Json,
}

/// Logs and traces.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct TelemetrySettings {
    /// An `EnvFilter` directive such as `info,primus_master=debug` (RUST_LOG overrides it).
    pub log_filter: String,
    /// Pretty lines or JSON objects.
    pub log_format: LogFormat,
    /// OTLP/gRPC collector (`http://127.0.0.1:4317`); traces are exported only when set.
    pub otlp_endpoint: Option<String>,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            log_filter: "info".into(),
            log_format: LogFormat::Pretty,
            otlp_endpoint: None,
        }
    }
}

/// Credentials and endpoint for `s3://` URLs (others need none).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Default, JsonSchema)]
#[serde(default)]
pub struct S3Settings {
    /// Endpoint of an S3-compatible server (MinIO, SeaweedFS); empty means AWS.
    pub endpoint: Option<String>,
    /// The region (`us-east-1` when unset and no `AWS_REGION`).
    pub region: Option<String>,
    /// Access key id; unset: `AWS_ACCESS_KEY_ID`.
    pub access_key_id: Option<String>,
    /// Secret key; unset: `AWS_SECRET_ACCESS_KEY`. Shown as `<redacted>` by
    /// `--print-settings` and in logs.
    pub secret_access_key: Option<crate::Secret>,
    /// Allow plain http endpoints (loopback servers, MinIO in compose); when false,
    /// `AWS_ALLOW_HTTP` decides.
    pub allow_http: bool,
}

/// Settings for `hdfs://` URLs.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct HdfsSettings {
    /// Failover attempts against the namenode; the client's own default takes minutes to
    /// give up on a dead namenode, so this stays small.
    pub failover_max_attempts: u32,
    /// First pause between failover attempts.
    pub failover_sleep_base_ms: u64,
    /// Longest pause between failover attempts.
    pub failover_sleep_max_ms: u64,
    /// A secured (Kerberos) cluster: the principal the process authenticates as
    /// (`primus@EXAMPLE.COM`); its key comes from `kerberos_keytab`, else from the ticket
    /// cache (`KRB5CCNAME`). The KDC is found through `KRB5_CONFIG` or `/etc/krb5.conf`.
    pub kerberos_principal: Option<String>,
    /// The keytab holding `kerberos_principal`'s key.
    pub kerberos_keytab: Option<PathBuf>,
    /// More Hadoop client settings, as in `hdfs-site.xml` (for a secured cluster
    /// `dfs.data.transfer.protection`, as the cluster sets it).
    pub config: BTreeMap<String, String>,
}

impl Default for HdfsSettings {
    fn default() -> Self {
        Self {
            failover_max_attempts: 1,
            failover_sleep_base_ms: 100,
            failover_sleep_max_ms: 1_000,
            kerberos_principal: None,
            kerberos_keytab: None,
            config: BTreeMap::new(),
        }
    }
}

/// How object-store URLs are opened.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Default, JsonSchema)]
#[serde(default)]
pub struct StorageSettings {
    /// `s3://` URLs.
    pub s3: S3Settings,
    /// `hdfs://` URLs.
    pub hdfs: HdfsSettings,
}

/// Who may call the API: bearer tokens read from a file, so no secret is ever part of the
/// settings (which `--print-settings` shows and logs may echo).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Default, JsonSchema)]
#[serde(default)]
pub struct AuthSettings {
    /// One token per line; blank lines and lines starting with `#` are skipped. Required:
    /// the API server does not start without at least one token.
    pub token_file: Option<PathBuf>,
}

/// How the API server keeps resources and their change log.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct ResourceStoreSettings {
    /// Changes kept for Watch replay; a watch from an older version must re-list.
    pub event_log_retention: u64,
    /// How often a Watch re-reads the log when no change notification arrives (a safety
    /// net for a lost NATS message).
    pub watch_poll_interval_ms: u64,
}

impl Default for ResourceStoreSettings {
    fn default() -> Self {
        Self {
            event_log_retention: 100_000,
            watch_poll_interval_ms: 1_000,
        }
    }
}

/// Settings of `primus-api-server`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct ApiServerSettings {
    /// The gRPC listener.
    pub server: ServerSettings,
    /// Resource events are published here.
    pub nats: NatsSettings,
    /// Resources and their change log live here.
    pub redis: RedisSettings,
    /// Bearer tokens.
    pub auth: AuthSettings,
    /// The change log kept for Watch.
    pub store: ResourceStoreSettings,
    /// Logs and traces.
    pub telemetry: TelemetrySettings,
    /// Where the dashboard reads traces back.
    pub traces: TraceQuerySettings,
    /// Where the dashboard reads Jobs, Datasets and Metrics.
    pub dashboard: DashboardSettings,
}

impl Default for ApiServerSettings {
    fn default() -> Self {
        Self {
            server: ServerSettings::on_port(DEFAULT_PORTS.api_server),
            nats: NatsSettings::default(),
            redis: RedisSettings::default(),
            auth: AuthSettings::default(),
            store: ResourceStoreSettings::default(),
            telemetry: TelemetrySettings::default(),
            traces: TraceQuerySettings::default(),
            dashboard: DashboardSettings::default(),
        }
    }
}

/// Where the dashboard reads the resources it shows.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Default, JsonSchema)]
#[serde(default)]
pub struct DashboardSettings {
    /// `api_server`: this API server's own resources. `kubernetes`: the PrimusJob,
    /// PrimusDataset and PrimusMetric custom resources of `namespace`, for a master that
    /// is their operator (`master.resources: kubernetes`); read with this server's
    /// Kubernetes identity, behind the same bearer tokens.
    pub resources: crate::ResourceSource,
    /// A kubeconfig file; unset: `KUBECONFIG`, then the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// The custom resources' namespace; unset: the kubeconfig's or the pod's.
    pub namespace: Option<String>,
}

/// The trace backend the dashboard reads a Job's traces from.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, Default, JsonSchema)]
#[serde(default)]
pub struct TraceQuerySettings {
    /// Jaeger's query service (`http://jaeger:16686`), whose HTTP API the dashboard's trace
    /// page reads; unset: the page says traces are not configured.
    pub jaeger_query_url: Option<String>,
}

/// How a service reaches the API server (the master and serving-sync read resources).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct ApiSettings {
    /// `http://host:port` or `https://host:port`.
    pub server: String,
    /// File holding the bearer token (first non-comment line).
    pub token_file: Option<PathBuf>,
    /// PEM file of a CA that signs the API server's certificate (TLS); unset: the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            server: format!("http://127.0.0.1:{}", DEFAULT_PORTS.api_server),
            token_file: None,
            ca_file: None,
        }
    }
}

/// Settings of a service that needs only its listener, NATS and telemetry (today: master,
/// data-executor, trainer, ps, serving-sync; each gets its own type once it needs more).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct NodeSettings {
    /// The gRPC listener.
    pub server: ServerSettings,
    /// The NATS connection.
    pub nats: NatsSettings,
    /// Logs and traces.
    pub telemetry: TelemetrySettings,
}

impl NodeSettings {
    /// Defaults with the listener on `port`.
    pub fn on_port(port: u16) -> Self {
        Self {
            server: ServerSettings::on_port(port),
            nats: NatsSettings::default(),
            telemetry: TelemetrySettings::default(),
        }
    }
}

/// Default gRPC ports of the services on one host (`primus up` uses them too).
pub struct DefaultPorts {
    /// `primus-api-server`.
    pub api_server: u16,
    /// `primus-master`.
    pub master: u16,
    /// `primus-data-executor`.
    pub data_executor: u16,
    /// `primus-trainer`.
    pub trainer: u16,
    /// `primus-ps`.
    pub ps: u16,
    /// `primus-serving-sync`.
    pub serving_sync: u16,
    /// The API server's dashboard (`server.http_addr`, as `primus up` sets it).
    pub dashboard: u16,
}

/// The default ports.
pub const DEFAULT_PORTS: DefaultPorts = DefaultPorts {
    api_server: 7070,
    master: 7071,
    data_executor: 7072,
    trainer: 7073,
    ps: 7074,
    serving_sync: 7075,
    dashboard: 7080,
};
