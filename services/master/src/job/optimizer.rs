//! DLRover-RM's auto-scaling of a running `policy: auto` Job (§4.3, stage 2). Every status
//! tick the Job tells the cluster what it holds. Once the allocation running now has
//! settled iteration times (`performance.rs`) and the cooldown has passed:
//! - with one allocation seen, the model cannot be fitted yet: one exploratory step (a
//!   trainer more where the cluster has the cores, else one fewer) gives it a second;
//! - with a fitted model, NSGA-II searches trainers and PS shards (cores per process as
//!   the spec gives them: the backends do not resize a process's cores) for the Pareto
//!   front of cost against throughput gain, the start overhead being the measured time
//!   executors took to serve. A plan that keeps 95% of the predicted samples/s with at
//!   most 90% of the cores is taken at once (it frees cores); otherwise the plans gaining
//!   at least 5% go to the cluster-level weighted greedy selection
//!   ([`crate::cluster::ClusterPlans`]) and the Job takes the one it is given.
//!
//! A plan is applied through the elastic mechanics: trainers one at a time
//! ([`super::scaling`]), PS shards by a live resharding ([`super::reshard`]). Each step is
//! an `Optimized` event and the `ResourcePlan` condition says the last one.

use std::time::Duration;

use primus_resource_model::Allocation;
use primus_resource_model::plans::{self, JobPlans, Plan, PlanSpace};
use primus_spec::job::{AllocationPolicy, parse_memory};
use tokio::time::Instant;

use super::JobRun;
use crate::backend::{ExecutorRole, ResourceBackend};
use crate::plan::Catalog;

/// NSGA-II's population and rounds: the space is at most `max_trainers x max_ps` plans.
const POPULATION: usize = 24;
const GENERATIONS: usize = 20;
/// A right-sized plan keeps this share of the predicted samples/s...
const RIGHT_SIZE_KEEPS: f64 = 0.95;
/// ...with at most this share of the cores.
const RIGHT_SIZE_CORES: f64 = 0.9;
/// A scale-up must gain this share of the predicted samples/s to be worth its start.
const WORTH: f64 = 0.05;
/// Seconds a new executor took to serve, before one was measured.
const FIRST_START_SECONDS: f64 = 5.0;

/// One Job's optimizer state.
pub(super) struct Optimizer {
    last_action: Instant,
    /// Plans applied (exploration included).
    pub(super) steps: u32,
    /// Seconds a started executor took to serve, smoothed.
    start_seconds: f64,
}

impl Optimizer {
    pub(super) fn new(started: Instant) -> Self {
        Self {
            last_action: started,
            steps: 0,
            start_seconds: FIRST_START_SECONDS,
        }
    }

    /// An executor took `took` from its start to serving.
    pub(super) fn started_in(&mut self, took: Duration) {
        self.start_seconds = 0.5 * self.start_seconds + 0.5 * took.as_secs_f64();
    }
}

/// What the optimizer does this tick.
enum Move {
    Explore(Allocation),
    RightSize(Plan),
    Selected(Plan, usize),
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Offers what the Job holds and its plans to the cluster, and applies the plan chosen.
    pub(super) async fn optimize(&mut self) {
        if self.job.spec.scaling.policy != AllocationPolicy::Auto {
            return;
        }
        let (cores, memory) = self.held();
        let cluster = self.context.cluster.clone();
        cluster.offer(&self.name, cores, memory, None);
        let cooling = Instant::now()
            < self.optimizer.last_action
                + Duration::from_secs(self.job.spec.scaling.cooldown_seconds);
        let Some(current) = self.allocation() else {
            return;
        };
        if cooling || !self.performance.settled() || self.checkpoint_in_flight.is_some() {
            return;
        }
        let Some(step) = self.next_move(current, cores, memory) else {
            return;
        };
        let (target, why) = match step {
            Move::Explore(target) => (
                target,
                "exploring: the model needs iteration times under a second allocation".to_owned(),
            ),
            Move::RightSize(plan) => (
                plan.allocation,
                format!(
                    "right-sizing: {} cores predicted to keep {:.0} samples/s",
                    plan.cores, plan.throughput
                ),
            ),
            Move::Selected(plan, competing) => (
                plan.allocation,
                format!(
                    "selected among {competing} Jobs' plans (rho {}): {:.0} samples/s predicted, +{:.0}, for {} cores",
                    self.context.capacity.rho, plan.throughput, plan.gain, plan.cores
                ),
            ),
        };
        self.move_to(current, target, &why).await;
    }

    /// Exploration, right-sizing or the cluster's selection; None: the Job stays.
    fn next_move(&mut self, current: Allocation, cores: f64, memory: u64) -> Option<Move> {
        let scaling = &self.job.spec.scaling;
        let cluster = self.context.cluster.clone();
        let capacity = self.context.capacity;
        let Some(model) = self.performance.fitted().copied() else {
            if self.performance.allocations() != 1 {
                return None;
            }
            let free = cluster.choose(&self.name, &capacity).free_cores;
            let more = current.trainers < scaling.max_trainers && free >= current.trainer_cpu;
            let trainers = match more {
                true => current.trainers + 1,
                false if current.trainers > 1 => current.trainers - 1,
                false => return None,
            };
            return Some(Move::Explore(Allocation {
                trainers,
                ..current
            }));
        };
        let predicted = model.throughput(&current).ok()?;
        let space = PlanSpace {
            max_trainers: scaling.max_trainers,
            max_ps: scaling.max_ps,
            core_step: 1.0,
            max_cores: 1.0,
            fixed_cores: Some((current.trainer_cpu, current.ps_cpu)),
            core_price: 1.0,
            start_seconds: self.optimizer.start_seconds,
            horizon_seconds: self.remaining_seconds(predicted),
        };
        let seed = u64::from(self.optimizer.steps) + 1;
        let front = plans::pareto_front(&model, &space, &current, POPULATION, GENERATIONS, seed);
        if let Some(smaller) = plans::right_size(&front, &current, predicted, RIGHT_SIZE_KEEPS)
            && smaller.cores <= RIGHT_SIZE_CORES * plans::cores(&current)
        {
            return Some(Move::RightSize(smaller));
        }
        let worth: Vec<Plan> = (front.into_iter())
            .filter(|p| p.gain >= WORTH * predicted)
            .collect();
        if worth.is_empty() {
            return None;
        }
        let offered = JobPlans {
            cores_now: plans::cores(&current),
            remaining_samples: predicted * space.horizon_seconds,
            plans: worth,
        };
        cluster.offer(&self.name, cores, memory, Some(offered.clone()));
        let choice = cluster.choose(&self.name, &capacity);
        let plan = offered.plans[choice.plan?];
        let added_memory = self
            .memory_of(&plan.allocation)
            .saturating_sub(self.memory_of(&current));
        if choice
            .free_memory_bytes
            .is_some_and(|free| added_memory > free)
        {
            return None;
        }
        Some(Move::Selected(plan, choice.competing))
    }

    /// Seconds the Job has left at `rate` samples/s (an hour for an open-ended one).
    fn remaining_seconds(&self, rate: f64) -> f64 {
        let progress = self.writer.status.progress.as_ref();
        let left = progress.and_then(|p| {
            let fraction = p.fraction.filter(|f| *f > 0.0 && *f < 1.0)?;
            Some(p.samples as f64 * (1.0 - fraction) / fraction)
        });
        match left {
            Some(samples) if rate > 0.0 => (samples / rate).max(60.0),
            _ => 3_600.0,
        }
    }

    /// Moves the Job's trainers and PS shards to `target`.
    async fn move_to(&mut self, current: Allocation, target: Allocation, why: &str) {
        let message = format!(
            "step {}: trainers {} -> {}, PS shards {} -> {} ({why})",
            self.optimizer.steps + 1,
            current.trainers,
            target.trainers,
            current.ps,
            target.ps
        );
        tracing::info!(job = self.name, %message, "optimizer");
        self.writer.event("Optimized", message.clone());
        if target.ps != current.ps {
            self.job.spec.topology.ps.replicas = target.ps;
            self.reshard_ps(target.ps).await;
        }
        if target.trainers != current.trainers {
            self.job.spec.topology.trainers.replicas = target.trainers;
            self.reconcile_replicas(&[ExecutorRole::Trainer]).await;
        }
        self.optimizer.steps += 1;
        self.optimizer.last_action = Instant::now();
        self.writer
            .condition("ResourcePlan", true, "Applied", message);
        self.show_replicas();
        self.writer.write().await;
    }

    /// Cores and memory bytes the Job's executors hold, by the spec's per-role figures.
    fn held(&self) -> (f64, u64) {
        let topology = &self.job.spec.topology;
        let roles = [
            (ExecutorRole::DataExecutor, &topology.data_executors),
            (ExecutorRole::Trainer, &topology.trainers),
            (ExecutorRole::Ps, &topology.ps),
        ];
        roles
            .iter()
            .fold((0.0, 0), |(cores, memory), (role, spec)| {
                let n = self.members(*role).len();
                let bytes = parse_memory(&spec.memory).unwrap_or(0);
                (cores + n as f64 * spec.cpu, memory + n as u64 * bytes)
            })
    }

    /// Memory bytes of `a`'s trainers and PS shards.
    fn memory_of(&self, a: &Allocation) -> u64 {
        let topology = &self.job.spec.topology;
        let bytes = |memory: &str| parse_memory(memory).unwrap_or(0);
        u64::from(a.trainers) * bytes(&topology.trainers.memory)
            + u64::from(a.ps) * bytes(&topology.ps.memory)
    }
}
