//! The Kubernetes deployment on this machine: `k8s/example` on the testkit's two-node
//! cluster (real kubelets and containers, tier a) next to the same Job on the local backend
//! in the same run, how long the Job's pods take from creation to Ready, and how long the
//! Job takes to train on after a PS shard's pod is killed and after a node is lost, with the
//! rows lost and trained twice counted row by row; then deploy/docker-compose.yaml's example
//! Job on the testkit's Docker engine, which must succeed.
//!
//! `cargo bench -p primus-benches --bench cluster` (after `./scripts/install-deps.sh`).

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use primus_cluster_tests::KubeDeployment;
use primus_cluster_tests::compose::ComposeDeployment;
use primus_cluster_tests::example::{self, ExampleRun};
use primus_cluster_tests::faults::{self, Fault};

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(bench());
}

async fn bench() {
    let local = example::run_locally().await;
    let deployment = KubeDeployment::shared();
    let kubernetes = example::run_on_kubernetes(deployment).await;
    example::delete(deployment).await;
    faults::prepare(deployment).await;
    let ps = faults::run(deployment, Fault::PsPodDeleted, faults::ROWS / 3).await;
    let node = faults::run(deployment, Fault::NodeLost, faults::ROWS / 3).await;
    let compose = ComposeDeployment::up().unwrap_or_else(|e| panic!("docker-compose up: {e}"));
    let (composed, _) = compose.run_example().await;
    compose.down();

    let rate = |run: &ExampleRun| run.samples as f64 / run.seconds;
    println!(
        "{:<34} {:>9} {:>9} {:>12} {:>7}",
        "run", "samples", "seconds", "samples/s", "AUC"
    );
    for (name, run) in [
        ("k8s/example, local backend", &local),
        ("k8s/example, kubernetes", &kubernetes),
        ("compose example, docker-compose", &composed),
    ] {
        println!(
            "{name:<34} {:>9} {:>9.1} {:>12.0} {:>7.4}",
            run.samples,
            run.seconds,
            rate(run),
            run.auc
        );
    }
    let nodes: std::collections::BTreeSet<&String> = kubernetes.pods.values().flatten().collect();
    let mut starts = kubernetes.pod_start_s.clone();
    starts.sort_by(f64::total_cmp);
    let p50 = starts.get(starts.len() / 2).copied().unwrap_or(f64::NAN);
    println!(
        "pods: {} executors on {nodes:?}, start to Ready {starts:.1?} s",
        kubernetes.pods.len()
    );
    for outcome in [&ps, &node] {
        println!("{}", outcome.row(44));
    }
    let recovered = |o: &primus_chaos::Outcome| o.recovered_s.unwrap_or(f64::NAN);
    println!(
        "cluster: kubernetes example {:.0} samples/s vs local {:.0} samples/s (tier a, {} nodes), \
         pod start p50 {p50:.1} s, recovery after a PS pod kill {:.1} s, after a node loss {:.1} s, \
         {} lost, {} duplicated; compose Succeeded",
        rate(&kubernetes),
        rate(&local),
        deployment.cluster.node_names().len(),
        recovered(&ps),
        recovered(&node),
        ps.lost + node.lost,
        ps.duplicated + node.duplicated,
    );
}
