//! A Job whose Dataset and checkpoints are on a real HDFS (a namenode and two datanodes,
//! replication 2, permissions on): its data executor reads the Parquet hours over the
//! HDFS RPC, its PS shards write checkpoints there, and it trains every row once.

use std::time::Duration;

use primus_config::StorageSettings;
use primus_harness::criteo::{
    DLRM_HOURS, DLRM_ROWS, apply_criteo_dataset_at, dlrm_job_checkpointed_at, write_criteo_rows_to,
};
use primus_harness::{Sandbox, condition};
use primus_spec::status::Phase;
use primus_testkit::Hdfs;

use crate::common::{data_executor, start_master_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlrm_job_reads_its_dataset_from_hdfs_and_checkpoints_there() {
    let hdfs = Hdfs::shared().expect("hdfs");
    let root = hdfs.folder("job").expect("folder");
    let data = format!("{root}/criteo");
    let location = primus_storage::open(&data, &StorageSettings::default()).expect("open");
    let best = write_criteo_rows_to(&location, DLRM_HOURS).await;

    let sandbox = Sandbox::start().await;
    apply_criteo_dataset_at(&sandbox, &data).await;
    let master = start_master_with(&sandbox, &data_executor());
    let checkpoints = format!("{root}/checkpoints/dlrm-hdfs");
    sandbox
        .apply([dlrm_job_checkpointed_at("dlrm-hdfs", 1, &checkpoints, 15).build()])
        .await;
    let status = sandbox
        .wait_for_phase("dlrm-hdfs", Phase::Succeeded, Duration::from_secs(600))
        .await;
    master.stop();

    let progress = status.progress.clone().expect("trainer progress");
    assert_eq!(progress.samples, DLRM_ROWS, "{progress:?}");
    let auc = progress.auc.expect("an AUC");
    assert!(
        auc > best - 0.02,
        "progressive AUC {auc:.4} is not within 0.02 of the best achievable {best:.4}"
    );
    let complete = condition(&status, "Complete");
    assert!(
        complete
            .message
            .contains(&format!("checkpoint: {checkpoints}/")),
        "{complete:?}"
    );
    let written = primus_storage::open(&checkpoints, &StorageSettings::default())
        .expect("open")
        .list("")
        .await
        .expect("list the checkpoints");
    assert!(
        written
            .iter()
            .any(|o| o.location.as_ref().ends_with(".json")),
        "no checkpoint manifest under {checkpoints}: {written:?}"
    );
}
