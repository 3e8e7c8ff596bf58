//! Data task generation (DTGG) for a synthetic catalog shaped like Primus's evaluation:
//! 20 days of hourly partitions of 2 sources, ~56M files, ~4M tasks. Listings come from an
//! in-memory catalog that builds each partition's listing (names and sizes) when asked, so
//! the planner pays for every listed entry as it would for a real LIST. Printed: tasks/s and
//! seconds with 1 window at a time (the baseline) and with parallel windows, and peak RSS.
//!
//! `cargo bench -p primus-benches --bench dtgg` (PRIMUS_BENCH_FILES, PRIMUS_BENCH_DAYS,
//! PRIMUS_BENCH_PARALLELISM).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use primus_data_tasks::plan::{
    BatchSource, Catalog, FileEntry, ListingCache, PlanError, PlanOptions, StreamPlan, plan_windows,
};
use primus_spec::dataset::WindowUnit;
use primus_spec::time;

// The allocator of the master binary, where the planner runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SOURCES: u64 = 2;
const TARGET_TASK_BYTES: u64 = 128 << 20;

struct SyntheticCatalog {
    files_per_hour: u64,
}

impl Catalog for SyntheticCatalog {
    /// An hour partition (`date=D/hour=H`): its files and a `_SUCCESS` marker.
    async fn list(&self, uri: &str, _partition: &str) -> Result<Vec<FileEntry>, PlanError> {
        let seed = uri.len() as u64;
        let mut files = Vec::with_capacity(self.files_per_hour as usize + 1);
        files.push(FileEntry {
            name: "_SUCCESS".into(),
            size: 0,
        });
        for i in 0..self.files_per_hour {
            let mixed = (i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            files.push(FileEntry {
                name: format!("part-{i:06}.zstd.parquet"),
                // 1..16 MiB: ~15 files per 128 MiB task.
                size: (1 << 20) + mixed % (15 << 20),
            });
        }
        Ok(files)
    }

    async fn exists(&self, _uri: &str) -> Result<bool, PlanError> {
        Ok(true)
    }
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

struct Run {
    tasks: u64,
    files: u64,
    seconds: f64,
}

async fn generate(files_per_hour: u64, days: i64, parallelism: usize) -> Run {
    let catalog = Arc::new(SyntheticCatalog { files_per_hour });
    let cache = Arc::new(ListingCache::new(catalog, parallelism * SOURCES as usize));
    let start = time::parse_window_time("2026-10-01T00").unwrap_or(0);
    let end = start + days * time::DAY;
    let sources = (0..SOURCES)
        .map(|i| BatchSource {
            name: format!("table{i}"),
            uri: format!("memory://catalog/table{i}"),
        })
        .collect();
    let stream = Arc::new(StreamPlan {
        name: "train".into(),
        rank: 0,
        unit: WindowUnit::Hourly,
        start,
        end: Some(end),
        epoch: start,
        first_source_index: 0,
        total_sources: SOURCES,
        sources,
    });
    let options = PlanOptions {
        target_task_bytes: TARGET_TASK_BYTES,
        parallelism,
    };
    let began = Instant::now();
    let mut windows = std::pin::pin!(plan_windows(
        cache,
        stream,
        Arc::from("bench"),
        start,
        end,
        options
    ));
    let (mut tasks, mut files, mut last_start) = (0u64, 0u64, i64::MIN);
    while let Some(window) = windows.next().await {
        let window = window.expect("synthetic listings do not fail");
        assert!(
            window.start > last_start,
            "windows leave the sink in time order"
        );
        last_start = window.start;
        tasks += window.tasks.len() as u64;
        files += window.files;
    }
    Run {
        tasks,
        files,
        seconds: began.elapsed().as_secs_f64(),
    }
}

fn main() {
    let total_files = primus_benches::env_or::<u64>("PRIMUS_BENCH_FILES", 56_000_000);
    let days = primus_benches::env_or::<u64>("PRIMUS_BENCH_DAYS", 20) as i64;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let parallelism =
        primus_benches::env_or::<u64>("PRIMUS_BENCH_PARALLELISM", 2 * cores as u64) as usize;
    let files_per_hour = total_files / (days as u64 * 24 * SOURCES);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!(
        "DTGG: {days} days x 24 hourly windows x {SOURCES} sources, {files_per_hour} files per source-hour ({:.1}M files), {} MiB tasks, {cores} cores",
        (files_per_hour * days as u64 * 24 * SOURCES) as f64 / 1e6,
        TARGET_TASK_BYTES >> 20
    );
    for (label, windows_at_once) in [
        ("baseline: 1 window at a time", 1),
        ("parallel windows", parallelism),
    ] {
        let run = runtime.block_on(generate(files_per_hour, days, windows_at_once));
        println!(
            "  {label:<30} ({windows_at_once:>2}): {:>9} tasks from {:>10} files in {:>6.2} s = {:>9.0} tasks/s, {:>10.0} files/s; peak RSS so far {:.0} MiB",
            run.tasks,
            run.files,
            run.seconds,
            run.tasks as f64 / run.seconds,
            run.files as f64 / run.seconds,
            peak_rss_mib()
        );
    }
    println!(
        "  reference (Primus, 8-core driver): 149 s with 1 thread, 42 s with 4 threads; target here: <= 10 s"
    );
}
