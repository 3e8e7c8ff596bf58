//! Observing a running Job: [`JobRun::observe`] builds one status tick's [`Snapshot`] from
//! the backend's measurements, the metrics reports, the task queue and the PS shards'
//! answers (asked in the background, so a shard that does not answer never holds up the
//! Job's loop).

use primus_job_policy::Snapshot;
use primus_job_policy::snapshot::{HeldTasks, ShardMemory};
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{Endpoint, Role, StatsRequest};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::JobRun;
use super::executors::{ANSWER_DEADLINE, with_role};
use primus_backend::ResourceBackend;
use primus_data_tasks::plan::Catalog;
use primus_data_tasks::queue::QueueCounts;

/// The PS shards' memory answers, asked in the background: a shard that does not answer
/// never holds up the Job's loop; the answers are taken at the next tick that finds them
/// all in.
#[derive(Debug, Default)]
pub(crate) struct ShardMemoryProbe {
    asking: Option<JoinHandle<Vec<ShardMemory>>>,
}

impl ShardMemoryProbe {
    /// The answers asked at an earlier tick, once all are in (None while some are still
    /// awaited, and at the first tick); asks `shards` again whenever it takes answers.
    async fn answers(&mut self, shards: Vec<Endpoint>) -> Option<Vec<ShardMemory>> {
        if self
            .asking
            .as_ref()
            .is_some_and(|asking| !asking.is_finished())
        {
            return None;
        }
        let answered = match self.asking.take() {
            Some(asking) => Some(asking.await.unwrap_or_default()),
            None => None,
        };
        self.asking = Some(tokio::spawn(async move {
            let asked = shards.iter().map(|shard| async move {
                let (bytes, refused) = held(&shard.grpc_addr).await?;
                Some(ShardMemory {
                    id: shard.id.clone(),
                    bytes,
                    refused,
                })
            });
            futures::future::join_all(asked)
                .await
                .into_iter()
                .flatten()
                .collect()
        }));
        answered
    }
}

impl Drop for ShardMemoryProbe {
    fn drop(&mut self) {
        if let Some(asking) = &self.asking {
            asking.abort();
        }
    }
}

/// The bytes a PS shard holds and the gradients it refused at its limit; None when it
/// does not answer within [`ANSWER_DEADLINE`].
async fn held(addr: &str) -> Option<(u64, u64)> {
    let asked = async {
        let mut client = ParameterServerClient::connect(format!("http://{addr}"))
            .await
            .ok()?;
        client.stats(StatsRequest {}).await.ok()
    };
    let stats = tokio::time::timeout(ANSWER_DEADLINE, asked)
        .await
        .ok()??
        .into_inner();
    let refused = stats.tables.iter().map(|t| t.refused).sum();
    Some((stats.memory_bytes, refused))
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Builds this tick's snapshot; the usage measured goes into the Metric resource.
    pub(super) async fn observe(&mut self, counts: QueueCounts) -> Snapshot {
        let usage = self.context.backend.usage(&self.name).await;
        let endpoints = self.endpoints();
        for used in &usage {
            if let Some(endpoint) = endpoints.iter().find(|e| e.id == used.id) {
                self.fold
                    .add_usage(endpoint.clone(), used.cpu_cores, used.memory_bytes);
            }
        }
        let buffer_fill = with_role(&endpoints, Role::DataExecutor)
            .into_iter()
            .filter_map(|e| Some((e.id.clone(), self.fold.gauge(&e.id, "buffer_fill")?)))
            .collect();
        let queue = &self.tasks.queue;
        let held = match (queue.running().await, queue.offsets().await) {
            (Ok(running), Ok(offsets)) => Some(HeldTasks { running, offsets }),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(job = self.name, error = %e, "reading the task queue");
                None
            }
        };
        let shards = primus_proto::role_endpoints(&endpoints, Role::Ps);
        let shard_memory = self.shard_memory.answers(shards).await;
        Snapshot {
            now: Instant::now(),
            spec: self.job.spec.clone(),
            pending_tasks: counts.pending,
            endpoints,
            usage,
            buffer_fill,
            held,
            shard_memory,
            memory_given: self.memory_given.clone(),
            horizon_samples: self.horizon_samples(),
            trainers_done: self.trainers_done.clone(),
            progress: self.writer.status.progress.clone(),
        }
    }

    /// `scaling.memory.horizon_seconds` in status intervals.
    fn horizon_samples(&self) -> u32 {
        let policy = &self.job.spec.scaling.memory;
        let interval = self.context.settings.master.status_interval_ms.max(1);
        (policy.horizon_seconds.saturating_mul(1_000) / interval).clamp(1, u64::from(u32::MAX))
            as u32
    }
}
