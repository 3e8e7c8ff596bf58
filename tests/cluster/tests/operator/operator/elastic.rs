//! What the master does to running Jobs works the same when they are custom resources: a
//! PrimusJob scaled with `kubectl patch` gets its new trainers, and a killed trainer under
//! `on_worker_failure: rollback` returns the Job to its latest checkpoint; the Job then
//! succeeds, its samples counting every row.

use std::time::Duration;

use primus_harness::{MasterProcess, Sandbox};
use primus_testkit::service::signal;
use serde_json::Value;

use super::crds::{apply, cluster, kubectl, namespace};
use super::jobs::{criteo_job, executor_pid, operator_settings, wait_for, wait_for_success};

fn has_condition(object: &Value, kind: &str) -> bool {
    (object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten())
    .any(|c| c["type"] == kind && c["status"] == true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_scaled_with_kubectl_and_rolled_back_after_a_killed_trainer_trains_every_row() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-elastic");
    let sandbox = Sandbox::start().await;
    let mut settings = operator_settings(&sandbox, cluster, namespace);
    // Each Parquet read waits 2 s: the Job runs long enough to be scaled and rolled back.
    settings.master.fault_injection.data_read_delay_ms = 2_000;
    let master = MasterProcess::start(&sandbox, &settings, &[]);
    let job = "ctr-elastic";
    let [dataset, mut object] = criteo_job(&sandbox, job).await;
    object["spec"]["checkpoint"]["interval_seconds"] = 2.into();
    object["spec"]["checkpoint"]["on_worker_failure"] = "rollback".into();
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

    let patch = r#"{"spec":{"topology":{"trainers":{"replicas":2}}}}"#;
    kubectl(
        cluster,
        &[
            "patch",
            "pjob",
            job,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            patch,
        ],
    );
    let two = |o: &Value| o["status"]["replicas"]["trainers"] == 2;
    wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(60),
        &sandbox,
        two,
    );

    let checkpointed = |o: &Value| has_condition(o, "Checkpoint");
    wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(60),
        &sandbox,
        checkpointed,
    );
    let trainer = executor_pid(&sandbox, job, "trainer-0");
    signal(trainer, "KILL").expect("SIGKILL trainer-0");
    let rolled_back = |o: &Value| has_condition(o, "RolledBack");
    wait_for(
        cluster,
        namespace,
        job,
        Duration::from_secs(60),
        &sandbox,
        rolled_back,
    );

    let done = wait_for_success(cluster, namespace, job, &sandbox);
    assert_eq!(
        done["status"]["replicas"]["trainers"], 2,
        "{:#}",
        done["status"]
    );
    master.stop();
}
