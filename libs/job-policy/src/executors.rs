//! The executors of a Job as its policies name them: their roles, what one uses, and
//! the topology entry of each role.

use primus_proto::v1::Role;
use primus_spec::job::{JobSpec, RoleSpec};

/// The roles of a job's topology, as the backend starts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExecutorRole {
    /// A PS shard.
    Ps,
    /// A data executor.
    DataExecutor,
    /// A trainer.
    Trainer,
    /// A serving replica: `primus-ps` with `ps.role = "serving"`.
    Serving,
}

impl ExecutorRole {
    /// Every role, in the order a topology lists them.
    pub const ALL: [ExecutorRole; 4] = [Self::Ps, Self::DataExecutor, Self::Trainer, Self::Serving];

    /// Name in settings (`local.binaries.<name>`), executor ids and subjects.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ps => "ps",
            Self::DataExecutor => "data_executor",
            Self::Trainer => "trainer",
            Self::Serving => "serving",
        }
    }

    /// The binary that runs it.
    pub fn binary(self) -> &'static str {
        match self {
            Self::Ps => "primus-ps",
            Self::DataExecutor => "primus-data-executor",
            Self::Trainer => "primus-trainer",
            Self::Serving => "primus-ps",
        }
    }

    /// Its role on the wire.
    pub fn proto(self) -> Role {
        match self {
            Self::Ps => Role::Ps,
            Self::DataExecutor => Role::DataExecutor,
            Self::Trainer => Role::Trainer,
            Self::Serving => Role::Serving,
        }
    }
}

/// What one running executor uses, as the backend measures it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutorUsage {
    /// The executor's id.
    pub id: String,
    /// CPU cores in use (averaged since the previous measurement).
    pub cpu_cores: f64,
    /// Resident memory.
    pub memory_bytes: u64,
}

/// The topology entry of `role` in `spec`, or none (a Job without serving replicas).
pub fn role_spec(spec: &JobSpec, role: ExecutorRole) -> Option<&RoleSpec> {
    let topology = &spec.topology;
    match role {
        ExecutorRole::Ps => Some(&topology.ps),
        ExecutorRole::DataExecutor => Some(&topology.data_executors),
        ExecutorRole::Trainer => Some(&topology.trainers),
        ExecutorRole::Serving => topology.serving.as_ref(),
    }
}
