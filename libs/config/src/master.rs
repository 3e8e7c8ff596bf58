//! Settings of `primus-master`: the shared sections plus `api` (where the API server is),
//! `master` (sharding, planner, task service, which resource backend), `local` and
//! `kubernetes` (the two resource backends).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::ServiceSettings;
use crate::{
    ApiSettings, DEFAULT_PORTS, NatsSettings, RedisSettings, ServerSettings, StorageSettings,
    TelemetrySettings,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Settings of `primus-master`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct MasterSettings {
    /// The gRPC listener (task, checkpoint and topology services).
    pub server: ServerSettings,
    /// The NATS connection (metrics, heartbeats, and the executors' settings copy it).
    pub nats: NatsSettings,
    /// Logs and traces (the executors' settings copy it).
    pub telemetry: TelemetrySettings,
    /// Task queues live here (with the API server's resources, under the same prefix).
    pub redis: RedisSettings,
    /// Credentials and endpoints for the Datasets' source URLs.
    pub storage: StorageSettings,
    /// Where Jobs and Datasets are read and Job status is written.
    pub api: ApiSettings,
    /// How Jobs are driven.
    pub master: ControllerSettings,
    /// The local backend: executors as child processes.
    pub local: LocalBackendSettings,
    /// The Kubernetes backend: executors as pods.
    pub kubernetes: KubernetesBackendSettings,
}

/// Where a Job's executors run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Child processes of the master, on its host (`local` settings).
    #[default]
    Local,
    /// A pod per executor (`kubernetes` settings).
    Kubernetes,
}

/// Where the master takes its Jobs and Datasets from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResourceSource {
    /// The Primus API server (`primus apply`).
    #[default]
    ApiServer,
    /// PrimusJob and PrimusDataset custom resources in the Kubernetes API (`kubectl apply`).
    Kubernetes,
}

/// How the master drives its Jobs.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct ControllerSettings {
    /// `i/n`: this master drives the jobs whose name hashes to `i` modulo `n`.
    pub shard: String,
    /// How often each job's status and Metric resource are written.
    pub status_interval_ms: u64,
    /// How Datasets become data tasks.
    pub planner: PlannerSettings,
    /// How data tasks are handed out and watched.
    pub tasks: TaskSettings,
    /// How checkpoints are taken and kept.
    pub checkpoint: CheckpointSettings,
    /// Faults the master injects into its Jobs' executors, for tests and benchmarks.
    pub fault_injection: FaultInjectionSettings,
    /// Where the Jobs' executors run: `local` or `kubernetes`.
    pub backend: BackendKind,
    /// Where Jobs and Datasets are read and Job status, metrics and events written:
    /// `api_server` (the `api` settings) or `kubernetes` (the custom resources of
    /// `k8s/crds` in `kubernetes.namespace`, through `kubernetes.kubeconfig`).
    pub resources: ResourceSource,
    /// What the optimizer of `policy: auto` Jobs divides among them.
    pub cluster: ClusterSettings,
    /// Bearer tokens (one per line) every serving replica this master starts requires on
    /// Predict, over gRPC and HTTP (the replica's `serving.token_file`). Unset: Predict is
    /// open to whoever reaches a replica.
    pub predict_token_file: Option<PathBuf>,
}

/// Faults injected into every Job's executors, for tests and benchmarks only: they make a
/// Job slower on purpose. All off by default.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct FaultInjectionSettings {
    /// Each data executor pauses this long before each Parquet read (its
    /// `data.read_delay_ms`), as a slow object store would.
    pub data_read_delay_ms: u64,
    /// Data executor `slow_data_executor` (its index, `data_executor-<index>`) pauses
    /// `slow_read_delay_ms` more before each Parquet read: a straggler.
    pub slow_data_executor: Option<u32>,
    /// The straggler's extra pause before each Parquet read.
    pub slow_read_delay_ms: u64,
}

/// The checkpoint coordinator (a Job's `spec.checkpoint` says where and how often).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct CheckpointSettings {
    /// Trainers have this long to finish what was served before a barrier; otherwise
    /// the checkpoint is abandoned (training goes on; the next one is tried on time).
    pub align_timeout_ms: u64,
    /// A paused data executor resumes by itself after this long without the master's
    /// resume (a master that died mid-checkpoint).
    pub pause_timeout_ms: u64,
    /// Checkpoints kept in the object store: committing one deletes the files of those
    /// this many ids before it (and of abandoned attempts in between). At least 1.
    pub keep: u64,
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        Self {
            align_timeout_ms: 60_000,
            pause_timeout_ms: 300_000,
            keep: 3,
        }
    }
}

/// How a Dataset's windows become data tasks (Primus's DTGG).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct PlannerSettings {
    /// Files are grouped (and large files split) into tasks of about this many bytes.
    pub target_task_bytes: u64,
    /// Windows generated at once.
    pub parallelism: usize,
    /// How often an open-ended stream is checked for newly ended windows.
    pub poll_interval_ms: u64,
    /// How long a source's store out of reach (down, restarting, cut off) is waited out,
    /// when a Job starts and while its windows are planned, before the Job fails. A store
    /// that refuses the call (missing prefix, denied credentials) fails the Job at once.
    pub store_outage_timeout_s: u64,
}

/// How data tasks are handed out and executors watched.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct TaskSettings {
    /// Attempts a task gets before it fails (and with it, the job).
    pub max_attempts: u32,
    /// Executors are told to heartbeat this often.
    pub heartbeat_interval_ms: u64,
    /// An executor silent for this long is lost: its tasks are re-queued from their last
    /// reported offsets.
    pub heartbeat_timeout_ms: u64,
    /// Throttle: a batch task is handed out only if its window starts less than this many
    /// hours after the oldest window still in progress (0: no limit).
    pub max_lead_hours: u64,
}

/// The `local` backend: a job's executors are child processes of the master.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct LocalBackendSettings {
    /// Where the service binaries are (default: next to `primus-master`).
    pub bin_dir: Option<PathBuf>,
    /// A different binary for a role (`data_executor`, `trainer`, `ps`, `serving`).
    pub binaries: BTreeMap<String, PathBuf>,
    /// Settings files, logs and PID files of the processes, one folder per job.
    pub work_dir: PathBuf,
    /// First restart delay of a crashed process; doubles per crash, up to 30 s.
    pub restart_backoff_ms: u64,
    /// Crashes after which a process is given up on (and its job fails).
    pub max_restarts: u32,
    /// SIGTERM, then SIGKILL after this long.
    pub stop_grace_ms: u64,
    /// The IP executors listen on and are reached at (the topology gives `ip:port`). The
    /// default, loopback, keeps them private to this host; on Kubernetes the pod IP lets
    /// serving-sync in another pod reach the PS shards and serving replicas.
    pub executor_ip: IpAddr,
    /// Variables every executor process gets besides the master's own environment (e.g.
    /// `ORT_DYLIB_PATH`, where serving replicas find ONNX Runtime), so a master started
    /// again from its settings file starts the same executors.
    pub environment: BTreeMap<String, String>,
}

/// The `kubernetes` backend: each executor is a pod (with a Secret holding its settings
/// file), owned by one object per Job so deleting that object removes them all.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct KubernetesBackendSettings {
    /// A kubeconfig file; unset: `KUBECONFIG`, then the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of the executors' pods; unset: the kubeconfig's or the master pod's.
    pub namespace: Option<String>,
    /// The image every executor runs (its entrypoint picks the program by its first
    /// argument: `ps`, `data-executor`, `trainer`).
    pub image: String,
    /// `Always`, `IfNotPresent` or `Never`.
    pub image_pull_policy: String,
    /// The service account of the executors' pods; unset: the namespace's default.
    pub service_account: Option<String>,
    /// The port every executor serves gRPC on, inside its pod.
    pub grpc_port: u16,
    /// How executors reach the master (`host:port`), e.g. its Service's DNS name; unset:
    /// the master's own pod IP and port.
    pub master_addr: Option<String>,
    /// Crashes after which an executor is given up on (and its job fails).
    pub max_restarts: u32,
    /// The pods' termination grace period: SIGTERM, then SIGKILL after this long.
    pub stop_grace_ms: u64,
    /// Lines of a failed container's log quoted in the Job's condition.
    pub log_lines: u32,
    /// With `master.resources: kubernetes`: how long the shard's Lease holds unrenewed
    /// (a master renews it every third of this; one that stops is replaced after it).
    pub lease_duration_ms: u64,
    /// Node labels the executors' pods must match.
    pub node_selector: BTreeMap<String, String>,
    /// Extra labels on every object the backend creates.
    pub labels: BTreeMap<String, String>,
    /// Each Job's executors form one gang: a Volcano PodGroup
    /// (`scheduling.volcano.sh/v1beta1`) owned by the Job, with every executor as its
    /// minimum members and their requests as its minimum resources, and each pod annotated
    /// `scheduling.k8s.io/group-name`; the master then requests all of a Job's executors
    /// at once. Needs the PodGroup CRD (Volcano) and a gang scheduler (`scheduler_name`)
    /// for the gang to hold.
    pub pod_group: bool,
    /// The scheduler of the executors' pods (`volcano`); unset: the cluster's default.
    pub scheduler_name: Option<String>,
}

impl Default for KubernetesBackendSettings {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            namespace: None,
            image: "primus-rs".into(),
            image_pull_policy: "IfNotPresent".into(),
            service_account: None,
            grpc_port: 7080,
            master_addr: None,
            max_restarts: 5,
            stop_grace_ms: 30_000,
            log_lines: 20,
            lease_duration_ms: 15_000,
            node_selector: BTreeMap::new(),
            labels: BTreeMap::new(),
            pod_group: false,
            scheduler_name: None,
        }
    }
}

impl Default for ControllerSettings {
    fn default() -> Self {
        Self {
            shard: "0/1".into(),
            status_interval_ms: 2_000,
            planner: PlannerSettings::default(),
            tasks: TaskSettings::default(),
            checkpoint: CheckpointSettings::default(),
            fault_injection: FaultInjectionSettings::default(),
            backend: BackendKind::default(),
            resources: ResourceSource::default(),
            predict_token_file: None,
            cluster: ClusterSettings::default(),
        }
    }
}

/// The capacity DLRover-RM's cluster-level selection (Eqs. 11-14) gives the running
/// `policy: auto` Jobs of this master, and its priority exponent.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(default)]
pub struct ClusterSettings {
    /// Cores in all (> 0). Unset: the local backend's host cores; on Kubernetes the
    /// optimizer then applies no plan that adds cores.
    pub cpu: Option<f64>,
    /// Memory in all (`64Gi`, `512Mi`; > 0). Unset: not a limit.
    pub memory: Option<String>,
    /// Eq. 14's `rho` (-10..=10): above 0 the selection favours Jobs close to done.
    pub rho: f64,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            cpu: None,
            memory: None,
            rho: 2.5,
        }
    }
}

impl Default for PlannerSettings {
    fn default() -> Self {
        Self {
            target_task_bytes: 128 << 20,
            parallelism: 4,
            poll_interval_ms: 60_000,
            store_outage_timeout_s: 300,
        }
    }
}

impl Default for TaskSettings {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            heartbeat_interval_ms: 2_000,
            heartbeat_timeout_ms: 10_000,
            max_lead_hours: 0,
        }
    }
}

impl Default for LocalBackendSettings {
    fn default() -> Self {
        Self {
            bin_dir: None,
            binaries: BTreeMap::new(),
            work_dir: std::env::temp_dir().join("primus-master"),
            restart_backoff_ms: 500,
            max_restarts: 5,
            stop_grace_ms: 5_000,
            executor_ip: IpAddr::from([127, 0, 0, 1]),
            environment: BTreeMap::new(),
        }
    }
}

impl Default for MasterSettings {
    fn default() -> Self {
        Self {
            server: crate::NodeSettings::on_port(DEFAULT_PORTS.master).server,
            nats: NatsSettings::default(),
            telemetry: TelemetrySettings::default(),
            redis: RedisSettings::default(),
            storage: StorageSettings::default(),
            api: ApiSettings::default(),
            master: ControllerSettings::default(),
            local: LocalBackendSettings::default(),
            kubernetes: KubernetesBackendSettings::default(),
        }
    }
}

impl ServiceSettings for MasterSettings {
    fn telemetry(&self) -> &TelemetrySettings {
        &self.telemetry
    }
}
