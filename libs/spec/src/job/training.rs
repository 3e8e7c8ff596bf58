//! How a Job's trainers step: batch size, metrics, stream loading, and HypeReca's hot set.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::defaults;
use crate::validate::{FieldError, Validate, fail, field};

/// How each trainer steps and what its progressive metrics cover.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainingSpec {
    /// Samples per minibatch.
    #[serde(default = "defaults::batch_size")]
    pub batch_size: u32,
    /// Pull the dense parameters from the PS every this many steps.
    #[serde(default = "defaults::one_u32")]
    pub dense_pull_every: u32,
    /// The newest samples a trainer's AUC, logloss and calibration cover (each scored
    /// before it was trained on).
    #[serde(default = "defaults::eval_window")]
    pub eval_window: u32,
    /// How stream partitions are loaded (Primus Table 2).
    #[serde(default)]
    pub stream_loading: StreamLoading,
    /// Rows every trainer replicates and trains in lockstep (HypeReca §5).
    #[serde(default)]
    pub hot_set: HotSetSpec,
}

/// When and how a job's trainers replicate their most accessed rows (HypeReca's
/// two-fold parallelism): those rows skip the PS, and every trainer applies the sum of
/// all trainers' gradients to them after each step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HotSetSpec {
    /// Off: every row goes through the PS (the default).
    pub enabled: bool,
    /// Minibatches whose key accesses each trainer counts before the hot set is chosen.
    pub warmup_batches: u32,
    /// Most rows replicated (over all tables).
    pub max_rows: u64,
    /// Replicate exactly this many of the most accessed rows instead of the cost model's
    /// choice (still capped by `max_rows`).
    pub rows: Option<u64>,
    /// Choose again at a checkpoint once the hot rows' share of accesses fell this far
    /// below the share they were chosen for.
    pub drift_tolerance: f64,
    /// A trainer silent this long during a round ends the group: every trainer then goes
    /// back to the PS for all rows until the hot set is chosen again.
    pub sync_timeout_ms: u64,
    /// How a round's gradients travel between the members.
    pub exchange: HotExchange,
}

/// How the hot set's members exchange a round's gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HotExchange {
    /// Direct gRPC between the trainers on a ring (HypeReca §4): the hot rows are sharded by
    /// key among the members, reduced around the ring and gathered back; each member sends
    /// about 2(n-1)/n of one share and pushes its own shard of the sum to the PS. NATS
    /// carries only the rounds' membership.
    #[default]
    Ring,
    /// Every member publishes its whole share on the Job's NATS subject and sums all of
    /// them; the lowest member pushes the sum. For trainers that cannot reach each other.
    Nats,
}

impl Default for HotSetSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            warmup_batches: 20,
            max_rows: 100_000,
            rows: None,
            drift_tolerance: 0.05,
            sync_timeout_ms: 10_000,
            exchange: HotExchange::default(),
        }
    }
}

impl Validate for HotSetSpec {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        if self.warmup_batches == 0 {
            fail(errors, field(path, "warmup_batches"), "must be > 0");
        }
        if self.max_rows == 0 {
            fail(errors, field(path, "max_rows"), "must be > 0");
        }
        if self.rows == Some(0) {
            fail(errors, field(path, "rows"), "must be > 0 when set");
        }
        if !(0.0..=1.0).contains(&self.drift_tolerance) {
            fail(
                errors,
                field(path, "drift_tolerance"),
                "must be between 0 and 1",
            );
        }
        if self.sync_timeout_ms == 0 {
            fail(errors, field(path, "sync_timeout_ms"), "must be > 0");
        }
    }
}

/// Primus's two stream loading modes (Table 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamLoading {
    /// Each executor pre-processes only the stream partitions bound to it.
    #[default]
    Forward,
    /// An executor whose own partitions are caught up also takes raw messages of a
    /// partition that is behind (from the same durable consumer as its holder), so a hot
    /// partition spreads over the executors that have time.
    Rebalance,
}

impl Default for TrainingSpec {
    fn default() -> Self {
        Self {
            batch_size: defaults::batch_size(),
            dense_pull_every: 1,
            eval_window: defaults::eval_window(),
            stream_loading: StreamLoading::default(),
            hot_set: HotSetSpec::default(),
        }
    }
}

impl Validate for TrainingSpec {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        for (name, value) in [
            ("batch_size", self.batch_size),
            ("dense_pull_every", self.dense_pull_every),
            ("eval_window", self.eval_window),
        ] {
            if value == 0 {
                fail(errors, field(path, name), "must be > 0");
            }
        }
        self.hot_set.validate(&field(path, "hot_set"), errors);
    }
}
