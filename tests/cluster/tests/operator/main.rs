//! Jobs, Datasets and Metrics as Kubernetes custom resources on the testkit's real
//! two-node cluster (and k8s/overlays/operator deployed to it). Every test's path starts with `operator::`, so that
//! `cargo test --workspace operator` runs them.

mod operator {
    mod crds;
    mod dashboard;
    mod elastic;
    mod example;
    mod jobs;
    mod kueue;
}
