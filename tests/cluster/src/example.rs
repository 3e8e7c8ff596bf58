//! `k8s/example` as a user runs it (`kubectl apply -k k8s/example` after
//! `k8s/overlays/dev`), and the same Dataset and Job on the local backend over the same rows.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use primus_harness::{MasterProcess, Sandbox, binary};
use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::{FeatureValue, PredictRequest, PredictResponse, Sample, feature_value};
use primus_spec::status::Phase;

use crate::{KubeDeployment, NAMESPACE};

/// The example's Job.
pub const JOB: &str = "ctr-k8s";
/// Its rows.
pub const ROWS: u64 = 240_000;
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

/// What a run of the example's Job measured.
#[derive(Debug, Clone, Default)]
pub struct ExampleRun {
    /// Samples trained.
    pub samples: u64,
    /// Seconds from the master starting the Job to its end, as the master recorded them.
    pub seconds: f64,
    /// Its progressive AUC.
    pub auc: f64,
    /// The nodes each executor's pods ran on (empty on the local backend).
    pub pods: BTreeMap<String, BTreeSet<String>>,
    /// Seconds from each pod's first sight to its first sight Ready (polled every 250 ms
    /// from the moment the example is applied).
    pub pod_start_s: Vec<f64>,
}

impl ExampleRun {
    /// Asserts that each of the example's six executors ran as a pod of its own and that
    /// the pods ran on both nodes; the nodes.
    pub fn assert_pods_on_both_nodes(&self) -> BTreeSet<String> {
        let executors: Vec<&str> = self.pods.keys().map(String::as_str).collect();
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
        let nodes: BTreeSet<String> = self.pods.values().flatten().cloned().collect();
        assert_eq!(
            nodes.len(),
            2,
            "the Job's pods ran on both nodes: {:?}",
            self.pods
        );
        nodes
    }
}

/// Applies the deployment's example (`k8s/example`, or `k8s/example-operator`) and follows its Job to Succeeded, watching its pods from the
/// moment the example is applied; fails with the cluster's diagnostics when its data step
/// or the Job fails.
pub async fn run_on_kubernetes(deployment: &KubeDeployment) -> ExampleRun {
    let cluster = deployment.cluster;
    let example = deployment.example_applied().display().to_string();
    cluster
        .kubectl_run(&["apply", "-k", &example])
        .unwrap_or_else(|e| panic!("kubectl apply -k {example}: {e}"));
    let mut run = ExampleRun::default();
    let mut first_seen: BTreeMap<String, Instant> = BTreeMap::new();
    let mut ready: BTreeSet<String> = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(1200);
    let mut applied = false;
    let status = loop {
        for pod in deployment.job_pods(JOB) {
            let seen = *first_seen
                .entry(pod.uid.clone())
                .or_insert_with(Instant::now);
            if pod.ready && ready.insert(pod.uid.clone()) {
                run.pod_start_s.push(seen.elapsed().as_secs_f64());
            }
            run.pods.entry(pod.executor).or_default().insert(pod.node);
        }
        // The example's own Kubernetes Job writes the data, then applies the Job.
        applied = applied || example_step_done(deployment);
        if applied {
            let status = deployment.status(JOB).await;
            if status.phase == Phase::Succeeded {
                break status;
            }
            assert!(
                !status.phase.is_terminal(),
                "{JOB} is {:?}: {status:#?}\n{}",
                status.phase,
                cluster.diagnostics(NAMESPACE)
            );
        }
        assert!(
            Instant::now() < deadline,
            "{JOB} not Succeeded within 20 minutes\n{}",
            cluster.diagnostics(NAMESPACE)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    run.seconds = job_seconds(&status);
    let progress = status.progress.expect("progress");
    run.samples = progress.samples;
    run.auc = progress.auc.expect("an AUC");
    run
}

/// Whether `k8s/example`'s data and apply step completed; fails when it failed for good.
fn example_step_done(deployment: &KubeDeployment) -> bool {
    let state = deployment
        .cluster
        .kubectl_run(&[
            "-n",
            NAMESPACE,
            "get",
            "job/example-ctr-k8s",
            "-o",
            "jsonpath={.status.succeeded}/{.status.failed}",
        ])
        .unwrap_or_default();
    let (succeeded, failed) = state.trim().split_once('/').unwrap_or(("", ""));
    assert!(
        failed.parse::<u32>().unwrap_or(0) < 3,
        "the example's data and apply step failed: {state}\n{}",
        deployment.cluster.diagnostics(NAMESPACE)
    );
    succeeded == "1"
}

/// Seconds from the master starting the Job (its `Scheduled` condition) to its end (its
/// `Complete` condition), as the master recorded them.
pub(crate) fn job_seconds(status: &primus_spec::status::Status) -> f64 {
    let at = |kind: &str| {
        (status.conditions.iter())
            .find(|c| c.kind == kind)
            .map_or(0, |c| c.last_transition_unix_ms)
    };
    (at("Complete") - at("Scheduled")) as f64 / 1e3
}

/// The same Dataset and Job on the local backend (`primus up`'s), over the same rows on
/// local files.
pub async fn run_locally() -> ExampleRun {
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
    let seconds = job_seconds(&status);
    let progress = status.progress.expect("progress");
    ExampleRun {
        samples: progress.samples,
        seconds,
        auc: progress.auc.expect("an AUC"),
        ..ExampleRun::default()
    }
}

/// Predict over gRPC at the serving replica's pod address, for 16 samples.
pub async fn predict(deployment: &KubeDeployment) -> PredictResponse {
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
    serving
        .predict(PredictRequest {
            job: JOB.into(),
            samples,
        })
        .await
        .expect("Predict")
        .into_inner()
}

/// Deletes the Job (through the API server, or the PrimusJob), waits until no object of it
/// is left, and deletes the example.
pub async fn delete(deployment: &KubeDeployment) {
    deployment.delete_job(JOB).await;
    let example = deployment.example_applied().display().to_string();
    deployment
        .cluster
        .kubectl_run(&["delete", "-k", &example, "--wait=true"])
        .unwrap_or_else(|e| panic!("kubectl delete -k {example}: {e}"));
}
