//! Status shared by every resource kind; written only through the API server's UpdateStatus.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub enum Phase {
    #[default]
    Pending,
    Starting,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl Phase {
    /// Succeeded, Failed and Cancelled are final.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// A condition explains the phase: `type` holds, or not, for `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: bool,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    pub last_transition_unix_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Progress {
    pub samples: u64,
    pub steps: u64,
    /// Share of the bounded data consumed (0..=1); unset for open-ended streams.
    #[serde(default)]
    pub fraction: Option<f64>,
    #[serde(default)]
    pub samples_per_second: f64,
    #[serde(default)]
    pub auc: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Status {
    #[serde(default)]
    pub phase: Phase,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default)]
    pub observed_generation: u64,
    #[serde(default)]
    pub progress: Option<Progress>,
}
