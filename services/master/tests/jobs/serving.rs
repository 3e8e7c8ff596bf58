//! The serving path through real processes: the master starts the Job's training PS,
//! trainer, data executor and serving replica; serving-sync (in-process) keeps the replica
//! equal to the training rows and Predict follows new stream rows.

use std::collections::HashMap;
use std::time::Duration;

use primus_harness::Sandbox;
use primus_harness::resources::served;
use primus_harness::rows::{Rows, replica_rows, training_rows};
use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::topology_service_client::TopologyServiceClient;
use primus_proto::v1::{
    FeatureValue, GetTopologyRequest, PredictRequest, Role, Sample, feature_value::Value,
};
use primus_service::Shutdown;
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
