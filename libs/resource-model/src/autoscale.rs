//! One Job's step of DLRover-RM's auto-scaling (§4.3, stage 2), the same for the master
//! and the cluster simulator: the iteration times a Job ran at per allocation
//! ([`Measurements`]), and what to do next ([`step`]): explore while the model cannot be
//! fitted or no plan is worth a move, right-size an over-provisioned Job (to an allocation
//! it measured, or by a model that fits its measurements), or offer the plans worth their
//! start to the cluster-level selection ([`crate::plans::select`]).
//! The allocations a Job ran with are priced by their measured rates, the others by the
//! model ([`Measured`]), whose form knows no contention between processes sharing cores.

use std::collections::BTreeMap;

use crate::plans::{self, JobPlans, Measured, Plan, PlanSpace, Throughput};
use crate::{Allocation, FittedModel, JobShape, Observation, Terms};

/// A right-sized plan keeps this share of the predicted samples/s...
pub const RIGHT_SIZE_KEEPS: f64 = 0.95;
/// ...with at most this share of the cores.
pub const RIGHT_SIZE_CORES: f64 = 0.9;
/// A scale-up gains at least this share of the predicted samples/s...
pub const WORTH: f64 = 0.05;
/// ...and each core it adds yields at least this share of what a core yields now (so a
/// right-sized Job is not scaled straight back up).
pub const MARGINAL: f64 = 0.5;
/// A right-sizing to an allocation the Job has not run with needs a model this close to
/// the measurements (RMSLE): shrinking on a model that does not fit them can cost more
/// than the cores it frees.
pub const RIGHT_SIZE_RMSLE: f64 = 0.1;
/// A step moves each of trainers, PS shards and their cores by at most this factor: the
/// model is trusted near what the Job measured, not far from it.
pub const TRUST_FACTOR: f64 = 3.0;
/// Iteration times under the allocation running now before a step is taken.
pub const SETTLED_TIMES: usize = 3;
/// Exploratory steps a Job takes at most.
pub const MOST_EXPLORATIONS: u32 = 2;
/// Steps a Job takes at most: measured rates are noisy, and a Job that moved this often
/// has been measured near every plan worth taking.
pub const MOST_STEPS: u32 = 8;
/// NSGA-II's population and rounds.
const POPULATION: usize = 24;
const GENERATIONS: usize = 20;

/// An allocation as a map key: counts, and cores in thousandths.
type Key = (u32, u32, u64, u64);

fn key(a: &Allocation) -> Key {
    let milli = |cores: f64| (cores * 1000.0).round().max(1.0) as u64;
    (a.trainers, a.ps, milli(a.trainer_cpu), milli(a.ps_cpu))
}

/// The iteration times a Job ran at, per allocation (the newest `kept` of each).
#[derive(Debug, Clone, PartialEq)]
pub struct Measurements {
    shape: JobShape,
    kept: usize,
    times: BTreeMap<Key, (Allocation, Vec<f64>)>,
}

impl Measurements {
    /// None yet, for a Job of `shape`.
    pub fn new(shape: JobShape, kept: usize) -> Self {
        Self {
            shape,
            kept: kept.max(1),
            times: BTreeMap::new(),
        }
    }

    /// The Job's shape.
    pub fn shape(&self) -> JobShape {
        self.shape
    }

    /// One iteration time under `allocation`.
    pub fn add(&mut self, allocation: Allocation, iteration_seconds: f64) {
        let (_, times) = (self.times.entry(key(&allocation))).or_insert((allocation, Vec::new()));
        times.push(iteration_seconds);
        if times.len() > self.kept {
            times.remove(0);
        }
    }

    /// Iteration times kept for `allocation`.
    pub fn count(&self, allocation: &Allocation) -> usize {
        self.times.get(&key(allocation)).map_or(0, |(_, t)| t.len())
    }

    /// Allocations with iteration times.
    pub fn allocations(&self) -> usize {
        self.times.len()
    }

    /// Each allocation's median iteration time.
    pub fn observations(&self) -> Vec<Observation> {
        (self.times.values())
            .map(|(allocation, times)| {
                let mut sorted = times.clone();
                sorted.sort_by(f64::total_cmp);
                Observation {
                    allocation: *allocation,
                    iteration_seconds: sorted[sorted.len() / 2],
                }
            })
            .collect()
    }

    /// Each allocation's samples/s, from its median iteration time.
    pub fn rates(&self) -> Vec<(Allocation, f64)> {
        (self.observations().into_iter())
            .map(|o| {
                let samples = f64::from(o.allocation.trainers) * self.shape.batch;
                (o.allocation, samples / o.iteration_seconds)
            })
            .collect()
    }

    /// The model fitted with `terms` to the medians, once two allocations have some.
    pub fn fit(&self, terms: Terms) -> Option<FittedModel> {
        let observations = self.observations();
        if observations.len() < 2 {
            return None;
        }
        FittedModel::fit_terms(self.shape, &observations, terms).ok()
    }
}

/// What a Job's step is decided from.
#[derive(Debug, Clone, Copy)]
pub struct JobState<'a> {
    /// The allocation running now.
    pub current: Allocation,
    /// The fitted model; None while it cannot be fitted.
    pub model: Option<&'a FittedModel>,
    /// What the Job measured.
    pub measurements: &'a Measurements,
    /// Where it may go (`horizon_seconds` is set here from `remaining_samples`).
    pub space: PlanSpace,
    /// Samples it has left; None: open-ended (an hour at its rate counts).
    pub remaining_samples: Option<f64>,
    /// Cores of the cluster nobody holds.
    pub free_cores: f64,
    /// Steps taken so far, and explorations among them.
    pub steps: u32,
    /// Explorations taken so far.
    pub explorations: u32,
    /// Seeds the plan search.
    pub seed: u64,
}

/// What a Job does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Runs under another allocation to measure it.
    Explore(Allocation),
    /// Moves to a plan with fewer cores that keeps most of its rate (frees cores).
    RightSize(Plan),
    /// Offers its scale-ups to the cluster-level selection.
    Offer(JobPlans),
    /// Stays as it is.
    Stay,
}

/// The Job's next step.
pub fn step(state: &JobState<'_>) -> Step {
    let current = state.current;
    let (max_trainers, max_ps) = (state.space.max_trainers, state.space.max_ps);
    let done = state.steps >= MOST_STEPS;
    if done || state.measurements.count(&current) < SETTLED_TIMES {
        return Step::Stay;
    }
    let exploring = state.explorations < MOST_EXPLORATIONS;
    let Some(model) = state.model else {
        let first = state.measurements.allocations() == 1 && exploring;
        return match first.then(|| explore(current, state.free_cores, max_trainers, max_ps)) {
            Some(Some(next)) => Step::Explore(next),
            _ => Step::Stay,
        };
    };
    let rates = state.measurements.rates();
    let predictor = Measured {
        model,
        rates: &rates,
    };
    match plan(state, &predictor, &rates) {
        Step::Stay if exploring => {
            match unmeasured_neighbour(current, &rates, state.free_cores, max_trainers, max_ps) {
                Some(next) => Step::Explore(next),
                None => Step::Stay,
            }
        }
        planned => planned,
    }
}

/// Right-sizing, or the plans worth offering, by `predictor`.
fn plan(state: &JobState<'_>, predictor: &Measured<'_>, rates: &[(Allocation, f64)]) -> Step {
    let current = state.current;
    let Some(predicted) = predictor.throughput(&current).filter(|r| *r > 0.0) else {
        return Step::Stay;
    };
    let remaining = state.remaining_samples.unwrap_or(predicted * 3_600.0);
    let space = PlanSpace {
        horizon_seconds: (remaining / predicted).max(60.0),
        ..state.space
    };
    let mut candidates = plans::pareto_front(
        predictor,
        &space,
        &current,
        POPULATION,
        GENERATIONS,
        state.seed,
    );
    // The allocations the Job ran with compete with their measured rates.
    candidates.extend((rates.iter()).filter_map(|(a, _)| {
        let inside = a.trainers <= space.max_trainers && a.ps <= space.max_ps;
        inside.then(|| plans::plan(predictor, &space, &current, *a))?
    }));
    candidates.retain(|p| near(&p.allocation, &current));
    let front = plans::non_dominated(&candidates);
    let cores_now = plans::cores(&current);
    let fits = (predictor.model.rmsle(&state.measurements.observations()))
        .is_ok_and(|e| e <= RIGHT_SIZE_RMSLE);
    let trusted: Vec<Plan> = (front.iter().copied())
        .filter(|p| fits || rates.iter().any(|(a, _)| *a == p.allocation))
        .collect();
    if let Some(smaller) = plans::right_size(&trusted, &current, predicted, RIGHT_SIZE_KEEPS)
        && smaller.cores <= RIGHT_SIZE_CORES * cores_now
    {
        return Step::RightSize(smaller);
    }
    let per_core = predicted / cores_now;
    let pays = |p: &Plan| {
        let added = p.cores - cores_now;
        p.gain >= WORTH * predicted && (added <= 0.0 || p.gain / added >= MARGINAL * per_core)
    };
    let worth: Vec<Plan> = front.into_iter().filter(pays).collect();
    match worth.is_empty() {
        true => Step::Stay,
        false => Step::Offer(JobPlans {
            cores_now,
            remaining_samples: remaining,
            plans: worth,
        }),
    }
}

/// Whether `a` is within [`TRUST_FACTOR`] of `current` in every dimension.
fn near(a: &Allocation, current: &Allocation) -> bool {
    let within = |x: f64, y: f64| x <= TRUST_FACTOR * y && y <= TRUST_FACTOR * x;
    within(f64::from(a.trainers), f64::from(current.trainers))
        && within(f64::from(a.ps), f64::from(current.ps))
        && within(a.trainer_cpu, current.trainer_cpu)
        && within(a.ps_cpu, current.ps_cpu)
}

/// The first exploratory step from `current` with `free` cores: a trainer more, else one
/// fewer, else a PS shard more, else one fewer; None when none is possible.
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

    fn a(trainers: u32, ps: u32) -> Allocation {
        Allocation::one_core_each(trainers, ps)
    }

    #[test]
    fn exploration_adds_where_cores_are_free_and_otherwise_removes() {
        assert_eq!(explore(a(1, 1), 2.0, 4, 4), Some(a(2, 1)));
        assert_eq!(explore(a(2, 1), 0.0, 4, 4), Some(a(1, 1)));
        assert_eq!(explore(a(4, 1), 2.0, 4, 4), Some(a(3, 1)));
        assert_eq!(explore(a(1, 1), 0.5, 4, 4), None);
        assert_eq!(explore(a(1, 2), 0.0, 4, 4), Some(a(1, 1)));
        assert_eq!(explore(a(1, 1), 1.0, 1, 4), Some(a(1, 2)));
    }

    #[test]
    fn the_neighbour_explored_is_along_the_dimension_measured_least() {
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

    #[test]
    fn medians_per_allocation_make_the_observations_and_rates() {
        let shape = JobShape {
            batch: 100.0,
            model_bytes: 1e6,
            embedding_width: 16.0,
            bandwidth: 1e9,
        };
        let mut measured = Measurements::new(shape, 3);
        for seconds in [9.0, 1.0, 2.0, 3.0] {
            measured.add(a(2, 1), seconds);
        }
        // The newest three kept: 1, 2, 3; their median 2 s for 200 samples.
        assert_eq!(measured.count(&a(2, 1)), 3);
        assert_eq!(measured.rates(), vec![(a(2, 1), 100.0)]);
        assert!(measured.fit(Terms::All).is_none(), "one allocation");
        measured.add(a(1, 1), 1.5);
        assert!(measured.fit(Terms::All).is_some());
    }
}
