//! Settings of `primus-trainer`: the shared sections plus how it trains. The master writes
//! `trainer.model` and `trainer.schema` from the Job and its Dataset.

use crate::ServiceSettings;
use crate::{DEFAULT_PORTS, NatsSettings, NodeSettings, ServerSettings, TelemetrySettings};
use primus_spec::dataset::FeatureSchema;
use primus_spec::job::{Device, HotSetSpec, ModelSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Settings of `primus-trainer`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct TrainerSettings {
    /// The gRPC listener (health).
    pub server: ServerSettings,
    /// The NATS connection (metrics, hot-set rounds).
    pub nats: NatsSettings,
    /// Logs and traces.
    pub telemetry: TelemetrySettings,
    /// What and how the trainer trains.
    pub trainer: TrainSettings,
}

/// What and how a trainer trains.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct TrainSettings {
    /// The job trained; empty: `PRIMUS_JOB` (set by the master that starts the trainer).
    pub job: String,
    /// This trainer's id; empty: `PRIMUS_EXECUTOR_ID`.
    pub executor_id: String,
    /// The master (topology service), host:port; empty: `PRIMUS_MASTER_ADDR`.
    pub master_addr: String,
    /// The Job's model. Required.
    pub model: Option<ModelSpec>,
    /// The Dataset's feature schema. Required.
    pub schema: Option<FeatureSchema>,
    /// Samples per minibatch asked of the data executors.
    pub batch_size: u32,
    /// Pull the dense parameters from the PS every this many steps (1: every step; more
    /// trades staleness for fewer pulls).
    pub dense_pull_every: u32,
    /// Samples the progressive-validation metrics (AUC, logloss, calibration) cover.
    pub eval_window: usize,
    /// How often metrics go to NATS.
    pub metrics_interval_ms: u64,
    /// Seeds the initial dense parameters (the first trainer's values win on the PS).
    pub seed: u64,
    /// HypeReca's hot set: rows every trainer replicates and trains locally (the Job's
    /// `training.hot_set`).
    pub hot_set: HotSetSpec,
    /// Where pooling, its backward and the hot rows run (the Job's
    /// `topology.trainers.device`), and the dense network in a build with the `cuda`
    /// feature. `cuda` refuses to start without a usable GPU.
    pub device: Device,
    /// The GPU (CUDA ordinal) of `device: cuda`.
    pub cuda_device: usize,
}

impl Default for TrainSettings {
    fn default() -> Self {
        Self {
            job: String::new(),
            executor_id: String::new(),
            master_addr: String::new(),
            model: None,
            schema: None,
            batch_size: 2048,
            dense_pull_every: 1,
            eval_window: 100_000,
            metrics_interval_ms: 2000,
            seed: 0,
            hot_set: HotSetSpec::default(),
            device: Device::Cpu,
            cuda_device: 0,
        }
    }
}

impl Default for TrainerSettings {
    fn default() -> Self {
        let node = NodeSettings::on_port(DEFAULT_PORTS.trainer);
        Self {
            server: node.server,
            nats: node.nats,
            telemetry: node.telemetry,
            trainer: TrainSettings::default(),
        }
    }
}

impl ServiceSettings for TrainerSettings {
    fn telemetry(&self) -> &TelemetrySettings {
        &self.telemetry
    }
}
