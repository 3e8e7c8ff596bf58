//! `primus-backend`: the master's resource backends, behind the unified resource
//! controller's interface (Primus §3.1): a backend starts, stops, resizes and watches a
//! job's executors, and knows nothing of Jobs' policies, task queues or checkpoints.
//! [`local::LocalBackend`] runs them as child processes; `kubernetes::KubernetesBackend`
//! (the `kubernetes` feature) as pods.

#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub mod local;

use std::future::Future;
use std::net::SocketAddr;

use primus_config::{
    ConfigError, DataExecutorSettings, PsSettings, ServerSettings, TrainerSettings,
};
pub use primus_job_policy::{ExecutorRole, ExecutorUsage};
use tokio::sync::broadcast;

/// What to start: one process of a role, with its settings.
#[derive(Debug, Clone)]
pub struct ExecutorSpec {
    pub job: String,
    pub role: ExecutorRole,
    pub index: u32,
    /// The process's settings (its `server.grpc_addr` is chosen by the backend).
    pub settings: ExecutorSettings,
    pub cpu: f64,
    pub memory_bytes: u64,
}

impl ExecutorSpec {
    /// `<role>-<index>`, unique within the job.
    pub fn id(&self) -> String {
        format!("{}-{}", self.role.as_str(), self.index)
    }
}

/// An executor's settings, typed as the executor loads them.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecutorSettings {
    /// A PS shard or a serving replica (`ps.role`).
    Ps(Box<PsSettings>),
    DataExecutor(Box<DataExecutorSettings>),
    Trainer(Box<TrainerSettings>),
}

impl ExecutorSettings {
    pub fn server_mut(&mut self) -> &mut ServerSettings {
        match self {
            Self::Ps(settings) => &mut settings.server,
            Self::DataExecutor(settings) => &mut settings.server,
            Self::Trainer(settings) => &mut settings.server,
        }
    }

    /// The settings file the executor is started with.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        match self {
            Self::Ps(settings) => primus_config::to_toml(settings),
            Self::DataExecutor(settings) => primus_config::to_toml(settings),
            Self::Trainer(settings) => primus_config::to_toml(settings),
        }
    }
}

/// A started executor.
#[derive(Debug, Clone, PartialEq)]
pub struct Executor {
    pub job: String,
    pub id: String,
    pub role: ExecutorRole,
    pub grpc_addr: SocketAddr,
}

/// A Job's executors scheduled together: all of them, or none while they do not fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Gang {
    /// Executors that must all be placed before any runs.
    pub members: u32,
    /// Their CPU requests together.
    pub cpu: f64,
    /// Their memory requests together.
    pub memory_bytes: u64,
}

/// What happened to an executor after it started.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendEvent {
    /// It exited with status 0 and is not restarted.
    Completed { job: String, id: String },
    /// It crashed and is being restarted (attempt `restart` of the allowed ones).
    Restarting {
        job: String,
        id: String,
        status: String,
        restart: u32,
    },
    /// It crashed more often than allowed: it stays down.
    GaveUp {
        job: String,
        id: String,
        status: String,
    },
    /// It was killed for using more memory than it was given (and is being restarted).
    OutOfMemory {
        job: String,
        id: String,
        memory_bytes: u64,
    },
    /// Its replacement (a new pod after the old one was lost) serves at a new address.
    Moved {
        job: String,
        id: String,
        grpc_addr: SocketAddr,
    },
    /// Its resources changed.
    Resized {
        job: String,
        id: String,
        cpu: f64,
        memory_bytes: u64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("cannot start {binary} for {id}: {message}")]
    Start {
        id: String,
        binary: String,
        message: String,
    },
    #[error("{0}")]
    Io(String),
    #[error("no executor {id} in job {job}")]
    Unknown { job: String, id: String },
    #[error("cannot resize {id}: {message}")]
    Capacity { id: String, message: String },
}

/// Starts, stops, resizes and watches executors.
pub trait ResourceBackend: Send + Sync + 'static {
    fn request(
        &self,
        spec: ExecutorSpec,
    ) -> impl Future<Output = Result<Executor, BackendError>> + Send;

    /// Stops one executor (SIGTERM, then SIGKILL after the grace period for processes).
    fn release(&self, job: &str, id: &str)
    -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Stops one executor at once (SIGKILL for a process, a pod deleted without grace):
    /// nothing it would still do counts, as when the Job rolls back to a checkpoint.
    fn kill(&self, job: &str, id: &str) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Stops every executor of `job`.
    fn release_job(&self, job: &str) -> impl Future<Output = ()> + Send;

    /// Changes an executor's CPU and memory; refused when the pool cannot give it.
    fn resize(
        &self,
        job: &str,
        id: &str,
        cpu: f64,
        memory_bytes: u64,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    fn events(&self) -> broadcast::Receiver<BackendEvent>;

    /// CPU and memory of each running executor of `job`.
    fn usage(&self, job: &str) -> impl Future<Output = Vec<ExecutorUsage>> + Send;

    /// Whether a Job's executors are placed as one gang ([`ResourceBackend::form_gang`]):
    /// the master then requests them all at once, as a gang of which only some were
    /// requested would never be placed.
    fn schedules_gangs(&self) -> bool {
        false
    }

    /// Declares `job`'s gang, before its executors are requested.
    fn form_gang(
        &self,
        _job: &str,
        _gang: &Gang,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        async { Ok(()) }
    }

    /// Whether executors outlive the master that started them (pods do, child processes
    /// do not): a master that stops then leaves its Jobs' executors running for the next.
    fn executors_outlive_master(&self) -> bool {
        false
    }

    /// Deletes what executors of Jobs absent from `listed` (every Job of this master's
    /// shard) left: Jobs deleted while no master followed them, whose executors outlived
    /// the master that started them.
    fn release_jobs_not_listed(&self, _listed: &[String]) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Kills, and waits until they are gone, the executors of `job` with a role in `roles`
    /// that a previous master left running: a Job taken over resumes from its latest
    /// checkpoint, so nothing they did since may count.
    fn kill_previous(
        &self,
        _job: &str,
        _roles: &[ExecutorRole],
    ) -> impl Future<Output = Result<Vec<String>, BackendError>> + Send {
        async { Ok(Vec::new()) }
    }
}
