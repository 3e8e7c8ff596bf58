//! The suite's HDFS faults. Their Jobs read the same numbered Parquet rows, copied to the
//! testkit's HDFS (a namenode and two datanodes, replication 2), and write their
//! checkpoints there: a datanode stopped (its blocks are read from the other), the namenode
//! stopped and started again (readers wait and read on; a checkpoint attempted meanwhile is
//! abandoned whole), and the checkpoint folder out of space (the Job says so, keeps its
//! previous checkpoint and goes on once there is space again).

use std::time::Duration;

use primus_config::StorageSettings;
use primus_harness::Sandbox;
use primus_harness::stores::copy_files;
use primus_storage::Location;
use primus_testkit::Hdfs;
use tokio::time::Instant;

use crate::workload::{Store, mixed_dataset};

/// The Dataset of the Jobs that read from HDFS.
const DATASET: &str = "criteo-mixed-hdfs";
/// The datanode a fault stops (of 0 and 1).
const STOPPED_DATANODE: usize = 1;
/// How long the namenode stays down.
const NAMENODE_DOWN: Duration = Duration::from_secs(5);

/// The suite's data on HDFS.
pub(crate) struct OnHdfs {
    hdfs: &'static Hdfs,
    /// `hdfs://127.0.0.1:<port>/data/chaos-.../checkpoints`.
    checkpoints: String,
}

impl OnHdfs {
    /// Copies the suite's Parquet rows (numbered already) from the sandbox to HDFS and
    /// applies Dataset [`DATASET`] over them.
    pub(crate) async fn prepare(sandbox: &Sandbox) -> Self {
        let hdfs = Hdfs::shared().expect("hdfs");
        let root = hdfs.folder("chaos").expect("a folder on HDFS");
        let local = open(&sandbox.dir().join("criteo").display().to_string());
        let remote = open(&format!("{root}/criteo"));
        copy_files(&local, &remote).await;
        sandbox
            .apply([mixed_dataset(DATASET, format!("{root}/criteo"))])
            .await;
        let checkpoints = format!("{root}/checkpoints");
        Self { hdfs, checkpoints }
    }

    /// Where a Job of these faults reads and checkpoints.
    pub(crate) fn store(&self) -> Store<'_> {
        Store::Remote {
            dataset: DATASET,
            checkpoints: &self.checkpoints,
        }
    }

    /// Stops a datanode; [`OnHdfs::start_datanode`] starts it again.
    pub(crate) async fn stop_datanode(&self) -> String {
        let hdfs = self.hdfs;
        blocking(move || hdfs.stop_datanode(STOPPED_DATANODE)).await;
        format!("datanode {STOPPED_DATANODE} stopped: every block read from the other")
    }

    pub(crate) async fn start_datanode(&self) {
        let hdfs = self.hdfs;
        blocking(move || hdfs.start_datanode(STOPPED_DATANODE)).await;
    }

    /// Stops the namenode and starts it again on its metadata after [`NAMENODE_DOWN`].
    pub(crate) async fn restart_namenode(&self) -> String {
        let hdfs = self.hdfs;
        blocking(move || hdfs.stop_namenode()).await;
        tokio::time::sleep(NAMENODE_DOWN).await;
        let started = Instant::now();
        blocking(move || hdfs.start_namenode()).await;
        format!(
            "namenode down {} s, active again {:.1} s after its start",
            NAMENODE_DOWN.as_secs(),
            started.elapsed().as_secs_f64()
        )
    }

    /// Leaves `job`'s checkpoint folder no space; once a checkpoint failed for it, checks
    /// that the Job said so and that every checkpoint committed before is still whole, and
    /// gives the space back.
    pub(crate) async fn fill_checkpoint_folder(&self, sandbox: &Sandbox, job: &str) -> String {
        let url = format!("{}/{job}", self.checkpoints);
        let folder = url
            .strip_prefix(&self.hdfs.url())
            .expect("a folder of this HDFS")
            .to_owned();
        let before = manifests(&url).await;
        assert!(!before.is_empty(), "{job}: no checkpoint committed yet");
        let hdfs = self.hdfs;
        let quota_folder = folder.clone();
        blocking(move || hdfs.set_space_quota(&quota_folder, 1)).await;
        let failed = checkpoint_failure(sandbox, job).await;
        assert!(
            failed.contains("quota") || failed.contains("Quota"),
            "{job}: the failed checkpoint does not say the folder is out of space: {failed}"
        );
        let after = manifests(&url).await;
        let lost: Vec<&String> = before.iter().filter(|m| !after.contains(m)).collect();
        assert!(
            lost.is_empty(),
            "{job}: checkpoints lost while out of space: {lost:?}"
        );
        blocking(move || hdfs.clear_space_quota(&folder)).await;
        let reason = failed
            .find("DiskSpace quota")
            .map_or(&failed[..], |at| &failed[at..]);
        let reason = reason.split(':').next().unwrap_or(reason).trim();
        format!("out of space, said so ({reason}), previous checkpoints kept")
    }
}

fn open(url: &str) -> Location {
    primus_storage::open(url, &StorageSettings::default()).expect("open")
}

/// Every checkpoint manifest under `url`.
async fn manifests(url: &str) -> Vec<String> {
    let location = open(url);
    (location.list("").await.expect("list the checkpoints"))
        .into_iter()
        .map(|object| object.location.to_string())
        .filter(|path| path.ends_with("manifest.json"))
        .collect()
}

/// The message of `job`'s `Checkpoint` condition once it reports a failed checkpoint.
async fn checkpoint_failure(sandbox: &Sandbox, job: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = sandbox.status(job).await;
        if let Some(failed) = (status.conditions.iter())
            .find(|c| c.kind == "Checkpoint" && !c.status && c.reason == "CheckpointFailed")
        {
            return failed.message.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{job}: no checkpoint failed for want of space: {status:?}\n{}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs one of the launcher's commands, which wait for the cluster, off the runtime.
async fn blocking(command: impl FnOnce() -> Result<(), primus_testkit::Error> + Send + 'static) {
    tokio::task::spawn_blocking(command)
        .await
        .expect("the command ran")
        .expect("the HDFS launcher did it");
}
