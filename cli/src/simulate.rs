//! `primus simulate`: the cluster simulator (`primus-simulator`) on a seeded trace, every
//! policy in turn, with a progress bar on a terminal; prints the table and the comparison
//! of DLRover-RM against static allocation.

use std::io::IsTerminal;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use primus_simulator::report::{summary, table};
use primus_simulator::{Policy, Settings, generate, simulate};

use crate::Failure;

#[derive(Args)]
pub struct SimulateArgs {
    /// Jobs in the trace.
    #[arg(long, default_value_t = 2_000)]
    jobs: usize,
    /// Seed of the trace (arrivals, sizes, faults).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Eq. 14's rho: how strongly the selection favours Jobs close to done (-10..=10).
    #[arg(long, default_value_t = 2.5)]
    rho: f64,
    /// Seconds between the simulated master's status ticks (its `master.status_interval_ms`;
    /// the master runs at 2 s): a shorter interval simulates it more closely, at more cost.
    #[arg(long, default_value_t = 60.0)]
    interval: f64,
    /// Run only this policy (static, primus or dlrover-rm); default: all three.
    #[arg(long)]
    policy: Option<String>,
}

pub fn run_simulation(args: SimulateArgs) -> Result<(), Failure> {
    let bad = |e: primus_simulator::SimulateError| Failure::input(e.into());
    if args.jobs == 0 {
        return Err(Failure::input(anyhow::anyhow!(
            "--jobs: at least one Job is needed"
        )));
    }
    let settings = Settings {
        rho: args.rho,
        interval_seconds: args.interval,
    };
    settings.check().map_err(bad)?;
    let policies = match &args.policy {
        Some(name) => vec![name.parse::<Policy>().map_err(bad)?],
        None => Policy::ALL.to_vec(),
    };
    let trace = generate(args.jobs, args.seed);
    println!(
        "{} Jobs (seed {}) on {} cores and {} GiB",
        args.jobs, args.seed, trace.cluster.cpu, trace.cluster.memory_gib
    );
    let mut outcomes = Vec::new();
    for policy in policies {
        let bar = progress_bar(policy);
        let mut shown = |done: f64| bar.set_position((done * 1_000.0) as u64);
        outcomes.push(simulate(&trace, policy, settings, args.seed, &mut shown).map_err(bad)?);
        bar.finish_and_clear();
    }
    print!("{}", table(&outcomes));
    let find = |p: Policy| outcomes.iter().find(|o| o.policy == p);
    if let (Some(dlrover), Some(baseline)) = (find(Policy::DlroverRm), find(Policy::Static)) {
        println!("{}", summary(dlrover, baseline));
    }
    Ok(())
}

/// A bar over the simulated time on a terminal; hidden otherwise.
fn progress_bar(policy: Policy) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(1_000);
    let style = ProgressStyle::with_template("{prefix:>10} [{bar:40}] {percent:>3}% {elapsed}")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(policy.name());
    bar
}
