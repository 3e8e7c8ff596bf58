//! The master's part of a simulated Job under the Primus and DLRover-RM policies: the
//! master's own policies (`primus-job-policy`, the code its status tick runs) decide on a
//! [`Snapshot`] built from the Job's true state, and the engine carries out the
//! [`Action`]s they return on the simulated Job.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use primus_job_policy::snapshot::ShardMemory;
use primus_job_policy::{ExecutorRole, ExecutorUsage, Policies, Snapshot};
use primus_proto::v1::Endpoint;
use primus_resource_model::{Allocation, JobShape};
use primus_spec::job::{AllocationPolicy, JobSpec};
use primus_spec::status::Progress;
use primus_spec::{Resource, parse_documents};
use tokio::time::Instant;

use crate::policy::Policy;
use crate::trace::Request;

/// Bytes in a GiB.
pub(crate) const GIB: f64 = (1u64 << 30) as f64;
/// The simulated Jobs' `scaling.max_trainers` and `scaling.max_ps`.
const MAX_TRAINERS: u32 = 32;
const MAX_PS: u32 = 16;

/// The example Job, whose spec every simulated Job's starts from.
const EXAMPLE: &str = include_str!("../../../examples/criteo-like.yaml");

/// The example Job's spec: the template of a simulated Job's.
pub(crate) fn template() -> Option<JobSpec> {
    let resources = parse_documents("examples/criteo-like.yaml", EXAMPLE).ok()?;
    resources.into_iter().find_map(|r| match r {
        Resource::Job(job) => Some(job.spec),
        _ => None,
    })
}

/// What the master keeps of one simulated Job.
pub(crate) struct Managed {
    pub(crate) spec: JobSpec,
    pub(crate) policies: Policies,
    /// Memory executors were given beyond their role's, by id.
    pub(crate) memory_given: HashMap<String, u64>,
    /// Whether a PS shard reached its memory and refused new keys.
    pub(crate) refused_keys: bool,
}

/// A simulated Job's state as a status tick sees it.
pub(crate) struct Observed {
    pub(crate) now: Instant,
    pub(crate) allocation: Allocation,
    /// Memory a trainer uses, GiB.
    pub(crate) trainer_gib: f64,
    /// Memory a PS shard's tables would use without a limit, GiB.
    pub(crate) ps_gib: f64,
    /// Cores a trainer keeps busy.
    pub(crate) trainer_busy_cores: f64,
    pub(crate) samples_trained: f64,
    pub(crate) samples: f64,
    /// The trainers' samples per second as they reported it.
    pub(crate) samples_per_second: f64,
    /// `scaling.memory.horizon_seconds` in status ticks.
    pub(crate) horizon_samples: u32,
}

impl Managed {
    /// The master's state for a Job asking for `request` under `policy`, its executors
    /// serving from `started`.
    pub(crate) fn new(
        template: &JobSpec,
        request: &Request,
        policy: Policy,
        shape: JobShape,
        started: Instant,
    ) -> Self {
        let mut spec = template.clone();
        let a = &request.allocation;
        let topology = &mut spec.topology;
        topology.trainers.replicas = a.trainers;
        topology.trainers.cpu = a.trainer_cpu;
        topology.trainers.memory = bytes(request.trainer_gib).to_string();
        topology.ps.replicas = a.ps;
        topology.ps.cpu = a.ps_cpu;
        topology.ps.memory = bytes(request.ps_gib).to_string();
        let scaling = &mut spec.scaling;
        // No data executor is simulated: the autoscaler and the straggler policy see none.
        scaling.enabled = false;
        scaling.policy = match policy {
            Policy::DlroverRm => AllocationPolicy::Auto,
            _ => AllocationPolicy::Static,
        };
        scaling.max_trainers = MAX_TRAINERS;
        scaling.max_ps = MAX_PS;
        Self {
            spec,
            policies: Policies::new(shape, started),
            memory_given: HashMap::new(),
            refused_keys: false,
        }
    }

    /// Memory executor `id` of `role` holds, GiB: what it was given, else its role's.
    pub(crate) fn allotted_gib(&self, request: &Request, role: ExecutorRole, id: &str) -> f64 {
        match self.memory_given.get(id) {
            Some(given) => *given as f64 / GIB,
            None if role == ExecutorRole::Ps => request.ps_gib,
            None => request.trainer_gib,
        }
    }

    /// Memory every process of `request` holds, GiB.
    pub(crate) fn held_gib(&self, request: &Request) -> f64 {
        let a = &request.allocation;
        (ids(ExecutorRole::Trainer, a.trainers).iter())
            .map(|id| self.allotted_gib(request, ExecutorRole::Trainer, id))
            .chain(
                (ids(ExecutorRole::Ps, a.ps).iter())
                    .map(|id| self.allotted_gib(request, ExecutorRole::Ps, id)),
            )
            .sum()
    }

    /// The processes of `allocation` run from now on: memory given to ones that stopped
    /// is forgotten.
    pub(crate) fn keep_memory_of(&mut self, allocation: &Allocation) {
        let running: BTreeSet<String> = (ids(ExecutorRole::Trainer, allocation.trainers))
            .into_iter()
            .chain(ids(ExecutorRole::Ps, allocation.ps))
            .collect();
        self.memory_given.retain(|id, _| running.contains(id));
    }

    /// The status tick's snapshot of the Job, as the master would build it; a PS shard
    /// whose tables outgrow its memory holds at its limit and refuses new keys.
    pub(crate) fn observe(&mut self, request: &Request, seen: &Observed) -> Snapshot {
        let a = &seen.allocation;
        let trainers = ids(ExecutorRole::Trainer, a.trainers);
        let shards = ids(ExecutorRole::Ps, a.ps);
        let usage = (trainers.iter())
            .map(|id| ExecutorUsage {
                id: id.clone(),
                cpu_cores: seen.trainer_busy_cores,
                memory_bytes: bytes(seen.trainer_gib),
            })
            .collect();
        let shard_memory = (shards.iter())
            .map(|id| {
                let limit = self.allotted_gib(request, ExecutorRole::Ps, id);
                let refused = seen.ps_gib > limit;
                self.refused_keys |= refused;
                ShardMemory {
                    id: id.clone(),
                    bytes: bytes(seen.ps_gib.min(limit)),
                    refused: u64::from(refused),
                }
            })
            .collect();
        let endpoints = (trainers
            .iter()
            .map(|id| endpoint(ExecutorRole::Trainer, id)))
        .chain(shards.iter().map(|id| endpoint(ExecutorRole::Ps, id)))
        .collect();
        Snapshot {
            now: seen.now,
            spec: self.spec.clone(),
            pending_tasks: 0,
            endpoints,
            usage,
            buffer_fill: HashMap::new(),
            held: None,
            shard_memory: Some(shard_memory),
            memory_given: self.memory_given.clone(),
            horizon_samples: seen.horizon_samples,
            trainers_done: BTreeSet::new(),
            progress: Some(Progress {
                samples: seen.samples_trained as u64,
                fraction: Some((seen.samples_trained / seen.samples).clamp(0.0, 1.0)),
                samples_per_second: seen.samples_per_second,
                ..Progress::default()
            }),
        }
    }

    /// An executor started: the optimizer prices a plan's start by how long that took.
    pub(crate) fn started_in(&mut self, seconds: f64) {
        (self.policies.optimizer).started_in(Duration::from_secs_f64(seconds));
    }
}

/// The ids of `count` executors of `role`.
pub(crate) fn ids(role: ExecutorRole, count: u32) -> Vec<String> {
    (0..count)
        .map(|i| format!("{}-{i}", role.as_str()))
        .collect()
}

/// The endpoint of executor `id`, as the topology lists it.
pub(crate) fn endpoint(role: ExecutorRole, id: &str) -> Endpoint {
    Endpoint {
        role: role.proto() as i32,
        id: id.to_owned(),
        grpc_addr: String::new(),
    }
}

/// `gib` in bytes.
pub(crate) fn bytes(gib: f64) -> u64 {
    (gib.max(0.0) * GIB) as u64
}

#[cfg(test)]
mod tests {
    use primus_job_policy::{Action, Capacity, ClusterPlans, Market};

    use super::*;

    fn request(ps_gib: f64) -> Request {
        Request {
            allocation: Allocation {
                trainers: 2,
                ps: 2,
                trainer_cpu: 4.0,
                ps_cpu: 4.0,
            },
            ps_gib,
            trainer_gib: 8.0,
        }
    }

    /// Ticks of a Job whose PS shards' tables grow 0.25 GiB a tick, under `policy`: what
    /// the master's policies decide at each, and whether the shards refused keys.
    fn grow(policy: Policy, ticks: u32) -> (Vec<Vec<Action>>, bool) {
        let template = template().expect("the example Job");
        let request = request(8.0);
        let shape = JobShape {
            batch: 512.0,
            model_bytes: 1e6,
            embedding_width: 64.0,
            bandwidth: 1.25e9,
        };
        let start = Instant::now();
        let mut managed = Managed::new(&template, &request, policy, shape, start);
        let (ledger, capacity) = (
            ClusterPlans::default(),
            Capacity {
                cpu: Some(64.0),
                memory_bytes: None,
                rho: 1.0,
            },
        );
        let decided = (1..=ticks)
            .map(|tick| {
                let seen = Observed {
                    now: start + Duration::from_secs(u64::from(tick) * 60),
                    allocation: request.allocation,
                    trainer_gib: 4.0,
                    ps_gib: 1.0 + 0.25 * f64::from(tick),
                    trainer_busy_cores: 2.0,
                    samples_trained: 1e6 * f64::from(tick),
                    samples: 1e9,
                    samples_per_second: 10_000.0,
                    horizon_samples: 1,
                };
                let snapshot = managed.observe(&request, &seen);
                managed.policies.record(&snapshot);
                let market = Market {
                    job: "job-0",
                    cluster: &ledger,
                    capacity: &capacity,
                };
                managed.policies.decide(&snapshot, &market)
            })
            .collect();
        (decided, managed.refused_keys)
    }

    #[test]
    fn the_masters_memory_policy_raises_a_growing_shard_before_it_refuses_keys() {
        let (decided, refused) = grow(Policy::Primus, 28);
        let first = decided.iter().position(|actions| {
            actions
                .iter()
                .any(|a| matches!(a, Action::RaiseShardMemory { id, .. } if id == "ps-0"))
        });
        // Ten samples first (`scaling.memory.samples`), and then once the forecast with the
        // 10% margin crosses 8 GiB.
        let first = first.expect("ps-0 given more memory");
        assert!((20..27).contains(&first), "raised at tick {}", first + 1);
        assert!(
            !refused,
            "the shards grow to 8 GiB of 8 GiB within 28 ticks"
        );
        let (_, refused) = grow(Policy::Primus, 40);
        assert!(
            refused,
            "without the raises carried out, the shards outgrow 8 GiB"
        );
    }

    #[test]
    fn only_an_auto_job_is_moved_by_the_optimizer() {
        let moved = |policy| {
            let (decided, _) = grow(policy, 30);
            decided
                .iter()
                .flatten()
                .any(|a| matches!(a, Action::Move { .. }))
        };
        assert!(!moved(Policy::Primus));
        assert!(
            moved(Policy::DlroverRm),
            "an auto Job explores a second allocation"
        );
    }
}
