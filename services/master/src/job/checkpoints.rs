//! A running Job's checkpoints: the periodic ones (taken by [`checkpoint::Coordinator`] in
//! a task of their own while the Job's events go on, reported in the `Checkpoint`
//! condition), the restore of a Job started again, and the final snapshot of a Job that
//! succeeded.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{Endpoint, Role, SnapshotRequest};

use super::executors::with_role;
use super::{JobRun, Outcome};
use crate::checkpoint::{self, Alignments, CheckpointError, CheckpointRecord};
use primus_backend::{BackendEvent, ResourceBackend};
use primus_data_tasks::plan::Catalog;
use primus_data_tasks::queue::TaskQueue;

/// Puts the queue back to the latest committed checkpoint (to the start when there is
/// none) and returns that checkpoint.
pub(super) async fn rollback_queue(
    job: &str,
    queue: &TaskQueue,
) -> Result<Option<CheckpointRecord>, CheckpointError> {
    let restored = checkpoint::latest(queue).await?;
    let reopened = queue.rollback(restored.as_ref().map(|r| r.id)).await?;
    if reopened > 0 || restored.is_some() {
        let checkpoint = restored.as_ref().map(|r| r.id);
        tracing::info!(job, ?checkpoint, reopened, "task queue rolled back");
    }
    Ok(restored)
}

/// Abandons `job`'s checkpoint in progress as soon as the backend reports one of its
/// executors crashed or given up: the barrier cannot complete, and waiting out its
/// timeout would hold the data executors paused.
pub(super) async fn abandon_on_crash(
    mut events: tokio::sync::broadcast::Receiver<BackendEvent>,
    job: String,
    alignments: Arc<Alignments>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let lost = match events.recv().await {
            Ok(BackendEvent::Restarting {
                job: of,
                id,
                status,
                ..
            }) if of == job => format!("{id} crashed ({status})"),
            Ok(BackendEvent::GaveUp {
                job: of,
                id,
                status,
            }) if of == job => format!("{id} gave up ({status})"),
            Ok(_) | Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        };
        alignments.participant_lost(lost);
    }
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Opens every PS shard for training: restored from the latest checkpoint when there is
    /// one, else as they are (emptied first with `empty`).
    pub(super) async fn restore_or_open_ps(&mut self, empty: bool) -> Result<(), Outcome> {
        if let Some(record) = self.committed.clone() {
            return self.restore_ps(&record).await;
        }
        if let Some(uri) = self.job.spec.start_from.clone() {
            return self.start_from(&uri).await;
        }
        let endpoints = self.endpoints();
        let shards = primus_proto::role_endpoints(&endpoints, Role::Ps);
        let opens = shards
            .iter()
            .map(|shard| checkpoint::open_shard(shard, empty));
        for opened in futures::future::join_all(opens).await {
            opened.map_err(|e| Outcome::failed("ShardOpenFailed", e.to_string()))?;
        }
        Ok(())
    }

    /// Restores every PS shard from `record` and says so in the `Restored` condition.
    pub(super) async fn restore_ps(&mut self, record: &CheckpointRecord) -> Result<(), Outcome> {
        let endpoints = self.endpoints();
        let shards = primus_proto::role_endpoints(&endpoints, Role::Ps);
        let shards: Vec<&Endpoint> = shards.iter().collect();
        let rows = checkpoint::restore_ps(record, &shards)
            .await
            .map_err(|e| Outcome::failed("CheckpointRestoreFailed", e.to_string()))?;
        let message = format!(
            "from checkpoint {} ({}): {} samples trained, {} tasks done, {} in progress; rows restored: {rows}",
            record.id,
            record.uri,
            record.samples(),
            record.succeeded_tasks,
            record.offsets.len()
        );
        tracing::info!(job = self.name, %message, "restored");
        self.writer
            .condition("Restored", true, "FromCheckpoint", message);
        Ok(())
    }

    /// Starts the next checkpoint beside the event loop, unless one is still being taken
    /// or every task is done: then the trainers are finishing, the final snapshot follows,
    /// and a trainer whose streams ended would never align.
    pub(super) async fn on_checkpoint_tick(&mut self) -> ControlFlow<Outcome> {
        if self.checkpoint_in_flight.is_some() {
            return ControlFlow::Continue(());
        }
        let finishing = match self.tasks.queue.counts().await {
            Ok(c) => self.all_planned() && c.pending == 0 && c.running == 0,
            Err(_) => false,
        };
        if !finishing && let Some(coordinator) = self.coordinator() {
            let id = self.next_checkpoint;
            let previous = self.committed.clone();
            let participants = self.participants();
            self.checkpoint_in_flight = Some(tokio::spawn(async move {
                let taken = coordinator.take(id, previous.as_ref(), &participants).await;
                (id, taken)
            }));
            self.next_checkpoint += 1;
        }
        ControlFlow::Continue(())
    }

    /// The coordinator of the Job's `spec.checkpoint` (none without it).
    fn coordinator(&self) -> Option<checkpoint::Coordinator> {
        let target = self.job.spec.checkpoint.as_ref()?;
        let settings = &self.context.settings;
        let limits = &settings.master.checkpoint;
        Some(checkpoint::Coordinator {
            job: self.name.clone(),
            queue: self.tasks.queue.clone(),
            alignments: self.tasks.alignments.clone(),
            recovery: self.recovery.clone(),
            storage: settings.storage.clone(),
            uri: target.uri.clone(),
            full_every: u64::from(target.full_every),
            limits: checkpoint::Limits {
                keep: limits.keep,
                align: Duration::from_millis(limits.align_timeout_ms),
                pause: Duration::from_millis(limits.pause_timeout_ms),
            },
        })
    }

    /// The executors a checkpoint waits for: every data executor and PS shard, and the
    /// trainers still training.
    fn participants(&self) -> checkpoint::Participants {
        let endpoints = self.endpoints();
        let of_role = |role| with_role(&endpoints, role).into_iter().cloned().collect();
        checkpoint::Participants {
            data_executors: of_role(Role::DataExecutor),
            ps: of_role(Role::Ps),
            trainers: with_role(&endpoints, Role::Trainer)
                .into_iter()
                .map(|e| e.id.clone())
                .filter(|id| !self.trainers_done.contains(id))
                .collect(),
        }
    }

    /// Says how checkpoint `id` went in the Job's `Checkpoint` condition (a failed one is
    /// reported and training goes on) and keeps its record once committed.
    pub(super) async fn on_checkpoint_done(
        &mut self,
        id: u64,
        taken: Result<checkpoint::Taken, CheckpointError>,
    ) -> ControlFlow<Outcome> {
        let job = self.name.as_str();
        match taken {
            Ok(taken) => {
                let record = taken.record;
                let kind = if record.chain_start == id {
                    "full".to_owned()
                } else {
                    format!(
                        "incremental, chained to full checkpoint {}",
                        record.chain_start
                    )
                };
                let message = format!(
                    "checkpoint {id} ({kind}) at {}: {} samples trained, {} tasks done, {} in progress; paused {} ms",
                    record.uri,
                    record.samples(),
                    record.succeeded_tasks,
                    record.offsets.len(),
                    taken.paused.as_millis()
                );
                tracing::info!(job, %message, "checkpoint committed");
                self.writer
                    .condition("Checkpoint", true, "Checkpointed", message);
                self.committed = Some(record);
            }
            Err(e) => {
                tracing::warn!(job, checkpoint = id, error = %e, "checkpoint abandoned");
                if let CheckpointError::ParticipantLost { .. } = e {
                    // Kept in the Job's events: the condition shows only the latest attempt.
                    self.writer.event("CheckpointAbandoned", e.to_string());
                }
                let message = format!("checkpoint {id}: {e}");
                self.writer
                    .condition("Checkpoint", false, "CheckpointFailed", message);
            }
        }
        self.writer.write().await;
        ControlFlow::Continue(())
    }

    /// A Job without a checkpoint of its own starts from an earlier Job's (`spec.start_from`):
    /// the PS shards are restored from it and the serving replicas load it.
    async fn start_from(&mut self, uri: &str) -> Result<(), Outcome> {
        let failed = |e: CheckpointError| {
            Outcome::failed("StartFromFailed", format!("spec.start_from {uri}: {e}"))
        };
        let record = checkpoint::read_record(&self.context.settings.storage, uri)
            .await
            .map_err(failed)?;
        let endpoints = self.endpoints();
        let shards = primus_proto::role_endpoints(&endpoints, Role::Ps);
        let shards: Vec<&Endpoint> = shards.iter().collect();
        let rows = checkpoint::restore_ps(&record, &shards)
            .await
            .map_err(failed)?;
        let manifests: Vec<String> = record.ps.values().cloned().collect();
        let mut message = format!(
            "from {uri} (another Job's checkpoint {}, {} samples trained; rows restored: {rows})",
            record.id,
            record.samples()
        );
        if !with_role(&endpoints, Role::Serving).is_empty() {
            self.load_into_replicas(&manifests).await.map_err(|e| {
                Outcome::failed(
                    "StartFromFailed",
                    format!("spec.start_from {uri}: serving replicas: {e}"),
                )
            })?;
            message.push_str("; the serving replicas serve it");
        }
        tracing::info!(job = self.name, %message, "started from an earlier checkpoint");
        self.writer
            .condition("Restored", true, "FromEarlierJob", message);
        Ok(())
    }

    /// Snapshots every PS shard of the finished Job under `uri/final/<shard id>` and writes
    /// the record of `uri/final` (what `spec.start_from` of a later Job reads); returns the
    /// manifest URIs.
    pub(super) async fn final_checkpoint(
        &self,
        uri: &str,
        succeeded_tasks: u64,
    ) -> Result<Vec<String>, String> {
        let endpoints = self.endpoints();
        let folder = format!("{}/final", uri.trim_end_matches('/'));
        let mut record = CheckpointRecord {
            id: self.committed.as_ref().map_or(1, |c| c.id + 1),
            unix_ms: primus_spec::time::unix_ms(),
            uri: folder.clone(),
            ps: Default::default(),
            chain_start: 0,
            trainers: Default::default(),
            offsets: Default::default(),
            stream_positions: Default::default(),
            succeeded_tasks,
        };
        record.chain_start = record.id;
        let mut manifests = Vec::new();
        for shard in with_role(&endpoints, Role::Ps) {
            let target = format!("{folder}/{}", shard.id);
            let mut client = ParameterServerClient::connect(format!("http://{}", shard.grpc_addr))
                .await
                .map_err(|e| format!("{}: {e}", shard.id))?;
            let response = client
                .snapshot(SnapshotRequest {
                    uri: target,
                    base_manifest_uri: String::new(),
                    in_background: false,
                })
                .await
                .map_err(|status| format!("{}: {}", shard.id, status.message()))?;
            let manifest = response.into_inner().manifest_uri;
            record.ps.insert(shard.id.clone(), manifest.clone());
            manifests.push(manifest);
        }
        let json = serde_json::to_string_pretty(&record).map_err(|e| e.to_string())?;
        checkpoint::write_record(&self.context.settings.storage, &folder, &json)
            .await
            .map_err(|e| e.to_string())?;
        Ok(manifests)
    }
}
