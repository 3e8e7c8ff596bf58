//! Settings of `primus-ps`: the shared sections plus the tables this process holds.

use crate::ServiceSettings;
use crate::{DEFAULT_PORTS, NatsSettings, ServerSettings, StorageSettings, TelemetrySettings};
use std::path::PathBuf;

use primus_spec::dataset::FeatureSchema;
use primus_spec::job::{Device, ModelSpec, OptimizerSpec, TableSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Settings of `primus-ps`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct PsSettings {
    /// The gRPC listener.
    pub server: ServerSettings,
    /// The NATS connection (delta notices).
    pub nats: NatsSettings,
    /// Logs and traces.
    pub telemetry: TelemetrySettings,
    /// Credentials and endpoints for snapshot URLs.
    pub storage: StorageSettings,
    /// The tables this process holds and how.
    pub ps: TableSettings,
    /// The serving role's model, schema and Predict limits (`ps.role = "serving"`).
    pub serving: ServingSettings,
}

/// Which half of Monolith's PS this process is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PsRole {
    /// Tables with optimizer state, trained by Push (the ParameterServer API).
    #[default]
    Training,
    /// Read-only replicas fed by serving-sync, answering Predict (the ServingService API).
    Serving,
}

/// What a serving replica needs besides its tables (the master writes these from the Job).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct ServingSettings {
    /// The Job this replica serves (Predict requests naming another job are refused).
    pub job: String,
    /// The Job's model (`spec.model`) and its Dataset's schema: Predict runs the training
    /// feature transforms on raw features.
    pub model: Option<ModelSpec>,
    /// The Dataset's feature schema (serving role).
    pub schema: Option<FeatureSchema>,
    /// libonnxruntime.so; unset: the ORT_DYLIB_PATH environment variable.
    pub onnxruntime_library: Option<PathBuf>,
    /// ONNX Runtime sessions per model (concurrent Predicts computing at once).
    pub sessions: usize,
    /// Largest number of samples in one Predict.
    pub max_samples: usize,
    /// Bearer tokens (one per line) Predict requires, over gRPC and HTTP. Unset: none.
    pub token_file: Option<PathBuf>,
}

impl Default for ServingSettings {
    fn default() -> Self {
        Self {
            job: String::new(),
            model: None,
            schema: None,
            onnxruntime_library: None,
            sessions: 2,
            max_samples: 4096,
            token_file: None,
        }
    }
}

/// The embedding tables of this PS (the master writes them from the Job's model).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct TableSettings {
    /// Training (tables with optimizer state) or serving (replicas and Predict).
    pub role: PsRole,
    /// Tables as in a Job spec (`spec.model.tables`): name, dim, optimizer, initializer,
    /// admission, ttl_seconds.
    pub tables: Vec<TableSpec>,
    /// Independently locked shards per table (a power of two).
    pub shards_per_table: usize,
    /// Where rows live (training role). `cuda`: in GPU memory (device `cuda_device`);
    /// lookups, new rows and optimizer updates run as kernels, batched per shard, while the
    /// cuckoo index, row metadata, admission and eviction stay on the host. Each shard is
    /// one kernel launch per call, so a few shards per table (e.g. 4) suit it better than
    /// the CPU's 64. Tables' optimizers must be adagrad or adam.
    pub device: Device,
    /// The GPU's ordinal with `device: cuda`.
    pub cuda_device: usize,
    /// Seeds initializers and admission draws; every PS of a job must use the same seed so
    /// a key's initial row does not depend on which PS holds it.
    pub seed: u64,
    /// The optimizer applied to pushed dense gradients.
    pub dense_optimizer: OptimizerSpec,
    /// Largest request accepted, in bytes.
    pub max_request_bytes: usize,
    /// How often rows idle past their table's TTL are evicted.
    pub eviction_interval_ms: u64,
    /// The job and shard id this PS announces deltas as; empty: the PRIMUS_JOB and
    /// PRIMUS_EXECUTOR_ID the master starts executors with (neither: no notices).
    pub job: String,
    /// The shard id this PS announces deltas as; empty: `PRIMUS_EXECUTOR_ID`.
    pub shard_id: String,
    /// Least time between two delta notices on NATS.
    pub delta_notice_interval_ms: u64,
    /// Bytes the tables (rows, index, optimizer state, admission sketches) and dense
    /// parameters may hold; at it, new keys are refused (their gradients dropped and
    /// counted) while existing rows keep training. Unset: no limit. The master sets it from
    /// `topology.ps.memory`.
    pub memory_limit_bytes: Option<u64>,
    /// Refuse training calls (lookups, pushes, dense calls, snapshots) with UNAVAILABLE
    /// until a Restore or Open call: the master starts a Job's shards so, and a restarted
    /// shard then takes no update before its checkpoint is back (a trainer holds its pushes
    /// and sends them after).
    pub await_restore: bool,
}

impl Default for TableSettings {
    fn default() -> Self {
        Self {
            role: PsRole::Training,
            tables: Vec::new(),
            shards_per_table: 64,
            device: Device::Cpu,
            cuda_device: 0,
            seed: 0,
            dense_optimizer: OptimizerSpec::Adam {
                learning_rate: 0.001,
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8,
            },
            max_request_bytes: 64 << 20,
            eviction_interval_ms: 60_000,
            job: String::new(),
            shard_id: String::new(),
            delta_notice_interval_ms: 100,
            memory_limit_bytes: None,
            await_restore: false,
        }
    }
}

impl Default for PsSettings {
    fn default() -> Self {
        Self {
            server: crate::NodeSettings::on_port(DEFAULT_PORTS.ps).server,
            nats: NatsSettings::default(),
            telemetry: TelemetrySettings::default(),
            storage: StorageSettings::default(),
            ps: TableSettings::default(),
            serving: ServingSettings::default(),
        }
    }
}

impl ServiceSettings for PsSettings {
    fn telemetry(&self) -> &TelemetrySettings {
        &self.telemetry
    }
}
