//! Kueue admitting PrimusJobs: the real Kueue controller manager (v0.17.0, built by
//! `scripts/install-cluster-tools.sh`) against the test cluster, a ClusterQueue whose quota
//! holds one Job, and two Jobs created suspended in its LocalQueue: the first is admitted
//! and runs, the second waits until the first finished and gave its quota back, then is
//! admitted and runs too; a third, evicted while it runs (its Workload deactivated), stops
//! and gives its quota back, and runs to the end once active and admitted again. The
//! master (outside the cluster, on the local backend) makes each Job's Workload, resumes
//! it once admitted, stops it when evicted and marks it Finished at its end.

use std::time::Duration;

use primus_harness::{MasterProcess, Sandbox};
use primus_spec::job::parse_memory;
use primus_testkit::kube::{KubeCluster, Kueue};
use serde_json::{Value, json};

use super::crds::{apply, cluster, get_json, has_condition, kubectl, merge_patch, namespace};
use super::jobs::{criteo_job, operator_settings, wait_for, wait_for_success};

const QUEUE: &str = "operator-queue";

/// CPU cores and memory bytes a Job's executors request in all.
fn requests(job: &Value) -> (f64, u64) {
    let topology = &job["spec"]["topology"];
    let roles = ["ps", "data_executors", "trainers", "serving"];
    (roles.iter().map(|r| &topology[*r]))
        .filter(|role| !role.is_null())
        .fold((0.0, 0), |(cpu, memory), role| {
            let replicas = role["replicas"].as_u64().unwrap_or(0);
            let each = parse_memory(role["memory"].as_str().unwrap_or("0")).expect("a quantity");
            (
                cpu + role["cpu"].as_f64().unwrap_or(0.0) * replicas as f64,
                memory + each * replicas,
            )
        })
}

/// A flavor, a ClusterQueue of `cpu` cores and `memory` bytes, and its LocalQueue.
fn queues(cluster: &KubeCluster, namespace: &str, cpu: f64, memory: u64) {
    let objects = [
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": "operator-flavor"}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "operator-cq"},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory"],
            "flavors": [{"name": "operator-flavor", "resources": [
                {"name": "cpu", "nominalQuota": format!("{}m", (cpu * 1000.0) as u64)},
                {"name": "memory", "nominalQuota": memory.to_string()},
            ]}],
        }]}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": QUEUE, "namespace": namespace},
               "spec": {"clusterQueue": "operator-cq"}}),
    ];
    apply(cluster, namespace, &objects, &[]).unwrap_or_else(|e| panic!("Kueue's queues: {e}"));
}

fn workload(cluster: &KubeCluster, namespace: &str, job: &str) -> Option<Value> {
    let name = format!("primusjob-{job}");
    let found = cluster.kubectl_run(&[
        "get",
        "workloads.kueue.x-k8s.io",
        &name,
        "-n",
        namespace,
        "-o",
        "json",
    ]);
    found.ok().and_then(|text| serde_json::from_str(&text).ok())
}

fn condition(object: &Value, kind: &str) -> Option<String> {
    (object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten())
    .find(|c| c["type"] == kind)
    .and_then(|c| c["status"].as_str().map(str::to_owned))
}

/// When the master recorded condition `kind` of Job `object` (Unix milliseconds).
fn condition_at(object: &Value, kind: &str) -> i64 {
    (object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten())
    .find(|c| c["type"] == kind)
    .and_then(|c| c["last_transition_unix_ms"].as_i64())
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_admits_two_queued_jobs_in_turn_within_its_quota() {
    let cluster = cluster();
    let _kueue = Kueue::start(cluster).unwrap_or_else(|e| panic!("Kueue: {e}"));
    let namespace = namespace(cluster, "operator-kueue");
    let sandbox = Sandbox::start().await;
    let mut settings = operator_settings(&sandbox, cluster, namespace);
    // Each Parquet read waits 1.5 s: the first Job runs while the second waits.
    settings.master.fault_injection.data_read_delay_ms = 1_500;
    let master = MasterProcess::start(&sandbox, &settings, &[]);

    let mut jobs = Vec::new();
    for name in ["kq-first", "kq-second"] {
        let [dataset, mut job] = criteo_job(&sandbox, name).await;
        job["spec"]["suspend"] = true.into();
        job["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": QUEUE});
        jobs.push((name, dataset, job));
    }
    let (cpu, memory) = requests(&jobs[0].2);
    queues(cluster, namespace, cpu * 1.5, memory * 3 / 2);

    let (first, dataset, job) = &jobs[0];
    apply(cluster, namespace, &[dataset.clone(), job.clone()], &[])
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for(
        cluster,
        namespace,
        first,
        Duration::from_secs(120),
        &sandbox,
        |o| o["status"]["progress"]["samples"].as_u64().unwrap_or(0) > 0,
    );
    let admitted = workload(cluster, namespace, first).expect("the first Job's Workload");
    assert_eq!(
        condition(&admitted, "Admitted").as_deref(),
        Some("True"),
        "{admitted:#}"
    );

    let (second, _, job) = &jobs[1];
    apply(cluster, namespace, std::slice::from_ref(job), &[]).unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let waiting = workload(cluster, namespace, second).expect("the second Job's Workload");
    assert_eq!(
        condition(&waiting, "QuotaReserved").as_deref(),
        Some("False"),
        "{waiting:#}"
    );
    let held = get_json(cluster, namespace, "primusjob", second);
    assert_eq!(held["spec"]["suspend"], true, "{held:#}");
    assert!(
        has_condition(&held, "Suspended"),
        "the second Job waits suspended: {:#}",
        held["status"]
    );

    let done_first = wait_for_success(cluster, namespace, first, &sandbox);
    let done_second = wait_for_success(cluster, namespace, second, &sandbox);
    assert!(
        condition_at(&done_second, "Scheduled") >= condition_at(&done_first, "Complete"),
        "the second Job started only once the first had ended:\n{:#}\n{:#}",
        done_first["status"]["conditions"],
        done_second["status"]["conditions"]
    );
    let finished = workload(cluster, namespace, first).expect("the first Job's Workload");
    assert_eq!(
        condition(&finished, "Finished").as_deref(),
        Some("True"),
        "{finished:#}"
    );
    let events = kubectl(cluster, &["get", "events", "-n", namespace, "-o", "name"]);
    assert!(!events.is_empty());

    evicted_then_admitted_again(cluster, namespace, &sandbox).await;
    master.stop();
}

/// `spec.active` of Job `job`'s Workload (Kueue evicts an inactive Workload).
fn set_active(cluster: &KubeCluster, namespace: &str, job: &str, active: bool) {
    let patch = format!(r#"{{"spec":{{"active":{active}}}}}"#);
    let name = format!("primusjob-{job}");
    merge_patch(
        cluster,
        namespace,
        "workloads.kueue.x-k8s.io",
        &name,
        &patch,
    );
}

/// A running Job whose Workload Kueue evicts (deactivated) stops and gives its quota back;
/// activated again, Kueue admits it again and it runs to the end.
async fn evicted_then_admitted_again(cluster: &KubeCluster, namespace: &str, sandbox: &Sandbox) {
    let job = "kq-evicted";
    let [_, mut object] = criteo_job(sandbox, job).await;
    object["spec"]["suspend"] = true.into();
    object["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": QUEUE});
    apply(cluster, namespace, &[object], &[]).unwrap_or_else(|e| panic!("{e}"));
    let running = |o: &Value| o["status"]["progress"]["samples"].as_u64().unwrap_or(0) > 0;
    wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(120),
        sandbox,
        running,
    );

    set_active(cluster, namespace, job, false);
    let stopped = wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(120),
        sandbox,
        |o| has_condition(o, "Suspended"),
    );
    assert_eq!(stopped["spec"]["suspend"], true, "{stopped:#}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let released = workload(cluster, namespace, job).expect("the Workload");
        if condition(&released, "QuotaReserved").as_deref() == Some("False") {
            assert!(released["status"]["admission"].is_null(), "{released:#}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the quota stays held: {released:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let selector = format!("involvedObject.name={job},reason=Evicted");
    let evicted = kubectl(
        cluster,
        &[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &selector,
            "-o",
            "name",
        ],
    );
    assert!(!evicted.trim().is_empty(), "an Evicted event on {job}");

    set_active(cluster, namespace, job, true);
    wait_for_success(cluster, namespace, job, sandbox);
    let admitted = workload(cluster, namespace, job).expect("the Workload");
    assert_eq!(
        condition(&admitted, "Finished").as_deref(),
        Some("True"),
        "{admitted:#}"
    );
}
