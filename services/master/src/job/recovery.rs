//! Monolith's PS recovery (§2.3): a PS shard that crashed and was restarted by the backend
//! gets back its rows of the Job's latest committed checkpoint. The updates it took since
//! then are lost (the `ShardRestored` condition says of how many steps and samples) and the
//! other shards keep theirs; a Job with no committed checkpoint goes on with the shard
//! empty. With `on_ps_failure: rollback` the Job's loop rolls the whole Job back instead
//! (`rollback.rs`).

use std::sync::Arc;
use std::time::Duration;

use primus_proto::v1::{Endpoint, Role};
use primus_spec::job::{PsFailure, WorkerFailure};
use tokio::sync::{broadcast, mpsc};

use super::executors::{READY_TIMEOUT, serving};
use crate::checkpoint::{self, KnownTotals, ShardRecovery};
use crate::topology::Topologies;
use primus_backend::{BackendEvent, ExecutorRole};
use primus_data_tasks::queue::TaskQueue;

/// A recovered shard's condition reason and message, or the error that fails the Job.
pub(crate) type Recovered = Result<(&'static str, String), String>;

/// What a restarted executor asks of the Job.
pub(crate) enum Restart {
    /// `restore_shard`: it was restored alone ([`Recovered`]).
    Restored(Recovered),
    /// `rollback`: the Job returns to its checkpoint after an executor crashed (a PS shard
    /// awaits that restore); what crashed, as a phrase (`trainer-0 crashed`).
    RollBack(String),
}

/// What the recovery of one Job's restarted PS shards works with.
pub(crate) struct ShardRestarts {
    pub(crate) job: String,
    pub(crate) queue: TaskQueue,
    pub(crate) topologies: Topologies,
    pub(crate) recovery: Arc<ShardRecovery>,
    pub(crate) totals: Arc<KnownTotals>,
    /// `spec.checkpoint.on_ps_failure`.
    pub(crate) policy: PsFailure,
    /// `spec.checkpoint.on_worker_failure`.
    pub(crate) workers: WorkerFailure,
    /// Whether the Job's trainers share a `training.hot_set`.
    pub(crate) hot_set: bool,
}

/// Restores every PS shard of the Job the backend restarts, sending how each went, or with
/// `on_ps_failure: rollback` asks the Job to roll back. The new address of an executor
/// whose replacement moved (a new pod) goes into the topology here, in the order of the
/// backend's events, so the restore that follows reaches it.
pub(crate) async fn recover_restarted_shards(
    mut events: broadcast::Receiver<BackendEvent>,
    restarts: ShardRestarts,
    outcomes: mpsc::Sender<Restart>,
) {
    let ShardRestarts {
        job,
        queue,
        topologies,
        recovery,
        totals,
        policy,
        workers,
        hot_set,
    } = restarts;
    loop {
        let shard = match events.recv().await {
            Ok(BackendEvent::Moved {
                job: of,
                id,
                grpc_addr,
            }) if of == job => {
                topologies.readdress(&job, &id, grpc_addr.to_string());
                continue;
            }
            Ok(BackendEvent::Restarting { job: of, id, .. })
                if of == job && id.starts_with(ExecutorRole::Ps.as_str()) =>
            {
                id
            }
            Ok(BackendEvent::Restarting { job: of, id, .. }) if of == job => {
                if let Some(crash) = worker_rollback(workers, hot_set, &id)
                    && outcomes.send(Restart::RollBack(crash)).await.is_err()
                {
                    return;
                }
                continue;
            }
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(
                    job,
                    missed,
                    "backend events missed: a PS restart among them goes unrestored"
                );
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let endpoints = topologies.get(&job).map(|(_, e)| e).unwrap_or_default();
        let shards = primus_proto::role_endpoints(&endpoints, Role::Ps);
        let Some(endpoint) = shards.iter().find(|e| e.id == shard) else {
            continue;
        };
        recovery.restarting(&shard);
        let outcome = match policy {
            // The Job's loop restores every shard and says when it is done.
            PsFailure::Rollback => match serving_again(endpoint).await {
                Ok(()) => Restart::RollBack(format!("{shard} crashed")),
                Err(message) => Restart::Restored(Err(message)),
            },
            PsFailure::RestoreShard => {
                let recovered = recover_shard(&queue, endpoint, &shards, &totals).await;
                recovery.restored();
                Restart::Restored(recovered)
            }
        };
        if outcomes.send(outcome).await.is_err() {
            return;
        }
    }
}

async fn recover_shard(
    queue: &TaskQueue,
    shard: &Endpoint,
    shards: &[Endpoint],
    totals: &KnownTotals,
) -> Recovered {
    serving_again(shard).await?;
    // What the shard held beyond the checkpoint: the updates of every step since.
    let trained = totals.sum();
    let Some(record) = checkpoint::latest(queue).await.map_err(|e| e.to_string())? else {
        checkpoint::open_shard(shard, false)
            .await
            .map_err(|e| e.to_string())?;
        return Ok((
            "NoCheckpoint",
            format!(
                "{} restarted empty: no checkpoint committed yet; its updates of {} steps ({} samples) are lost",
                shard.id, trained.steps, trained.samples
            ),
        ));
    };
    let shards: Vec<&Endpoint> = shards.iter().collect();
    let rows = checkpoint::restore_shard(&record, shard, &shards)
        .await
        .map_err(|e| e.to_string())?;
    let lost_steps = trained.steps.saturating_sub(record.steps());
    let lost_samples = trained.samples.saturating_sub(record.samples());
    Ok((
        "FromCheckpoint",
        format!(
            "{} restarted and restored from checkpoint {} ({}): {rows} rows; its updates of the {lost_steps} steps ({lost_samples} samples) trained since, as last reported, are lost",
            shard.id, record.id, record.uri
        ),
    ))
}

/// Waits until the restarted `shard` serves. The crashed process is gone once the backend
/// reports the restart, so the first SERVING answer comes from its successor.
async fn serving_again(shard: &Endpoint) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    while !serving(&shard.grpc_addr).await {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{} at {} did not serve again within {}s of its restart",
                shard.id,
                shard.grpc_addr,
                READY_TIMEOUT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The crash that rolls the Job back when worker `id` restarts, if it does: any data
/// executor's or trainer's under `on_worker_failure: rollback`, and a trainer's under either
/// policy when the trainers share a hot set. A hot-set member's crash cannot be continued
/// from exactly: the gradients it gave to a round reach the PS only through the round's
/// sum, which survivors may or may not have applied and pushed, so the minibatch served
/// again could be applied twice or a share of the round lost. The rounds are a collective,
/// and like DLRover-RM's allreduce jobs the group restarts from the checkpoint.
fn worker_rollback(workers: WorkerFailure, hot_set: bool, id: &str) -> Option<String> {
    let is = |role: ExecutorRole| id.starts_with(role.as_str());
    if hot_set && is(ExecutorRole::Trainer) {
        return Some(format!("{id}, a member of the hot set, crashed"));
    }
    let worker = is(ExecutorRole::DataExecutor) || is(ExecutorRole::Trainer);
    (workers == WorkerFailure::Rollback && worker).then(|| format!("{id} crashed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_rolls_the_job_back_under_rollback_and_a_hot_set_member_always() {
        use WorkerFailure::{Continue, Rollback};
        let cases = [
            (
                Rollback,
                false,
                "data_executor-1",
                Some("data_executor-1 crashed"),
            ),
            (Rollback, false, "trainer-0", Some("trainer-0 crashed")),
            (Continue, false, "trainer-0", None),
            (Continue, false, "data_executor-0", None),
            (
                Continue,
                true,
                "trainer-1",
                Some("trainer-1, a member of the hot set, crashed"),
            ),
            (
                Rollback,
                true,
                "trainer-0",
                Some("trainer-0, a member of the hot set, crashed"),
            ),
            (Continue, true, "data_executor-0", None),
            (
                Rollback,
                true,
                "data_executor-0",
                Some("data_executor-0 crashed"),
            ),
            (Rollback, true, "serving-0", None),
            (Rollback, false, "ps-0", None),
        ];
        for (workers, hot_set, id, expected) in cases {
            assert_eq!(
                worker_rollback(workers, hot_set, id).as_deref(),
                expected,
                "{workers:?}, hot set {hot_set}, {id}"
            );
        }
    }
}
