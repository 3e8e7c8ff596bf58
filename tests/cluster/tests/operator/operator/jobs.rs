//! The master as the operator of PrimusJobs (`master.resources: kubernetes`) against the
//! test cluster's real API server: a Job applied with kubectl runs to Succeeded with its
//! status, columns, PrimusMetric and Events in Kubernetes; a Job deleted while it runs
//! is held by the master's finalizer until its executors are stopped. The executors run
//! on the local backend (processes beside the master): which backend runs them is the
//! master's other, independent choice.

use std::time::{Duration, Instant};

use primus_config::{MasterSettings, ResourceSource};
use primus_harness::criteo::{dlrm_job, write_criteo_rows};
use primus_harness::resources::{dataset, hourly, parquet};
use primus_harness::{MasterProcess, Sandbox};
use primus_kube_resources::convert::custom_resource;
use primus_testkit::kube::KubeCluster;
use serde_json::Value;

use super::crds::{
    apply, cluster, get_json, has_condition, kubectl, merge_patch, namespace, primus,
};

const ROWS: u64 = primus_harness::criteo::DLRM_ROWS_PER_HOUR as u64;

/// Dataset `criteo` (one hour of rows under the sandbox) and DLRM Job `job` on it, as
/// custom resources.
pub(super) async fn criteo_job(sandbox: &Sandbox, job: &str) -> [Value; 2] {
    write_criteo_rows(sandbox, 1).await;
    let data = sandbox.dir().join("criteo");
    let criteo = dataset("criteo")
        .schema(primus_datagen::criteo::feature_schema("categorical"))
        .stream(
            "clicks",
            hourly("2026-11-01T00", Some("2026-11-01T01")),
            vec![parquet("criteo", data.display())],
        )
        .build();
    let job = dlrm_job(sandbox, job, 1, 3600).batch_size(512).build();
    [criteo, job].map(|r| custom_resource(&r, None).expect("a custom resource"))
}

/// A master of `sandbox` taking its Jobs from `namespace` of `cluster`.
pub(super) fn operator_settings(
    sandbox: &Sandbox,
    cluster: &KubeCluster,
    namespace: &str,
) -> MasterSettings {
    let mut settings = sandbox.master_settings();
    settings.master.resources = ResourceSource::Kubernetes;
    settings.kubernetes.kubeconfig = Some(cluster.kubeconfig());
    settings.kubernetes.namespace = Some(namespace.into());
    settings
}

/// Waits up to `timeout` until `done` holds for PrimusJob `job` as kubectl reads it.
pub(super) fn wait_for(
    cluster: &KubeCluster,
    namespace: &str,
    job: &str,
    timeout: Duration,
    sandbox: &Sandbox,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let object = get_json(cluster, namespace, "primusjob", job);
        if done(&object) {
            return object;
        }
        assert!(
            Instant::now() < deadline,
            "{job}: {:#}\n{}",
            object["status"],
            sandbox.logs(job)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits up to 5 minutes for PrimusJob `job` to succeed having trained every row; its
/// object as kubectl read it then.
pub(super) fn wait_for_success(
    cluster: &KubeCluster,
    namespace: &str,
    job: &str,
    sandbox: &Sandbox,
) -> Value {
    let done = wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(300),
        sandbox,
        |o| o["status"]["phase"] == "Succeeded",
    );
    assert_eq!(
        done["status"]["progress"]["samples"], ROWS,
        "{job}: {:#}",
        done["status"]
    );
    done
}

/// Sets PrimusJob `job`'s `spec.suspend` with `kubectl patch`.
fn set_suspend(cluster: &KubeCluster, namespace: &str, job: &str, suspend: bool) {
    let patch = format!(r#"{{"spec":{{"suspend":{suspend}}}}}"#);
    merge_patch(cluster, namespace, "pjob", job, &patch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_applied_with_kubectl_runs_to_succeeded_with_its_status_metric_and_events() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-jobs");
    let sandbox = Sandbox::start().await;
    let master = MasterProcess::start(
        &sandbox,
        &operator_settings(&sandbox, cluster, namespace),
        &[],
    );
    let job = "ctr-operator";
    apply(cluster, namespace, &criteo_job(&sandbox, job).await, &[])
        .unwrap_or_else(|e| panic!("{e}"));

    let running = wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(60),
        &sandbox,
        |o| {
            o["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
        },
    );
    assert_eq!(running["metadata"]["finalizers"][0], "primus.dev/master");
    let done = wait_for_success(cluster, namespace, job, &sandbox);
    assert_eq!(done["status"]["observed_generation"], 1);
    let row = kubectl(
        cluster,
        &["get", "pjob", job, "-n", namespace, "--no-headers"],
    );
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[..4],
        [job, "Succeeded", "1", &ROWS.to_string()],
        "{row}"
    );

    // The CLI reads the same custom resource.
    let listed = primus(cluster, namespace, &["get", "jobs"]).unwrap_or_else(|e| panic!("{e}"));
    let line = listed
        .lines()
        .find(|l| l.starts_with(job))
        .unwrap_or_default();
    let cells: Vec<&str> = line.split_whitespace().collect();
    let auc = done["status"]["progress"]["auc"].as_f64().expect("an AUC");
    assert_eq!(
        cells.get(1..6),
        Some(
            &[
                "Succeeded",
                "batch",
                "100.0%",
                cells[4],
                &format!("{auc:.4}")
            ][..]
        ),
        "{listed}"
    );

    let metric = get_json(cluster, namespace, "primusmetric", job);
    assert_eq!(metric["spec"]["job"], job);
    assert!(
        (metric["spec"]["series"].as_array()).is_some_and(|s| !s.is_empty()),
        "{metric:#}"
    );
    assert_eq!(
        metric["metadata"]["ownerReferences"][0]["uid"],
        done["metadata"]["uid"]
    );

    let selector = format!("involvedObject.name={job}");
    let events = kubectl(
        cluster,
        &[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &selector,
            "-o",
            "json",
        ],
    );
    let events: Value = serde_json::from_str(&events).expect("kubectl's JSON");
    let reasons: Vec<&str> = (events["items"].as_array().into_iter().flatten())
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(
        !reasons.is_empty(),
        "Events recorded on the Job: {events:#}"
    );
    eprintln!("{job}: {row}; Events: {reasons:?}");

    // Deleting it lets the finalizer go and the garbage collector takes its Metric.
    kubectl(
        cluster,
        &["delete", "pjob", job, "-n", namespace, "--timeout=60s"],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster
        .kubectl_run(&["get", "pmetric", job, "-n", namespace])
        .is_ok()
    {
        assert!(Instant::now() < deadline, "the Metric outlived its Job");
        std::thread::sleep(Duration::from_millis(500));
    }
    master.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_deleted_while_it_runs_is_held_until_its_executors_are_stopped() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-delete");
    let sandbox = Sandbox::start().await;
    let master = MasterProcess::start(
        &sandbox,
        &operator_settings(&sandbox, cluster, namespace),
        &[],
    );
    let job = "ctr-deleted";
    apply(cluster, namespace, &criteo_job(&sandbox, job).await, &[])
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(120),
        &sandbox,
        |o| o["status"]["progress"]["samples"].as_u64().unwrap_or(0) > 0,
    );
    let started = Instant::now();
    kubectl(
        cluster,
        &["delete", "pjob", job, "-n", namespace, "--timeout=60s"],
    );
    eprintln!("{job}: deleted in {:.1}s", started.elapsed().as_secs_f64());
    // The finalizer's removal is logged after the API server accepted it, so the line
    // may reach the file a moment after `kubectl delete` returned.
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = std::fs::read_to_string(sandbox.dir().join("master.log")).unwrap_or_default();
        if log.contains("the master's finalizer removed") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stopped = log.find("Job deleted: executors stopped");
    let released = log.find("the master's finalizer removed");
    assert!(
        released.is_some(),
        "the finalizer's removal was never logged:\n{}",
        sandbox.logs(job)
    );
    assert!(
        stopped.is_some() && stopped < released,
        "the finalizer goes only after the executors stopped:\n{}",
        sandbox.logs(job)
    );
    master.stop();
}

/// The holder of Lease `name` in `namespace`.
fn lease_holder(cluster: &KubeCluster, namespace: &str, name: &str) -> String {
    let path = "jsonpath={.spec.holderIdentity}";
    kubectl(
        cluster,
        &["get", "lease", name, "-n", namespace, "-o", path],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_master_waits_for_the_lease_and_a_restarted_one_takes_it_over_mid_job() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-lease");
    let sandbox = Sandbox::start().await;
    let mut settings = operator_settings(&sandbox, cluster, namespace);
    settings.kubernetes.lease_duration_ms = 3_000;
    // Each Parquet read (7 row groups) waits 4 s: the Job is mid-way throughout.
    settings.master.fault_injection.data_read_delay_ms = 4_000;
    let mut master = MasterProcess::start(&sandbox, &settings, &[]);
    let job = "ctr-lease";
    let [dataset, mut job_object] = criteo_job(&sandbox, job).await;
    job_object["spec"]["checkpoint"]["interval_seconds"] = 2.into();
    apply(cluster, namespace, &[dataset, job_object], &[]).unwrap_or_else(|e| panic!("{e}"));
    wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(120),
        &sandbox,
        |o| o["status"]["progress"]["samples"].as_u64().unwrap_or(0) > 0,
    );
    let lease = "primus-master-0-of-1";
    let first = lease_holder(cluster, namespace, lease);
    assert!(first.starts_with(master.addr()), "{first}");

    // A second master of the same shard (its executors in a folder of its own) waits.
    let mut second_settings = settings.clone();
    second_settings.server.grpc_addr =
        ([127, 0, 0, 1], primus_testkit::free_port().expect("port")).into();
    second_settings.local.work_dir = sandbox.dir().join("second-work");
    let second = MasterProcess::start_as(&sandbox, "second-master", &second_settings, &[]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let log = std::fs::read_to_string(sandbox.dir().join("second-master.log")).unwrap_or_default();
    assert!(log.contains("waiting for the shard's Lease"), "{log}");
    assert!(
        !log.contains("executor started"),
        "the second master drove nothing:\n{log}"
    );
    assert_eq!(lease_holder(cluster, namespace, lease), first);
    second.stop();

    // The first master killed mid-Job, another started in its place takes the Lease over
    // once it expires, and finishes the Job from its checkpoint.
    let at_kill = get_json(cluster, namespace, "primusjob", job);
    assert_ne!(
        at_kill["status"]["phase"], "Succeeded",
        "the Job was mid-way: {:#}",
        at_kill["status"]
    );
    master.kill_and_start(&sandbox, &settings, &[]);
    wait_for_success(cluster, namespace, job, &sandbox);
    let next = lease_holder(cluster, namespace, lease);
    assert!(
        next != first && next.starts_with(master.addr()),
        "{first} -> {next}"
    );
    let log = std::fs::read_to_string(sandbox.dir().join("master.log")).unwrap_or_default();
    assert!(log.contains("acquired the shard's Lease"), "{log}");
    master.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_created_suspended_runs_nothing_until_resumed_then_succeeds() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-suspend");
    let sandbox = Sandbox::start().await;
    let master = MasterProcess::start(
        &sandbox,
        &operator_settings(&sandbox, cluster, namespace),
        &[],
    );
    let job = "ctr-suspended";
    let [dataset, mut job_object] = criteo_job(&sandbox, job).await;
    job_object["spec"]["suspend"] = true.into();
    apply(cluster, namespace, &[dataset, job_object], &[]).unwrap_or_else(|e| panic!("{e}"));
    let held = wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(60),
        &sandbox,
        |o| has_condition(o, "Suspended"),
    );
    assert_eq!(held["status"]["phase"], "Pending", "{:#}", held["status"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = std::fs::read_to_string(sandbox.dir().join("master.log")).unwrap_or_default();
    assert!(
        !log.contains("executor started"),
        "a suspended Job started executors:\n{log}"
    );

    set_suspend(cluster, namespace, job, false);
    let done = wait_for_success(cluster, namespace, job, &sandbox);
    let conditions = done["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let suspended = conditions.iter().find(|c| c["type"] == "Suspended");
    assert_eq!(
        suspended.map(|c| &c["status"]),
        Some(&Value::Bool(false)),
        "{conditions:#?}"
    );
    master.stop();
}

/// A Job name of shard `i` of `n` (the CRC-32 of the name, as `master.shard` documents).
fn job_of_shard(prefix: &str, (i, n): (u32, u32)) -> String {
    (0..)
        .map(|k| format!("{prefix}-{k}"))
        .find(|name| crc32fast::hash(name.as_bytes()) % n == i)
        .expect("a name of the shard")
}

/// The Jobs a master's log says it started executors of, among `jobs`.
fn driven(log: &str, jobs: &[&str]) -> Vec<String> {
    let started: Vec<String> = (log.lines())
        .filter(|line| line.contains("executor started"))
        .map(without_colours)
        .collect();
    (jobs.iter())
        .filter(|job| {
            started
                .iter()
                .any(|line| line.contains(&format!("job={job} ")))
        })
        .map(|job| job.to_string())
        .collect()
}

/// A log line without its terminal colour codes (`ESC [ ... m`).
fn without_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            plain.push(c);
        }
    }
    plain
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_masters_each_drive_only_the_jobs_of_their_share() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-shards");
    let sandbox = Sandbox::start().await;
    let mut first = operator_settings(&sandbox, cluster, namespace);
    first.master.shard = "0/2".into();
    let mut second = first.clone();
    second.master.shard = "1/2".into();
    second.server.grpc_addr = ([127, 0, 0, 1], primus_testkit::free_port().expect("port")).into();
    second.local.work_dir = sandbox.dir().join("second-work");
    let masters = [
        MasterProcess::start(&sandbox, &first, &[]),
        MasterProcess::start_as(&sandbox, "second-master", &second, &[]),
    ];
    let jobs = [
        job_of_shard("ctr-shard", (0, 2)),
        job_of_shard("ctr-shard", (1, 2)),
    ];
    for job in &jobs {
        apply(cluster, namespace, &criteo_job(&sandbox, job).await, &[])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for job in &jobs {
        wait_for_success(cluster, namespace, job, &sandbox);
    }
    let names: Vec<&str> = jobs.iter().map(String::as_str).collect();
    for (log, job) in [("master.log", &jobs[0]), ("second-master.log", &jobs[1])] {
        let text = std::fs::read_to_string(sandbox.dir().join(log)).unwrap_or_default();
        assert_eq!(
            driven(&text, &names),
            std::slice::from_ref(job),
            "{log}:\n{text}"
        );
    }
    let holders: Vec<String> = ["primus-master-0-of-2", "primus-master-1-of-2"]
        .map(|lease| lease_holder(cluster, namespace, lease))
        .to_vec();
    for (holder, master) in holders.iter().zip(&masters) {
        assert!(holder.starts_with(master.addr()), "{holders:?}");
    }
    for master in masters {
        master.stop();
    }
}

/// The PIDs of Job `job`'s executor processes as its master's local backend recorded them.
/// The process of executor `id` of `job` (its PID file's first line).
pub(super) fn executor_pid(sandbox: &Sandbox, job: &str, id: &str) -> u32 {
    let file = sandbox.work_dir().join(job).join(format!("{id}.pid"));
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    (text
        .lines()
        .next()
        .and_then(|line| line.trim().parse().ok()))
    .unwrap_or_else(|| panic!("{}: no PID in {text:?}", file.display()))
}

fn executor_pids(sandbox: &Sandbox, job: &str) -> Vec<u32> {
    let files = std::fs::read_dir(sandbox.work_dir().join(job))
        .into_iter()
        .flatten()
        .flatten();
    (files.map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "pid"))
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .filter_map(|text| text.lines().next()?.trim().parse().ok())
        .collect()
}

/// A master of a fresh sandbox taking its Jobs from `namespace`, each Parquet read of it
/// waiting 2 s (a Job is mid-way for a while), and the DLRM Job `job` (a checkpoint every
/// 2 s, then `change`) applied and training.
pub(super) async fn running_job(
    cluster: &KubeCluster,
    namespace: &str,
    job: &str,
    change: impl FnOnce(&mut Value),
) -> (Sandbox, MasterProcess) {
    let sandbox = Sandbox::start().await;
    let mut settings = operator_settings(&sandbox, cluster, namespace);
    settings.master.fault_injection.data_read_delay_ms = 2_000;
    let master = MasterProcess::start(&sandbox, &settings, &[]);
    let [dataset, mut object] = criteo_job(&sandbox, job).await;
    object["spec"]["checkpoint"]["interval_seconds"] = 2.into();
    change(&mut object);
    apply(cluster, namespace, &[dataset, object], &[]).unwrap_or_else(|e| panic!("{e}"));
    let running = |o: &Value| o["status"]["progress"]["samples"].as_u64().unwrap_or(0) > 0;
    wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(120),
        &sandbox,
        running,
    );
    (sandbox, master)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_suspended_while_it_runs_stops_its_executors_and_resumes_to_succeed() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-suspend-running");
    let job = "ctr-pause";
    let (sandbox, master) = running_job(cluster, namespace, job, |_| {}).await;
    let pids = executor_pids(&sandbox, job);
    assert!(pids.len() >= 4, "the Job's executors: {pids:?}");

    set_suspend(cluster, namespace, job, true);
    let held = wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(60),
        &sandbox,
        |o| has_condition(o, "Suspended"),
    );
    assert_eq!(held["status"]["phase"], "Pending", "{:#}", held["status"]);
    let running: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|pid| primus_harness::alive(*pid))
        .collect();
    assert!(
        running.is_empty(),
        "executors still running while suspended: {running:?}"
    );

    set_suspend(cluster, namespace, job, false);
    wait_for_success(cluster, namespace, job, &sandbox);
    master.stop();
}
