//! Settings of `primus-serving-sync`: the shared sections, `api` (where Jobs are read) and
//! `sync` (where the masters are, how often to look for jobs).

use crate::ServiceSettings;
use crate::{ApiSettings, DEFAULT_PORTS, NatsSettings, ServerSettings, TelemetrySettings};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Settings of `primus-serving-sync`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct ServingSyncSettings {
    /// The gRPC listener (health).
    pub server: ServerSettings,
    /// The NATS connection (delta notices, metrics).
    pub nats: NatsSettings,
    /// Logs and traces.
    pub telemetry: TelemetrySettings,
    /// Where Jobs are read.
    pub api: ApiSettings,
    /// Where the masters are and how often Jobs are looked for.
    pub sync: SyncSettings,
}

/// What serving-sync follows and how often.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct SyncSettings {
    /// gRPC addresses (`host:port`) of the masters; each job's topology is asked of them.
    pub master_addrs: Vec<String>,
    /// How often Jobs are listed (new jobs with serving enabled, topology changes, ends).
    pub discovery_interval_ms: u64,
    /// How often sync metrics go to NATS (the master folds them into the Job's Metric).
    pub report_interval_ms: u64,
}

impl Default for SyncSettings {
    fn default() -> Self {
        Self {
            master_addrs: vec![format!("127.0.0.1:{}", DEFAULT_PORTS.master)],
            discovery_interval_ms: 1_000,
            report_interval_ms: 2_000,
        }
    }
}

impl Default for ServingSyncSettings {
    fn default() -> Self {
        Self {
            server: crate::NodeSettings::on_port(DEFAULT_PORTS.serving_sync).server,
            nats: NatsSettings::default(),
            telemetry: TelemetrySettings::default(),
            api: ApiSettings::default(),
            sync: SyncSettings::default(),
        }
    }
}

impl ServiceSettings for ServingSyncSettings {
    fn telemetry(&self) -> &TelemetrySettings {
        &self.telemetry
    }
}
