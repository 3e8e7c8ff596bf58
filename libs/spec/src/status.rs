//! Status shared by every resource kind; written only through the API server's UpdateStatus.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a resource is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(rename_all = "PascalCase")]
pub enum Phase {
    /// Accepted, not started yet.
    #[default]
    Pending,
    /// Its processes are starting.
    Starting,
    /// Running.
    Running,
    /// Finished as asked (a batch Job's data is read and trained).
    Succeeded,
    /// Stopped by a failure (the `Complete` condition says which).
    Failed,
    /// Stopped before it finished.
    Cancelled,
}

impl Phase {
    /// Succeeded, Failed and Cancelled are final.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// A condition explains the phase: `type` holds, or not, for `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// What the condition is about (`Ready`, `Checkpoint`, `Complete`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// Whether it holds.
    pub status: bool,
    /// Why, in one CamelCase word.
    pub reason: String,
    /// Why, for a person.
    #[serde(default)]
    pub message: String,
    /// When `status` or `reason` last changed (Unix milliseconds).
    pub last_transition_unix_ms: i64,
}

/// How far a Job's training is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Progress {
    /// Samples trained.
    pub samples: u64,
    /// Training steps (minibatches) taken.
    pub steps: u64,
    /// Share of a batch Job's rows trained (0..=1), once every window is planned and a
    /// task with rows has been read; unset for Jobs that read streams.
    #[serde(default)]
    pub fraction: Option<f64>,
    /// Samples trained per second lately.
    #[serde(default)]
    pub samples_per_second: f64,
    /// Progressive-validation AUC over the trainers' evaluation windows.
    #[serde(default)]
    pub auc: Option<f64>,
    /// Samples trained before a rollback to a checkpoint (`on_ps_failure: rollback`) that
    /// the Job trains again; `samples` counts from the checkpoint's.
    #[serde(default)]
    pub retrained_samples: u64,
    /// The same per Dataset source, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceProgress>,
    /// The batch data tasks planned so far, by state (a Job that reads batch sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TaskProgress>,
    /// A model of several heads: each head's progressive-validation score, in its order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub heads: Vec<HeadProgress>,
}

/// One head's progressive-validation score over the trainers' evaluation windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeadProgress {
    /// The head's name.
    pub name: String,
    /// A binary head's AUC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auc: Option<f64>,
    /// A regression head's root mean squared error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rmse: Option<f64>,
}

/// A Job's batch data tasks by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskProgress {
    /// Planned so far (every window once the Dataset's end is planned).
    pub total: u64,
    /// Waiting for a data executor.
    pub pending: u64,
    /// Being read.
    pub running: u64,
    /// Read to the end.
    pub succeeded: u64,
    /// Out of attempts.
    pub failed: u64,
}

/// One Dataset source's share of a Job's training.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceProgress {
    /// The source's name in the Dataset.
    pub source: String,
    /// Its rows served to trainers, counting again those served again after a rollback
    /// or restore.
    #[serde(default)]
    pub rows_read: u64,
    /// Its samples trained (counted like `Progress::samples`).
    pub samples: u64,
    /// Its samples trained before rollbacks and trained again since.
    #[serde(default)]
    pub retrained_samples: u64,
}

/// How many executors of each role a Job runs now (its spec's replicas are where it
/// started; scaling moves these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Replicas {
    /// PS shards.
    pub ps: u32,
    /// Data executors.
    pub data_executors: u32,
    /// Trainers.
    pub trainers: u32,
    /// Serving replicas.
    #[serde(default)]
    pub serving: u32,
}

/// One executor of a Job as its master saw it last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutorStatus {
    /// `<role>-<index>`, as in the topology.
    pub id: String,
    /// `ps`, `data_executor`, `trainer` or `serving`.
    pub role: String,
    /// Where it serves gRPC (host:port).
    pub address: String,
    /// Whether it runs.
    pub state: ExecutorState,
    /// Times it crashed and was started again.
    #[serde(default)]
    pub restarts: u32,
    /// How its last run ended (an exit status or signal), once it crashed or ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
    /// When it entered its state or last restarted (Unix milliseconds).
    pub since_unix_ms: i64,
}

/// Whether an executor runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(rename_all = "PascalCase")]
pub enum ExecutorState {
    /// Started, or started again after a crash.
    #[default]
    Running,
    /// Exited 0 (a trainer whose data ended).
    Completed,
    /// Crashed more often than allowed: it stays down.
    Failed,
    /// Stopped by its master because the Job ended (a succeeded Job's serving replicas once
    /// their time to keep serving is up).
    Stopped,
}

/// Something that happened to a resource, such as a scaling decision and the figures it
/// was made on. A status keeps the latest [`MAX_EVENTS`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// When (Unix milliseconds).
    pub unix_ms: i64,
    /// What, in one CamelCase word (`ScaledOut`, `ScaledIn`, ...).
    pub reason: String,
    /// What and why, for a person.
    pub message: String,
}

/// How many events a status keeps.
pub const MAX_EVENTS: usize = 20;

/// A resource's status: phase, conditions, progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Status {
    /// Where the resource is in its life.
    #[serde(default)]
    pub phase: Phase,
    /// Why it is there, one condition per kind.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default)]
    pub observed_generation: u64,
    /// A Job's training progress.
    #[serde(default)]
    pub progress: Option<Progress>,
    /// A Job's executors now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<Replicas>,
    /// Each of a Job's executors: where it serves, whether it runs, how often it restarted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub executors: Vec<ExecutorStatus>,
    /// The latest events, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
}

impl Status {
    /// Records an event, dropping the oldest beyond [`MAX_EVENTS`].
    pub fn push_event(&mut self, unix_ms: i64, reason: &str, message: String) {
        self.events.push(Event {
            unix_ms,
            reason: reason.to_owned(),
            message,
        });
        let excess = self.events.len().saturating_sub(MAX_EVENTS);
        self.events.drain(..excess);
    }
}
