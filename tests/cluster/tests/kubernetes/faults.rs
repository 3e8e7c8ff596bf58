//! Faults of the cluster, one per Job, each with 0 rows lost and 0 trained twice, counted
//! as the chaos suite counts them ([`primus_cluster_tests::faults`] says what each is).

use primus_chaos::Report;
use primus_cluster_tests::KubeDeployment;
use primus_cluster_tests::faults::{Fault, ROWS, prepare, run};

use crate::SERIAL;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::disallowed_methods,
    reason = "PRIMUS_CLUSTER_FAULT runs some faults alone"
)]
async fn every_fault_of_the_cluster_loses_and_repeats_no_row() {
    let _serial = SERIAL.lock().await;
    let deployment = KubeDeployment::shared();
    deployment.delete_left_jobs().await;
    prepare(deployment).await;
    let mut report = Report::default();
    // PRIMUS_CLUSTER_FAULT=<index>[,<index>...] runs those faults alone (Fault::ALL's
    // order), as one after another they meet the cluster.
    let only: Option<Vec<usize>> = std::env::var("PRIMUS_CLUSTER_FAULT").ok().map(|v| {
        (v.split(','))
            .map(|i| {
                i.trim()
                    .parse()
                    .expect("PRIMUS_CLUSTER_FAULT: fault indices")
            })
            .collect()
    });
    for (index, fault) in Fault::ALL.into_iter().enumerate() {
        if only.as_ref().is_some_and(|only| !only.contains(&index)) {
            continue;
        }
        // Between a third and two thirds of the rows, a different share for each fault.
        let at = ROWS / 3 + (index as u64 * ROWS / 15);
        let outcome = run(deployment, fault, at).await;
        eprintln!("{}", outcome.row(44));
        report.outcomes.push(outcome);
    }
    eprintln!("{}", report.table());
    assert_eq!(
        (report.lost(), report.duplicated()),
        (0, 0),
        "{}",
        report.table()
    );
}
