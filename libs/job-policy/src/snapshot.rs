//! What one status tick sees of a running Job: its executors, their measured use, the
//! data executors' buffers, the task queue, the PS shards' memory and the memory each
//! executor was given. The master builds it from its backend, Redis and the executors (the
//! simulator from its model of a cluster); every policy decides on it alone, so a policy
//! is tested by building a snapshot, with no backend, Redis or executor.

use std::collections::{BTreeSet, HashMap};

use primus_proto::v1::Endpoint;
use primus_resource_model::Allocation;
use primus_spec::job::JobSpec;
use primus_spec::status::Progress;
use tokio::time::Instant;

use crate::executors::{ExecutorRole, ExecutorUsage, role_spec};

/// One status tick's view of a Job.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub now: Instant,
    /// The spec as it applies now (replicas and scaling change while the Job runs).
    pub spec: JobSpec,
    /// Data tasks waiting in the queue.
    pub pending_tasks: u64,
    /// Every executor in the Job's topology.
    pub endpoints: Vec<Endpoint>,
    /// CPU and resident memory the backend measured per executor.
    pub usage: Vec<ExecutorUsage>,
    /// The data executors' last reported buffer fill, by id.
    pub buffer_fill: HashMap<String, f64>,
    /// The tasks held now; None when the queue could not be read.
    pub held: Option<HeldTasks>,
    /// The PS shards' answers about their memory, asked at an earlier tick; None while
    /// some are still on their way.
    pub shard_memory: Option<Vec<ShardMemory>>,
    /// Memory executors were given beyond their role's, by id.
    pub memory_given: HashMap<String, u64>,
    /// `scaling.memory.horizon_seconds` in status intervals.
    pub horizon_samples: u32,
    /// Trainers that finished (their data ended).
    pub trainers_done: BTreeSet<String>,
    /// The Job's progress as last written.
    pub progress: Option<Progress>,
}

/// The running tasks of the queue: task -> executor, and task -> rows served.
#[derive(Debug, Clone, Default)]
pub struct HeldTasks {
    pub running: HashMap<String, String>,
    pub offsets: HashMap<String, u64>,
}

/// What a PS shard answered about its memory.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardMemory {
    pub id: String,
    pub bytes: u64,
    /// Gradients of new keys it refused at its limit, so far.
    pub refused: u64,
}

impl Snapshot {
    /// The executors of `role`: (index, id), by index.
    pub fn members(&self, role: ExecutorRole) -> Vec<(u32, String)> {
        members_of(&self.endpoints, role)
    }

    /// The trainers still training and the PS shards running now, with their cores; None
    /// while either role has none.
    pub fn allocation(&self) -> Option<Allocation> {
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
    pub fn samples_per_second(&self) -> f64 {
        self.progress.as_ref().map_or(0.0, |p| p.samples_per_second)
    }

    /// The memory `endpoint` is allotted now: what it was given, else its role's
    /// `topology.<role>.memory`.
    pub fn allotted(&self, endpoint: &Endpoint) -> Option<u64> {
        allotted(&self.spec, &self.memory_given, endpoint)
    }
}

/// The executors of `role` among `endpoints`: (index, id), by index.
pub fn members_of(endpoints: &[Endpoint], role: ExecutorRole) -> Vec<(u32, String)> {
    let mut members: Vec<(u32, String)> = (endpoints.iter())
        .filter(|e| e.role == role.proto() as i32)
        .filter_map(|e| Some((index_of(&e.id)?, e.id.clone())))
        .collect();
    members.sort();
    members
}

/// The memory `endpoint` is allotted: `given`, else its role's `topology.<role>.memory`.
pub fn allotted(spec: &JobSpec, given: &HashMap<String, u64>, endpoint: &Endpoint) -> Option<u64> {
    if let Some(memory) = given.get(&endpoint.id) {
        return Some(*memory);
    }
    let spec = role_spec(spec, role_of(endpoint)?)?;
    primus_spec::job::parse_memory(&spec.memory).ok()
}

/// The role of an executor the topology lists.
pub fn role_of(endpoint: &Endpoint) -> Option<ExecutorRole> {
    ExecutorRole::ALL
        .into_iter()
        .find(|role| role.proto() as i32 == endpoint.role)
}

/// The index in an executor id `<role>-<index>`.
pub fn index_of(id: &str) -> Option<u32> {
    id.rsplit_once('-')?.1.parse().ok()
}

/// Snapshots for the policies' tests.
#[cfg(test)]
pub mod fixture {
    use super::*;
    use primus_spec::{Resource, parse_documents};

    const EXAMPLE: &str = include_str!("../../../examples/criteo-like.yaml");

    /// The example Job's spec.
    pub fn spec() -> JobSpec {
        parse_documents("criteo-like.yaml", EXAMPLE)
            .expect("the example parses")
            .into_iter()
            .find_map(|r| match r {
                Resource::Job(job) => Some(job.spec),
                _ => None,
            })
            .expect("the example has a Job")
    }

    pub fn endpoint(id: &str) -> Endpoint {
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
    pub fn snapshot(spec: JobSpec, ids: &[&str], now: Instant) -> Snapshot {
        Snapshot {
            now,
            spec,
            pending_tasks: 0,
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

    pub fn used(id: &str, cpu_cores: f64, memory_bytes: u64) -> ExecutorUsage {
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
