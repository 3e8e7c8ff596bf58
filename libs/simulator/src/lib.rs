//! `primus-simulator`: a discrete-event simulator of a training cluster, for comparing
//! resource policies on thousands of Jobs in seconds (DLRover-RM §6).
//!
//! - [`trace`]: seeded Job traces (arrivals, sizes, over-provisioned user allocations,
//!   stragglers, hot PS shards, process failures).
//! - [`truth`]: how a Job really runs under an allocation, in a form unlike the fitted
//!   model's (saturating cores, contention, noise).
//! - [`policy`]: static allocation, and the master's policies for a `policy: static` Job
//!   (Primus) and a `policy: auto` one (DLRover-RM).
//! - `master`: the master's part of a simulated Job: the snapshot its policies
//!   (`primus-job-policy`, the code the master runs) decide on, built from the Job's
//!   true state.
//! - `engine`: the event loop, which carries out what the master's policies decide.
//! - [`report`]: JCT, completion rate and utilisation per policy, as a table and the
//!   one-line comparison.

#![warn(missing_docs)]

mod engine;
mod master;
pub mod policy;
mod random;
pub mod report;
pub mod trace;
pub mod truth;

pub use policy::{Policy, Settings};
pub use report::Outcome;
pub use trace::{Trace, generate};

/// Input a simulation cannot run with; names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimulateError {
    /// A setting or argument out of range.
    #[error("{field}: {message}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// Runs `policy` over `trace`, telling `progress` the share simulated (0..=1).
pub fn simulate(
    trace: &Trace,
    policy: Policy,
    settings: Settings,
    seed: u64,
    progress: &mut dyn FnMut(f64),
) -> Result<Outcome, SimulateError> {
    settings.check()?;
    if trace.cluster.cpu <= 0.0 || !trace.cluster.cpu.is_finite() {
        return Err(invalid("cluster.cpu", trace.cluster.cpu));
    }
    if trace.cluster.memory_gib <= 0.0 || !trace.cluster.memory_gib.is_finite() {
        return Err(invalid("cluster.memory_gib", trace.cluster.memory_gib));
    }
    let template = master::template().ok_or_else(|| SimulateError::Invalid {
        field: "examples/criteo-like.yaml".into(),
        message: "the example Job does not parse".into(),
    })?;
    Ok(engine::Simulation::new(trace, policy, settings, template, seed).run(progress))
}

fn invalid(field: &str, value: f64) -> SimulateError {
    SimulateError::Invalid {
        field: field.into(),
        message: format!("{value} is not a capacity > 0"),
    }
}
