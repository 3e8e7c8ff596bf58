//! What the master does to running Jobs works the same when they are custom resources: a
//! PrimusJob scaled with `kubectl patch` gets its new trainers, and a killed trainer under
//! `on_worker_failure: rollback` returns the Job to its latest checkpoint; the Job then
//! succeeds, its samples counting every row.

use std::time::Duration;

use primus_testkit::service::signal;
use serde_json::Value;

use super::crds::{cluster, has_condition, merge_patch, namespace};
use super::jobs::{executor_pid, running_job, wait_for, wait_for_success};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_scaled_with_kubectl_and_rolled_back_after_a_killed_trainer_trains_every_row() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-elastic");
    let job = "ctr-elastic";
    let rollback = |object: &mut Value| {
        object["spec"]["checkpoint"]["on_worker_failure"] = "rollback".into();
    };
    let (sandbox, master) = running_job(cluster, namespace, job, rollback).await;

    let patch = r#"{"spec":{"topology":{"trainers":{"replicas":2}}}}"#;
    merge_patch(cluster, namespace, "pjob", job, patch);
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
