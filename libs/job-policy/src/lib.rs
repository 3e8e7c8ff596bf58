//! `primus-job-policy`: what a running Job's policies decide, as plain code. Each status
//! tick the master builds one [`Snapshot`] of a Job (members, usage, buffers, held tasks,
//! PS memory, progress); every policy decides on it alone and returns [`Action`]s, which
//! the master carries out in one place. The cluster simulator (`primus-simulator`) builds
//! the same snapshot from its model of a Job and runs the same [`Policies`], so what it
//! reports is what the master does.
//!
//! - [`optimizer`]: DLRover-RM's auto-scaling of a `policy: auto` Job, over the
//!   [`performance`] log and the cluster-level selection of [`market`].
//! - [`memory`]: memory given before an executor or a PS shard runs out (Primus Eqs. 2-3).
//! - [`autoscale`]: data executors added and removed by their load (Primus Eq. 1).
//! - [`stragglers`]: slow data executors marked and their tasks taken back.
//!
//! Nothing here calls a backend, Redis or an executor.

pub mod actions;
pub mod autoscale;
pub mod executors;
pub mod market;
pub mod memory;
pub mod optimizer;
pub mod performance;
pub mod snapshot;
pub mod stragglers;

pub use actions::{Action, Shortfall};
pub use executors::{ExecutorRole, ExecutorUsage, role_spec};
pub use market::{Capacity, ClusterPlans};
pub use optimizer::Market;
pub use snapshot::Snapshot;

use primus_resource_model::{Allocation, FittedModel, JobShape};
use tokio::time::Instant;

/// The master's warm start (DLRover-RM Alg. 1): the similar finished Jobs drawn on.
pub const WARM_START_NEIGHBOURS: usize = 5;
/// The warm start's smoothing factor (Eq. 10).
pub const WARM_START_SMOOTHING: f64 = 0.5;

/// A Job's policies with what each keeps between ticks, in the order they decide.
pub struct Policies {
    pub optimizer: optimizer::Optimizer,
    pub memory: memory::MemoryPolicy,
    pub autoscaler: autoscale::Autoscaler,
    pub stragglers: stragglers::StragglerPolicy,
    pub performance: performance::PerformanceLog,
}

impl Policies {
    /// For a Job of `shape` whose executors serve from `started`: that counts as an
    /// action, so the first scaling decisions wait a cooldown.
    pub fn new(shape: JobShape, started: Instant) -> Self {
        Self {
            optimizer: optimizer::Optimizer::new(started),
            memory: memory::MemoryPolicy::default(),
            autoscaler: autoscale::Autoscaler::new(started),
            stragglers: stragglers::StragglerPolicy::default(),
            performance: performance::PerformanceLog::of(shape),
        }
    }

    /// The executors serve from `started`: the cooldowns count from there.
    pub fn serving_from(&mut self, started: Instant) {
        self.autoscaler = autoscale::Autoscaler::new(started);
        self.optimizer = optimizer::Optimizer::new(started);
    }

    /// Adds the trainers' rate under the allocation of `snapshot` to the performance log:
    /// that allocation, the fitted model, its RMSLE and the allocations it was fitted to,
    /// once the model fits.
    pub fn record(&mut self, snapshot: &Snapshot) -> Option<(Allocation, FittedModel, f64, usize)> {
        let allocation = snapshot.allocation()?;
        let rate = snapshot.samples_per_second();
        let (fitted, rmsle, allocations) =
            (self.performance).record(allocation, rate, snapshot.now)?;
        Some((allocation, fitted, rmsle, allocations))
    }

    /// What the policies decide on `snapshot`, in order: the optimizer's move, executors'
    /// memory, data executors by load, stragglers, PS shards' memory.
    pub fn decide(&mut self, snapshot: &Snapshot, market: &Market<'_>) -> Vec<Action> {
        let mut actions = (self.optimizer).decide(snapshot, &self.performance, market);
        actions.extend(self.memory.decide_executors(snapshot));
        actions.extend(self.autoscaler.decide(snapshot));
        actions.extend(self.stragglers.decide(snapshot));
        actions.extend(self.memory.decide_shards(snapshot));
        actions
    }
}
