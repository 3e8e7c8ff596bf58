//! The serving path through real processes: the master starts the Job's training PS,
//! trainer, data executor and serving replica; serving-sync (in-process) keeps the replica
//! equal to the training rows and Predict follows new stream rows; a Job sampling
//! negatives serves probabilities calibrated on all rows.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, RecordBatch, UInt64Array};
use primus_harness::Sandbox;
use primus_harness::resources::{
    dataset, hourly, id_schema, job, log_join, served, small_wide_deep,
};
use primus_harness::rows::{Rows, replica_rows, training_rows};
use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::topology_service_client::TopologyServiceClient;
use primus_proto::v1::{
    FeatureValue, GetTopologyRequest, PredictRequest, Role, Sample, feature_value::Value,
};
use primus_service::Shutdown;
use primus_spec::dataset::FeatureSchema;
use primus_spec::job::TrainingMode;
use primus_testkit::free_port;

use crate::common::{
    apply_online_job, data_executor, online_job, publish_rows, start_master_with, topology,
};

/// The training rows of every PS shard of `job` and the rows of its serving replica, once
/// they are equal (or after 30 s).
async fn converged(master: &str, job: &str) -> (Rows, Rows) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let endpoints = topology(master, job).await;
        let mut trained = Rows::new();
        for shard in primus_proto::role_addrs(&endpoints, Role::Ps) {
            trained.extend(training_rows(&shard).await);
        }
        let [replica] = &primus_proto::role_addrs(&endpoints, Role::Serving)[..] else {
            panic!("one serving replica expected: {endpoints:?}");
        };
        let held = replica_rows(replica).await;
        if trained == held || tokio::time::Instant::now() > deadline {
            return (trained, held);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The whole serving path through real processes: the master starts the Job's training
/// PS, trainer, data executor and serving replica; serving-sync (in-process, the real
/// service) finds the Job through the API server and the master's topology; the replica
/// ends up holding exactly the training rows, and Predict follows new stream rows, also
/// after the Job's PS was resharded from one shard to two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_online_job_with_serving_predicts_from_the_rows_it_trains() {
    let sandbox = Sandbox::start().await;
    let js = apply_online_job(&sandbox, "served", served).await;
    let master = start_master_with(&sandbox, &data_executor());
    let mut settings = primus_serving_sync::default_settings();
    settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
    settings.nats.url = sandbox.nats.url();
    settings.api.server = format!("http://{}", sandbox.api_addr());
    settings.api.token_file = Some(sandbox.token_file());
    settings.sync.master_addrs = vec![master.addr().to_owned()];
    settings.sync.discovery_interval_ms = 200;
    let sync_shutdown = Shutdown::new();
    let sync = tokio::spawn(primus_serving_sync::run(settings, sync_shutdown.clone()));
    sandbox.wait_for_samples("served", 500).await;

    let endpoints = TopologyServiceClient::connect(format!("http://{}", master.addr()))
        .await
        .expect("master")
        .get_topology(GetTopologyRequest {
            job: "served".into(),
        })
        .await
        .expect("topology")
        .into_inner()
        .endpoints;
    let [shard] = &primus_proto::role_addrs(&endpoints, Role::Ps)[..] else {
        panic!("one training PS expected: {endpoints:?}");
    };
    let [replica] = &primus_proto::role_addrs(&endpoints, Role::Serving)[..] else {
        panic!("one serving replica expected: {endpoints:?}");
    };
    let mut serving = ServingServiceClient::connect(format!("http://{replica}"))
        .await
        .expect("serving replica");
    let probe = |c1: f64| PredictRequest {
        job: "served".into(),
        samples: vec![Sample {
            features: HashMap::from([(
                "c1".to_owned(),
                FeatureValue {
                    value: Some(Value::Number(c1)),
                },
            )]),
        }],
    };

    // Training has stopped (every published row is trained): the replica converges to
    // the training PS row for row, and Predict answers once the dense model is loaded.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (trained, held) = loop {
        let trained = training_rows(shard).await;
        let held = replica_rows(replica).await;
        let answered = serving.predict(probe(7.0)).await.is_ok();
        if (answered && trained == held) || tokio::time::Instant::now() > deadline {
            break (trained, held);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(trained.len() >= 500, "{} trained rows", trained.len());
    assert_eq!(held, trained, "{}", sandbox.logs("served"));
    let probability = serving
        .predict(probe(7.0))
        .await
        .expect("predict")
        .into_inner();
    assert!(
        probability.probabilities.len() == 1 && (0.0..=1.0).contains(&probability.probabilities[0]),
        "{probability:?}"
    );

    // New ids arrive on the stream: once trained, Predict for one of them changes.
    let before = serving
        .predict(probe(10_001.0))
        .await
        .expect("predict")
        .into_inner();
    publish_rows(&js, "clicks.live", 10_000..10_064).await;
    sandbox.wait_for_samples("served", 564).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = serving
            .predict(probe(10_001.0))
            .await
            .expect("predict")
            .into_inner();
        if now.probabilities != before.probabilities {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Predict for a newly trained id still {now:?}\n{}",
            sandbox.logs("served")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Resharded to two PS shards: the replica follows the rows on both.
    sandbox
        .apply([online_job("served", |spec| {
            served(spec);
            spec.topology.ps.replicas = 2;
        })
        .build()])
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while primus_proto::role_addrs(&topology(master.addr(), "served").await, Role::Ps).len() != 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not resharded: {}",
            sandbox.logs("served")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    publish_rows(&js, "clicks.live", 10_064..10_128).await;
    sandbox.wait_for_samples("served", 628).await;
    let (trained, held) = converged(master.addr(), "served").await;
    assert_eq!(held, trained, "{}", sandbox.logs("served"));

    sync_shutdown.trigger();
    sync.await
        .expect("joined")
        .expect("serving-sync exits cleanly");
    sandbox.delete_job("served").await;
    master.stop();
}

/// Request `rid`'s item: 8 items, each clicked at its own rate.
fn item(rid: u64) -> u64 {
    rid % 8
}

/// Whether request `rid` is clicked: item i at 4% + 6% * i, decided by a hash of `rid`.
fn clicked(rid: u64) -> bool {
    let rate = 0.04 + 0.06 * item(rid) as f64;
    (primus_batch::hash::mix64(rid) % 10_000) < (rate * 10_000.0) as u64
}

/// Publishes requests `rids` on `log.features` (request id `rid`, item `c1`) and an action
/// for each on `log.actions`: label 1 when clicked, else 0. Every row joins at once, so
/// positives and negatives reach training mixed as they happened.
async fn publish_requests(js: &primus_bus::jetstream::JetStream, rids: std::ops::Range<u64>) {
    let column = |values: Vec<u64>| -> ArrayRef { Arc::new(UInt64Array::from(values)) };
    let features = RecordBatch::try_from_iter([
        ("rid", column(rids.clone().collect())),
        ("c1", column(rids.clone().map(item).collect())),
    ])
    .expect("rows");
    let actions = RecordBatch::try_from_iter([
        (
            "label",
            column(rids.clone().map(|r| u64::from(clicked(r))).collect()),
        ),
        ("rid", column(rids.collect())),
    ])
    .expect("rows");
    for (subject, rows) in [("log.features", features), ("log.actions", actions)] {
        let message = primus_proto::v1::SampleRows {
            arrow_ipc: primus_batch::ipc::encode_rows(&rows).expect("encode"),
        };
        js.publish(subject.into(), &message).await.expect("publish");
    }
}

/// Monolith's negative sampling end to end: the joiner trains a quarter of the negatives,
/// the model exported to serving carries the rate, and the served probabilities over
/// every request (sampled out or not) add up to the clicks within 2%. Uncorrected, they
/// would be about twice too high.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_sampling_negatives_serves_probabilities_calibrated_on_all_rows() {
    const REQUESTS: u64 = 40_000;
    const RATE: f64 = 0.25;
    let sandbox = Sandbox::start().await;
    let js = sandbox.jetstream().await;
    js.ensure_stream("LOG", vec!["log.>".into()])
        .await
        .expect("stream");
    for first in (0..REQUESTS).step_by(1000) {
        publish_requests(&js, first..first + 1000).await;
    }
    let schema = FeatureSchema {
        negative_sample_rate: Some(RATE),
        ..id_schema()
    };
    let joined = dataset("requests").schema(schema).stream(
        "live",
        hourly("2026-11-01T00", None),
        vec![log_join("joined")],
    );
    let online = job(
        "sampled",
        "requests",
        TrainingMode::Stream,
        small_wide_deep(),
    )
    .batch_size(64)
    .with(served);
    sandbox.apply([joined.build(), online.build()]).await;
    let master = start_master_with(&sandbox, &data_executor());
    let _sync = sandbox.start_serving_sync(master.addr(), None).await;

    // Every request handed out or sampled out, and every handed-out row trained.
    let names = [
        "join_joined_rows.joined",
        "join_negative_rows.joined",
        "join_sampled_out_rows.joined",
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let sampled_out = loop {
        let latest = sandbox.latest_metrics("sampled", &names).await;
        let trained = sandbox
            .status("sampled")
            .await
            .progress
            .map_or(0, |p| p.samples);
        if let Some([joined, timed_out, sampled_out]) = latest.as_deref()
            && (joined + timed_out) as u64 == REQUESTS
            && trained + *sampled_out as u64 == REQUESTS
        {
            break *sampled_out as u64;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "join gauges {latest:?}, {trained} trained\n{}",
            sandbox.logs("sampled")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let clicks = (0..REQUESTS).filter(|r| clicked(*r)).count() as f64;
    let negatives = REQUESTS as f64 - clicks;
    let kept = (negatives - sampled_out as f64) / negatives;
    assert!(
        (kept - RATE).abs() < 0.02,
        "{kept} of the negatives trained"
    );

    // The replica holds the final rows and a dense network exported after them.
    let (trained, held) = converged(master.addr(), "sampled").await;
    assert_eq!(held, trained, "{}", sandbox.logs("sampled"));
    let [replica] =
        &primus_proto::role_addrs(&topology(master.addr(), "sampled").await, Role::Serving)[..]
    else {
        panic!("one serving replica expected");
    };
    let mut serving = ServingServiceClient::connect(format!("http://{replica}"))
        .await
        .expect("serving replica");
    let items = PredictRequest {
        job: "sampled".into(),
        samples: (0..8)
            .map(|c1| Sample {
                features: HashMap::from([(
                    "c1".to_owned(),
                    FeatureValue {
                        value: Some(Value::Number(c1 as f64)),
                    },
                )]),
            })
            .collect(),
    };
    // Dense networks reach the replica every second: two answers 1.5 s apart agree.
    let mut last: Option<Vec<f32>> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let served = loop {
        let now = serving
            .predict(items.clone())
            .await
            .map(|r| r.into_inner().probabilities);
        match (&last, now) {
            (Some(before), Ok(now)) if *before == now => break now,
            (_, now) => last = now.ok(),
        }
        assert!(tokio::time::Instant::now() < deadline, "no stable answer");
        tokio::time::sleep(Duration::from_millis(1500)).await;
    };
    let per_item = (REQUESTS / 8) as f64;
    let predicted: f64 = served.iter().map(|p| f64::from(*p) * per_item).sum();
    let uncorrected: f64 = served
        .iter()
        .map(|p| {
            let p = f64::from(*p);
            p / (p + RATE * (1.0 - p)) * per_item
        })
        .sum();
    let calibration = predicted / clicks;
    eprintln!(
        "calibration {calibration:.4} ({predicted:.0} predicted, {clicks} clicks), \
         uncorrected {:.4}; per item {served:?}",
        uncorrected / clicks
    );
    assert!(
        (calibration - 1.0).abs() <= 0.02,
        "calibration {calibration}: {served:?}"
    );
    assert!(uncorrected / clicks > 1.5, "{uncorrected}");
    sandbox.delete_job("sampled").await;
    master.stop();
}
