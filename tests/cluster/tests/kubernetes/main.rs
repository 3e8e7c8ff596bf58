//! k8s/ on a real two-node cluster, applied with kustomize as a user applies it: the
//! example Job, faults, and what the cluster's own tools do to a Job. The tests share one
//! cluster and one deployment and run one at a time.

mod example;
mod faults;

use tokio::sync::Mutex;

/// One test at a time on the shared deployment: two nodes of two CPUs hold one Job.
static SERIAL: Mutex<()> = Mutex::const_new(());
