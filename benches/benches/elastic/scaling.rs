//! (a) Horizontal scaling by load (Primus Eq. 1): a batch Job on Criteo-like hourly Parquet
//! files starts with one data executor that cannot keep its trainer busy, because every
//! Parquet read waits `READ_DELAY_MS` as from a slow object store
//! (`master.fault_injection.data_read_delay_ms`, a fault injected for tests and benchmarks).
//! It runs twice: with `spec.scaling` off, the baseline, and on (1 to `MAX_DATA_EXECUTORS`
//! data executors). Each run prints its time from apply to Succeeded, the data executors it
//! ended with and this machine's mean CPU utilisation meanwhile.

use crate::jobs::{ROW_GROUP_ROWS, ROWS_PER_HOUR, criteo_data, resources, run, table};

const READ_DELAY_MS: u64 = 2_000;
const MAX_DATA_EXECUTORS: u32 = 4;

/// Runs (a) on `hours` hourly files; returns the speed-up of scaling on over off.
pub(crate) async fn scale_out(hours: usize) -> f64 {
    let (_dir, data) = criteo_data(hours).await;
    let rows = (hours * ROWS_PER_HOUR) as u64;
    println!(
        "(a) horizontal scaling by load: {rows} rows, one data executor at the start, each Parquet read of {ROW_GROUP_ROWS} rows delayed {READ_DELAY_MS} ms"
    );
    let job = |scaling: bool| {
        resources(&data, hours, 1, |spec| {
            let policy = &mut spec.scaling;
            policy.enabled = scaling;
            policy.min_data_executors = 1;
            policy.max_data_executors = MAX_DATA_EXECUTORS;
            policy.cooldown_seconds = 3;
        })
    };
    let slow_store = |settings: &mut primus_config::MasterSettings| {
        settings.master.fault_injection.data_read_delay_ms = READ_DELAY_MS;
    };
    let off = run(job(false), slow_store).await;
    let on = run(job(true), slow_store).await;
    table(&[
        ("scaling off (baseline)", &off),
        ("scaling on (1..=4)", &on),
    ]);
    for (name, run) in [("off", &off), ("on", &on)] {
        assert_eq!(run.samples, rows, "scaling {name}: every row trained once");
    }
    for event in &on.status.events {
        println!("  {}: {}", event.reason, event.message);
    }
    off.seconds / on.seconds
}
