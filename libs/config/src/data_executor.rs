//! Settings of `primus-data-executor`: the shared sections plus how tasks are run and
//! buffered. The master writes `data.dataset` from the Job's Dataset.

use crate::ServiceSettings;
use crate::{
    DEFAULT_PORTS, NatsSettings, NodeSettings, ServerSettings, StorageSettings, TelemetrySettings,
};
use primus_spec::dataset::DatasetSpec;
use primus_spec::job::StreamLoading;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Settings of `primus-data-executor`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct DataExecutorSettings {
    /// The gRPC listener (the dataset service trainers read from).
    pub server: ServerSettings,
    /// The NATS connection (heartbeats, metrics, stream sources).
    pub nats: NatsSettings,
    /// Logs and traces.
    pub telemetry: TelemetrySettings,
    /// Credentials and endpoints for the sources' object stores.
    pub storage: StorageSettings,
    /// What the executor reads and how it buffers.
    pub data: DataSettings,
}

/// What a data executor reads and how it buffers.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct DataSettings {
    /// The job served; empty: `PRIMUS_JOB` (set by the master that starts the executor).
    pub job: String,
    /// This executor's id; empty: `PRIMUS_EXECUTOR_ID`.
    pub executor_id: String,
    /// The master's task service, host:port; empty: `PRIMUS_MASTER_ADDR`.
    pub master_addr: String,
    /// The Job's Dataset (sources, weights, feature schema). Required to run tasks.
    pub dataset: Option<DatasetSpec>,
    /// Tasks read in parallel.
    pub runners: usize,
    /// Rows each source's serving buffer holds before readers wait (backpressure).
    pub buffer_rows: usize,
    /// Rows per Parquet read (and per buffered chunk); at most `buffer_rows`.
    pub read_batch_rows: usize,
    /// How often consumed offsets (rows trainers confirmed, without a gap) are reported to
    /// the master and finished tasks closed.
    pub progress_interval_ms: u64,
    /// How long to wait before asking again when the master has no task.
    pub idle_poll_ms: u64,
    /// Stream sources of `rebalance` loading and join sources: JetStream messages asked
    /// for per fetch (and how many waiting make a partition behind).
    pub stream_fetch_messages: usize,
    /// Stream sources: how long one fetch or read waits for messages (a read in order that
    /// waits this long in vain counts the stream as caught up).
    pub stream_fetch_wait_ms: u64,
    /// Stream sources of `rebalance` loading and join sources: a delivered message not
    /// acked (buffered) within this long is delivered again, to this or another executor.
    /// While a full buffer holds a fetch back, its messages are kept alive with
    /// in-progress acks.
    pub stream_ack_wait_ms: u64,
    /// Join sources: where feature rows beyond a source's `memory_rows` wait on disk
    /// (unset: a directory under the system's temporary directory).
    pub join_spill_dir: Option<std::path::PathBuf>,
    /// `rebalance`: also take raw messages of other executors' stream partitions that
    /// are behind, while this executor's own are caught up (Primus Table 2).
    pub stream_loading: StreamLoading,
    /// How long a task's read waits for an object store it cannot reach (a namenode
    /// restarting, an S3 outage) before the task fails: it retries with backoff and reads on
    /// from the rows already served. A missing file, a refused permission or a file that is
    /// not Parquet fails the task at once.
    pub storage_retry_ms: u64,
    /// Fault injection for tests and benchmarks: a pause before each Parquet read of
    /// `read_batch_rows`, as a slow object store adds. 0 (the default) outside them.
    pub read_delay_ms: u64,
}

impl Default for DataSettings {
    fn default() -> Self {
        Self {
            job: String::new(),
            executor_id: String::new(),
            master_addr: String::new(),
            dataset: None,
            runners: 2,
            buffer_rows: 65_536,
            read_batch_rows: 8192,
            progress_interval_ms: 200,
            idle_poll_ms: 200,
            stream_fetch_messages: 64,
            stream_fetch_wait_ms: 500,
            stream_ack_wait_ms: 30_000,
            join_spill_dir: None,
            stream_loading: StreamLoading::Forward,
            storage_retry_ms: 120_000,
            read_delay_ms: 0,
        }
    }
}

impl Default for DataExecutorSettings {
    fn default() -> Self {
        let node = NodeSettings::on_port(DEFAULT_PORTS.data_executor);
        Self {
            server: node.server,
            nats: node.nats,
            telemetry: node.telemetry,
            storage: StorageSettings::default(),
            data: DataSettings::default(),
        }
    }
}

impl ServiceSettings for DataExecutorSettings {
    fn telemetry(&self) -> &TelemetrySettings {
        &self.telemetry
    }
}
