//! `kubectl apply -k k8s/example` after `k8s/overlays/dev`: its Job runs every PS shard,
//! data executor, trainer and serving replica as a pod of its own across both nodes,
//! succeeds with the AUC the same Job reaches on the local backend, its replica answers
//! Predict, and deleting the Job leaves no object of it behind.

use primus_cluster_tests::KubeDeployment;
use primus_cluster_tests::example::{self, ROWS};

use crate::SERIAL;

const MAX_AUC_DIFFERENCE: f64 = 0.02;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_job_runs_as_pods_on_both_nodes_as_it_does_locally() {
    let _serial = SERIAL.lock().await;
    let local = example::run_locally().await;
    assert_eq!(local.samples, ROWS, "{local:?}");

    let deployment = KubeDeployment::shared();
    deployment.delete_left_jobs().await;
    let run = example::run_on_kubernetes(deployment).await;
    let nodes = run.assert_pods_on_both_nodes();
    assert_eq!(run.samples, ROWS, "{run:?}");
    eprintln!(
        "k8s/example: {} samples in {:.0}s, AUC {:.4} (local backend {:.4}), pods on {nodes:?}",
        run.samples, run.seconds, run.auc, local.auc
    );
    assert!(
        (run.auc - local.auc).abs() <= MAX_AUC_DIFFERENCE,
        "AUC {:.4} on Kubernetes, {:.4} on the local backend",
        run.auc,
        local.auc
    );

    // The replica keeps serving the final model after the Job succeeded.
    let answer = example::predict(deployment).await;
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

    example::delete(deployment).await;
}
