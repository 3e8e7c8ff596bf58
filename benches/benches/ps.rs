//! Embedding lookups through one PS process over gRPC on loopback, next to the same lookups
//! on an in-process table in the same run (the ceiling the network path is measured against).
//!
//! `cargo bench -p primus-benches --bench ps` (PRIMUS_BENCH_SECONDS, PRIMUS_BENCH_KEYS).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use primus_config::PsSettings;
use primus_embedding::{Table, TableOptions};
use primus_ps_client::PsClient;
use primus_service::Shutdown;
use primus_spec::job::{OptimizerSpec, TableSpec};
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, free_port};

const DIM: usize = 16;
const BATCH: usize = 4096;
const CALLERS: usize = 8;

fn spec() -> TableSpec {
    TableSpec::new("items", DIM as u32, OptimizerSpec::adagrad(0.05))
}

fn key_of(i: u64) -> u64 {
    (i ^ 0xdead_beef).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Distinct keys per batch (a trainer dedups before it asks), drawn uniformly.
fn batches(keys: u64, count: usize) -> Vec<Vec<u64>> {
    let mut state = 0x1234_5678u64;
    (0..count)
        .map(|_| {
            let mut batch: Vec<u64> = (0..BATCH)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    key_of((state >> 33) % keys)
                })
                .collect();
            batch.sort_unstable();
            batch.dedup();
            batch
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let seconds = primus_benches::env_or::<u64>("PRIMUS_BENCH_SECONDS", 3);
    let keys = primus_benches::env_or::<u64>("PRIMUS_BENCH_KEYS", 1_000_000);
    let duration = Duration::from_secs(seconds);
    let nats = NatsServer::start().expect("nats-server");
    let mut settings = PsSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
    settings.nats.url = nats.url();
    settings.ps.tables = vec![spec()];
    settings.telemetry.log_filter = "warn".into();
    let addr = settings.server.grpc_addr.to_string();
    let shutdown = Shutdown::new();
    let server = tokio::spawn(primus_ps::run(settings, shutdown.clone()));
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(20))
        .await
        .expect("ps serving");
    let client = PsClient::connect(std::slice::from_ref(&addr))
        .await
        .expect("connect");

    let local = Table::new(&spec(), TableOptions::default()).expect("table");
    let all: Vec<u64> = (0..keys).map(key_of).collect();
    let zeros = vec![0.0f32; BATCH * DIM];
    for chunk in all.chunks(BATCH) {
        client
            .push("items", chunk, &zeros[..chunk.len() * DIM])
            .await
            .expect("fill ps");
        local
            .push(chunk, &zeros[..chunk.len() * DIM], 1)
            .expect("fill local");
    }
    let batches = Arc::new(batches(keys, 64));
    let keys_per_batch = batches.iter().map(Vec::len).sum::<usize>() as f64 / batches.len() as f64;

    // In-process ceiling: one thread, no network.
    let mut out = vec![0.0f32; BATCH * DIM];
    let start = Instant::now();
    let mut done = 0usize;
    while start.elapsed() < duration {
        let batch = &batches[done % batches.len()];
        local
            .lookup(batch, &mut out[..batch.len() * DIM])
            .expect("lookup");
        done += batch.len();
    }
    let in_process = done as f64 / start.elapsed().as_secs_f64();

    let served = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let client = client.clone();
            let batches = batches.clone();
            let served = served.clone();
            tokio::spawn(async move {
                let mut i = caller;
                while start.elapsed() < duration {
                    let batch = &batches[i % batches.len()];
                    client.lookup("items", batch).await.expect("lookup");
                    served.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    i += CALLERS;
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("caller");
    }
    let over_grpc = served.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    println!(
        "{keys} keys, dim {DIM}, {keys_per_batch:.0} distinct keys per call, {CALLERS} callers, {seconds} s each"
    );
    println!("in-process lookup (1 thread)   {:>12.0} keys/s", in_process);
    println!(
        "PS lookup over gRPC (loopback) {:>12.0} keys/s   ({:.0}% of in-process)",
        over_grpc,
        100.0 * over_grpc / in_process
    );
    shutdown.trigger();
    let _ = server.await;
}
