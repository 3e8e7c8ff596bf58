//! NSGA-II's plans against the exact Pareto front of a small space, and the cluster-level
//! greedy selection's priorities and capacity.

use primus_resource_model::plans::{
    JobPlans, Plan, PlanSpace, cores, non_dominated, pareto_front, plan, right_size, select,
};
use primus_resource_model::{Allocation, Coefficients, FittedModel, JobShape};

fn model() -> FittedModel {
    FittedModel {
        shape: JobShape {
            batch: 2048.0,
            model_bytes: 1.9e6,
            embedding_width: 416.0,
            bandwidth: 1.0e9,
        },
        coefficients: Coefficients {
            grad: 2.0e-5,
            update: 4.0e-3,
            sync: 2.0,
            embedding: 1.0e-8,
            base: 2.0e-3,
        },
    }
}

const SPACE: PlanSpace = PlanSpace {
    max_trainers: 6,
    max_ps: 4,
    core_step: 0.5,
    max_cores: 2.0,
    fixed_cores: None,
    core_price: 1.0,
    start_seconds: 30.0,
    horizon_seconds: 3600.0,
};

const CURRENT: Allocation = Allocation::one_core_each(1, 1);

/// Every allocation of the space with a positive gain, and the exact front among them.
fn exhaustive_front() -> Vec<Plan> {
    let mut all = Vec::new();
    for trainers in 1..=SPACE.max_trainers {
        for ps in 1..=SPACE.max_ps {
            for t in 1..=4 {
                for p in 1..=4 {
                    let allocation = Allocation {
                        trainers,
                        ps,
                        trainer_cpu: f64::from(t) * 0.5,
                        ps_cpu: f64::from(p) * 0.5,
                    };
                    let candidate = plan(&model(), &SPACE, &CURRENT, allocation).expect("plan");
                    if candidate.gain > 0.0 {
                        all.push(candidate);
                    }
                }
            }
        }
    }
    non_dominated(&all)
}

#[test]
fn nsga_ii_finds_the_pareto_front_of_a_small_space() {
    let exact = exhaustive_front();
    assert!(exact.len() >= 5, "a front worth searching: {}", exact.len());
    let mut found = pareto_front(&model(), &SPACE, &CURRENT, 40, 60, 7);
    found.retain(|p| p.gain > 0.0);
    // Nothing it returns is beaten by any allocation of the space...
    for p in &found {
        assert!(
            !exact.iter().any(|q| q.cost <= p.cost
                && q.gain >= p.gain
                && (q.cost < p.cost || q.gain > p.gain)),
            "{p:?} is dominated"
        );
        assert!(p.gain > 0.0);
    }
    // ...and it finds most of the exact front.
    let hits = exact
        .iter()
        .filter(|q| found.iter().any(|p| p.cost == q.cost && p.gain == q.gain))
        .count();
    assert!(
        hits * 10 >= exact.len() * 8,
        "found {hits} of the {} plans on the front",
        exact.len()
    );
    // Cheapest first, and each dearer plan gains more.
    for pair in found.windows(2) {
        assert!(
            pair[0].cost < pair[1].cost && pair[0].gain < pair[1].gain,
            "{pair:?}"
        );
    }
}

fn candidate(cores: f64, gain: f64, throughput: f64) -> Plan {
    Plan {
        allocation: CURRENT,
        cores,
        cost: cores,
        gain,
        throughput,
    }
}

#[test]
fn the_greedy_selection_favours_short_jobs_by_rho_and_keeps_to_the_capacity() {
    // Job 0 has far fewer samples left; job 1's plan is more efficient per core.
    let jobs = vec![
        JobPlans {
            cores_now: 2.0,
            remaining_samples: 1.0e5,
            plans: vec![candidate(6.0, 400.0, 1000.0)],
        },
        JobPlans {
            cores_now: 2.0,
            remaining_samples: 1.0e8,
            plans: vec![candidate(6.0, 900.0, 1000.0)],
        },
    ];
    // Room for one plan: rho 2.5 picks the short Job, rho 0 the efficient one.
    assert_eq!(select(&jobs, 4.0, 2.5), vec![Some(0), None]);
    assert_eq!(select(&jobs, 4.0, 0.0), vec![None, Some(0)]);
    // Room for both: both.
    assert_eq!(select(&jobs, 8.0, 2.5), vec![Some(0), Some(0)]);
    // No room: none.
    assert_eq!(select(&jobs, 3.0, 2.5), vec![None, None]);
}

#[test]
fn right_sizing_takes_the_cheapest_plan_that_keeps_the_throughput() {
    let current = Allocation {
        trainers: 6,
        ps: 4,
        trainer_cpu: 2.0,
        ps_cpu: 2.0,
    };
    let now = model().throughput(&current).expect("throughput");
    let front = pareto_front(&model(), &SPACE, &current, 40, 30, 5);
    assert!(
        front.iter().any(|p| p.gain < 0.0),
        "cheaper plans stay on the front"
    );
    let smaller = right_size(&front, &current, now, 0.9).expect("a smaller allocation");
    assert!(smaller.cores < cores(&current));
    assert!(smaller.throughput >= 0.9 * now);
    let cheaper_that_keeps = (front.iter())
        .filter(|p| p.throughput >= 0.9 * now && p.cost < smaller.cost)
        .count();
    assert_eq!(cheaper_that_keeps, 0);
    // Nothing keeps all of it with fewer cores in a model where every core helps.
    assert_eq!(right_size(&front, &current, now * 1.5, 1.0), None);
}
