//! DLRover-RM's auto-scaling of a running `policy: auto` Job (§4.3, stage 2). Every status
//! tick the Job tells the cluster what it holds. Once the allocation running now has
//! settled iteration times (`performance.rs`) and the cooldown has passed:
//! - with one allocation seen, the model cannot be fitted yet: one exploratory step (a
//!   trainer more where the cluster has the cores, else one fewer, else the same with a
//!   PS shard) gives it a second;
//! - with a fitted model, NSGA-II searches trainers and PS shards (cores per process as
//!   the spec gives them: the backends do not resize a process's cores) for the Pareto
//!   front of cost against throughput gain, the start overhead being the measured time
//!   executors took to serve. A plan that keeps 95% of the predicted samples/s with at
//!   most 90% of the cores is taken at once (it frees cores); otherwise the plans gaining
//!   at least 5% go to the cluster-level weighted greedy selection
//!   ([`crate::cluster::ClusterPlans`]) and the Job takes the one it is given.
//!
//! Where no plan is worth a move, the Job explores a neighbouring allocation it has not run
//! with (at most four explorations in all); the allocations it ran with are priced by
//! their measured rates, the others by the model ([`Measured`]). A Job moves at most eight
//! times. A plan is applied through the elastic mechanics: trainers one at a time
//! ([`super::scaling`]), PS shards by a live resharding ([`super::reshard`]). Each step is
//! an `Optimized` event and the `ResourcePlan` condition says the last one.

use std::time::Duration;

use primus_resource_model::Allocation;
use primus_resource_model::plans::{self, JobPlans, Measured, Plan, PlanSpace, Throughput};
use primus_spec::job::{AllocationPolicy, parse_memory};
use tokio::time::Instant;

use super::JobRun;
use crate::backend::{ExecutorRole, ResourceBackend};
use crate::cluster::ClusterPlans;
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
/// Exploratory steps a Job takes at most.
const MOST_EXPLORATIONS: u32 = 4;
/// Steps a Job takes at most: measured rates are noisy, and a Job that moved this often
/// has been measured near every plan worth taking.
const MOST_STEPS: u32 = 8;

/// One Job's optimizer state.
pub(super) struct Optimizer {
    last_action: Instant,
    /// Plans applied (exploration included).
    pub(super) steps: u32,
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
        let done = self.optimizer.steps >= MOST_STEPS;
        if done || cooling || !self.performance.settled() || self.checkpoint_in_flight.is_some() {
            return;
        }
        let Some(step) = self.next_move(current, cores, memory) else {
            return;
        };
        let (target, why) = match step {
            Move::Explore(target) => {
                self.optimizer.explorations += 1;
                let why = match self.performance.allocations() {
                    1 => "exploring: the model needs iteration times under a second allocation",
                    _ => {
                        "exploring: no plan is worth a move, and this neighbour is not measured yet"
                    }
                };
                (target, why.to_owned())
            }
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
        let free = cluster.choose(&self.name, &capacity).free_cores;
        let (max_trainers, max_ps) = (scaling.max_trainers, scaling.max_ps);
        let exploring = self.optimizer.explorations < MOST_EXPLORATIONS;
        let Some(model) = self.performance.fitted().copied() else {
            if self.performance.allocations() != 1 || !exploring {
                return None;
            }
            return explore(current, free, max_trainers, max_ps).map(Move::Explore);
        };
        let rates = self.performance.measured();
        let predictor = Measured {
            model: &model,
            rates: &rates,
        };
        let planned = self.plan(&predictor, current, &rates, cluster, cores, memory);
        match planned {
            Some(planned) => Some(planned),
            None if exploring => {
                unmeasured_neighbour(current, &rates, free, max_trainers, max_ps).map(Move::Explore)
            }
            None => None,
        }
    }

    /// Right-sizing or the cluster's selection over the Job's plans by `predictor`.
    fn plan(
        &self,
        predictor: &Measured<'_>,
        current: Allocation,
        rates: &[(Allocation, f64)],
        cluster: ClusterPlans,
        cores: f64,
        memory: u64,
    ) -> Option<Move> {
        let scaling = &self.job.spec.scaling;
        let capacity = self.context.capacity;
        let predicted = predictor.throughput(&current)?;
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
        let mut candidates =
            plans::pareto_front(predictor, &space, &current, POPULATION, GENERATIONS, seed);
        // The allocations the Job ran with compete with their measured rates.
        candidates.extend((rates.iter()).filter_map(|(a, _)| {
            let inside = a.trainers <= space.max_trainers && a.ps <= space.max_ps;
            inside.then(|| plans::plan(predictor, &space, &current, *a))?
        }));
        let front = plans::non_dominated(&candidates);
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

/// The exploratory step from `current` with `free` cores: a trainer more, else one fewer,
/// else a PS shard more, else one fewer; None when none is possible.
fn explore(current: Allocation, free: f64, max_trainers: u32, max_ps: u32) -> Option<Allocation> {
    let a = current;
    if a.trainers < max_trainers && free >= a.trainer_cpu {
        Some(Allocation {
            trainers: a.trainers + 1,
            ..a
        })
    } else if a.trainers > 1 {
        Some(Allocation {
            trainers: a.trainers - 1,
            ..a
        })
    } else if a.ps < max_ps && free >= a.ps_cpu {
        Some(Allocation { ps: a.ps + 1, ..a })
    } else if a.ps > 1 {
        Some(Allocation { ps: a.ps - 1, ..a })
    } else {
        None
    }
}

/// A neighbour of `current` (a PS shard or a trainer more or fewer) not measured yet, within
/// the bounds and `free` cores: first along the dimension measured at fewer values, then
/// the one with fewer cores.
fn unmeasured_neighbour(
    current: Allocation,
    rates: &[(Allocation, f64)],
    free: f64,
    max_trainers: u32,
    max_ps: u32,
) -> Option<Allocation> {
    let values = |of: fn(&Allocation) -> u32| {
        let mut seen: Vec<u32> = rates.iter().map(|(a, _)| of(a)).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    };
    let (trainer_values, ps_values) = (values(|a| a.trainers), values(|a| a.ps));
    let a = current;
    let neighbours = [
        (
            ps_values,
            Allocation {
                ps: a.ps.wrapping_sub(1),
                ..a
            },
        ),
        (ps_values, Allocation { ps: a.ps + 1, ..a }),
        (
            trainer_values,
            Allocation {
                trainers: a.trainers.wrapping_sub(1),
                ..a
            },
        ),
        (
            trainer_values,
            Allocation {
                trainers: a.trainers + 1,
                ..a
            },
        ),
    ];
    (neighbours.into_iter())
        .filter(|(_, n)| (1..=max_trainers).contains(&n.trainers) && (1..=max_ps).contains(&n.ps))
        .filter(|(_, n)| plans::cores(n) - plans::cores(&a) <= free)
        .filter(|(_, n)| !rates.iter().any(|(m, _)| m == n))
        .min_by(|(x, n), (y, m)| x.cmp(y).then(plans::cores(n).total_cmp(&plans::cores(m))))
        .map(|(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exploration_adds_where_cores_are_free_and_otherwise_removes() {
        let a = |trainers, ps| Allocation {
            trainers,
            ps,
            trainer_cpu: 1.0,
            ps_cpu: 1.0,
        };
        assert_eq!(explore(a(1, 1), 2.0, 4, 4), Some(a(2, 1)));
        assert_eq!(explore(a(2, 1), 0.0, 4, 4), Some(a(1, 1)));
        assert_eq!(explore(a(4, 1), 2.0, 4, 4), Some(a(3, 1)));
        assert_eq!(explore(a(1, 1), 0.5, 4, 4), None);
        assert_eq!(explore(a(1, 2), 0.0, 4, 4), Some(a(1, 1)));
        assert_eq!(explore(a(1, 1), 1.0, 1, 4), Some(a(1, 2)));
    }

    #[test]
    fn the_neighbour_explored_is_along_the_dimension_measured_least() {
        let a = |trainers, ps| Allocation {
            trainers,
            ps,
            trainer_cpu: 1.0,
            ps_cpu: 1.0,
        };
        // Trainers were varied, PS shards not: one PS shard fewer, the cheaper way.
        let rates = [(a(1, 2), 100.0), (a(2, 2), 110.0)];
        assert_eq!(
            unmeasured_neighbour(a(1, 2), &rates, 4.0, 3, 3),
            Some(a(1, 1))
        );
        // Without free cores, only what costs no more.
        let rates = [(a(1, 2), 100.0), (a(2, 2), 110.0), (a(1, 1), 120.0)];
        assert_eq!(unmeasured_neighbour(a(1, 1), &rates, 0.0, 3, 3), None);
        assert_eq!(
            unmeasured_neighbour(a(1, 1), &rates, 1.0, 3, 3),
            Some(a(2, 1))
        );
    }
}
