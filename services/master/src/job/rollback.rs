//! `spec.checkpoint.on_ps_failure: rollback` (a crashed PS shard) and `on_worker_failure:
//! rollback` (a crashed data executor or trainer), and under either worker policy a crashed
//! trainer of a Job with a hot set (`recovery.rs`), return the whole Job to its latest
//! checkpoint, so no Parquet row's update is lost or applied twice. The data
//! executors and trainers are killed (nothing they would still send or push counts), their
//! tasks go back to the queue at the checkpoint's offsets, every PS shard is restored from
//! the checkpoint (emptied without one), the trainers' totals return to the checkpoint's,
//! and the same data executors and trainers start again.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::Duration;

use primus_proto::v1::Role;

use super::checkpoints::rollback_queue;
use super::executors::{start_executor, wait_serving, with_role};
use super::{JobRun, Outcome};
use primus_backend::{ExecutorRole, ResourceBackend};
use primus_data_tasks::plan::Catalog;

/// The roles a rollback stops and starts again, in start order.
const WORKERS: [ExecutorRole; 2] = [ExecutorRole::DataExecutor, ExecutorRole::Trainer];

/// How long reports a killed trainer sent just before may still take to arrive.
const REPORTS_IN_FLIGHT: Duration = Duration::from_millis(300);

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Rolls the Job back to its latest checkpoint after `crash` (`ps-0 crashed`), and
    /// says so in the `RolledBack` condition and the Job's events.
    pub(super) async fn roll_back(&mut self, crash: &str) -> ControlFlow<Outcome> {
        let failed = |message: String| {
            ControlFlow::Break(Outcome::failed(
                "RollbackFailed",
                format!("rolling back after {crash}: {message}"),
            ))
        };
        // It cannot commit with a shard gone, and must not pause executors being killed.
        if let Some(checkpoint) = self.checkpoint_in_flight.take() {
            checkpoint.abort();
        }
        // What the trainers trained, from their data executors while they still run.
        let endpoints = self.endpoints();
        let trainers: Vec<String> = (with_role(&endpoints, Role::Trainer).into_iter())
            .map(|e| e.id.clone())
            .collect();
        let executors: Vec<_> = (with_role(&endpoints, Role::DataExecutor).into_iter())
            .cloned()
            .collect();
        (self.tasks.trainer_totals)
            .raise_to_confirmed(&self.name, &trainers, &executors)
            .await;
        let stopped = match self.kill_workers().await {
            Ok(stopped) => stopped,
            Err(message) => return failed(message),
        };
        let trained = self.tasks.trainer_totals.sum();
        let record = match rollback_queue(&self.name, &self.tasks.queue).await {
            Ok(record) => record,
            Err(e) => return failed(e.to_string()),
        };
        self.tasks.trainer_totals.reset(
            record
                .as_ref()
                .map_or_else(BTreeMap::new, |r| r.trainers.clone()),
        );
        if let Some(record) = &record {
            self.next_checkpoint = self.next_checkpoint.max(record.id + 1);
        }
        self.committed = record;
        if let Err(outcome) = self.restore_or_open_ps(true).await {
            return ControlFlow::Break(outcome);
        }
        self.recovery.restored();
        self.drop_stale_trainer_reports().await;
        if let Err(message) = self.restart_workers(&stopped).await {
            return failed(message);
        }
        let (restored, at_checkpoint) = match &self.committed {
            Some(r) => (format!("checkpoint {} ({})", r.id, r.uri), r.totals()),
            None => (
                "the start (no checkpoint committed yet)".to_owned(),
                Default::default(),
            ),
        };
        let retrained = trained.samples.saturating_sub(at_checkpoint.samples);
        self.retrained_samples += retrained;
        for (source, samples) in trained.sources_since(&at_checkpoint) {
            *self.retrained_sources.entry(source).or_default() += samples;
        }
        let message = format!(
            "{crash}: the Job returned to {restored}; {retrained} samples trained since are trained again, {} in all",
            self.retrained_samples
        );
        tracing::warn!(job = self.name, %message, "rolled back");
        self.writer.event("RolledBack", message.clone());
        let reason = match self.committed {
            Some(_) => "ToCheckpoint",
            None => "ToStart",
        };
        self.writer.condition("RolledBack", true, reason, message);
        self.writer.write().await;
        ControlFlow::Continue(())
    }

    /// Kills every data executor and trainer (out of the topology first) and takes the
    /// data executors' tasks back; returns what ran, as (role, index).
    async fn kill_workers(&mut self) -> Result<Vec<(ExecutorRole, u32)>, String> {
        let mut stopped = Vec::new();
        for role in WORKERS {
            for (index, id) in self.members(role) {
                self.context.topologies.remove(&self.name, &id);
                self.context
                    .backend
                    .kill(&self.name, &id)
                    .await
                    .map_err(|e| format!("stopping {id}: {e}"))?;
                if role == ExecutorRole::DataExecutor {
                    self.tasks
                        .queue
                        .release_executor(&id)
                        .await
                        .map_err(|e| format!("taking back the tasks of {id}: {e}"))?;
                }
                stopped.push((role, index));
            }
        }
        Ok(stopped)
    }

    /// Drops the reports the killed trainers sent before they died: their totals are past
    /// the checkpoint the trainers start again from.
    async fn drop_stale_trainer_reports(&mut self) {
        tokio::time::sleep(REPORTS_IN_FLIGHT).await;
        while let Ok(report) = self.reports.try_recv() {
            let from_trainer = report
                .endpoint
                .as_ref()
                .is_some_and(|e| e.role == Role::Trainer as i32);
            if !from_trainer {
                self.fold.add(report);
            }
        }
    }

    /// Starts `stopped` again under the same ids and waits until each serves.
    async fn restart_workers(&mut self, stopped: &[(ExecutorRole, u32)]) -> Result<(), String> {
        for role in WORKERS {
            for &(_, index) in stopped.iter().filter(|(r, _)| *r == role) {
                let parts = self.job.parts(&self.name, &self.memory_given);
                let endpoint = start_executor(self.context, &parts, role, index)
                    .await
                    .map_err(|e| format!("starting {} {index}: {e}", role.as_str()))?;
                self.trainers_done.remove(&endpoint.id);
                wait_serving(&endpoint).await?;
            }
        }
        Ok(())
    }
}
