//! The hot set's gradient exchange between four trainers on this machine (HypeReca §4):
//! over NATS (every member publishes its whole share, every member receives every other
//! share through the server) against the ring (direct gRPC, reduce-scatter then
//! all-gather over the rows sharded among the members).
//!
//! Four in-process trainers of a small DLRM (26 Criteo-like features, dim 16) share one
//! parameter store and a hot set of `PRIMUS_BENCH_HOT_ROWS` rows (default 20,000), and
//! train `PRIMUS_BENCH_STEPS` minibatches of 2,048 each (default 30) in lockstep rounds, once
//! per exchange, alternating, `PRIMUS_BENCH_ROUNDS` times (default 2; the best run of each
//! counts). Per member and round: the gradient bytes it sent and received, and the time
//! from its part in a round to the round's sum (which includes waiting for the slowest
//! member's step). The last line:
//! `hot exchange: ring S KiB sent, R KiB received, L ms per round; NATS S KiB, R KiB, L ms (4 trainers, H hot rows)`.
#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use primus_batch::{FeaturePipeline, Minibatch};
use primus_bus::Bus;
use primus_config::NatsSettings;
use primus_datagen::criteo::{Criteo, CriteoOptions, feature_schema};
use primus_model::{Model, ModelLayout};
use primus_proto::v1::SourceKind;
use primus_spec::job::{
    DenseSpec, HotExchange, HotSetSpec, ModelKind, ModelSpec, OptimizerSpec, TableSpec,
};
use primus_testkit::NatsServer;
use primus_trainer::device::EmbeddingDevice;
use primus_trainer::feed::{Feed, Incoming};
use primus_trainer::hot::{HotSync, RingEndpoint, TrainerDirectory};
use primus_trainer::meter::{Report, Reporter};
use primus_trainer::store::LocalStore;
use primus_trainer::train::{Trainer, TrainerTotals};

const TRAINERS: usize = 4;
const TABLE: &str = "categorical";
const BATCH: usize = 2048;

fn layout() -> (ModelLayout, OptimizerSpec) {
    let spec = ModelSpec {
        kind: ModelKind::Dlrm,
        tables: vec![TableSpec::new(TABLE, 16, OptimizerSpec::adagrad(0.05))],
        dense: DenseSpec {
            bottom: vec![32, 16],
            top: vec![32, 1],
            optimizer: OptimizerSpec::adagrad(0.01),
            graph: None,
        },
    };
    let layout = ModelLayout::new(&spec, &feature_schema(TABLE)).expect("layout");
    (layout, spec.dense.optimizer)
}

fn minibatches(seed: u64, count: usize) -> Vec<Minibatch> {
    let pipeline = FeaturePipeline::new(&feature_schema(TABLE));
    let mut generator = Criteo::new(CriteoOptions {
        seed,
        cardinality_scale: 0.001,
        ..CriteoOptions::default()
    })
    .expect("generator");
    (0..count)
        .map(|_| {
            let generated = generator.generate(BATCH, 0).expect("rows");
            pipeline.minibatch(&generated.batch).expect("minibatch")
        })
        .collect()
}

struct Quiet;

impl Reporter for Quiet {
    async fn report(&self, _: &Report) {}
    async fn aligned(&self, _: u64, _: &TrainerTotals) {}
}

/// One member's figures over a run: bytes sent and received per round, ms per round.
#[derive(Debug, Clone, Copy)]
struct PerRound {
    sent_kib: f64,
    received_kib: f64,
    ms: f64,
}

async fn run(
    nats: &NatsServer,
    exchange: HotExchange,
    hot_rows: u64,
    feeds: &[Vec<Minibatch>],
) -> (PerRound, Duration) {
    let bus = Bus::connect(&NatsSettings {
        url: nats.url(),
        ..NatsSettings::default()
    })
    .await
    .expect("nats");
    let (layout, dense) = layout();
    let store = Arc::new(LocalStore::new(&layout.ps_tables(), &dense, 0).expect("store"));
    let ids: Vec<String> = (0..TRAINERS).map(|i| format!("trainer-{i}")).collect();
    let directory: TrainerDirectory = {
        let ids = ids.clone();
        Arc::new(move || {
            let ids = ids.clone();
            Box::pin(async move { Ok(ids) })
        })
    };
    let settings = HotSetSpec {
        enabled: true,
        warmup_batches: 3,
        rows: Some(hot_rows),
        max_rows: hot_rows,
        sync_timeout_ms: 60_000,
        exchange,
        ..HotSetSpec::default()
    };
    // Each run its own job, so no message of an earlier run reaches this one.
    let job = format!("bench-{exchange:?}-{}", rand_suffix());
    let mut trainers = Vec::new();
    let mut servers = Vec::new();
    for id in &ids {
        let bind = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let (endpoint, server) = RingEndpoint::serve(bind).await.expect("ring endpoint");
        servers.push(server);
        let hot = HotSync::join(
            settings.clone(),
            &bus,
            &job,
            id,
            &layout,
            directory.clone(),
            EmbeddingDevice::Cpu,
            Some(endpoint),
        )
        .await
        .expect("join");
        let trainer = Trainer::start(
            Model::new(layout.clone()).expect("a model of the layout"),
            store.clone(),
            0,
            1,
            10_000,
        )
        .await
        .expect("trainer");
        trainers.push(trainer.with_hot_set(hot));
    }
    let started = Instant::now();
    let training = trainers.iter_mut().zip(feeds).map(|(trainer, feed)| {
        let items: Vec<Feed> = (feed.iter().cloned())
            .map(|batch| {
                Feed::batch(Incoming::new(
                    batch,
                    SourceKind::Batch,
                    "bench",
                    &Default::default(),
                ))
            })
            .chain([Feed::Barrier(1)])
            .collect();
        let items = futures::stream::iter(items).map(Ok).boxed();
        trainer.train(items, Duration::from_secs(3600), &Quiet)
    });
    for trained in futures::future::join_all(training).await {
        trained.expect("training");
    }
    let elapsed = started.elapsed();
    let mut total = PerRound {
        sent_kib: 0.0,
        received_kib: 0.0,
        ms: 0.0,
    };
    for trainer in &trainers {
        let status = trainer.hot_set().expect("hot set").status();
        assert_eq!(status.members, TRAINERS, "{status:?}");
        let rounds = status.rounds.max(1) as f64;
        let traffic = status.exchange;
        total.sent_kib += traffic.sent_bytes as f64 / 1024.0 / rounds;
        total.received_kib += traffic.received_bytes as f64 / 1024.0 / rounds;
        total.ms += traffic.seconds * 1000.0 / rounds;
    }
    for server in servers {
        server.abort();
    }
    let members = TRAINERS as f64;
    let mean = PerRound {
        sent_kib: total.sent_kib / members,
        received_kib: total.received_kib / members,
        ms: total.ms / members,
    };
    (mean, elapsed)
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn main() {
    let hot_rows: u64 = primus_benches::env_or("PRIMUS_BENCH_HOT_ROWS", 20_000);
    let steps: usize = primus_benches::env_or("PRIMUS_BENCH_STEPS", 30);
    let rounds: usize = primus_benches::env_or("PRIMUS_BENCH_ROUNDS", 2).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let nats = NatsServer::start().expect("nats-server");
        let feeds: Vec<Vec<Minibatch>> = (0..TRAINERS as u64)
            .map(|t| minibatches(t + 1, steps))
            .collect();
        println!(
            "{TRAINERS} trainers, small DLRM (26 features, dim 16), minibatches of {BATCH}, \
             {steps} steps each, a hot set of {hot_rows} rows"
        );
        let mut best: [Option<(PerRound, Duration)>; 2] = [None, None];
        for round in 1..=rounds {
            for (slot, exchange) in [HotExchange::Ring, HotExchange::Nats].into_iter().enumerate() {
                let (figures, elapsed) = run(&nats, exchange, hot_rows, &feeds).await;
                println!(
                    "round {round}, {exchange:?}: per member and round {:.0} KiB sent, {:.0} KiB \
                     received, {:.2} ms from its part to the sum; {:.2} s for all steps",
                    figures.sent_kib,
                    figures.received_kib,
                    figures.ms,
                    elapsed.as_secs_f64()
                );
                if best[slot].is_none_or(|(b, _)| figures.ms < b.ms) {
                    best[slot] = Some((figures, elapsed));
                }
            }
        }
        let [Some((ring, _)), Some((nats_figures, _))] = best else {
            unreachable!("every exchange ran at least once")
        };
        println!(
            "hot exchange: ring {:.0} KiB sent, {:.0} KiB received, {:.2} ms per round; NATS {:.0} KiB, {:.0} KiB, {:.2} ms ({TRAINERS} trainers, {hot_rows} hot rows)",
            ring.sent_kib,
            ring.received_kib,
            ring.ms,
            nats_figures.sent_kib,
            nats_figures.received_kib,
            nats_figures.ms,
        );
    });
}
