//! What the master's parts share while it runs: its resources' source, NATS, Redis, its
//! settings and shard, the resource backend, the listing cache, the Jobs' task queues and
//! topologies, and the capacity its `policy: auto` Jobs divide. The controller builds it
//! once; each Job's run reads it.

use std::sync::Arc;

use primus_bus::Bus;
use primus_config::MasterSettings;
use primus_data_tasks::plan::ListingCache;
use redis::aio::ConnectionManager;

use crate::resources::Resources;
use crate::tasks::JobRegistry;
use crate::ticks::TickTimes;
use crate::topology::Topologies;
use primus_job_policy::{Capacity, ClusterPlans};

/// Everything the Jobs' runs share.
pub struct Context<B, C> {
    pub resources: Resources,
    pub bus: Bus,
    pub redis: ConnectionManager,
    pub settings: MasterSettings,
    pub shard: (u32, u32),
    pub backend: Arc<B>,
    pub cache: Arc<ListingCache<C>>,
    pub jobs: JobRegistry,
    pub topologies: Topologies,
    /// What the optimizer of `policy: auto` Jobs divides among them.
    pub capacity: Capacity,
    /// Those Jobs' holdings and plans (DLRover-RM's cluster-level selection).
    pub cluster: ClusterPlans,
    /// How long the Jobs' status ticks take.
    pub ticks: TickTimes,
}
