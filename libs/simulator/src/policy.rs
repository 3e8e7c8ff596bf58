//! The allocation policies a simulation compares, and their settings.

use std::str::FromStr;

use crate::SimulateError;

/// Who decides a Job's resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The user's allocation, fixed; a failed process restarts the Job from its last
    /// checkpoint.
    Static,
    /// Primus's dynamic scaling: the user's allocation, then scale-ups of trainer and PS
    /// counts planned from a model of the computation alone (DLRover-RM Eqs. 1-3); memory
    /// raised before a process runs out; failures recovered in place.
    Primus,
    /// DLRover-RM as the master runs it: warm start from similar finished Jobs, the full
    /// model (Eqs. 1-6) with NSGA-II plans over trainer and PS counts (each process keeps
    /// its cores, as the master's backends do not resize them) and the weighted greedy
    /// selection, memory raised before a process runs out, and stragglers and hot PS
    /// shards handled as they appear.
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
    /// Seconds between the optimizer's rounds (and the profiles it reads).
    pub interval_seconds: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            rho: 2.5,
            interval_seconds: 180.0,
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
