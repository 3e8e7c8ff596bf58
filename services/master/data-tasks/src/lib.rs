//! `primus-data-tasks`: the data-task plane of the master (Primus §4.2-4.3), testable
//! against Redis (and NATS for heartbeats) alone, knowing nothing of executors' processes,
//! checkpoints or a Job's policies.
//!
//! - [`plan`]: the data task planner (DTGG) and the catalog of source listings.
//! - [`planning`]: which sources a mode reads, a Dataset's streams as plans, the planning
//!   loop of one stream into the queue, and the stream bindings.
//! - [`queue`]: a job's batch task queue and stream task graph in Redis (its Lua scripts
//!   are the only code that touches those keys).
//! - [`monitor`]: heartbeats, and the work of silent data executors back to the queue.
//! - [`received`]: the task rows trainers received from a data executor that died.

pub mod monitor;
pub mod plan;
pub mod planning;
pub mod queue;
pub mod received;
