//! DLRover-RM's auto-scaling of a running `policy: auto` Job (§4.3, stage 2). Every status
//! tick the Job tells the cluster what it holds; once the cooldown has passed it takes
//! primus-resource-model's step ([`autoscale::step`], the code the cluster simulator runs
//! too) over what it measured per allocation ([`crate::performance`]): an exploratory step, a
//! right-sized plan (taken at once: it frees cores), or plans offered to the cluster-level
//! weighted greedy selection ([`crate::market::ClusterPlans`]), of which it takes the one
//! it is given where the cluster's memory has room. Trainers and PS shards are searched
//! with cores per process as the spec gives them (the backends do not resize a process's
//! cores); a plan's start overhead is the time this Job's executors took to serve.
//!
//! The master applies a plan through the elastic mechanics: trainers one at a time, PS
//! shards by a live resharding. Each step is an `Optimized` event and the `ResourcePlan`
//! condition says the last one.

use std::time::Duration;

use primus_resource_model::Allocation;
use primus_resource_model::autoscale::{self, JobState, MOST_STEPS, Step};
use primus_resource_model::plans::{Plan, PlanSpace};
use primus_spec::job::{AllocationPolicy, JobSpec, parse_memory};
use tokio::time::Instant;

use crate::ExecutorRole;
use crate::actions::Action;
use crate::market::{Capacity, ClusterPlans};
use crate::performance::PerformanceLog;
use crate::snapshot::Snapshot;

/// Seconds a new executor took to serve, before one was measured.
const FIRST_START_SECONDS: f64 = 5.0;

/// One Job's optimizer state.
pub struct Optimizer {
    last_action: Instant,
    /// Plans applied (explorations included).
    steps: u32,
    /// Exploratory steps among them.
    explorations: u32,
    /// Seconds a started executor took to serve, smoothed.
    start_seconds: f64,
}

/// Where a Job offers what it holds and its plans: the master's ledger of the cluster.
pub struct Market<'a> {
    pub job: &'a str,
    pub cluster: &'a ClusterPlans,
    pub capacity: &'a Capacity,
}

impl Optimizer {
    pub fn new(started: Instant) -> Self {
        Self {
            last_action: started,
            steps: 0,
            explorations: 0,
            start_seconds: FIRST_START_SECONDS,
        }
    }

    /// An executor took `took` from its start to serving.
    pub fn started_in(&mut self, took: Duration) {
        self.start_seconds = 0.5 * self.start_seconds + 0.5 * took.as_secs_f64();
    }

    /// A move ended at `now`: the cooldown counts from there.
    pub fn moved(&mut self, now: Instant) {
        self.steps += 1;
        self.last_action = now;
    }

    /// Offers what the Job holds and its plans to the market; the move it takes, if any.
    pub fn decide(
        &mut self,
        snapshot: &Snapshot,
        performance: &PerformanceLog,
        market: &Market<'_>,
    ) -> Vec<Action> {
        let spec = &snapshot.spec;
        if spec.scaling.policy != AllocationPolicy::Auto {
            return Vec::new();
        }
        let (cores, memory) = held(snapshot);
        let (cluster, capacity) = (market.cluster, market.capacity);
        cluster.offer(market.job, cores, memory, None);
        let cooldown = Duration::from_secs(spec.scaling.cooldown_seconds);
        let cooling = snapshot.now < self.last_action + cooldown;
        let Some(current) = snapshot.allocation() else {
            return Vec::new();
        };
        if cooling {
            return Vec::new();
        }
        let state = JobState {
            current,
            model: performance.fitted(),
            measurements: &performance.measurements,
            space: self.plan_space(spec, current),
            remaining_samples: remaining_samples(snapshot),
            free_cores: cluster.choose(market.job, capacity).free_cores,
            steps: self.steps,
            explorations: self.explorations,
            seed: u64::from(self.steps) + 1,
        };
        let explored = performance.measurements.allocations();
        let (target, why) = match autoscale::step(&state) {
            Step::Stay => return Vec::new(),
            Step::Explore(target) => {
                self.explorations += 1;
                let why = match explored {
                    1 => "exploring: the model needs iteration times under a second allocation",
                    _ => {
                        "exploring: no plan is worth a move, and this neighbour is not measured yet"
                    }
                };
                (target, why.to_owned())
            }
            Step::RightSize(plan) => (
                plan.allocation,
                format!(
                    "right-sizing: {} cores predicted to keep {:.0} samples/s",
                    plan.cores, plan.throughput
                ),
            ),
            Step::Offer(plans) => {
                cluster.offer(market.job, cores, memory, Some(plans.clone()));
                let choice = cluster.choose(market.job, capacity);
                let Some(plan) = choice.plan.map(|k| plans.plans[k]) else {
                    return Vec::new();
                };
                let added =
                    memory_of(spec, &plan.allocation).saturating_sub(memory_of(spec, &current));
                if choice.free_memory_bytes.is_some_and(|free| added > free) {
                    return Vec::new();
                }
                (
                    plan.allocation,
                    selected(&plan, choice.competing, capacity.rho),
                )
            }
        };
        let message = format!(
            "step {} of at most {MOST_STEPS}: trainers {} -> {}, PS shards {} -> {} ({why})",
            self.steps + 1,
            current.trainers,
            target.trainers,
            current.ps,
            target.ps
        );
        vec![Action::Move {
            current,
            target,
            message,
        }]
    }

    /// Trainers and PS shards within the spec's bounds, cores per process as they are.
    fn plan_space(&self, spec: &JobSpec, current: Allocation) -> PlanSpace {
        let scaling = &spec.scaling;
        PlanSpace::counts_only(
            &current,
            scaling.max_trainers,
            scaling.max_ps,
            self.start_seconds,
        )
    }
}

/// Samples the Job has left (None for an open-ended one).
fn remaining_samples(snapshot: &Snapshot) -> Option<f64> {
    let progress = snapshot.progress.as_ref()?;
    let fraction = progress.fraction.filter(|f| *f > 0.0 && *f < 1.0)?;
    Some(progress.samples as f64 * (1.0 - fraction) / fraction)
}

/// Cores and memory bytes the Job's executors hold, by the spec's per-role figures.
fn held(snapshot: &Snapshot) -> (f64, u64) {
    let topology = &snapshot.spec.topology;
    let roles = [
        (ExecutorRole::DataExecutor, &topology.data_executors),
        (ExecutorRole::Trainer, &topology.trainers),
        (ExecutorRole::Ps, &topology.ps),
    ];
    roles
        .iter()
        .fold((0.0, 0), |(cores, memory), (role, spec)| {
            let n = snapshot.members(*role).len();
            let bytes = parse_memory(&spec.memory).unwrap_or(0);
            (cores + n as f64 * spec.cpu, memory + n as u64 * bytes)
        })
}

/// Memory bytes of `a`'s trainers and PS shards.
fn memory_of(spec: &JobSpec, a: &Allocation) -> u64 {
    let topology = &spec.topology;
    let bytes = |memory: &str| parse_memory(memory).unwrap_or(0);
    u64::from(a.trainers) * bytes(&topology.trainers.memory)
        + u64::from(a.ps) * bytes(&topology.ps.memory)
}

/// Why a plan the selection gave the Job was taken.
fn selected(plan: &Plan, competing: usize, rho: f64) -> String {
    format!(
        "selected among {competing} Jobs' plans (rho {rho}): {:.0} samples/s predicted, +{:.0}, for {} cores",
        plan.throughput, plan.gain, plan.cores
    )
}

#[cfg(test)]
mod tests {
    use primus_resource_model::JobShape;

    use super::*;
    use crate::snapshot::fixture;

    const IDS: [&str; 4] = ["data_executor-0", "trainer-0", "ps-0", "ps-1"];

    /// The example Job as `policy: auto`, at `now`.
    fn auto_job(now: Instant) -> Snapshot {
        let mut spec = fixture::spec();
        spec.scaling.policy = AllocationPolicy::Auto;
        fixture::snapshot(spec, &IDS, now)
    }

    /// Iteration times measured under `allocation` only.
    fn measured_under(allocation: Allocation) -> PerformanceLog {
        let mut performance = PerformanceLog::of(JobShape {
            batch: 256.0,
            model_bytes: 1.0e6,
            embedding_width: 16.0,
            bandwidth: 1.25e9,
        });
        let start = Instant::now();
        for n in 0..30 {
            let at = start + Duration::from_secs(n);
            performance.record(allocation, 1_000.0, at);
        }
        performance
    }

    #[test]
    fn an_auto_job_measured_under_one_allocation_explores_once_its_cooldown_is_over() {
        let now = Instant::now() + Duration::from_secs(120);
        let snapshot = auto_job(now);
        let current = snapshot.allocation().expect("trainers and PS shards run");
        let performance = measured_under(current);
        let cluster = ClusterPlans::default();
        let capacity = Capacity {
            cpu: Some(16.0),
            memory_bytes: None,
            rho: 1.0,
        };
        let market = Market {
            job: "j",
            cluster: &cluster,
            capacity: &capacity,
        };
        let mut cooling = Optimizer::new(now - Duration::from_secs(10));
        assert_eq!(cooling.decide(&snapshot, &performance, &market), vec![]);
        // What the Job holds is offered even while it cools down: 1 + 1 + 2 x 0.5 cores.
        assert_eq!(cluster.choose("j", &capacity).free_cores, 13.0);

        let mut optimizer = Optimizer::new(now - Duration::from_secs(60));
        let moved = optimizer.decide(&snapshot, &performance, &market);
        let [
            Action::Move {
                current: from,
                target,
                message,
            },
        ] = moved.as_slice()
        else {
            panic!("a move: {moved:?}");
        };
        assert_eq!(*from, current);
        assert_ne!(*target, current);
        assert!(message.starts_with("step 1 of at most"), "{message}");
        assert!(message.contains("exploring"), "{message}");

        let mut manual = snapshot.clone();
        manual.spec.scaling.policy = AllocationPolicy::Static;
        let idle = ClusterPlans::default();
        let market = Market {
            cluster: &idle,
            ..market
        };
        assert_eq!(optimizer.decide(&manual, &performance, &market), vec![]);
        assert_eq!(idle.choose("j", &capacity).competing, 0, "nothing offered");
    }
}
