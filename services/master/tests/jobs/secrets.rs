//! Secrets stay where they belong. A Job whose checkpoints go to a real S3 server (MinIO)
//! and whose serving replica requires a Predict token runs to the end; then neither the
//! S3 secret key, the Predict token nor the API token appears in any file the deployment
//! wrote (every log, the checkpoints' records, the Parquet data), in the Job's status and
//! events, in its Metric resource or in a service's `--print-settings`. The executors'
//! settings files, which must hold the key, are readable by their user only.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use primus_harness::criteo::dlrm_job_checkpointed_at;
use primus_harness::stores::s3_settings;
use primus_harness::{Sandbox, TOKEN, binary};
use primus_spec::Kind;
use primus_spec::status::Phase;
use primus_testkit::{MinioS3, S3Bucket};

use crate::common::{DLRM_ROWS, apply_criteo_dataset, data_executor, master_settings, start};

const PREDICT_TOKEN: &str = "planted-predict-token-5d1c";

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read a folder").flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else if path.is_file() {
            found.push(path);
        }
    }
    found
}

/// Which of `secrets` `bytes` holds.
fn held<'s>(bytes: &[u8], secrets: &[&'s str]) -> Vec<&'s str> {
    (secrets.iter())
        .filter(|s| bytes.windows(s.len()).any(|w| w == s.as_bytes()))
        .copied()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_appears_in_what_a_job_writes() {
    let minio = MinioS3::start().expect("minio");
    let bucket = minio.bucket("secrets").expect("a bucket");
    let sandbox = Sandbox::start().await;
    apply_criteo_dataset(&sandbox).await;
    let predict_tokens = sandbox.dir().join("predict.tokens");
    std::fs::write(&predict_tokens, format!("{PREDICT_TOKEN}\n")).expect("the token file");
    let mut settings = master_settings(&sandbox, &data_executor());
    settings.storage = s3_settings(&bucket);
    settings.master.predict_token_file = Some(predict_tokens.clone());
    let master = start(&sandbox, &settings);
    let job = "secrets";
    let checkpoints = format!("{}/checkpoints/{job}", bucket.url());
    let spec = dlrm_job_checkpointed_at(job, 1, checkpoints, 2)
        .with(|spec| spec.topology.serving = Some(primus_spec::job::RoleSpec::new(1)));
    sandbox.apply([spec.build()]).await;
    let status = (sandbox.wait_for_phase(job, Phase::Succeeded, Duration::from_secs(600))).await;
    let progress = status.progress.clone().expect("trainer progress");
    assert_eq!(progress.samples, DLRM_ROWS, "{progress:?}");
    let checkpointed = status.conditions.iter().find(|c| c.kind == "Checkpoint");
    assert!(
        checkpointed.is_some_and(|c| c.status),
        "the Job wrote checkpoints to S3, so its executors used the key: {:?}",
        status.conditions
    );
    let secrets = [S3Bucket::SECRET_KEY, PREDICT_TOKEN, TOKEN];

    // What the API server holds of the Job: its status and events, and its Metric.
    let client = sandbox.client().await;
    let mut api = format!("{status:?}");
    for kind in [Kind::Job, Kind::Metric] {
        let resource = client.get(kind, job).await.expect("the Job's resource");
        api.push_str(&format!("{resource:?}"));
    }
    assert_eq!(
        held(api.as_bytes(), &secrets),
        Vec::<&str>::new(),
        "in the API's resources"
    );

    // Every file: logs, the executors' settings, the data. Files that exist to hold a
    // secret are the token files and the executors' settings; the latter are private.
    let work = sandbox.work_dir();
    let (mut settings_files, mut key_holders, mut searched) = (0, 0, 0);
    for path in files(sandbox.dir()) {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path == predict_tokens || path == sandbox.token_file() {
            continue;
        }
        if path.starts_with(&work) && name.ends_with(".toml") {
            let mode = std::fs::metadata(&path)
                .expect("metadata")
                .permissions()
                .mode();
            assert_eq!(
                mode & 0o077,
                0,
                "{} is readable by others ({mode:o})",
                path.display()
            );
            settings_files += 1;
            let bytes = std::fs::read(&path).expect("read a settings file");
            key_holders += usize::from(!held(&bytes, &[S3Bucket::SECRET_KEY]).is_empty());
            continue;
        }
        if path.starts_with(sandbox.dir()) && name.ends_with(".toml") {
            // The test's own settings files for the processes it starts.
            continue;
        }
        let bytes = std::fs::read(&path).expect("read a file");
        assert_eq!(
            held(&bytes, &secrets),
            Vec::<&str>::new(),
            "in {}",
            path.display()
        );
        searched += 1;
    }
    assert!(
        settings_files >= 4,
        "the executors' settings files: {settings_files}"
    );
    // The search finds the key where it must be: the PS shards' settings hold it.
    assert!(
        key_holders >= 2,
        "settings files holding the key: {key_holders}"
    );
    assert!(searched >= 10, "files searched: {searched}");
    master.stop();

    // `--print-settings` of each service that reads storage, with the key set, shows it
    // redacted.
    for service in ["primus-master", "primus-ps", "primus-data-executor"] {
        let out = Command::new(binary(service))
            .arg("--print-settings")
            .env(
                "PRIMUS_STORAGE__S3__SECRET_ACCESS_KEY",
                S3Bucket::SECRET_KEY,
            )
            .output()
            .expect("run the service");
        assert!(out.status.success(), "{service}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("secret_access_key = \"<redacted>\""),
            "{service} prints the key as redacted: {text}"
        );
        assert_eq!(held(&out.stdout, &secrets), Vec::<&str>::new(), "{service}");
    }
}
