//! (o) DLRover-RM's optimizer on this machine: the Job of (a) (no injected slowness) run
//! once per topology of a sweep (trainers x PS shards) with its allocation fixed, then
//! once from the sweep's poorest topology with `spec.scaling.policy: auto`. Each run's
//! samples/s is measured while it trains (the status polled every 250 ms, over the middle
//! of its samples; for the `auto` run, over the samples after its last step settled). The
//! `auto` run's figure is set against the sweep's best, with the steps it took.

use std::time::{Duration, Instant};

use primus_spec::job::AllocationPolicy;
use primus_spec::status::{Phase, Status};

use crate::jobs::{Cluster, ROWS_PER_HOUR, criteo_data, resources};

const TRAINERS: [u32; 3] = [1, 2, 3];
const PS: [u32; 2] = [1, 2];
/// The cores the master's optimizer divides (`master.cluster.cpu`).
const CLUSTER_CORES: f64 = 8.0;
/// Seconds after the optimizer's last step before its rate counts (a new executor's
/// start and the trainers' report window).
const SETTLE_SECONDS: f64 = 6.0;

/// What the optimizer reached against the sweep.
pub(crate) struct Optimized {
    pub(crate) auto_rate: f64,
    pub(crate) best_rate: f64,
    pub(crate) steps: usize,
}

/// One run: (seconds since apply, samples) every poll, and the final status.
struct Trace {
    applied_unix_ms: i64,
    samples: Vec<(f64, u64)>,
    status: Status,
}

async fn traced_run(resources: [primus_spec::Resource; 2]) -> Trace {
    let cluster = Cluster::start(|settings| {
        settings.master.status_interval_ms = 250;
        // Processes on one host have no core limits: what the optimizer may hand out.
        settings.master.cluster.cpu = Some(CLUSTER_CORES);
    })
    .await;
    let started = Instant::now();
    let applied_unix_ms = primus_spec::time::unix_ms();
    cluster.sandbox.apply(resources).await;
    let mut samples = Vec::new();
    let status = loop {
        let status = cluster.sandbox.status("elastic").await;
        let done = status.progress.as_ref().map_or(0, |p| p.samples);
        samples.push((started.elapsed().as_secs_f64(), done));
        match status.phase {
            Phase::Succeeded => break status,
            phase if phase.is_terminal() => panic!("the Job ended {phase:?}: {status:?}"),
            _ => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "the Job took too long"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    cluster.stop().await;
    Trace {
        applied_unix_ms,
        samples,
        status,
    }
}

/// Samples/s between the polls where the samples crossed `from` and `to` of the total.
fn rate_between(trace: &Trace, from: u64, to: u64) -> f64 {
    let at = |target: u64| trace.samples.iter().find(|(_, s)| *s >= target).copied();
    match (at(from), at(to)) {
        (Some((t0, s0)), Some((t1, s1))) if t1 > t0 => (s1 - s0) as f64 / (t1 - t0),
        _ => 0.0,
    }
}

/// Runs (o): the sweep on `hours` hourly files, the `auto` run on three times as many (it
/// moves for half a minute or so before its rate is measured).
pub(crate) async fn optimize(hours: usize) -> Optimized {
    let auto_hours = 3 * hours;
    let (_dir, data) = criteo_data(auto_hours).await;
    let rows = (hours * ROWS_PER_HOUR) as u64;
    let auto_rows = (auto_hours * ROWS_PER_HOUR) as u64;
    println!(
        "(o) the optimizer: a sweep of fixed topologies on {rows} rows, then `policy: auto` from the poorest on {auto_rows}"
    );
    let mut sweep = Vec::new();
    for trainers in TRAINERS {
        for ps in PS {
            let job = resources(&data, hours, 1, |spec| {
                spec.topology.trainers.replicas = trainers;
                spec.topology.ps.replicas = ps;
            });
            let trace = traced_run(job).await;
            let rate = rate_between(&trace, rows / 5, rows * 4 / 5);
            println!("  {trainers} trainers, {ps} PS shards: {rate:.0} samples/s");
            sweep.push((trainers, ps, rate));
        }
    }
    let by_rate = |a: &&(u32, u32, f64), b: &&(u32, u32, f64)| a.2.total_cmp(&b.2);
    let best = *sweep.iter().max_by(by_rate).expect("a sweep");
    let poorest = *sweep.iter().min_by(by_rate).expect("a sweep");
    let job = resources(&data, auto_hours, 1, |spec| {
        spec.topology.trainers.replicas = poorest.0;
        spec.topology.ps.replicas = poorest.1;
        spec.scaling.policy = AllocationPolicy::Auto;
        spec.scaling.cooldown_seconds = 2;
        spec.scaling.max_trainers = *TRAINERS.last().unwrap_or(&1);
        spec.scaling.max_ps = *PS.last().unwrap_or(&1);
    });
    let trace = traced_run(job).await;
    let steps: Vec<_> = (trace.status.events.iter())
        .filter(|e| e.reason == "Optimized")
        .collect();
    for step in &steps {
        println!("  Optimized: {}", step.message);
    }
    // The status keeps its latest events only; the condition counts every step.
    let taken = (trace.status.conditions.iter())
        .find(|c| c.kind == "ResourcePlan")
        .and_then(|c| {
            c.message
                .strip_prefix("step ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0usize);
    // The rate after the last step settled, to the end of training.
    let settled_at = steps.last().map_or(0.0, |last| {
        (last.unix_ms - trace.applied_unix_ms) as f64 / 1000.0 + SETTLE_SECONDS
    });
    let from = (trace.samples.iter())
        .find(|(t, _)| *t >= settled_at)
        .map_or(auto_rows, |(_, s)| *s);
    let to = auto_rows * 19 / 20;
    let auto_rate = rate_between(&trace, from.max(1), to);
    println!(
        "  the auto run ({auto_rows} rows) counts its rows {from} to {to} (from {settled_at:.1} s after apply)"
    );
    let replicas = trace.status.replicas.unwrap_or_default();
    println!(
        "  auto from {} trainers, {} PS shards: {} steps, ended with {} trainers, {} PS shards, {auto_rate:.0} samples/s after its last step = {:.2} of the best topology's {:.0} ({} trainers, {} PS shards)",
        poorest.0,
        poorest.1,
        taken,
        replicas.trainers,
        replicas.ps,
        auto_rate / best.2.max(1.0),
        best.2,
        best.0,
        best.1
    );
    assert_eq!(
        trace.status.progress.as_ref().map(|p| p.samples),
        Some(auto_rows),
        "every row trained once"
    );
    Optimized {
        auto_rate,
        best_rate: best.2,
        steps: taken,
    }
}
