//! k8s/overlays/operator (the master in the cluster, taking its Jobs from PrimusJobs under
//! its own RBAC) and k8s/example-operator (the example's Dataset and Job applied as custom
//! resources by `primus --kubernetes apply` under a service account of its own) on the
//! real two-node cluster: the Job runs every executor as a pod across both nodes and
//! succeeds, and the API server's dashboard shows it from the custom resource; deleting
//! the PrimusJob leaves no object of it behind.

use primus_cluster_tests::example::{self, JOB, ROWS};
use primus_cluster_tests::{DEV_TOKEN, KubeDeployment, NAMESPACE, service_ip};
use primus_testkit::service::http_request;
use serde_json::Value;

use super::crds::kubectl;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_applied_as_custom_resources_runs_as_pods_on_both_nodes() {
    let deployment = KubeDeployment::operator();
    deployment.delete_left_jobs().await;
    let run = example::run_on_kubernetes(deployment).await;
    let nodes = run.assert_pods_on_both_nodes();
    assert_eq!(run.samples, ROWS, "{run:?}");
    // The data's best AUC is about 0.80; a model that learned nothing scores 0.5.
    assert!(run.auc > 0.7, "{run:?}");
    eprintln!(
        "k8s/example-operator: {} samples in {:.0}s, AUC {:.4}, pods on {nodes:?}",
        run.samples, run.seconds, run.auc
    );

    let cluster = deployment.cluster;
    let job = kubectl(
        cluster,
        &["get", "primusjob", JOB, "-n", NAMESPACE, "-o", "json"],
    );
    let job: Value = serde_json::from_str(&job).expect("kubectl's JSON");
    assert_eq!(job["metadata"]["finalizers"][0], "primus.dev/master");
    let selector = format!("involvedObject.name={JOB}");
    let events = kubectl(
        cluster,
        &[
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            &selector,
            "-o",
            "name",
        ],
    );
    assert!(
        !events.trim().is_empty(),
        "the in-cluster master recorded Events on {JOB}"
    );
    // The API server's dashboard shows the custom resource, read with its own identity.
    let api = service_ip(cluster, "api-server").expect("the API server's Service");
    let bearer = format!("Bearer {DEV_TOKEN}");
    let (status, body) = http_request(
        &format!("{api}:8080"),
        "GET",
        &format!("/api/v1/Job/{JOB}"),
        &[("authorization", &bearer)],
        "",
    )
    .await
    .expect("the dashboard answers");
    let shown: Value = serde_json::from_str(&body).expect("the dashboard's JSON");
    assert_eq!(
        (status, shown["status"]["phase"].as_str()),
        (200, Some("Succeeded")),
        "{body}"
    );

    example::delete(deployment).await;
}
