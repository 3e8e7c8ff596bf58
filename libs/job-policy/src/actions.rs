//! What the Job's policies decide: a policy returns [`Action`]s from a
//! [`crate::Snapshot`], and the master carries them out in one place (the backend, the
//! executors and the task queue), as the simulator does in its model of a cluster.

use std::collections::BTreeSet;

use primus_resource_model::Allocation;

use crate::ExecutorRole;

/// One decision of a policy.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// One more executor of `role`, at the lowest free index.
    AddExecutor { role: ExecutorRole, why: String },
    /// One fewer: the executor of `role` with the highest index.
    RemoveExecutor { role: ExecutorRole, why: String },
    /// One more PS shard than run now, by a live resharding.
    AddPsShard,
    /// Gives PS shard `id` `bytes` of memory (the backend's allotment, then the shard's own
    /// limit); where it cannot, adds a PS shard. `figures` say why.
    RaiseShardMemory {
        id: String,
        bytes: u64,
        figures: String,
    },
    /// Gives executor `id` `bytes` of memory through the backend.
    Resize {
        id: String,
        bytes: u64,
        figures: String,
        otherwise: Shortfall,
    },
    /// The optimizer's step: trainers and PS shards from `current` to `target`.
    Move {
        current: Allocation,
        target: Allocation,
        message: String,
    },
    /// The data executors the task service treats as stragglers from now on.
    MarkStragglers(BTreeSet<String>),
    /// Asks `holder` to give `task` back and puts it back in the queue from there.
    TakeBack { task: String, holder: String },
    Event {
        reason: &'static str,
        message: String,
    },
    Condition {
        kind: &'static str,
        holds: bool,
        reason: &'static str,
        message: String,
    },
}

/// What a [`Action::Resize`] the backend refuses leaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shortfall {
    /// A `MemoryShort` event, once per executor.
    ShortOnce,
    /// An `OutOfMemory` event: the executor was killed for its memory.
    Killed,
}
