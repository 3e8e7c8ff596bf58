//! Elastic Jobs, all in one run: (a) horizontal scaling by load ([`scaling`]), (b) live PS
//! resharding ([`reshard`]: `b` between PS processes under load, `j` in a running Job),
//! (c) straggler handling ([`straggler`]), (o) DLRover-RM's optimizer against a sweep of
//! topologies ([`optimizer`]). The last line sums up (a) to (c).
//!
//! `cargo build --release --bins && cargo bench -p primus-benches --bench elastic`
//! (or `--profile dev` for both). PRIMUS_BENCH_HOURS sets the data of (a) and (c) (24 hourly
//! files of 16,384 rows by default), PRIMUS_BENCH_RESHARD_ROWS the table of (b) (1,000,000
//! rows), PRIMUS_BENCH_RESHARD_HOURS and PRIMUS_BENCH_RESHARD_CARDINALITY the Job's data in
//! (b) (72 files, Criteo cardinalities times 8), PRIMUS_BENCH_OPTIMIZER_HOURS the data of
//! (o)'s sweep (384 files; its `auto` run reads three times as many), and PRIMUS_BENCH_PARTS the parts to run (`abjco`).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

mod jobs;
mod optimizer;
mod reshard;
mod scaling;
mod straggler;

#[tokio::main]
async fn main() {
    let parts: String = primus_benches::env_or("PRIMUS_BENCH_PARTS", "abjco".to_owned());
    let hours = primus_benches::env_or("PRIMUS_BENCH_HOURS", 24);
    let speed_up = match parts.contains('a') {
        true => Some(scaling::scale_out(hours).await),
        false => None,
    };
    let resharding = match parts.contains('b') {
        true => Some(
            reshard::reshard_two_to_four(primus_benches::env_or(
                "PRIMUS_BENCH_RESHARD_ROWS",
                1_000_000,
            ))
            .await,
        ),
        false => None,
    };
    let in_a_job = match parts.contains('j') {
        true => Some(
            reshard::reshard_a_running_job(
                primus_benches::env_or("PRIMUS_BENCH_RESHARD_HOURS", 72),
                primus_benches::env_or("PRIMUS_BENCH_RESHARD_CARDINALITY", 8.0),
                primus_benches::env_or("PRIMUS_BENCH_RESHARD_ROWS", 1_000_000),
            )
            .await,
        ),
        false => None,
    };
    let straggling = match parts.contains('c') {
        true => Some(straggler::stragglers(hours).await),
        false => None,
    };
    if parts.contains('o') {
        let optimized =
            optimizer::optimize(primus_benches::env_or("PRIMUS_BENCH_OPTIMIZER_HOURS", 384)).await;
        println!(
            "(o) the optimizer: {:.0} samples/s = {:.2}x the sweep's best {:.0}, after {} steps",
            optimized.auto_rate,
            optimized.auto_rate / optimized.best_rate.max(1.0),
            optimized.best_rate,
            optimized.steps
        );
    }
    if let Some(resharded) = in_a_job {
        let pause = resharded
            .pause
            .map_or("none".to_owned(), |p| format!("{} ms", p.as_millis()));
        println!("(b) in a Job: longest trainer wait on the fence {pause}");
    }
    let figure = |value: Option<String>| value.unwrap_or_else(|| "not run".to_owned());
    println!(
        "elastic: scale-out speed-up {}, reshard pause p99 {}, straggler speed-up {}",
        figure(speed_up.map(|x| format!("{x:.2}x"))),
        figure(resharding.map(|r| format!("{} ms", r.pause_p99.as_millis()))),
        figure(straggling.map(|x| format!("{x:.2}x")))
    );
}
