//! Primus Fig. 11 as an experiment on the real serving buffers: a mixture job's batch
//! backlog (always full) and a live stream share one trainer; the stream bursts to 10x its
//! rate for one second. Printed: the stream's lag (age of its oldest queued row) over
//! time, with Algorithm 2's stream weight at 1 (no prioritisation: the fuller buffer wins)
//! and at 2 and 4 (`examples/mixture.yaml` uses 4).
//!
//! Virtual time, 10 ms ticks, so the figures are the policy's alone, not this machine's:
//! `cargo bench -p primus-data-executor --bench burst`.

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::collections::VecDeque;
use std::sync::Arc;

use primus_batch::{DenseMatrix, Kjt, Minibatch, Sparse};
use primus_data_executor::buffer::{Buffers, Chunk};
use primus_data_executor::ledger::TaskLedger;
use primus_proto::v1::SourceKind;

const TICK_MS: u64 = 10;
const TICKS: u64 = 2_000;
/// Rows the trainer takes per tick (12,800 rows/s) in minibatches of this size.
const MINIBATCH: usize = 128;
const STREAM_ROWS_PER_TICK: usize = 20;
/// One second at 10x the stream's rate.
const BURST: std::ops::Range<u64> = 500..600;
const BATCH_CHUNK: usize = 512;
const CAPACITY: usize = 65_536;

fn rows(n: usize) -> Minibatch {
    Minibatch {
        labels: vec![0.0; n],
        targets: Vec::new(),
        dense: DenseMatrix::default(),
        sparse: Sparse::Jagged(Kjt {
            rows: n,
            features: vec![],
        }),
    }
}

/// What one run saw.
struct Run {
    /// The stream's lag at each tick, in seconds.
    lag: Vec<f64>,
    batch_rows: u64,
    stream_rows: u64,
}

async fn run(stream_weight: f64) -> Run {
    let buffers = Buffers::new(
        vec![
            ("batch".into(), SourceKind::Batch, 1.0),
            ("stream".into(), SourceKind::Stream, stream_weight),
        ],
        CAPACITY,
    );
    let (batch_task, stream_task) = (
        Arc::new(TaskLedger::new("batch".into(), 0)),
        Arc::new(TaskLedger::new("stream".into(), 0)),
    );
    // Arrival tick of every queued stream row's run, oldest first (buffers are FIFO).
    let mut arrivals: VecDeque<(u64, usize)> = VecDeque::new();
    let mut run = Run {
        lag: Vec::new(),
        batch_rows: 0,
        stream_rows: 0,
    };
    let (mut batch_offset, mut stream_offset) = (0, 0);
    for tick in 0..TICKS {
        while buffers.fill()[0].1 + BATCH_CHUNK <= CAPACITY {
            push(&buffers, 0, &batch_task, &mut batch_offset, BATCH_CHUNK).await;
        }
        let arriving = STREAM_ROWS_PER_TICK * if BURST.contains(&tick) { 10 } else { 1 };
        // The trainer pops later in this tick: a full stream buffer would block for good.
        assert!(
            buffers.fill()[1].1 + arriving <= CAPACITY,
            "the stream buffer filled up at tick {tick}"
        );
        push(&buffers, 1, &stream_task, &mut stream_offset, arriving).await;
        arrivals.push_back((tick, arriving));
        let mut trained = 0;
        while trained < MINIBATCH {
            let Some(served) = buffers.try_pop(MINIBATCH - trained) else {
                break;
            };
            let n = served.batch.rows();
            trained += n;
            if served.kind == SourceKind::Stream {
                run.stream_rows += n as u64;
                take(&mut arrivals, n);
            } else {
                run.batch_rows += n as u64;
            }
        }
        let oldest = arrivals.front().map_or(tick, |(at, _)| *at);
        run.lag.push(((tick - oldest) * TICK_MS) as f64 / 1000.0);
    }
    run
}

/// Pushes `n` rows of `task` into buffer `source`.
async fn push(
    buffers: &Buffers,
    source: usize,
    task: &Arc<TaskLedger>,
    offset: &mut u64,
    n: usize,
) {
    let chunk = Chunk {
        batch: rows(n),
        task: task.clone(),
        first_offset: *offset,
    };
    buffers.push(source, chunk).await;
    *offset += n as u64;
}

/// Drops the `n` oldest stream rows from the arrival record.
fn take(arrivals: &mut VecDeque<(u64, usize)>, mut n: usize) {
    while n > 0 {
        let Some((_, rows)) = arrivals.front_mut() else {
            return;
        };
        let taken = n.min(*rows);
        *rows -= taken;
        n -= taken;
        if *rows == 0 {
            arrivals.pop_front();
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let weights = [1.0, 2.0, 4.0];
    let runs: Vec<Run> = weights.iter().map(|w| runtime.block_on(run(*w))).collect();
    println!(
        "stream lag (s) under a 1 s burst at 10x the stream's rate from t = {:.1} s; trainer {} rows/s, stream {} rows/s, batch backlog always full",
        (BURST.start * TICK_MS) as f64 / 1000.0,
        MINIBATCH as u64 * 1000 / TICK_MS,
        STREAM_ROWS_PER_TICK as u64 * 1000 / TICK_MS
    );
    print!("{:>8}", "t (s)");
    for w in weights {
        print!(" {:>16}", format!("stream weight {w}"));
    }
    println!();
    for tick in (0..TICKS).step_by(100) {
        print!("{:>8.1}", (tick * TICK_MS) as f64 / 1000.0);
        for run in &runs {
            print!(" {:>16.2}", run.lag[tick as usize]);
        }
        println!();
    }
    let settled = |run: &Run| {
        run.lag[BURST.end as usize..]
            .iter()
            .position(|&lag| lag <= run.lag[BURST.start as usize - 1] + 0.05)
            .map_or(f64::NAN, |i| (i as u64 * TICK_MS) as f64 / 1000.0)
    };
    println!(
        "{:>8} {:>16} {:>16} {:>16} {:>16}",
        "weight", "max lag (s)", "settled after (s)", "stream share", "batch rows/s"
    );
    for (w, run) in weights.iter().zip(&runs) {
        let seconds = (TICKS * TICK_MS) as f64 / 1000.0;
        println!(
            "{:>8} {:>16.2} {:>16.2} {:>16.3} {:>16.0}",
            w,
            run.lag.iter().fold(0.0, |m: f64, l| m.max(*l)),
            settled(run),
            run.stream_rows as f64 / (run.stream_rows + run.batch_rows) as f64,
            run.batch_rows as f64 / seconds
        );
    }
}
