//! The local backend's child processes: they listen on `local.executor_ip` and do not
//! inherit the master's own `PRIMUS_<SECTION>__<KEY>` settings (a master configured by
//! environment, as on Kubernetes, would otherwise start executors that refuse an unknown
//! setting), and they get `local.environment`. The test runs itself again as a child process whose environment holds such
//! settings (this crate forbids `unsafe`, so `set_var` is not an option).

#![expect(
    clippy::disallowed_methods,
    reason = "the test runs itself again and tells the two runs apart by a variable"
)]
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use primus_backend::local::LocalBackend;
use primus_backend::{ExecutorRole, ExecutorSettings, ExecutorSpec, ResourceBackend};
use primus_config::LocalBackendSettings;

/// Set in the child run: it does the real check.
const INNER: &str = "PRIMUS_TEST_LOCAL_BACKEND_ENV";

#[test]
fn executors_get_their_ip_and_not_the_masters_settings_environment() {
    if std::env::var_os(INNER).is_some() {
        check_executor_environment();
        return;
    }
    primus_testkit::run_test_again(
        "executors_get_their_ip_and_not_the_masters_settings_environment",
        &[
            (INNER, "1".as_ref()),
            ("PRIMUS_LOCAL__EXECUTOR_IP", "127.0.0.2".as_ref()),
            ("PRIMUS_API__SERVER", "http://api-server:7070".as_ref()),
        ],
        &[],
    );
}

fn check_executor_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = dir.path().join("seen.txt");
    let script = dir.path().join("trainer.sh");
    // A stand-in executor that records its environment and settings file, then waits.
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n{{ env; cat \"$2\"; }} > {seen}.part && mv {seen}.part {seen}\nsleep 30\n",
            seen = seen.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let settings = LocalBackendSettings {
        binaries: [("trainer".to_owned(), script)].into(),
        work_dir: dir.path().join("work"),
        executor_ip: [127, 0, 0, 2].into(),
        environment: [(
            "ORT_DYLIB_PATH".to_owned(),
            "/opt/ort/libonnxruntime.so".to_owned(),
        )]
        .into(),
        ..LocalBackendSettings::default()
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let backend = LocalBackend::new(settings, "127.0.0.1:1".into());
        let executor = backend
            .request(ExecutorSpec {
                job: "j".into(),
                role: ExecutorRole::Trainer,
                index: 0,
                settings: ExecutorSettings::Trainer(Box::default()),
                cpu: 1.0,
                memory_bytes: 1 << 20,
            })
            .await
            .expect("started");
        assert_eq!(executor.grpc_addr.ip().to_string(), "127.0.0.2");
        let mut text = String::new();
        for _ in 0..200 {
            if let Ok(t) = std::fs::read_to_string(&seen) {
                text = t;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        backend.release_job("j").await;
        assert!(
            text.contains("PRIMUS_JOB=j"),
            "the executor's own variables are set: {text}"
        );
        assert!(
            text.contains("ORT_DYLIB_PATH=/opt/ort/libonnxruntime.so"),
            "local.environment reaches the executor: {text}"
        );
        assert!(
            !text.contains("PRIMUS_API__SERVER") && !text.contains("PRIMUS_LOCAL__EXECUTOR_IP"),
            "the master's settings variables are not inherited: {text}"
        );
        assert!(
            text.contains(&format!("grpc_addr = \"{}\"", executor.grpc_addr)),
            "the settings file names the executor's address: {text}"
        );
    });
}
