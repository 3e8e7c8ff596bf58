//! The cluster simulator (`primus-simulator`) on a seeded trace: each policy's JCT,
//! completion rate and CPU and memory utilisation, static allocation being the baseline
//! measured in the same run.
//!
//! `cargo bench -p primus-benches --bench simulate` (PRIMUS_BENCH_JOBS, default 2,000;
//! PRIMUS_BENCH_SEED, default 1). The last line:
//! `simulate: dlrover-rm vs static: JCT -N.N%, CPU utilisation +N.N%, memory utilisation
//! +N.N%, completion rate +N.N%` (signs as measured).
#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::time::Instant;

use primus_simulator::report::{summary, table};
use primus_simulator::{Policy, Settings, generate, simulate};

fn main() -> Result<(), primus_simulator::SimulateError> {
    let jobs: usize = primus_benches::env_or("PRIMUS_BENCH_JOBS", 2_000);
    let seed: u64 = primus_benches::env_or("PRIMUS_BENCH_SEED", 1);
    let trace = generate(jobs, seed);
    println!(
        "{jobs} Jobs (seed {seed}) on {} cores and {} GiB",
        trace.cluster.cpu, trace.cluster.memory_gib
    );
    let mut outcomes = Vec::new();
    for policy in Policy::ALL {
        let started = Instant::now();
        let outcome = simulate(&trace, policy, Settings::default(), seed, &mut |_| {})?;
        println!(
            "{}: simulated in {:.1} s",
            policy.name(),
            started.elapsed().as_secs_f64()
        );
        outcomes.push(outcome);
    }
    print!("{}", table(&outcomes));
    println!("{}", summary(&outcomes[2], &outcomes[0]));
    Ok(())
}
