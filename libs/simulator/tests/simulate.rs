//! The simulator end to end on small seeded traces.

use primus_resource_model::Allocation;
use primus_simulator::truth::Faults;
use primus_simulator::{Outcome, Policy, Settings, SimulateError, generate, simulate};

fn run(jobs: usize, policy: Policy) -> Outcome {
    let trace = generate(jobs, 7);
    simulate(&trace, policy, Settings::default(), 7, &mut |_| {}).expect("simulate")
}

#[test]
fn a_trace_is_reproducible_from_its_seed() {
    assert_eq!(generate(50, 3), generate(50, 3));
    assert_ne!(generate(50, 3), generate(50, 4));
    let trace = generate(50, 3);
    assert!(trace.jobs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    // Users over-provision memory, most of them: the trace's premise.
    let over = (trace.jobs.iter())
        .filter(|j| j.user.ps_gib > 1.4 * j.truth.ps_gib(j.user.allocation.ps))
        .count();
    assert!(over > 40, "{over} of 50 Jobs over-provisioned");
}

#[test]
fn the_ground_truth_saturates_where_the_model_is_linear() {
    let trace = generate(1, 1);
    let job = &trace.jobs[0];
    let at = |cores: f64| {
        let a = Allocation {
            trainers: 4,
            ps: 2,
            trainer_cpu: cores,
            ps_cpu: cores,
        };
        job.truth.throughput(&job.shape, &a, Faults::default())
    };
    let (small, large, huge) = (at(4.0), at(8.0), at(64.0));
    assert!(large > small && huge > large);
    assert!(
        huge / large < 8.0 / 2.0,
        "64 cores should pay far less than 8x"
    );
    let shape = job.shape;
    let hot = Faults {
        hot_ps: true,
        ..Faults::default()
    };
    let a = job.user.allocation;
    assert!(
        job.truth.throughput(&shape, &a, hot) < job.truth.throughput(&shape, &a, Faults::default())
    );
}

#[test]
fn every_policy_runs_and_dlrover_rm_beats_static_allocation() {
    let jobs = 80;
    let fixed = run(jobs, Policy::Static);
    let primus = run(jobs, Policy::Primus);
    let dlrover = run(jobs, Policy::DlroverRm);
    for outcome in [&fixed, &primus, &dlrover] {
        assert_eq!(outcome.jobs, jobs);
        assert!(outcome.completed > jobs * 9 / 10, "{outcome:?}");
        assert!(
            outcome.jct_p90_seconds >= outcome.jct_mean_seconds * 0.5,
            "{outcome:?}"
        );
        assert!(
            (0.0..=1.0).contains(&outcome.cpu_utilisation),
            "{outcome:?}"
        );
        assert!(
            (0.0..=1.0).contains(&outcome.memory_utilisation),
            "{outcome:?}"
        );
    }
    assert_eq!(fixed.scaling_actions, 0, "static allocation never changes");
    assert!(primus.scaling_actions > 0 && dlrover.scaling_actions > 0);
    assert!(
        dlrover.jct_mean_seconds < fixed.jct_mean_seconds,
        "{dlrover:?} vs {fixed:?}"
    );
    // The master never shrinks a process's memory and gives each PS shard it adds the
    // role's memory: DLRover-RM as it runs promises no memory utilisation over static's.
    assert!(
        dlrover.cpu_utilisation > fixed.cpu_utilisation,
        "{dlrover:?} vs {fixed:?}"
    );
    // Deterministic: the same trace and seed give the same figures.
    assert_eq!(run(jobs, Policy::DlroverRm), dlrover);
}

#[test]
fn bad_input_is_refused_naming_the_field() {
    let field = |e: SimulateError| match e {
        SimulateError::Invalid { field, .. } => field,
    };
    let unknown = "fastest".parse::<Policy>().expect_err("unknown policy");
    assert_eq!(field(unknown), "policy");
    assert_eq!("dlrover-rm".parse::<Policy>(), Ok(Policy::DlroverRm));
    let mut trace = generate(3, 1);
    let rho = Settings {
        rho: 11.0,
        ..Settings::default()
    };
    let refused = simulate(&trace, Policy::DlroverRm, rho, 1, &mut |_| {});
    assert_eq!(refused.map_err(field), Err("rho".to_owned()));
    trace.cluster.cpu = 0.0;
    let refused = simulate(&trace, Policy::Static, Settings::default(), 1, &mut |_| {});
    assert_eq!(refused.map_err(field), Err("cluster.cpu".to_owned()));
}
