//! Elastic Jobs, all in one run: (a) horizontal scaling by load ([`scaling`]), (b) live PS
//! resharding ([`reshard`]). The last line sums them up.
//!
//! `cargo build --release --bins && cargo bench -p primus-benches --bench elastic`
//! (or `--profile dev` for both). PRIMUS_BENCH_HOURS sets (a)'s data (24 hourly files of
//! 16,384 rows by default), PRIMUS_BENCH_RESHARD_ROWS (b)'s table (1,000,000 rows), and
//! PRIMUS_BENCH_PARTS the parts to run (`ab`).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

mod reshard;
mod scaling;

#[tokio::main]
async fn main() {
    let parts: String = primus_benches::env_or("PRIMUS_BENCH_PARTS", "ab".to_owned());
    let speed_up = match parts.contains('a') {
        true => Some(scaling::scale_out(primus_benches::env_or("PRIMUS_BENCH_HOURS", 24)).await),
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
    let figure = |value: Option<String>| value.unwrap_or_else(|| "not run".to_owned());
    println!(
        "elastic: scale-out speed-up {}, reshard pause p99 {}",
        figure(speed_up.map(|x| format!("{x:.2}x"))),
        figure(resharding.map(|r| format!("{} ms", r.pause_p99.as_millis())))
    );
}
