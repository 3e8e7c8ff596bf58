//! Resharding a running Job's PS (DLRover-RM's seamless migration). A new
//! `spec.topology.ps.replicas` starts the shards the new count adds, then
//! [`primus_ps_client::reshard`] moves the rows and dense tensors the new layout places
//! elsewhere while the trainers keep training, the topology's PS list switches in one change
//! (a trainer refused by a fenced shard picks the new list up and retries), and the shards
//! the count drops are stopped. No checkpoint runs meanwhile: the Job's event loop handles
//! one event at a time.

use std::time::Duration;

use primus_proto::v1::{Endpoint, Role};
use primus_ps_client::reshard::{ReshardReport, reshard};

use super::JobRun;
use super::executors::{request_executor, wait_serving};
use crate::checkpoint;
use primus_backend::{ExecutorRole, ResourceBackend};
use primus_data_tasks::plan::Catalog;

/// How long leaving shards keep running (refusing) after the switch.
const LEAVING_GRACE: Duration = Duration::from_secs(1);

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Moves the Job's parameters onto `wanted` PS shards; the outcome is a Job event.
    pub(super) async fn reshard_ps(&mut self, wanted: u32) {
        let endpoints = self.endpoints();
        let old = primus_proto::role_endpoints(&endpoints, Role::Ps);
        let event = match self.move_to_shards(&old, wanted).await {
            Ok(report) => (
                "Resharded",
                format!(
                    "ps {} -> {wanted} (spec.topology.ps.replicas is {wanted}): {} rows copied in {} rounds over {} ms, {} dense tensors moved, calls paused at most {} ms, {} rows dropped from the old shards",
                    old.len(),
                    report.rows_copied,
                    report.rounds,
                    report.copying.as_millis(),
                    report.dense_moved,
                    report.fenced.as_millis(),
                    report.rows_dropped
                ),
            ),
            Err(message) => (
                "ReshardFailed",
                format!("ps {} -> {wanted}: {message}", old.len()),
            ),
        };
        tracing::info!(job = self.name, reason = event.0, message = %event.1, "resharding");
        self.writer.event(event.0, event.1);
        self.show_replicas();
    }

    async fn move_to_shards(
        &mut self,
        old: &[Endpoint],
        wanted: u32,
    ) -> Result<ReshardReport, String> {
        if wanted == 0 {
            return Err("a Job needs at least one PS shard".to_owned());
        }
        let mut added = Vec::new();
        let started = self
            .start_shards(old.len() as u32, wanted, &mut added)
            .await;
        let moved = match started {
            Ok(()) => {
                let new: Vec<Endpoint> = old
                    .iter()
                    .take(wanted as usize)
                    .chain(&added)
                    .cloned()
                    .collect();
                let addrs = |shards: &[Endpoint]| -> Vec<String> {
                    shards.iter().map(|e| e.grpc_addr.clone()).collect()
                };
                let (topologies, job) = (self.context.topologies.clone(), self.name.clone());
                let switch = || async move {
                    topologies.replace_role(&job, Role::Ps, new);
                    Ok(())
                };
                let (from, to) = (addrs(old), addrs(&old[..old.len().min(wanted as usize)]));
                let to: Vec<String> = to.into_iter().chain(addrs(&added)).collect();
                reshard(&from, &to, switch).await.map_err(|e| e.to_string())
            }
            Err(message) => Err(message),
        };
        let stopping = match &moved {
            Ok(_) => old.get(wanted as usize..).unwrap_or_default(),
            Err(_) => &added[..],
        };
        if moved.is_ok() && !stopping.is_empty() {
            // Leaving shards refuse everything now; a while longer, so answers in flight
            // reach their callers and most clients learn the new list from a refusal.
            tokio::time::sleep(LEAVING_GRACE).await;
        }
        for shard in stopping {
            if let Err(e) = self.context.backend.release(&self.name, &shard.id).await {
                tracing::warn!(job = self.name, shard = shard.id, error = %e, "stopping a PS shard");
            }
            self.fold.retire(&shard.id);
        }
        moved
    }

    /// Starts shards `first..wanted` (none when shrinking) into `added` and waits until
    /// each serves.
    async fn start_shards(
        &mut self,
        first: u32,
        wanted: u32,
        added: &mut Vec<Endpoint>,
    ) -> Result<(), String> {
        let parts = self.job.parts(&self.name, &self.memory_given);
        for index in first..wanted {
            let shard = request_executor(self.context, &parts, ExecutorRole::Ps, index)
                .await
                .map_err(|e| format!("starting ps {index}: {e}"))?;
            added.push(shard);
        }
        // Open at once: nothing routes training calls to them before the switch, and the
        // rows they get before it are imported ones.
        for shard in added.iter() {
            wait_serving(shard).await?;
            checkpoint::open_shard(shard, false)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}
