//! The allocation policies a simulation compares, and their settings.

use std::str::FromStr;

use crate::SimulateError;

/// Who decides a Job's resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The user's allocation, fixed; a failed process restarts the Job from its last
    /// checkpoint.
    Static,
    /// The master's policies for a `policy: static` Job (Primus): the user's trainers and
    /// PS shards; memory given before a process runs out, else another PS shard (Primus
    /// Eqs. 2-3); an OOM-killed trainer given half as much again; failures recovered in
    /// place. (The master scales data executors by Eq. 1; none are simulated.)
    Primus,
    /// The master's policies for a `policy: auto` Job (DLRover-RM): Primus's, plus the
    /// warm start from similar finished Jobs and the optimizer, which moves trainer and
    /// PS counts (each process keeps its cores, as the master's backends do not resize
    /// them) by the model it fits to the Job's measured rates (Eqs. 1-6), NSGA-II plans
    /// and the cluster-level weighted greedy selection.
    DlroverRm,
}

impl Policy {
    /// Every policy, in the order a report lists them.
    pub const ALL: [Policy; 3] = [Policy::Static, Policy::Primus, Policy::DlroverRm];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Static => "static",
            Policy::Primus => "primus",
            Policy::DlroverRm => "dlrover-rm",
        }
    }

    /// Whether it changes allocations while Jobs run.
    pub(crate) fn scales(self) -> bool {
        self != Policy::Static
    }
}

impl FromStr for Policy {
    type Err = SimulateError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| SimulateError::Invalid {
                field: "policy".into(),
                message: format!("{name:?} is not one of static, primus, dlrover-rm"),
            })
    }
}

/// How a simulation runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Eq. 14's `rho`: how strongly the selection favours Jobs close to done.
    pub rho: f64,
    /// Seconds between the simulated master's status ticks.
    pub interval_seconds: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            rho: 2.5,
            interval_seconds: 60.0,
        }
    }
}

impl Settings {
    /// Refuses settings no simulation can run with, naming the field.
    pub fn check(&self) -> Result<(), SimulateError> {
        if !(self.rho.is_finite() && (-10.0..=10.0).contains(&self.rho)) {
            return Err(SimulateError::Invalid {
                field: "rho".into(),
                message: format!("{} is outside -10..=10", self.rho),
            });
        }
        if !(self.interval_seconds.is_finite() && self.interval_seconds >= 1.0) {
            return Err(SimulateError::Invalid {
                field: "interval_seconds".into(),
                message: format!("{} is not a number of seconds >= 1", self.interval_seconds),
            });
        }
        Ok(())
    }
}
