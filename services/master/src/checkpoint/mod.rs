//! The checkpoint coordinator: a model snapshot and the data offsets it was trained to,
//! taken at one moment and restored together.
//!
//! Checkpoint `id` is taken every `spec.checkpoint.interval_seconds`. First every data
//! executor pauses (`DatasetService.Pause`): nothing more leaves its serving buffers, each
//! open minibatch stream sends the barrier marker, and the executor answers with the rows
//! served of each task it holds and the position of each stream binding it reads in order.
//! Every running trainer then trains what came before the markers of all its streams and
//! says so (`CheckpointService.TrainerAligned`, with its step and sample totals); only then
//! do the served offsets and positions go into the task queue, as every row before them is
//! trained (an executor that dies before leaves the queue at what trainers consumed). Every
//! PS shard then copies its snapshot in memory (DLRover-RM §5.2's flash checkpoint), and the
//! queue's offsets, stream positions and succeeded set are staged in Redis. The data
//! executors resume after that, or as soon as any of it failed (a pause also expires by
//! itself): training pauses only from the pause to the staging. Each PS shard then writes
//! its copy to `<uri>/ckpt-<id>/<shard>`; once all are written, `<uri>/ckpt-<id>/checkpoint.json`
//! is, then the record is committed in Redis with the staged queue state (the commit point).
//! Last, the files of checkpoints `keep` ids or more before it are deleted.
//!
//! A Job started again (a new master, the same master after a restart) with a committed
//! checkpoint restores every PS shard from it, rolls the queue back to its offsets and
//! starts each trainer from its totals, before any data executor or trainer runs; with
//! checkpointing configured but none committed yet, the queue goes back to the start.
//! Stream bindings read in order (`forward` loading) go back to their recorded positions,
//! so every message after one is read again once; bindings of `rebalance` loading and
//! online joins are not rewound.
//!
//! A PS shard that crashes mid-job is restarted by the backend and restored alone from the
//! latest committed checkpoint (Monolith §2.3: the shard loses the updates since, the rest
//! of the job goes on). It refuses training calls until then (`ps.await_restore`), so
//! trainers hold their pushes for it instead of losing them to the restore. A checkpoint neither starts while a shard is being restored nor
//! commits when a shard restarted while it was taken ([`ShardRecovery`]), so none records
//! an emptied shard.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use primus_config::StorageSettings;
use primus_proto::v1::dataset_service_client::DatasetServiceClient;
use primus_proto::v1::{Endpoint, PauseRequest, PauseResponse, ResumeRequest};
use tokio::sync::Notify;

use primus_data_tasks::queue::{QueueError, TaskQueue};
use primus_spec::time::unix_ms;

mod record;
mod shards;

pub use record::{CheckpointRecord, KnownTotals, RecordedPosition, TrainerTotals};
use shards::channel;
pub use shards::{open_shard, restore_ps, restore_shard};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("data executor {id} at {addr}: {message}")]
    DataExecutor {
        id: String,
        addr: String,
        message: String,
    },
    #[error("checkpoint {id} abandoned: {lost}")]
    ParticipantLost { id: u64, lost: String },
    #[error("trainers {missing:?} did not align on checkpoint {id} within {timeout:?}")]
    NotAligned {
        id: u64,
        missing: Vec<String>,
        timeout: Duration,
    },
    #[error("PS shard {id} at {addr}: {message}")]
    Ps {
        id: String,
        addr: String,
        message: String,
    },
    #[error("{url}: {message}")]
    Storage { url: String, message: String },
    #[error("checkpoint record in Redis: {0}")]
    Record(String),
    #[error("PS shard {0} restarted and is not restored yet")]
    ShardRecovering(String),
    #[error(
        "a PS shard restarted during checkpoint {0}: its snapshot may be of the empty successor"
    )]
    Restarted(u64),
    #[error("task queue: {0}")]
    Queue(#[from] QueueError),
}

/// PS shards of one job that crashed and came back: a checkpoint must not snapshot one
/// before it has its rows back, or the checkpoint would record it empty.
#[derive(Default)]
pub struct ShardRecovery {
    /// Restarts seen so far; a checkpoint whose start and commit see different counts is
    /// abandoned.
    restarts: AtomicU64,
    /// The shard being restored, if any.
    recovering: Mutex<Option<String>>,
}

impl ShardRecovery {
    /// A shard restarted: checkpoints wait until [`Self::restored`].
    pub fn restarting(&self, shard: &str) {
        self.restarts.fetch_add(1, Ordering::AcqRel);
        *self.recovering.lock().unwrap_or_else(|p| p.into_inner()) = Some(shard.to_owned());
    }

    /// The restarted shard has its rows back (or none were committed to restore).
    pub fn restored(&self) {
        *self.recovering.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The restart count when no shard is being restored.
    fn settled(&self) -> Result<u64, CheckpointError> {
        match self
            .recovering
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            Some(shard) => Err(CheckpointError::ShardRecovering(shard)),
            None => Ok(self.restarts.load(Ordering::Acquire)),
        }
    }
}

/// One barrier round: the trainers aligned so far, and a participant lost meanwhile.
struct Round {
    id: u64,
    acks: BTreeMap<String, TrainerTotals>,
    lost: Option<String>,
}

/// The barrier round in progress for one job: which trainers have aligned.
#[derive(Default)]
pub struct Alignments {
    round: Mutex<Option<Round>>,
    arrived: Notify,
}

impl Alignments {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Round>> {
        self.round.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open(&self, id: u64) {
        *self.lock() = Some(Round {
            id,
            acks: BTreeMap::new(),
            lost: None,
        });
    }

    fn close(&self) {
        *self.lock() = None;
    }

    /// Records that `trainer` aligned on checkpoint `id`; false when that checkpoint is
    /// not in progress.
    pub fn ack(&self, id: u64, trainer: &str, totals: TrainerTotals) -> bool {
        let mut round = self.lock();
        match round.as_mut() {
            Some(round) if round.id == id => {
                round.acks.insert(trainer.to_owned(), totals);
                self.arrived.notify_waiters();
                true
            }
            _ => false,
        }
    }

    /// A participant of the Job died (`what` says which and how): the round in progress,
    /// if any, cannot complete and is abandoned now instead of at its timeout.
    pub fn participant_lost(&self, what: String) {
        if let Some(round) = self.lock().as_mut() {
            round.lost.get_or_insert(what);
            self.arrived.notify_waiters();
        }
    }

    /// The totals of every trainer in `expected` once all have aligned.
    async fn wait(
        &self,
        id: u64,
        expected: &BTreeSet<String>,
        timeout: Duration,
    ) -> Result<BTreeMap<String, TrainerTotals>, CheckpointError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let arrived = self.arrived.notified();
            let missing: Vec<String> = {
                let round = self.lock();
                if let Some(lost) = round.as_ref().and_then(|r| r.lost.clone()) {
                    return Err(CheckpointError::ParticipantLost { id, lost });
                }
                let acks = round.as_ref().map(|r| &r.acks);
                expected
                    .iter()
                    .filter(|t| !acks.is_some_and(|a| a.contains_key(*t)))
                    .cloned()
                    .collect()
            };
            if missing.is_empty() {
                let round = self.lock();
                let acks = round.as_ref().map(|r| r.acks.clone());
                return Ok(acks.unwrap_or_default());
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Err(CheckpointError::NotAligned {
                    id,
                    missing,
                    timeout,
                });
            }
        }
    }
}

/// How long the phases of a checkpoint may take, and how many checkpoints are kept.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Checkpoints kept in the object store (at least 1).
    pub keep: u64,
    /// Trainers have this long to align after the data executors paused.
    pub align: Duration,
    /// A data executor resumes by itself after this long without a Resume.
    pub pause: Duration,
}

/// A job's executors as the coordinator sees them.
pub struct Participants {
    pub data_executors: Vec<Endpoint>,
    pub ps: Vec<Endpoint>,
    /// Trainer ids still training (not exited).
    pub trainers: BTreeSet<String>,
}

/// One job's coordinator (owned, so a checkpoint runs beside the Job's event loop).
pub struct Coordinator {
    pub job: String,
    pub queue: TaskQueue,
    pub alignments: Arc<Alignments>,
    pub recovery: Arc<ShardRecovery>,
    pub storage: StorageSettings,
    /// `spec.checkpoint.uri`.
    pub uri: String,
    /// `spec.checkpoint.full_every`.
    pub full_every: u64,
    pub limits: Limits,
}

/// A checkpoint whose barrier is over and whose snapshots are being written: its record
/// without the manifests yet, and the PS restarts seen when it began.
struct Staged {
    record: CheckpointRecord,
    restarts: u64,
}

/// A committed checkpoint and how long training was paused for it.
pub struct Taken {
    pub record: CheckpointRecord,
    pub paused: Duration,
}

impl Coordinator {
    /// Takes checkpoint `id`, incremental to `previous` (the last committed one) when its
    /// chain is shorter than `full_every`; the data executors are resumed whatever happens.
    /// Once it is committed, the files of checkpoints that fall out of the ones kept are
    /// deleted (see [`retained`]).
    pub async fn take(
        &self,
        id: u64,
        previous: Option<&CheckpointRecord>,
        participants: &Participants,
    ) -> Result<Taken, CheckpointError> {
        let started = Instant::now();
        self.alignments.open(id);
        let base = previous.filter(|p| self.extends(id, p, participants));
        let staged = self.paused(id, base, participants).await;
        self.alignments.close();
        self.resume(id, &participants.data_executors).await;
        let paused = started.elapsed();
        let record = self.commit(staged?, participants).await?;
        let retained = retained(self.limits.keep, self.full_every);
        let previous = previous.map_or(0, |p| p.id);
        for old in (previous + 1).saturating_sub(retained).max(1)..=id.saturating_sub(retained) {
            self.delete(old).await;
        }
        Ok(Taken { record, paused })
    }

    /// Whether checkpoint `id` may be incremental to `previous`: its chain stays within
    /// `full_every` checkpoints and the same PS shards took it.
    fn extends(&self, id: u64, previous: &CheckpointRecord, participants: &Participants) -> bool {
        let shards: BTreeSet<&str> = participants.ps.iter().map(|e| e.id.as_str()).collect();
        previous.chain_start > 0
            && id.saturating_sub(previous.chain_start) < self.full_every
            && previous.ps.keys().map(String::as_str).eq(shards)
    }

    /// Deletes checkpoint `id`'s files; a failure is logged (they are only disk space).
    async fn delete(&self, id: u64) {
        let uri = self.uri.trim_end_matches('/');
        let deleted = match primus_storage::open(uri, &self.storage) {
            Ok(location) => location.delete_all(&format!("ckpt-{id}")).await,
            Err(e) => Err(e),
        };
        match deleted {
            Ok(files) => tracing::info!(
                job = %self.job,
                checkpoint = id,
                files,
                "old checkpoint deleted"
            ),
            Err(e) => {
                tracing::warn!(job = %self.job, checkpoint = id, error = %e, "deleting an old checkpoint")
            }
        }
    }

    /// The paused part of checkpoint `id`: the barrier, the PS shards' in-memory copies and
    /// the queue state staged; what is committed once the copies are written.
    async fn paused(
        &self,
        id: u64,
        base: Option<&CheckpointRecord>,
        participants: &Participants,
    ) -> Result<Staged, CheckpointError> {
        let restarts = self.recovery.settled()?;
        let served = self.pause(id, &participants.data_executors).await?;
        let trainers = self
            .alignments
            .wait(id, &participants.trainers, self.limits.align)
            .await?;
        // Only now is every row served before the pause trained: an executor that dies
        // between its pause and the trainers' alignment may have served rows no trainer
        // received, which its successor must serve again from the consumed offsets.
        for (executor, served) in served {
            self.record_offsets(&executor, served).await?;
        }
        let uri = format!("{}/ckpt-{id}", self.uri.trim_end_matches('/'));
        shards::copy_snapshots(&uri, &participants.ps, base.map(|b| &b.ps)).await?;
        self.queue.stage_checkpoint(id).await?;
        let offsets: BTreeMap<String, u64> = self.queue.offsets().await?.into_iter().collect();
        let stream_positions = self
            .queue
            .positions()
            .await?
            .into_iter()
            .map(|(task, p)| (task, RecordedPosition::from(p)))
            .collect();
        let record = CheckpointRecord {
            id,
            unix_ms: unix_ms(),
            uri,
            ps: BTreeMap::new(),
            chain_start: base.map_or(id, |b| b.chain_start),
            trainers,
            offsets,
            stream_positions,
            succeeded_tasks: self.queue.counts().await?.succeeded,
        };
        Ok(Staged { record, restarts })
    }

    /// Waits for the PS shards' writes of `staged`, then writes its record and commits it.
    async fn commit(
        &self,
        staged: Staged,
        participants: &Participants,
    ) -> Result<CheckpointRecord, CheckpointError> {
        let mut record = staged.record;
        record.ps = shards::written_snapshots(&record.uri, &participants.ps).await?;
        if self.recovery.settled()? != staged.restarts {
            return Err(CheckpointError::Restarted(record.id));
        }
        let json = serde_json::to_string_pretty(&record)
            .map_err(|e| CheckpointError::Record(e.to_string()))?;
        self.write_record(&record.uri, &json).await?;
        self.queue.commit_checkpoint(record.id, &json).await?;
        Ok(record)
    }

    /// Pauses every data executor; what each served up to its pause, by executor id.
    async fn pause(
        &self,
        id: u64,
        executors: &[Endpoint],
    ) -> Result<Vec<(String, PauseResponse)>, CheckpointError> {
        let request = || PauseRequest {
            job: self.job.to_owned(),
            checkpoint_id: id,
            timeout_ms: self.limits.pause.as_millis() as u64,
        };
        // An executor that does not answer (hung, or stopped) within its own pause expiry
        // fails the checkpoint instead of holding it.
        let deadline = self.limits.pause;
        let paused = join_all(executors.iter().map(|executor| async move {
            let mut client = DatasetServiceClient::new(channel(&executor.grpc_addr)?);
            let response = tokio::time::timeout(deadline, client.pause(request()))
                .await
                .map_err(|_| format!("no answer to Pause within {deadline:?}"))?;
            response
                .map(|r| r.into_inner())
                .map_err(|status| status.message().to_owned())
        }))
        .await;
        let mut served = Vec::new();
        for (executor, result) in executors.iter().zip(paused) {
            let response = result.map_err(|message| CheckpointError::DataExecutor {
                id: executor.id.clone(),
                addr: executor.grpc_addr.clone(),
                message,
            })?;
            served.push((executor.id.clone(), response));
        }
        Ok(served)
    }

    async fn record_offsets(
        &self,
        executor: &str,
        served: PauseResponse,
    ) -> Result<(), CheckpointError> {
        for (task, offset) in served.served_offsets {
            // A task taken back from this executor is not its to report: skipped.
            let position = served.stream_positions.get(&task);
            self.queue
                .report_progress(executor, &task, offset, position, unix_ms())
                .await?;
        }
        Ok(())
    }

    async fn resume(&self, id: u64, executors: &[Endpoint]) {
        let resumed = join_all(executors.iter().map(|executor| async move {
            let mut client = DatasetServiceClient::new(channel(&executor.grpc_addr)?);
            let request = ResumeRequest {
                job: self.job.to_owned(),
                checkpoint_id: id,
            };
            client
                .resume(request)
                .await
                .map(|_| ())
                .map_err(|status| status.message().to_owned())
        }))
        .await;
        for (executor, result) in executors.iter().zip(resumed) {
            if let Err(message) = result {
                tracing::warn!(job = %self.job, executor = %executor.id, %message, "resuming after checkpoint {id}; its pause expires by itself");
            }
        }
    }

    async fn write_record(&self, uri: &str, json: &str) -> Result<(), CheckpointError> {
        write_record(&self.storage, uri, json).await
    }
}

/// The file beside a checkpoint's snapshots that describes it on its own.
const RECORD_FILE: &str = "checkpoint.json";

fn storage_error(url: String, e: primus_storage::StorageError) -> CheckpointError {
    CheckpointError::Storage {
        url,
        message: e.to_string(),
    }
}

/// Writes `json` (a [`CheckpointRecord`]) as the record of the checkpoint folder `uri`.
pub async fn write_record(
    storage: &StorageSettings,
    uri: &str,
    json: &str,
) -> Result<(), CheckpointError> {
    let location = primus_storage::open(uri, storage).map_err(|e| storage_error(uri.into(), e))?;
    let path = location.path(RECORD_FILE);
    location
        .put(&path, bytes::Bytes::from(json.to_owned()))
        .await
        .map_err(|e| storage_error(location.url_of(&path), e))
}

/// The record of the checkpoint folder `uri` (`<checkpoint uri>/ckpt-<id>` or `/final`).
pub async fn read_record(
    storage: &StorageSettings,
    uri: &str,
) -> Result<CheckpointRecord, CheckpointError> {
    let location = primus_storage::open(uri, storage).map_err(|e| storage_error(uri.into(), e))?;
    let path = location.path(RECORD_FILE);
    let url = location.url_of(&path);
    let bytes = location
        .get(&path)
        .await
        .map_err(|e| storage_error(url.clone(), e))?;
    serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Storage {
        url,
        message: format!("not a checkpoint record: {e}"),
    })
}

/// How many of the newest checkpoint ids keep their files: the `keep` newest, and every
/// checkpoint their PS snapshots chain back to (at most `full_every` - 1 before each).
pub fn retained(keep: u64, full_every: u64) -> u64 {
    keep.max(1) + full_every.max(1) - 1
}

/// The latest committed checkpoint of a job's queue.
pub async fn latest(queue: &TaskQueue) -> Result<Option<CheckpointRecord>, CheckpointError> {
    let Some(json) = queue.latest_checkpoint().await? else {
        return Ok(None);
    };
    serde_json::from_str(&json)
        .map(Some)
        .map_err(|e| CheckpointError::Record(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn alignment_waits_for_every_expected_trainer_of_the_open_checkpoint() {
        let alignments = Alignments::default();
        let totals = TrainerTotals {
            steps: 3,
            samples: 300,
            ..TrainerTotals::default()
        };
        assert!(
            !alignments.ack(1, "trainer-0", totals.clone()),
            "no round open"
        );
        alignments.open(2);
        assert!(
            !alignments.ack(1, "trainer-0", totals.clone()),
            "another checkpoint"
        );
        assert!(alignments.ack(2, "trainer-0", totals.clone()));
        let expected: BTreeSet<String> = ["trainer-0", "trainer-1"].map(String::from).into();
        let timeout = Duration::from_millis(50);
        match alignments.wait(2, &expected, timeout).await {
            Err(CheckpointError::NotAligned { missing, .. }) => {
                assert_eq!(missing, vec!["trainer-1".to_owned()])
            }
            other => panic!("expected trainer-1 missing, got {:?}", other.map(|_| ())),
        }
        assert!(alignments.ack(2, "trainer-1", TrainerTotals::default()));
        let acks = alignments
            .wait(2, &expected, timeout)
            .await
            .expect("aligned");
        assert_eq!(acks.get("trainer-0"), Some(&totals));
        assert_eq!(acks.len(), 2);
    }

    #[tokio::test]
    async fn a_participant_lost_during_the_barrier_abandons_it_at_once() {
        let alignments = std::sync::Arc::new(Alignments::default());
        // Lost before any round: nothing to abandon, the next round is unaffected.
        alignments.participant_lost("trainer-0 crashed".into());
        alignments.open(3);
        let expected: BTreeSet<String> = ["trainer-0"].map(String::from).into();
        let waiter = {
            let alignments = alignments.clone();
            let expected = expected.clone();
            tokio::spawn(async move {
                alignments
                    .wait(3, &expected, Duration::from_secs(600))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        alignments.participant_lost("data_executor-0 crashed: signal 9".into());
        let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("abandoned long before the 600 s timeout")
            .expect("the waiter");
        match waited {
            Err(CheckpointError::ParticipantLost { id: 3, lost }) => {
                assert_eq!(lost, "data_executor-0 crashed: signal 9")
            }
            other => panic!("expected the round abandoned, got {:?}", other.map(|_| ())),
        }
        alignments.close();
        alignments.open(4);
        assert!(alignments.ack(4, "trainer-0", TrainerTotals::default()));
        let acks = alignments
            .wait(4, &expected, Duration::from_millis(50))
            .await;
        assert!(acks.is_ok(), "a new round starts clean");
    }

    #[test]
    fn a_shard_being_restored_holds_checkpoints_off_and_a_restart_is_seen() {
        let recovery = ShardRecovery::default();
        let before = recovery.settled().expect("nothing restarted");
        recovery.restarting("ps-1");
        match recovery.settled() {
            Err(CheckpointError::ShardRecovering(shard)) => assert_eq!(shard, "ps-1"),
            other => panic!("expected ps-1 recovering, got {other:?}"),
        }
        recovery.restored();
        let after = recovery.settled().expect("restored");
        assert_ne!(
            before, after,
            "a checkpoint spanning the restart must see it"
        );
    }

    #[test]
    fn known_totals_only_rise() {
        let known = KnownTotals::default();
        assert_eq!(known.get("trainer-0"), TrainerTotals::default());
        let totals = |steps, samples| TrainerTotals {
            steps,
            samples,
            sources: [("files".to_owned(), samples)].into(),
        };
        known.raise("trainer-0", totals(10, 1000));
        // A late report of the same process, then the restarted one's first.
        known.raise("trainer-0", totals(9, 900));
        assert_eq!(known.get("trainer-0"), totals(10, 1000));
        known.raise("trainer-0", totals(11, 1100));
        assert_eq!(known.get("trainer-0"), totals(11, 1100));
        assert_eq!(known.get("trainer-1"), TrainerTotals::default());
        known.raise("trainer-1", totals(2, 200));
        assert_eq!(known.sum(), totals(13, 1300));
    }
}
