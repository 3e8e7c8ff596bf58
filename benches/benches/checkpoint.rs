//! The PS part of a checkpoint's training pause, at 1M and 10M rows of dim 16 (Adagrad):
//! a snapshot written inside the pause (the pause before flash checkpoints) next to a
//! flash snapshot in the same run, where the pause ends once the rows are copied in memory
//! and the write to the object store (a local folder here) follows while training goes on.
//! The rest of a pause (the barrier: trainers finishing the minibatches they were sent) does
//! not depend on the rows and is not measured here.
//!
//! `cargo bench -p primus-benches --bench checkpoint` (PRIMUS_BENCH_ROWS: comma-separated
//! row counts, default `1000000,10000000`). Last line:
//! `checkpoint: pause at N rows X.XXX s written in the pause, Y.YYY s flash (Z.Zx shorter)`.

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::time::{Duration, Instant};

use primus_config::PsSettings;
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{AwaitSnapshotRequest, SnapshotRequest};
use primus_ps_client::PsClient;
use primus_service::Shutdown;
use primus_spec::job::{OptimizerSpec, TableSpec};
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, free_port};
use tonic::transport::Channel;

const DIM: usize = 16;
const FILL_BATCH: usize = 65_536;

fn key_of(i: u64) -> u64 {
    (i ^ 0xdead_beef).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// One pause, and for a flash snapshot the write after it.
struct Timed {
    pause: Duration,
    write_after: Duration,
}

async fn snapshot(
    raw: &mut ParameterServerClient<Channel>,
    uri: String,
    in_background: bool,
) -> Timed {
    let started = Instant::now();
    raw.snapshot(SnapshotRequest {
        uri: uri.clone(),
        base_manifest_uri: String::new(),
        in_background,
    })
    .await
    .expect("snapshot");
    let pause = started.elapsed();
    let resumed = Instant::now();
    if in_background {
        raw.await_snapshot(AwaitSnapshotRequest { uri })
            .await
            .expect("written");
    }
    Timed {
        pause,
        write_after: resumed.elapsed(),
    }
}

#[tokio::main]
#[expect(clippy::disallowed_methods, reason = "a bench's size knobs")]
async fn main() {
    let sizes: Vec<u64> = std::env::var("PRIMUS_BENCH_ROWS")
        .unwrap_or_else(|_| "1000000,10000000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut summary = String::new();
    for rows in sizes {
        let mut settings = PsSettings::default();
        settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
        settings.nats.url = nats.url();
        settings.ps.tables = vec![TableSpec::new(
            "items",
            DIM as u32,
            OptimizerSpec::adagrad(0.05),
        )];
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
        let grads = vec![0.01f32; FILL_BATCH * DIM];
        let keys: Vec<u64> = (0..rows).map(key_of).collect();
        for chunk in keys.chunks(FILL_BATCH) {
            client
                .push("items", chunk, &grads[..chunk.len() * DIM])
                .await
                .expect("fill");
        }
        drop(keys);
        let mut raw = ParameterServerClient::connect(format!("http://{addr}"))
            .await
            .expect("connect")
            .max_decoding_message_size(usize::MAX);
        let folder = |name: &str| format!("file://{}/{rows}-{name}", dir.path().display());
        let inside = snapshot(&mut raw, folder("inside"), false).await;
        let flash = snapshot(&mut raw, folder("flash"), true).await;
        println!(
            "{rows} rows, dim {DIM}: snapshot written in the pause {:.3} s; flash: pause {:.3} s, written {:.3} s after training resumed",
            inside.pause.as_secs_f64(),
            flash.pause.as_secs_f64(),
            flash.write_after.as_secs_f64()
        );
        summary = format!(
            "checkpoint: pause at {rows} rows {:.3} s written in the pause, {:.3} s flash ({:.1}x shorter)",
            inside.pause.as_secs_f64(),
            flash.pause.as_secs_f64(),
            inside.pause.as_secs_f64() / flash.pause.as_secs_f64().max(1e-9)
        );
        shutdown.trigger();
        let _ = server.await;
    }
    println!("{summary}");
}
