//! DLRover-RM's auto-scaling of a running `policy: auto` Job (§4.3, stage 2). Every status
//! tick the Job tells the cluster what it holds; once the cooldown has passed it takes
//! primus-resource-model's step ([`autoscale::step`], the code the cluster simulator runs
//! too) over what it measured per allocation (`performance.rs`): an exploratory step, a
//! right-sized plan (taken at once: it frees cores), or plans offered to the cluster-level
//! weighted greedy selection ([`crate::cluster::ClusterPlans`]), of which it takes the one
//! it is given where the cluster's memory has room. Trainers and PS shards are searched
//! with cores per process as the spec gives them (the backends do not resize a process's
//! cores); a plan's start overhead is the time this Job's executors took to serve.
//!
//! A plan is applied through the elastic mechanics: trainers one at a time
//! ([`super::scaling`]), PS shards by a live resharding ([`super::reshard`]). Each step is
//! an `Optimized` event and the `ResourcePlan` condition says the last one.

use std::time::Duration;

use primus_resource_model::Allocation;
use primus_resource_model::autoscale::{self, JobState, MOST_STEPS, Step};
use primus_resource_model::plans::{Plan, PlanSpace};
use primus_spec::job::{AllocationPolicy, parse_memory};
use tokio::time::Instant;

use super::JobRun;
use primus_backend::{ExecutorRole, ResourceBackend};
use primus_data_tasks::plan::Catalog;

/// Seconds a new executor took to serve, before one was measured.
const FIRST_START_SECONDS: f64 = 5.0;

/// One Job's optimizer state.
pub(super) struct Optimizer {
    last_action: Instant,
    /// Plans applied (explorations included).
    steps: u32,
    /// Exploratory steps among them.
    explorations: u32,
    /// Seconds a started executor took to serve, smoothed.
    start_seconds: f64,
}

impl Optimizer {
    pub(super) fn new(started: Instant) -> Self {
        Self {
            last_action: started,
            steps: 0,
            explorations: 0,
            start_seconds: FIRST_START_SECONDS,
        }
    }

    /// An executor took `took` from its start to serving.
    pub(super) fn started_in(&mut self, took: Duration) {
        self.start_seconds = 0.5 * self.start_seconds + 0.5 * took.as_secs_f64();
    }
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Offers what the Job holds and its plans to the cluster, and applies its step.
    pub(super) async fn optimize(&mut self) {
        if self.job.spec.scaling.policy != AllocationPolicy::Auto {
            return;
        }
        let (cores, memory) = self.held();
        let cluster = self.context.cluster.clone();
        cluster.offer(&self.name, cores, memory, None);
        let cooldown = Duration::from_secs(self.job.spec.scaling.cooldown_seconds);
        let cooling = Instant::now() < self.optimizer.last_action + cooldown;
        let Some(current) = self.allocation() else {
            return;
        };
        if cooling || self.checkpoint_in_flight.is_some() {
            return;
        }
        let capacity = self.context.capacity;
        let state = JobState {
            current,
            model: self.performance.fitted(),
            measurements: &self.performance.measurements,
            space: self.plan_space(current),
            remaining_samples: self.remaining_samples(),
            free_cores: cluster.choose(&self.name, &capacity).free_cores,
            steps: self.optimizer.steps,
            explorations: self.optimizer.explorations,
            seed: u64::from(self.optimizer.steps) + 1,
        };
        let explored = self.performance.measurements.allocations();
        let (target, why) = match autoscale::step(&state) {
            Step::Stay => return,
            Step::Explore(target) => {
                self.optimizer.explorations += 1;
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
                cluster.offer(&self.name, cores, memory, Some(plans.clone()));
                let choice = cluster.choose(&self.name, &capacity);
                let Some(plan) = choice.plan.map(|k| plans.plans[k]) else {
                    return;
                };
                let added = self
                    .memory_of(&plan.allocation)
                    .saturating_sub(self.memory_of(&current));
                if choice.free_memory_bytes.is_some_and(|free| added > free) {
                    return;
                }
                (
                    plan.allocation,
                    selected(&plan, choice.competing, capacity.rho),
                )
            }
        };
        self.move_to(current, target, &why).await;
    }

    /// Trainers and PS shards within the spec's bounds, cores per process as they are.
    fn plan_space(&self, current: Allocation) -> PlanSpace {
        let scaling = &self.job.spec.scaling;
        PlanSpace {
            max_trainers: scaling.max_trainers,
            max_ps: scaling.max_ps,
            core_step: 1.0,
            max_cores: 1.0,
            fixed_cores: Some((current.trainer_cpu, current.ps_cpu)),
            core_price: 1.0,
            start_seconds: self.optimizer.start_seconds,
            horizon_seconds: 0.0,
        }
    }

    /// Samples the Job has left (None for an open-ended one).
    fn remaining_samples(&self) -> Option<f64> {
        let progress = self.writer.status.progress.as_ref()?;
        let fraction = progress.fraction.filter(|f| *f > 0.0 && *f < 1.0)?;
        Some(progress.samples as f64 * (1.0 - fraction) / fraction)
    }

    /// Moves the Job's trainers and PS shards to `target`.
    async fn move_to(&mut self, current: Allocation, target: Allocation, why: &str) {
        let message = format!(
            "step {} of at most {MOST_STEPS}: trainers {} -> {}, PS shards {} -> {} ({why})",
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

/// Why a plan the selection gave the Job was taken.
fn selected(plan: &Plan, competing: usize, rho: f64) -> String {
    format!(
        "selected among {competing} Jobs' plans (rho {rho}): {:.0} samples/s predicted, +{:.0}, for {} cores",
        plan.throughput, plan.gain, plan.cores
    )
}
