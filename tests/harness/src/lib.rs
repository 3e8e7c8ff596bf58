//! The end-to-end test harness: a cluster [`Sandbox`] (real NATS and Redis, an API server,
//! a master process) that stops itself on drop, typed Job and Dataset builders
//! ([`resources`]), the row dumps tests compare ([`rows`]), the Criteo-like DLRM
//! workload ([`criteo`]) and object-store helpers ([`stores`]). Tests of several crates and
//! the end-to-end benchmarks share it instead of each keeping its own copy.

pub mod criteo;
pub mod image;
pub mod numbered;
pub mod partitions;
pub mod resources;
pub mod rows;
mod sandbox;
pub mod stores;

pub use sandbox::{MasterProcess, Sandbox, TOKEN, alive, bin_dir, binary, condition, topology};
