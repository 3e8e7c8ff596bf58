//! (c) Straggler handling (DLRover-RM §5.1): the batch Job of (a) with two data executors,
//! one of which waits `SLOW_READ_DELAY_MS` before each Parquet read
//! (`master.fault_injection.slow_data_executor`, a fault injected for tests and
//! benchmarks), runs with `spec.scaling.stragglers` off, the baseline, and on.

use crate::jobs::{ROW_GROUP_ROWS, ROWS_PER_HOUR, criteo_data, resources, run, table};

const SLOW_READ_DELAY_MS: u64 = 15_000;

/// Runs (c) on `hours` hourly files; returns the speed-up of handling on over off.
pub(crate) async fn stragglers(hours: usize) -> f64 {
    let (_dir, data) = criteo_data(hours).await;
    let rows = (hours * ROWS_PER_HOUR) as u64;
    println!(
        "(c) straggler handling: {rows} rows, two data executors, each Parquet read of {ROW_GROUP_ROWS} rows of data_executor-1 delayed {SLOW_READ_DELAY_MS} ms"
    );
    let job = |handled: bool| {
        resources(&data, hours, 2, |spec| {
            spec.scaling.stragglers.enabled = handled;
        })
    };
    let straggler = |settings: &mut primus_config::MasterSettings| {
        let faults = &mut settings.master.fault_injection;
        (faults.slow_data_executor, faults.slow_read_delay_ms) = (Some(1), SLOW_READ_DELAY_MS);
    };
    let off = run(job(false), straggler).await;
    let on = run(job(true), straggler).await;
    table(&[
        ("stragglers not handled (baseline)", &off),
        ("stragglers handled", &on),
    ]);
    for (name, run) in [("off", &off), ("on", &on)] {
        assert_eq!(run.samples, rows, "handling {name}: every row trained once");
    }
    for event in &on.status.events {
        println!("  {}: {}", event.reason, event.message);
    }
    off.seconds / on.seconds
}
