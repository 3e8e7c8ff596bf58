//! `kubectl apply -k k8s/example` after `k8s/overlays/dev`: its Job runs every PS shard,
//! data executor, trainer and serving replica as a pod of its own across both nodes,
//! succeeds with the AUC the same Job reaches on the local backend, its replica answers
//! Predict, and deleting the Job leaves no object of it behind.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use primus_cluster_tests::{KubeDeployment, NAMESPACE};
use primus_harness::{MasterProcess, Sandbox, binary};
use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::{FeatureValue, PredictRequest, Sample, feature_value};
use primus_spec::Kind;
use primus_spec::status::Phase;

use crate::SERIAL;

const JOB: &str = "ctr-k8s";
/// The data step of k8s/example/apply-job.yaml: the same rows are written for the local run.
const DATAGEN: [&str; 13] = [
    "datagen",
    "criteo",
    "--start",
    "2026-11-20T00",
    "--unit",
    "hourly",
    "--windows",
    "24",
    "--rows-per-window",
    "10000",
    "--cardinality-scale",
    "0.001",
    "--out",
];
const MAX_AUC_DIFFERENCE: f64 = 0.02;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_job_runs_as_pods_on_both_nodes_as_it_does_locally() {
    let _serial = SERIAL.lock().await;
    let local_auc = local_run().await;

    let deployment = KubeDeployment::shared();
    let cluster = deployment.cluster;
    let example = KubeDeployment::example_dir().display().to_string();
    let started = Instant::now();
    cluster
        .kubectl_run(&["apply", "-k", &example])
        .expect("kubectl apply -k k8s/example");
    cluster
        .kubectl_run(&[
            "-n",
            NAMESPACE,
            "wait",
            "--for=condition=complete",
            "job/example-ctr-k8s",
            "--timeout=600s",
        ])
        .unwrap_or_else(|e| {
            panic!(
                "the example's data and apply step: {e}\n{}",
                cluster.diagnostics(NAMESPACE)
            )
        });

    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let status = deployment
        .wait_for_phase(JOB, Phase::Succeeded, Duration::from_secs(900), |_| {
            for pod in deployment.job_pods(JOB) {
                seen.entry(pod.executor).or_default().insert(pod.node);
            }
        })
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    let executors: Vec<&str> = seen.keys().map(String::as_str).collect();
    assert_eq!(
        executors,
        [
            "data_executor-0",
            "data_executor-1",
            "ps-0",
            "ps-1",
            "serving-0",
            "trainer-0"
        ],
        "each executor a pod of its own"
    );
    let nodes: BTreeSet<&String> = seen.values().flatten().collect();
    assert_eq!(nodes.len(), 2, "the Job's pods ran on both nodes: {seen:?}");
    let progress = status.progress.clone().expect("progress");
    assert_eq!(progress.samples, 240_000, "{progress:?}");
    let auc = progress.auc.expect("an AUC");
    eprintln!(
        "k8s/example: {} samples in {elapsed:.0}s, AUC {auc:.4} (local backend {local_auc:.4}), pods on {nodes:?}",
        progress.samples
    );
    assert!(
        (auc - local_auc).abs() <= MAX_AUC_DIFFERENCE,
        "AUC {auc:.4} on Kubernetes, {local_auc:.4} on the local backend"
    );

    predict_from_the_replica(deployment).await;

    deployment
        .client()
        .await
        .delete(Kind::Job, JOB, 0)
        .await
        .expect("delete the Job");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = deployment.job_objects(JOB);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "objects of the deleted Job left: {left:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    cluster
        .kubectl_run(&["delete", "-k", &example, "--wait=true"])
        .expect("kubectl delete -k k8s/example");
}

/// The same Dataset and Job on the local backend (`primus up`'s), over the same rows on
/// local files; its AUC.
async fn local_run() -> f64 {
    let sandbox = Sandbox::start().await;
    let data = sandbox.dir().join("criteo-like");
    let mut args: Vec<String> = DATAGEN.iter().map(|a| (*a).to_owned()).collect();
    args.push(data.display().to_string());
    let datagen = std::process::Command::new(binary("primus"))
        .args(&args)
        .output()
        .expect("primus datagen");
    assert!(
        datagen.status.success(),
        "{}",
        String::from_utf8_lossy(&datagen.stderr)
    );
    let example = std::fs::read_to_string(KubeDeployment::example_dir().join("ctr-k8s.yaml"))
        .expect("k8s/example/ctr-k8s.yaml");
    let checkpoints = sandbox.dir().join("checkpoints");
    let local = example
        .replace(
            "s3://primus/data/criteo-like",
            &format!("file://{}", data.display()),
        )
        .replace(
            "s3://primus/checkpoints/ctr-k8s",
            &format!("file://{}", checkpoints.display()),
        );
    assert_ne!(local, example, "the example's URIs were replaced");
    let _master = MasterProcess::start(&sandbox, &sandbox.master_settings(), &[]);
    sandbox.apply_yaml(&local).await;
    let status = sandbox
        .wait_for_phase(JOB, Phase::Succeeded, Duration::from_secs(600))
        .await;
    let progress = status.progress.expect("progress");
    assert_eq!(progress.samples, 240_000, "{progress:?}");
    progress.auc.expect("an AUC")
}

/// The replica keeps serving the final model after the Job succeeded: Predict over gRPC at
/// its pod's address answers a probability per sample.
async fn predict_from_the_replica(deployment: &KubeDeployment) {
    let pods = deployment.job_pods(JOB);
    let replica = (pods.iter())
        .find(|p| p.executor == "serving-0" && !p.ip.is_empty())
        .unwrap_or_else(|| panic!("no serving replica pod with an address: {pods:?}"));
    let mut serving = ServingServiceClient::connect(format!("http://{}:7080", replica.ip))
        .await
        .expect("the replica's pod");
    let samples: Vec<Sample> = (0..16)
        .map(|i| {
            let features = [
                ("i1", f64::from(i)),
                ("i5", 402.0),
                ("c1", f64::from(1_204 + i)),
                ("c2", 87.0),
            ];
            Sample {
                features: features
                    .into_iter()
                    .map(|(name, value)| {
                        let value = Some(feature_value::Value::Number(value));
                        (name.to_owned(), FeatureValue { value })
                    })
                    .collect(),
            }
        })
        .collect();
    let answer = serving
        .predict(PredictRequest {
            job: JOB.into(),
            samples,
        })
        .await
        .expect("Predict")
        .into_inner();
    assert_eq!(answer.probabilities.len(), 16);
    assert!(
        answer.probabilities.iter().all(|p| *p > 0.0 && *p < 1.0),
        "{:?}",
        answer.probabilities
    );
    assert!(
        answer.dense_version > 0,
        "the final model's dense parameters: {answer:?}"
    );
}
