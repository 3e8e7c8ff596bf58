//! What one status tick sees of a running Job: its executors, their measured use, the
//! data executors' buffers, the task queue, the PS shards' memory and the memory each
//! executor was given. [`JobRun::observe`] builds it; every policy of the tick decides on
//! it alone ([`super::actions`] applies what they decide), so a policy is tested by
//! building a snapshot, with no backend, Redis or executor.

use std::collections::{BTreeSet, HashMap};

use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{Endpoint, Role, StatsRequest};
use primus_resource_model::Allocation;
use primus_spec::job::JobSpec;
use primus_spec::status::Progress;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::JobRun;
use super::executors::{ANSWER_DEADLINE, role_spec, with_role};
use primus_backend::{ExecutorRole, ExecutorUsage, ResourceBackend};
use primus_data_tasks::plan::Catalog;
use primus_data_tasks::queue::QueueCounts;

/// One status tick's view of a Job.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) now: Instant,
    /// The spec as it applies now (replicas and scaling change while the Job runs).
    pub(crate) spec: JobSpec,
    pub(crate) counts: QueueCounts,
    /// Every executor in the Job's topology.
    pub(crate) endpoints: Vec<Endpoint>,
    /// CPU and resident memory the backend measured per executor.
    pub(crate) usage: Vec<ExecutorUsage>,
    /// The data executors' last reported buffer fill, by id.
    pub(crate) buffer_fill: HashMap<String, f64>,
    /// The tasks held now; None when the queue could not be read.
    pub(crate) held: Option<HeldTasks>,
    /// The PS shards' answers about their memory, asked at an earlier tick; None while
    /// some are still on their way.
    pub(crate) shard_memory: Option<Vec<ShardMemory>>,
    /// Memory executors were given beyond their role's, by id.
    pub(crate) memory_given: HashMap<String, u64>,
    /// `scaling.memory.horizon_seconds` in status intervals.
    pub(crate) horizon_samples: u32,
    /// Trainers that finished (their data ended).
    pub(crate) trainers_done: BTreeSet<String>,
    /// The Job's progress as last written.
    pub(crate) progress: Option<Progress>,
}

/// The running tasks of the queue: task -> executor, and task -> rows served.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeldTasks {
    pub(crate) running: HashMap<String, String>,
    pub(crate) offsets: HashMap<String, u64>,
}

/// What a PS shard answered about its memory.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ShardMemory {
    pub(crate) id: String,
    pub(crate) bytes: u64,
    /// Gradients of new keys it refused at its limit, so far.
    pub(crate) refused: u64,
}

impl Snapshot {
    /// The executors of `role`: (index, id), by index.
    pub(crate) fn members(&self, role: ExecutorRole) -> Vec<(u32, String)> {
        members_of(&self.endpoints, role)
    }

    /// The trainers still training and the PS shards running now, with their cores; None
    /// while either role has none.
    pub(crate) fn allocation(&self) -> Option<Allocation> {
        let trainers = (self.members(ExecutorRole::Trainer).iter())
            .filter(|(_, id)| !self.trainers_done.contains(id))
            .count() as u32;
        let ps = self.members(ExecutorRole::Ps).len() as u32;
        let topology = &self.spec.topology;
        (trainers > 0 && ps > 0).then_some(Allocation {
            trainers,
            ps,
            trainer_cpu: topology.trainers.cpu,
            ps_cpu: topology.ps.cpu,
        })
    }

    /// The trainers' samples per second as last written.
    pub(crate) fn samples_per_second(&self) -> f64 {
        self.progress.as_ref().map_or(0.0, |p| p.samples_per_second)
    }

    /// The memory `endpoint` is allotted now: what it was given, else its role's
    /// `topology.<role>.memory`.
    pub(crate) fn allotted(&self, endpoint: &Endpoint) -> Option<u64> {
        allotted(&self.spec, &self.memory_given, endpoint)
    }
}

/// The executors of `role` among `endpoints`: (index, id), by index.
pub(crate) fn members_of(endpoints: &[Endpoint], role: ExecutorRole) -> Vec<(u32, String)> {
    let mut members: Vec<(u32, String)> = with_role(endpoints, role.proto())
        .into_iter()
        .filter_map(|e| Some((index_of(&e.id)?, e.id.clone())))
        .collect();
    members.sort();
    members
}

/// The memory `endpoint` is allotted: `given`, else its role's `topology.<role>.memory`.
pub(crate) fn allotted(
    spec: &JobSpec,
    given: &HashMap<String, u64>,
    endpoint: &Endpoint,
) -> Option<u64> {
    if let Some(memory) = given.get(&endpoint.id) {
        return Some(*memory);
    }
    let spec = role_spec(spec, role_of(endpoint)?)?;
    primus_spec::job::parse_memory(&spec.memory).ok()
}

/// The role of an executor the topology lists.
pub(crate) fn role_of(endpoint: &Endpoint) -> Option<ExecutorRole> {
    ExecutorRole::ALL
        .into_iter()
        .find(|role| role.proto() as i32 == endpoint.role)
}

/// The index in an executor id `<role>-<index>`.
pub(crate) fn index_of(id: &str) -> Option<u32> {
    id.rsplit_once('-')?.1.parse().ok()
}

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
            counts,
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

/// Snapshots for the policies' tests.
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;
    use primus_spec::{Resource, parse_documents};

    const EXAMPLE: &str = include_str!("../../../../examples/criteo-like.yaml");

    /// The example Job's spec.
    pub(crate) fn spec() -> JobSpec {
        parse_documents("criteo-like.yaml", EXAMPLE)
            .expect("the example parses")
            .into_iter()
            .find_map(|r| match r {
                Resource::Job(job) => Some(job.spec),
                _ => None,
            })
            .expect("the example has a Job")
    }

    pub(crate) fn endpoint(id: &str) -> Endpoint {
        let role = (ExecutorRole::ALL.into_iter())
            .find(|role| id.rsplit_once('-').is_some_and(|(r, _)| r == role.as_str()))
            .expect("an executor id");
        Endpoint {
            role: role.proto() as i32,
            id: id.to_owned(),
            grpc_addr: "127.0.0.1:1".to_owned(),
        }
    }

    /// A Job of `spec` running the executors `ids`, with nothing measured yet.
    pub(crate) fn snapshot(spec: JobSpec, ids: &[&str], now: Instant) -> Snapshot {
        Snapshot {
            now,
            spec,
            counts: QueueCounts::default(),
            endpoints: ids.iter().map(|id| endpoint(id)).collect(),
            usage: Vec::new(),
            buffer_fill: HashMap::new(),
            held: None,
            shard_memory: None,
            memory_given: HashMap::new(),
            horizon_samples: 1,
            trainers_done: BTreeSet::new(),
            progress: None,
        }
    }

    pub(crate) fn used(id: &str, cpu_cores: f64, memory_bytes: u64) -> ExecutorUsage {
        ExecutorUsage {
            id: id.to_owned(),
            cpu_cores,
            memory_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_executor_index_is_read_from_its_id() {
        assert_eq!(index_of("data_executor-12"), Some(12));
        assert_eq!(index_of("trainer-0"), Some(0));
        assert_eq!(index_of("trainer"), None);
    }
}
