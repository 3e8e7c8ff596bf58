//! The trainer's copy of the dense parameters against two real PS shards: exact while the
//! trainer is their only writer, given up for the PS's values once a push's answer shows
//! another writer, and read again once the trainer is alone.

use std::time::Duration;

use primus_config::PsSettings;
use primus_embedding::{DenseStore, DenseValues};
use primus_model::ParamTensor;
use primus_ps_client::PsClient;
use primus_service::Shutdown;
use primus_spec::job::OptimizerSpec;
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, free_port};
use primus_trainer::store::{ParameterStore, RemoteStore};

const NAMES: [&str; 3] = ["bottom.0.weight", "bottom.0.bias", "top.0.weight"];

fn adam() -> OptimizerSpec {
    OptimizerSpec::Adam {
        learning_rate: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
    }
}

async fn start_shard(nats: &NatsServer) -> (String, Shutdown) {
    let mut settings = PsSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
    settings.nats.url = nats.url();
    settings.ps.dense_optimizer = adam();
    let addr = settings.server.grpc_addr.to_string();
    let shutdown = Shutdown::new();
    tokio::spawn(primus_ps::run(settings, shutdown.clone()));
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(60))
        .await
        .expect("ps serving");
    (addr, shutdown)
}

/// Tensors of NAMES, with values that depend on `step`.
fn tensors(step: u32) -> Vec<ParamTensor> {
    NAMES
        .iter()
        .enumerate()
        .map(|(t, name)| ParamTensor {
            name: (*name).to_owned(),
            shape: vec![4, 3],
            values: (0..12)
                .map(|i| ((i * 7 + t * 5 + step as usize) % 11) as f32 / 11.0 - 0.5)
                .collect(),
        })
        .collect()
}

fn wire(tensors: &[ParamTensor]) -> Vec<DenseValues> {
    tensors.iter().cloned().map(DenseValues::from).collect()
}

fn bits(tensors: &[ParamTensor]) -> Vec<Vec<u32>> {
    (tensors.iter())
        .map(|t| t.values.iter().map(|v| v.to_bits()).collect())
        .collect()
}

fn wire_bits(tensors: &[DenseValues]) -> Vec<Vec<u32>> {
    (tensors.iter())
        .map(|t| t.values.iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dense_copy_is_exact_alone_and_gives_way_to_another_writer() {
    let nats = NatsServer::start().expect("nats-server");
    let (a, stop_a) = start_shard(&nats).await;
    let (b, stop_b) = start_shard(&nats).await;
    let addrs = vec![a, b];
    let names: Vec<String> = NAMES.iter().map(|n| (*n).to_owned()).collect();
    let store = RemoteStore::new(PsClient::connect(&addrs).await.expect("connect"));
    let other = PsClient::connect(&addrs).await.expect("connect");
    let reference = DenseStore::new(&adam());

    store.init_dense(&tensors(0)).await.expect("init");
    reference.init(&wire(&tensors(0))).expect("reference init");
    let on_ps = |client: &PsClient| {
        let (client, names) = (client.clone(), names.clone());
        async move { client.pull_dense(&names).await.expect("pull from the PS") }
    };

    // Alone: every pull is what the PS's optimizer made of every push, to the bit.
    for step in 1..=6 {
        let pulled = store.pull_dense(&names).await.expect("pull");
        let (expected, _) = reference.pull(&names).expect("reference");
        assert_eq!(bits(&pulled), wire_bits(&expected), "step {step}");
        store
            .push_dense(tensors(step), step.into())
            .await
            .expect("push");
        reference
            .push(&wire(&tensors(step)))
            .expect("reference push");
    }
    store.flush().await.expect("flush");
    let (expected, _) = reference.pull(&names).expect("reference");
    assert_eq!(wire_bits(&on_ps(&other).await), wire_bits(&expected));
    assert_eq!(
        bits(&store.pull_dense(&names).await.expect("pull")),
        wire_bits(&expected)
    );

    // Another writer: the answer to the trainer's next push shows it (read by the push
    // after, or a flush), and from then on pulls read the PS.
    other
        .push_dense(wire(&tensors(100)), 100)
        .await
        .expect("other push");
    store.push_dense(tensors(7), 7).await.expect("push");
    store.flush().await.expect("flush");
    let pulled = store.pull_dense(&names).await.expect("pull");
    let on_the_ps = on_ps(&other).await;
    assert_eq!(
        bits(&pulled),
        wire_bits(&on_the_ps),
        "the PS's values, both writers'"
    );
    let (mine_only, _) = {
        reference.push(&wire(&tensors(7))).expect("reference push");
        reference.pull(&names).expect("reference")
    };
    assert_ne!(wire_bits(&on_the_ps), wire_bits(&mine_only));

    // Alone again: after a few quiet pushes the copy is read again, and stays exact.
    for step in 8..=16 {
        store
            .push_dense(tensors(step), step.into())
            .await
            .expect("push");
        let pulled = store.pull_dense(&names).await.expect("pull");
        store.flush().await.expect("flush");
        assert_eq!(
            bits(&pulled),
            wire_bits(&on_ps(&other).await),
            "step {step}"
        );
    }

    // A minibatch pushed again (served again after its trainer died): the shards leave it
    // out, and the trainer's copy, which applied it, gives way to the PS's values.
    let before = on_ps(&other).await;
    store.push_dense(tensors(16), 16).await.expect("push");
    store.flush().await.expect("flush");
    assert_eq!(
        wire_bits(&on_ps(&other).await),
        wire_bits(&before),
        "applied once"
    );
    let pulled = store.pull_dense(&names).await.expect("pull");
    assert_eq!(bits(&pulled), wire_bits(&before), "the PS's values");
    // Quiet pushes after it: the copy is read again.
    for step in 19..=23 {
        store
            .push_dense(tensors(step), step.into())
            .await
            .expect("push");
        store.pull_dense(&names).await.expect("pull");
    }

    // Gradients that are not finite are refused before anything is sent; a push that
    // does not reach the PS fails the next call that waits for it.
    let mut bad = tensors(17);
    bad[0].values[0] = f32::NAN;
    let refused = store.push_dense(bad, 17).await.expect_err("not finite");
    assert!(format!("{refused:#}").contains("not finite"), "{refused:#}");
    stop_b.trigger();
    tokio::time::sleep(Duration::from_millis(500)).await;
    store
        .push_dense(tensors(18), 18)
        .await
        .expect("sent in the background");
    let failed = store.flush().await.expect_err("a shard is gone");
    assert!(
        format!("{failed:#}").contains("pushing dense gradients"),
        "{failed:#}"
    );
    stop_a.trigger();
}
