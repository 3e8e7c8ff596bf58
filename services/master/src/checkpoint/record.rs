//! What a checkpoint records: its PS snapshots, task offsets, stream positions and each
//! trainer's totals ([`CheckpointRecord`]), and the highest totals seen of each trainer of a
//! running Job ([`KnownTotals`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use primus_proto::v1::dataset_service_client::DatasetServiceClient;
use primus_proto::v1::{ConfirmedTotalsRequest, Endpoint, StreamPosition};
use serde::{Deserialize, Serialize};

use super::shards::channel;

/// A trainer's totals at a checkpoint's barrier.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TrainerTotals {
    pub steps: u64,
    pub samples: u64,
    /// Samples per Dataset source, summing to `samples`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<String, u64>,
}

impl TrainerTotals {
    /// Totals as a trainer reports them (`source_samples` a proto map).
    pub fn new(steps: u64, samples: u64, sources: HashMap<String, u64>) -> Self {
        Self {
            steps,
            samples,
            sources: sources.into_iter().collect(),
        }
    }

    /// The samples of each source these totals count beyond `earlier`'s.
    pub fn sources_since(&self, earlier: &TrainerTotals) -> BTreeMap<String, u64> {
        (self.sources.iter())
            .map(|(source, samples)| {
                let before = earlier.sources.get(source).copied().unwrap_or(0);
                (source.clone(), samples.saturating_sub(before))
            })
            .collect()
    }

    fn add(mut self, other: &TrainerTotals) -> Self {
        self.steps += other.steps;
        self.samples += other.samples;
        for (source, samples) in &other.sources {
            *self.sources.entry(source.clone()).or_default() += samples;
        }
        self
    }
}

/// What a checkpoint holds. The queue state it pairs with is copied in Redis under the
/// same id ([`primus_data_tasks::queue::TaskQueue::commit_checkpoint`]); `offsets`
/// repeats the unfinished tasks' offsets here so the object-store copy describes the data
/// position on its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub id: u64,
    pub unix_ms: i64,
    /// `<spec.checkpoint.uri>/ckpt-<id>`.
    pub uri: String,
    /// PS shard id -> its snapshot's manifest URI.
    pub ps: BTreeMap<String, String>,
    /// The checkpoint whose full snapshots the PS snapshots chain back to (this one's id
    /// when they are full; 0 in records written before incremental checkpoints).
    #[serde(default)]
    pub chain_start: u64,
    pub trainers: BTreeMap<String, TrainerTotals>,
    /// Task id -> rows consumed, for every task begun and not finished at the barrier.
    pub offsets: BTreeMap<String, u64>,
    /// Stream task id -> how far its subject was served at the barrier (bindings read in
    /// order; empty in records written before stream positions).
    #[serde(default)]
    pub stream_positions: BTreeMap<String, RecordedPosition>,
    pub succeeded_tasks: u64,
}

/// A [`StreamPosition`] in a checkpoint record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedPosition {
    /// The first message of the subject not wholly served.
    pub sequence: u64,
    /// Rows of it served.
    pub rows: u64,
}

impl From<StreamPosition> for RecordedPosition {
    fn from(p: StreamPosition) -> Self {
        Self {
            sequence: p.sequence,
            rows: p.rows,
        }
    }
}

impl CheckpointRecord {
    pub fn samples(&self) -> u64 {
        self.trainers.values().map(|t| t.samples).sum()
    }

    pub fn steps(&self) -> u64 {
        self.trainers.values().map(|t| t.steps).sum()
    }

    /// Every trainer's totals at the checkpoint, summed.
    pub fn totals(&self) -> TrainerTotals {
        (self.trainers.values()).fold(TrainerTotals::default(), TrainerTotals::add)
    }
}

/// How long a data executor has to say what a trainer confirmed to it.
const CONFIRMED_WAIT: Duration = Duration::from_secs(1);

/// The highest totals seen of each trainer of one job: what a trainer process continues
/// from when it starts, the first time or after a crash.
#[derive(Default)]
pub struct KnownTotals {
    totals: Mutex<BTreeMap<String, TrainerTotals>>,
}

impl KnownTotals {
    /// Raises `trainer`'s totals to `totals` where they are higher (reports arrive late
    /// and out of order; counters never go back).
    pub fn raise(&self, trainer: &str, totals: TrainerTotals) {
        let mut known = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        let entry = known.entry(trainer.to_owned()).or_default();
        // The higher count is the later report, per-source counts with it.
        if (totals.steps, totals.samples) > (entry.steps, entry.samples) {
            *entry = totals;
        }
    }

    /// `trainer`'s highest step count so far (0 before its first report).
    pub fn steps(&self, trainer: &str) -> u64 {
        let known = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        known.get(trainer).map_or(0, |totals| totals.steps)
    }

    /// Raises each of `trainers`' totals to the highest it confirmed with its minibatches
    /// to the data executors `executors` (its reports lag behind what it trained). An
    /// executor that does not answer within a second is skipped.
    pub async fn raise_to_confirmed(&self, job: &str, trainers: &[String], executors: &[Endpoint]) {
        for executor in executors {
            for trainer in trainers {
                let asked = async {
                    let mut client = DatasetServiceClient::new(channel(&executor.grpc_addr)?);
                    let request = ConfirmedTotalsRequest {
                        job: job.to_owned(),
                        trainer_id: trainer.clone(),
                    };
                    (client.confirmed_totals(request).await)
                        .map(|r| r.into_inner())
                        .map_err(|status| status.message().to_owned())
                };
                match tokio::time::timeout(CONFIRMED_WAIT, asked).await {
                    Ok(Ok(confirmed)) => self.raise(
                        trainer,
                        TrainerTotals::new(
                            confirmed.steps,
                            confirmed.samples,
                            confirmed.source_samples,
                        ),
                    ),
                    Ok(Err(message)) => {
                        tracing::debug!(executor = executor.id, %message, "no confirmed totals")
                    }
                    Err(_) => {
                        tracing::debug!(executor = executor.id, "no confirmed totals in time")
                    }
                }
            }
        }
    }

    /// Every trainer's totals summed.
    pub fn sum(&self) -> TrainerTotals {
        let totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        (totals.values()).fold(TrainerTotals::default(), TrainerTotals::add)
    }

    /// Every trainer's totals become `totals` (the Job rolled back to a checkpoint).
    pub fn reset(&self, totals: BTreeMap<String, TrainerTotals>) {
        *self.totals.lock().unwrap_or_else(|p| p.into_inner()) = totals;
    }

    pub fn get(&self, trainer: &str) -> TrainerTotals {
        self.totals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(trainer)
            .cloned()
            .unwrap_or_default()
    }
}
