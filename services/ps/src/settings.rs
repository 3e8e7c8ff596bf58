//! Settings of `primus-ps`: the shared sections plus the tables this process holds.

use primus_config::{
    DEFAULT_PORTS, NatsSettings, ServerSettings, StorageSettings, TelemetrySettings,
};
use primus_service::ServiceSettings;
use primus_spec::job::{OptimizerSpec, TableSpec};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct PsSettings {
    pub server: ServerSettings,
    pub nats: NatsSettings,
    pub telemetry: TelemetrySettings,
    /// Credentials and endpoints for snapshot URLs.
    pub storage: StorageSettings,
    pub ps: TableSettings,
}

/// The embedding tables of this PS (the master writes them from the Job's model).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct TableSettings {
    /// Tables as in a Job spec (`spec.model.tables`): name, dim, optimizer, initializer,
    /// admission, ttl_seconds.
    pub tables: Vec<TableSpec>,
    /// Independently locked shards per table (a power of two).
    pub shards_per_table: usize,
    /// Seeds initializers and admission draws; every PS of a job must use the same seed so
    /// a key's initial row does not depend on which PS holds it.
    pub seed: u64,
    /// The optimizer applied to pushed dense gradients.
    pub dense_optimizer: OptimizerSpec,
    /// Largest request accepted, in bytes.
    pub max_request_bytes: usize,
    /// How often rows idle past their table's TTL are evicted.
    pub eviction_interval_ms: u64,
}

impl Default for TableSettings {
    fn default() -> Self {
        Self {
            tables: Vec::new(),
            shards_per_table: 64,
            seed: 0,
            dense_optimizer: OptimizerSpec::Adam {
                learning_rate: 0.001,
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8,
            },
            max_request_bytes: 64 << 20,
            eviction_interval_ms: 60_000,
        }
    }
}

impl Default for PsSettings {
    fn default() -> Self {
        Self {
            server: primus_config::NodeSettings::on_port(DEFAULT_PORTS.ps).server,
            nats: NatsSettings::default(),
            telemetry: TelemetrySettings::default(),
            storage: StorageSettings::default(),
            ps: TableSettings::default(),
        }
    }
}

impl ServiceSettings for PsSettings {
    fn telemetry(&self) -> &TelemetrySettings {
        &self.telemetry
    }
}
