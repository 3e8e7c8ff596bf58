//! A Job whose sources' store is out of reach when it starts: waited out, with the Job's
//! `DataSources` condition saying so, for up to `master.planner.store_outage_timeout_s`.

use std::time::Duration;

use primus_harness::partitions::write_partitions;
use primus_harness::stores::{copy_files, s3_settings};
use primus_harness::{Sandbox, condition};
use primus_scripted::Script;
use primus_spec::status::{Phase, Status};
use primus_testkit::MinioS3;

use crate::{PATIENCE, ScriptedJob, id_job};

/// A master over Job `name`, whose day of partitions lies in a bucket of `minio` that is
/// stopped before the Job is applied; the master waits out a store away for `timeout_s`.
async fn job_with_store_away(name: &str, minio: &mut MinioS3, timeout_s: u64) -> ScriptedJob {
    let bucket = minio.bucket(name).expect("a bucket");
    let sandbox = Sandbox::start().await;
    let mut settings = sandbox.master_settings();
    settings.storage = s3_settings(&bucket);
    settings.master.planner.store_outage_timeout_s = timeout_s;
    let local = sandbox.dir().join("data");
    write_partitions(&local, "2026-01-01", 1).await;
    let uri = format!("{}/data", bucket.url());
    let from = primus_storage::open(&local.display().to_string(), &settings.storage);
    let to = primus_storage::open(&uri, &settings.storage);
    copy_files(&from.expect("the local files"), &to.expect("the bucket")).await;
    minio.stop();
    let resources = id_job(name, &uri, 4, (1, 1), |j| j);
    ScriptedJob::start_master(sandbox, settings, Script::default(), resources).await
}

/// The Job's status once its condition `kind` holds `holds`.
async fn wait_for_condition(job: &ScriptedJob, name: &str, kind: &str, holds: bool) -> Status {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let status = job.sandbox.status(name).await;
        if (status.conditions.iter()).any(|c| c.kind == kind && c.status == holds) {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {kind} condition {holds} within {PATIENCE:?}: {status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waits_its_store_out_and_runs_once_it_is_back() {
    let mut minio = MinioS3::start().expect("minio");
    let job = job_with_store_away("store-back", &mut minio, 300).await;
    let status = wait_for_condition(&job, "store-back", "DataSources", false).await;
    let sources = condition(&status, "DataSources");
    assert_eq!(sources.reason, "StoreOutOfReach", "{status:#?}");
    assert!(
        sources.message.starts_with("source `clicks`: ")
            && sources.message.ends_with("tried again for up to 300 s"),
        "{}",
        sources.message
    );
    assert_eq!(status.phase, Phase::Pending, "{status:#?}");
    assert!(job.backend.calls().is_empty(), "{:#?}", job.backend.calls());

    minio.start_again().expect("minio again");
    let status = job.wait_for_phase("store-back", Phase::Succeeded).await;
    let sources = condition(&status, "DataSources");
    assert!(sources.status, "{status:#?}");
    assert_eq!(sources.reason, "Readable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_store_stays_away_fails_naming_its_source() {
    let mut minio = MinioS3::start().expect("minio");
    let job = job_with_store_away("store-gone", &mut minio, 1).await;
    let status = job.wait_for_phase("store-gone", Phase::Failed).await;
    let complete = condition(&status, "Complete");
    assert_eq!(complete.reason, "DataSourceUnreadable", "{status:#?}");
    assert!(
        complete.message.starts_with("source `clicks`: ")
            && complete.message.contains("/data")
            && complete
                .message
                .ends_with("master.planner.store_outage_timeout_s)"),
        "{}",
        complete.message
    );
    assert!(job.backend.calls().is_empty(), "{:#?}", job.backend.calls());
}
