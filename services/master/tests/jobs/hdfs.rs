//! A Job whose Dataset and checkpoints are on a real HDFS (a namenode and two datanodes,
//! replication 2, permissions on): its data executor reads the Parquet hours over the
//! HDFS RPC, its PS shards write checkpoints there, and it trains every row once; the same
//! on an HDFS secured by Kerberos.

use std::time::Duration;

use primus_config::StorageSettings;
use primus_harness::criteo::{
    DLRM_HOURS, DLRM_ROWS, apply_criteo_dataset_at, dlrm_job_checkpointed_at, write_criteo_rows_to,
};
use primus_harness::{Sandbox, condition};
use primus_spec::status::{Phase, Status};
use primus_testkit::{Hdfs, run_test_again};

use crate::common::{data_executor, master_settings, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlrm_job_reads_its_dataset_from_hdfs_and_checkpoints_there() {
    let root = Hdfs::shared().expect("hdfs").folder("job").expect("folder");
    let (status, best) = train_on_hdfs(&root, &StorageSettings::default(), "dlrm-hdfs").await;
    let auc = status
        .progress
        .as_ref()
        .and_then(|p| p.auc)
        .expect("an AUC");
    assert!(
        auc > best - 0.02,
        "progressive AUC {auc:.4} is not within 0.02 of the best achievable {best:.4}"
    );
    let complete = condition(&status, "Complete");
    assert!(
        complete
            .message
            .contains(&format!("checkpoint: {root}/checkpoints/dlrm-hdfs/")),
        "{complete:?}"
    );
}

/// Set in the child run of the secured test: the folder, principal and keytab.
const SECURED_ROOT: &str = "PRIMUS_TEST_SECURED_HDFS_ROOT";
const SECURED_PRINCIPAL: &str = "PRIMUS_TEST_SECURED_HDFS_PRINCIPAL";
const SECURED_KEYTAB: &str = "PRIMUS_TEST_SECURED_HDFS_KEYTAB";

/// The same Job on a Kerberos-secured HDFS: the master's storage section names the
/// principal and keytab, and every executor it starts authenticates with them. The KDC is
/// found through `KRB5_CONFIG`, which this crate cannot set in its own process (`unsafe` is
/// forbidden): the test runs itself again as a child with it, and the processes the child
/// starts inherit it.
#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "the child run finds the cluster in variables its parent set"
)]
fn a_dlrm_job_on_a_kerberos_secured_hdfs_authenticates_with_the_keytab_in_its_settings() {
    if let Ok(root) = std::env::var(SECURED_ROOT) {
        let mut storage = StorageSettings::default();
        storage.hdfs.kerberos_principal = std::env::var(SECURED_PRINCIPAL).ok();
        storage.hdfs.kerberos_keytab = std::env::var_os(SECURED_KEYTAB).map(Into::into);
        storage.hdfs.config.insert(
            "dfs.data.transfer.protection".into(),
            "authentication".into(),
        );
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(train_on_hdfs(&root, &storage, "dlrm-secured"));
        return;
    }
    let hdfs = Hdfs::start_secured("primus").expect("a secured hdfs");
    let kerberos = hdfs.kerberos().expect("Kerberos credentials");
    let root = hdfs.folder("secured-job").expect("folder");
    run_test_again(
        "hdfs::a_dlrm_job_on_a_kerberos_secured_hdfs_authenticates_with_the_keytab_in_its_settings",
        &[
            ("KRB5_CONFIG", kerberos.krb5_conf.as_os_str()),
            (SECURED_ROOT, root.as_ref()),
            (SECURED_PRINCIPAL, kerberos.principal.as_ref()),
            (SECURED_KEYTAB, kerberos.keytab.as_os_str()),
        ],
        &["KRB5CCNAME"],
    );
}

/// Writes the Criteo-like data under `root` (a folder on HDFS) with `storage`, trains
/// `job` on it, checkpointed under `root`, with a master whose storage section is
/// `storage`, and checks that it trained every row once and left a checkpoint manifest.
/// The Job's status and the data's best achievable AUC.
async fn train_on_hdfs(root: &str, storage: &StorageSettings, job: &str) -> (Status, f64) {
    let data = format!("{root}/criteo");
    let location = primus_storage::open(&data, storage).expect("open");
    let best = write_criteo_rows_to(&location, DLRM_HOURS).await;

    let sandbox = Sandbox::start().await;
    apply_criteo_dataset_at(&sandbox, &data).await;
    let mut settings = master_settings(&sandbox, &data_executor());
    settings.storage = storage.clone();
    let master = start(&sandbox, &settings);
    let checkpoints = format!("{root}/checkpoints/{job}");
    sandbox
        .apply([dlrm_job_checkpointed_at(job, 1, &checkpoints, 15).build()])
        .await;
    let status = sandbox
        .wait_for_phase(job, Phase::Succeeded, Duration::from_secs(600))
        .await;
    master.stop();

    let progress = status.progress.clone().expect("trainer progress");
    assert_eq!(progress.samples, DLRM_ROWS, "{progress:?}");
    let written = primus_storage::open(&checkpoints, storage)
        .expect("open")
        .list("")
        .await
        .expect("list the checkpoints");
    assert!(
        written
            .iter()
            .any(|o| o.location.as_ref().ends_with("manifest.json")),
        "no checkpoint manifest under {checkpoints}: {written:?}"
    );
    (status, best)
}
