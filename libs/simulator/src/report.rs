//! What a simulation measured, per policy, and the comparison a report ends with.

use std::fmt::Write;

use crate::engine::Usage;
use crate::policy::Policy;
use crate::trace::Trace;

/// One policy's figures over one trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The policy.
    pub policy: Policy,
    /// Jobs submitted.
    pub jobs: usize,
    /// Jobs done by the horizon.
    pub completed: usize,
    /// Mean seconds from submission to completion, over the completed Jobs.
    pub jct_mean_seconds: f64,
    /// Their 90th percentile.
    pub jct_p90_seconds: f64,
    /// Completed / submitted.
    pub completion_rate: f64,
    /// Busy cores over the cores the running Jobs held, while submissions came.
    pub cpu_utilisation: f64,
    /// Used memory over the memory the running Jobs held, while submissions came.
    pub memory_utilisation: f64,
    /// Allocation changes the policy made: processes added or removed, memory given.
    pub scaling_actions: u64,
    /// Completed Jobs one of whose PS shards reached its memory and refused new keys (the
    /// master's PS shards refuse new keys at their limit rather than abort).
    pub refused_keys: usize,
}

impl Outcome {
    pub(crate) fn of(
        policy: Policy,
        trace: &Trace,
        finished: &[Option<f64>],
        usage: Usage,
        scaling_actions: u64,
        refused_keys: usize,
    ) -> Self {
        let mut jct: Vec<f64> = (trace.jobs.iter().zip(finished))
            .filter_map(|(job, done)| done.map(|at| at - job.arrival))
            .collect();
        jct.sort_by(f64::total_cmp);
        let mean = jct.iter().sum::<f64>() / jct.len().max(1) as f64;
        let p90 = jct
            .get((jct.len() * 9 / 10).min(jct.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0);
        Self {
            policy,
            jobs: trace.jobs.len(),
            completed: jct.len(),
            jct_mean_seconds: mean,
            jct_p90_seconds: p90,
            completion_rate: jct.len() as f64 / trace.jobs.len().max(1) as f64,
            cpu_utilisation: usage.busy_core_seconds / usage.held_core_seconds.max(1.0),
            memory_utilisation: usage.used_gib_seconds / usage.held_gib_seconds.max(1.0),
            scaling_actions,
            refused_keys,
        }
    }
}

/// The figures of every policy as a table.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::from(
        "policy      JCT mean   JCT p90          completed   CPU util   memory util   scalings   keys refused\n",
    );
    for o in outcomes {
        let _ = writeln!(
            out,
            "{:<11} {:>7.1} m {:>7.1} m   {:>6}/{:<6} {:>5.1}%   {:>7.1}%   {:>10.1}%   {:>8}   {:>12}",
            o.policy.name(),
            o.jct_mean_seconds / 60.0,
            o.jct_p90_seconds / 60.0,
            o.completed,
            o.jobs,
            100.0 * o.completion_rate,
            100.0 * o.cpu_utilisation,
            100.0 * o.memory_utilisation,
            o.scaling_actions,
            o.refused_keys,
        );
    }
    out
}

/// `simulate: dlrover-rm vs static: JCT -N.N%, CPU utilisation +N.N%, memory utilisation
/// +N.N%, completion rate +N.N%`, each as measured (relative changes, signs as they come).
pub fn summary(dlrover: &Outcome, baseline: &Outcome) -> String {
    let change = |new: f64, old: f64| 100.0 * (new - old) / old.abs().max(f64::MIN_POSITIVE);
    format!(
        "simulate: {} vs {}: JCT {:+.1}%, CPU utilisation {:+.1}%, memory utilisation {:+.1}%, completion rate {:+.1}%",
        dlrover.policy.name(),
        baseline.policy.name(),
        change(dlrover.jct_mean_seconds, baseline.jct_mean_seconds),
        change(dlrover.cpu_utilisation, baseline.cpu_utilisation),
        change(dlrover.memory_utilisation, baseline.memory_utilisation),
        change(dlrover.completion_rate, baseline.completion_rate),
    )
}
