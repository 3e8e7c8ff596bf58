//! DLRover-RM's auto-scaling plans (§4.2-4.3): per Job, the allocations on the Pareto
//! front of resource cost (Eq. 7) against 1 / throughput gain (Eqs. 8-9), found by NSGA-II
//! over the fitted model; across Jobs, the weighted greedy selection of one plan each under
//! the cluster's capacity (Eqs. 11-14).

use crate::{Allocation, FittedModel};

/// What predicts a Job's samples/s under an allocation: the fitted model, or
/// [`Measured`] rates where the Job ran and the model elsewhere.
pub trait Throughput {
    /// Predicted samples/s under `allocation`; None where it cannot say.
    fn throughput(&self, allocation: &Allocation) -> Option<f64>;
}

impl Throughput for FittedModel {
    fn throughput(&self, allocation: &Allocation) -> Option<f64> {
        FittedModel::throughput(self, allocation).ok()
    }
}

/// The samples/s a Job measured under the allocations it ran with, and the model's
/// prediction for the others: a measurement is what the model's form (which knows no
/// contention between processes sharing cores) cannot always fit.
#[derive(Debug, Clone, Copy)]
pub struct Measured<'a> {
    /// The fitted model.
    pub model: &'a FittedModel,
    /// Allocations run, with their measured samples/s.
    pub rates: &'a [(Allocation, f64)],
}

impl Throughput for Measured<'_> {
    fn throughput(&self, allocation: &Allocation) -> Option<f64> {
        match self.rates.iter().find(|(a, _)| a == allocation) {
            Some((_, rate)) => Some(*rate),
            None => FittedModel::throughput(self.model, allocation).ok(),
        }
    }
}

/// Where a Job may go, and what it costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanSpace {
    /// Most trainers and PS shards.
    pub max_trainers: u32,
    /// Most PS shards.
    pub max_ps: u32,
    /// Cores a trainer or PS shard may have: multiples of this step, up to `max_cores`.
    pub core_step: f64,
    /// Most cores per process.
    pub max_cores: f64,
    /// Cores per trainer and per PS shard where they cannot change (a backend that does
    /// not resize processes): the plans then differ in counts only, and `core_step` and
    /// `max_cores` are not used.
    pub fixed_cores: Option<(f64, f64)>,
    /// What a core costs (Eq. 7's `Money`), per core.
    pub core_price: f64,
    /// Seconds a started process takes before it trains (Eq. 8's overhead), measured.
    pub start_seconds: f64,
    /// Seconds over which a plan's gain is counted (the Job's expected remaining time).
    pub horizon_seconds: f64,
}

impl PlanSpace {
    /// The space of a running Job whose processes keep the cores they run with, as the
    /// master's backends do not resize a process's cores: plans differ in trainer and PS
    /// counts only, up to `max_trainers` and `max_ps`; a core costs 1 and a started
    /// process takes `start_seconds` before it trains.
    pub fn counts_only(
        current: &Allocation,
        max_trainers: u32,
        max_ps: u32,
        start_seconds: f64,
    ) -> Self {
        Self {
            max_trainers,
            max_ps,
            core_step: 1.0,
            max_cores: 1.0,
            fixed_cores: Some((current.trainer_cpu, current.ps_cpu)),
            core_price: 1.0,
            start_seconds,
            horizon_seconds: 0.0,
        }
    }
}

/// One plan for one Job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// The allocation to move to.
    pub allocation: Allocation,
    /// Its cores in all (Eq. 7 without the price).
    pub cores: f64,
    /// Eq. 7: what its cores cost.
    pub cost: f64,
    /// Eq. 8: predicted samples/s over the current allocation's, less the overhead of
    /// starting the processes it adds, spread over the horizon.
    pub gain: f64,
    /// Its predicted samples/s.
    pub throughput: f64,
}

/// Cores of an allocation.
pub fn cores(a: &Allocation) -> f64 {
    f64::from(a.trainers) * a.trainer_cpu + f64::from(a.ps) * a.ps_cpu
}

/// `candidate` priced and its gain over `current` predicted by `model`.
pub fn plan(
    model: &dyn Throughput,
    space: &PlanSpace,
    current: &Allocation,
    candidate: Allocation,
) -> Option<Plan> {
    let now = model.throughput(current)?;
    let then = model.throughput(&candidate)?;
    let added = candidate.trainers.saturating_sub(current.trainers)
        + candidate.ps.saturating_sub(current.ps);
    let overhead = now * space.start_seconds * f64::from(added) / space.horizon_seconds.max(1.0);
    let cores = cores(&candidate);
    Some(Plan {
        allocation: candidate,
        cores,
        cost: cores * space.core_price,
        gain: then - now - overhead,
        throughput: then,
    })
}

/// A plan's genes: trainers, PS shards, and each one's cores in steps.
type Genes = [u32; 4];

/// The cheapest plan of `front` (from [`pareto_front`]) that keeps at least `keep` (0..=1)
/// of `current`'s predicted throughput with fewer cores than `current`: an over-provisioned
/// Job's right size. None when the model sees no such plan.
pub fn right_size(
    front: &[Plan],
    current: &Allocation,
    current_throughput: f64,
    keep: f64,
) -> Option<Plan> {
    front
        .iter()
        .filter(|p| p.cores < cores(current) && p.throughput >= keep * current_throughput)
        .min_by(|a, b| a.cost.total_cmp(&b.cost))
        .copied()
}

/// NSGA-II over `space` (population `population`, `generations` rounds, seeded): every plan
/// no other plan beats on both cost and gain over `current`, gains below zero included
/// (cheaper plans that lose throughput), cheapest first. Empty for a space without a core
/// step or cores.
pub fn pareto_front(
    model: &dyn Throughput,
    space: &PlanSpace,
    current: &Allocation,
    population: usize,
    generations: usize,
    seed: u64,
) -> Vec<Plan> {
    let steps = match space.fixed_cores {
        Some(_) => 1,
        None => {
            let valid = space.core_step > 0.0 && space.max_cores >= space.core_step;
            if !valid || !space.core_step.is_finite() || !space.max_cores.is_finite() {
                return Vec::new();
            }
            (space.max_cores / space.core_step).floor().max(1.0) as u32
        }
    };
    let mut random = Random(seed | 1);
    let limits: Genes = [space.max_trainers.max(1), space.max_ps.max(1), steps, steps];
    let evaluate = |genes: &Genes| {
        let (trainer_cpu, ps_cpu) = space.fixed_cores.unwrap_or((
            f64::from(genes[2]) * space.core_step,
            f64::from(genes[3]) * space.core_step,
        ));
        let allocation = Allocation {
            trainers: genes[0],
            ps: genes[1],
            trainer_cpu,
            ps_cpu,
        };
        plan(model, space, current, allocation)
    };
    let mut members: Vec<(Genes, Plan)> = (0..population.max(4))
        .filter_map(|_| {
            let genes = limits.map(|limit| 1 + random.below(limit));
            evaluate(&genes).map(|p| (genes, p))
        })
        .collect();
    for _ in 0..generations {
        let rank = fronts(&members);
        let spread = crowding(&members, &rank);
        let mut children = Vec::with_capacity(members.len());
        // A child the model cannot price is dropped; the tries are bounded all the same.
        for _ in 0..4 * members.len() {
            if children.len() >= members.len() {
                break;
            }
            let pick = |random: &mut Random| {
                let (a, b) = (
                    random.below(members.len() as u32) as usize,
                    random.below(members.len() as u32) as usize,
                );
                let better = (rank[a], -spread[a]) <= (rank[b], -spread[b]);
                if better { a } else { b }
            };
            let (mother, father) = (pick(&mut random), pick(&mut random));
            let mut genes = members[mother].0;
            for (i, gene) in genes.iter_mut().enumerate() {
                if random.below(2) == 0 {
                    *gene = members[father].0[i];
                }
                if random.below(4) == 0 {
                    // Mutation: one step either way, within the limits.
                    let up = random.below(2) == 0;
                    *gene = if up {
                        (*gene + 1).min(limits[i])
                    } else {
                        (*gene - 1).max(1)
                    };
                }
            }
            if let Some(p) = evaluate(&genes) {
                children.push((genes, p));
            }
        }
        members.extend(children);
        members.sort_by_key(|m| m.0);
        members.dedup_by(|a, b| a.0 == b.0);
        let rank = fronts(&members);
        let spread = crowding(&members, &rank);
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by(|&a, &b| rank[a].cmp(&rank[b]).then(spread[b].total_cmp(&spread[a])));
        order.truncate(population.max(4));
        members = order.into_iter().map(|i| members[i]).collect();
    }
    let plans: Vec<Plan> = members.iter().map(|(_, p)| *p).collect();
    let mut front = non_dominated(&plans);
    front.sort_by(|a, b| a.cost.total_cmp(&b.cost));
    front
}

/// Whether `a` is at least as good as `b` on cost and gain and better on one.
fn dominates(a: &Plan, b: &Plan) -> bool {
    a.cost <= b.cost && a.gain >= b.gain && (a.cost < b.cost || a.gain > b.gain)
}

/// The plans no other of `plans` dominates (equal plans kept once).
pub fn non_dominated(plans: &[Plan]) -> Vec<Plan> {
    let mut front: Vec<Plan> = Vec::new();
    for p in plans {
        if plans.iter().any(|q| dominates(q, p))
            || front.iter().any(|q| q.cost == p.cost && q.gain == p.gain)
        {
            continue;
        }
        front.push(*p);
    }
    front
}

/// Each member's front: 0 for the non-dominated, 1 for those only the first front beats...
fn fronts(members: &[(Genes, Plan)]) -> Vec<usize> {
    let n = members.len();
    let mut rank = vec![usize::MAX; n];
    let mut current = 0;
    let mut left: Vec<usize> = (0..n).collect();
    while !left.is_empty() {
        let front: Vec<usize> = left
            .iter()
            .copied()
            .filter(|&i| {
                !left
                    .iter()
                    .any(|&j| dominates(&members[j].1, &members[i].1))
            })
            .collect();
        for &i in &front {
            rank[i] = current;
        }
        left.retain(|i| !front.contains(i));
        current += 1;
    }
    rank
}

/// Crowding distance within each front, on cost and gain (the ends of a front infinite).
fn crowding(members: &[(Genes, Plan)], ranks: &[usize]) -> Vec<f64> {
    let mut distance = vec![0.0; members.len()];
    let fronts = ranks.iter().copied().max().map_or(0, |m| m + 1);
    for front in 0..fronts {
        let ids: Vec<usize> = (0..members.len()).filter(|&i| ranks[i] == front).collect();
        for objective in [|p: &Plan| p.cost, |p: &Plan| p.gain] {
            let mut sorted = ids.clone();
            sorted.sort_by(|&a, &b| objective(&members[a].1).total_cmp(&objective(&members[b].1)));
            let (Some(&first), Some(&last)) = (sorted.first(), sorted.last()) else {
                continue;
            };
            let span =
                (objective(&members[last].1) - objective(&members[first].1)).max(f64::MIN_POSITIVE);
            distance[first] = f64::INFINITY;
            distance[last] = f64::INFINITY;
            for w in sorted.windows(3) {
                distance[w[1]] +=
                    (objective(&members[w[2]].1) - objective(&members[w[0]].1)) / span;
            }
        }
    }
    distance
}

/// One Job's part in the cluster-level selection.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPlans {
    /// Cores the Job holds now.
    pub cores_now: f64,
    /// Samples it has left to train (Eq. 14's `Φ`).
    pub remaining_samples: f64,
    /// Its candidate plans.
    pub plans: Vec<Plan>,
}

/// Eqs. 11-14: for each Job, the index of the plan chosen (None: it stays as it is), picked
/// greedily by resource efficiency (gain per cost) times the priority weight
/// `1 / (remaining time + eps)^rho`, while the cores they add fit in `free_cores`.
pub fn select(jobs: &[JobPlans], free_cores: f64, rho: f64) -> Vec<Option<usize>> {
    const EPSILON: f64 = 1e-9;
    let mut chosen = vec![None; jobs.len()];
    let mut free = free_cores;
    loop {
        let mut best: Option<(usize, usize, f64)> = None;
        for (j, job) in jobs
            .iter()
            .enumerate()
            .filter(|(j, _)| chosen[*j].is_none())
        {
            for (k, plan) in job.plans.iter().enumerate() {
                let added = plan.cores - job.cores_now;
                if added > free || plan.cost <= 0.0 || plan.throughput <= 0.0 {
                    continue;
                }
                let efficiency = plan.gain / plan.cost;
                let weight = 1.0 / (job.remaining_samples / plan.throughput + EPSILON).powf(rho);
                let score = efficiency * weight;
                if best.is_none_or(|(_, _, s)| score > s) {
                    best = Some((j, k, score));
                }
            }
        }
        let Some((j, k, _)) = best else {
            return chosen;
        };
        free -= jobs[j].plans[k].cores - jobs[j].cores_now;
        chosen[j] = Some(k);
    }
}

/// xorshift64: the search is seeded, so a plan is reproducible.
struct Random(u64);

impl Random {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n.max(1))) as u32
    }
}
