//! How a Job is allocated at its start, how its running data executors are scaled and how
//! their stragglers are handled.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::defaults;
use crate::validate::{FieldError, Validate, fail, field};

/// Primus's horizontal scaling of data executors by load (Eq. 1): every status interval the
/// master computes `L = w.u / sum(w)` over the data executors' utilisation `u` (buffer
/// starvation, CPU, memory; each 0..1, averaged over the executors) and adds one data
/// executor when `L` is above `load_threshold` and tasks are waiting, or removes one when it
/// is below `scale_in_threshold`; one action at a time, at least `cooldown_seconds` apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScalingPolicy {
    /// Scale data executors by load.
    #[serde(default)]
    pub enabled: bool,
    /// Where the Job's first allocation comes from.
    #[serde(default)]
    pub policy: AllocationPolicy,
    /// Fewest data executors.
    #[serde(default = "defaults::one_u32")]
    pub min_data_executors: u32,
    /// Most data executors.
    #[serde(default = "defaults::one_u32")]
    pub max_data_executors: u32,
    /// Add a data executor when the load `L` is above this (0..1).
    #[serde(default = "defaults::load_threshold")]
    pub load_threshold: f64,
    /// Remove a data executor when the load `L` is below this (0..1, under
    /// `load_threshold`).
    #[serde(default = "defaults::scale_in_threshold")]
    pub scale_in_threshold: f64,
    /// The weights `w` of the utilisations in `L`.
    #[serde(default)]
    pub weights: LoadWeights,
    /// Seconds after a scaling action before the next one.
    #[serde(default = "defaults::cooldown_seconds")]
    pub cooldown_seconds: u64,
    /// With `policy: auto`, the most trainers the master's optimizer gives the running Job.
    #[serde(default = "defaults::max_auto_replicas")]
    pub max_trainers: u32,
    /// With `policy: auto`, the most PS shards the master's optimizer gives the running Job.
    #[serde(default = "defaults::max_auto_replicas")]
    pub max_ps: u32,
    /// Data executors much slower than their peers (DLRover-RM §5.1).
    #[serde(default)]
    pub stragglers: StragglerPolicy,
    /// PS shards about to outgrow `topology.ps.memory` (DLRover-RM §5.3).
    #[serde(default)]
    pub memory: MemoryPolicy,
}

/// Where a Job's first allocation comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AllocationPolicy {
    /// The spec's `topology` as written.
    #[default]
    Static,
    /// DLRover-RM's optimizer. At the start, the warm start: replicas and cores of data
    /// executors, trainers and PS shards from the most similar Jobs that succeeded before
    /// (the master's config DB); the spec's own numbers when there are none. While the Job
    /// runs: trainers and PS shards moved to the plans its fitted resource-performance
    /// model and the cluster-level selection choose, within `max_trainers` and `max_ps`
    /// and the master's `master.cluster` capacity.
    Auto,
}

impl Default for ScalingPolicy {
    fn default() -> Self {
        Self {
            enabled: false,
            policy: AllocationPolicy::default(),
            min_data_executors: defaults::one_u32(),
            max_data_executors: defaults::one_u32(),
            load_threshold: defaults::load_threshold(),
            scale_in_threshold: defaults::scale_in_threshold(),
            weights: LoadWeights::default(),
            cooldown_seconds: defaults::cooldown_seconds(),
            max_trainers: defaults::max_auto_replicas(),
            max_ps: defaults::max_auto_replicas(),
            stragglers: StragglerPolicy::default(),
            memory: MemoryPolicy::default(),
        }
    }
}

/// The weights of the data executors' utilisations in their load (Primus Eq. 1). Each is
/// >= 0 and at least one is > 0; only their ratios matter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadWeights {
    /// Buffer starvation: 1 - the share of the serving buffers filled. Empty buffers mean
    /// the trainers take minibatches faster than the executors make them.
    #[serde(default = "defaults::starvation_weight")]
    pub starvation: f64,
    /// CPU used / `topology.data_executors.cpu`.
    #[serde(default = "defaults::cpu_weight")]
    pub cpu: f64,
    /// Resident memory / `topology.data_executors.memory`.
    #[serde(default = "defaults::memory_weight")]
    pub memory: f64,
}

impl Default for LoadWeights {
    fn default() -> Self {
        Self {
            starvation: defaults::starvation_weight(),
            cpu: defaults::cpu_weight(),
            memory: defaults::memory_weight(),
        }
    }
}

/// Straggler handling (DLRover-RM §5.1). A data executor that serves rows at less than
/// `1 / slowdown` of its peers' median rate (each measured over the time it held a task) is
/// a straggler: it takes a task only while more than one is waiting, and once nothing is
/// waiting and a faster executor is idle, the task it reads is taken back at the rows it
/// served and the faster one continues it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StragglerPolicy {
    /// Handle stragglers.
    #[serde(default = "defaults::true_bool")]
    pub enabled: bool,
    /// How many times slower than the median of its peers a straggler is (> 1).
    #[serde(default = "defaults::straggler_slowdown")]
    pub slowdown: f64,
}

impl Default for StragglerPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            slowdown: defaults::straggler_slowdown(),
        }
    }
}

impl Validate for ScalingPolicy {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        if self.min_data_executors == 0 {
            fail(errors, field(path, "min_data_executors"), "must be >= 1");
        }
        for (name, value) in [("max_trainers", self.max_trainers), ("max_ps", self.max_ps)] {
            if value == 0 {
                fail(errors, field(path, name), "must be >= 1");
            }
        }
        if self.max_data_executors < self.min_data_executors {
            fail(
                errors,
                field(path, "max_data_executors"),
                format!(
                    "must be >= min_data_executors ({} < {})",
                    self.max_data_executors, self.min_data_executors
                ),
            );
        }
        for (name, value) in [
            ("load_threshold", self.load_threshold),
            ("scale_in_threshold", self.scale_in_threshold),
        ] {
            if !(value.is_finite() && value > 0.0 && value <= 1.0) {
                fail(
                    errors,
                    field(path, name),
                    format!("must be within (0, 1] (got {value})"),
                );
            }
        }
        if self.scale_in_threshold >= self.load_threshold {
            fail(
                errors,
                field(path, "scale_in_threshold"),
                format!(
                    "must be below load_threshold ({} >= {})",
                    self.scale_in_threshold, self.load_threshold
                ),
            );
        }
        self.weights.validate(&field(path, "weights"), errors);
        self.stragglers.validate(&field(path, "stragglers"), errors);
        self.memory.validate(&field(path, "memory"), errors);
    }
}

/// OOM prevention for PS shards (Primus Eq. 2-3, DLRover-RM §5.3). Every status interval
/// the master samples the bytes each PS shard holds; from the last `samples` it forecasts
/// the change per interval (recent changes weighted most) and the memory the shard needs
/// within `horizon_seconds`: the most it held, plus the forecast change, plus
/// `safety_margin` of its memory. When that crosses the shard's memory (at first
/// `topology.ps.memory`) and it holds at least half of it, the master gives the shard that
/// much memory where the backend can (`vertical`) and otherwise adds a PS shard (a live
/// resharding), before the limit is reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryPolicy {
    /// Add PS shards before one reaches its memory.
    #[serde(default = "defaults::true_bool")]
    pub oom_prevention: bool,
    /// Samples the forecast uses (at least 2).
    #[serde(default = "defaults::memory_samples")]
    pub samples: u32,
    /// How far ahead the forecast looks.
    #[serde(default = "defaults::memory_horizon_seconds")]
    pub horizon_seconds: u64,
    /// Head room kept below a shard's memory, as a share of it (0..1).
    #[serde(default = "defaults::memory_safety_margin")]
    pub safety_margin: f64,
    /// Give a shard more memory before adding a shard.
    #[serde(default = "defaults::true_bool")]
    pub vertical: bool,
    /// A shard is not given more memory for less than this (Primus's minimum adjustment,
    /// a quantity like `16Mi`): the safety margin covers such growth.
    #[serde(default = "defaults::memory_min_change")]
    pub min_change: String,
}

impl Default for MemoryPolicy {
    fn default() -> Self {
        Self {
            oom_prevention: true,
            samples: defaults::memory_samples(),
            horizon_seconds: defaults::memory_horizon_seconds(),
            safety_margin: defaults::memory_safety_margin(),
            vertical: true,
            min_change: defaults::memory_min_change(),
        }
    }
}

impl Validate for MemoryPolicy {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        if self.samples < 2 {
            fail(
                errors,
                field(path, "samples"),
                format!("must be >= 2 (got {})", self.samples),
            );
        }
        if !(self.safety_margin.is_finite() && (0.0..1.0).contains(&self.safety_margin)) {
            fail(
                errors,
                field(path, "safety_margin"),
                format!("must be within [0, 1) (got {})", self.safety_margin),
            );
        }
        if let Err(e) = super::parse_memory(&self.min_change) {
            fail(errors, field(path, "min_change"), e);
        }
    }
}

impl Validate for StragglerPolicy {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        if !(self.slowdown.is_finite() && self.slowdown > 1.0) {
            fail(
                errors,
                field(path, "slowdown"),
                format!("must be > 1 (got {})", self.slowdown),
            );
        }
    }
}

impl Validate for LoadWeights {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        let weights = [
            ("starvation", self.starvation),
            ("cpu", self.cpu),
            ("memory", self.memory),
        ];
        for (name, value) in weights {
            if !(value.is_finite() && value >= 0.0) {
                fail(
                    errors,
                    field(path, name),
                    format!("must be >= 0 (got {value})"),
                );
            }
        }
        if weights.iter().all(|(_, value)| *value == 0.0) {
            fail(
                errors,
                path.to_owned(),
                "are all 0: at least one must be > 0",
            );
        }
    }
}
