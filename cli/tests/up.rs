//! `primus up --check` and `primus health` as a user runs them.
//!
//! The service binaries are found next to `primus` in the target folder; `cargo test
//! --workspace` builds them (each service crate has integration tests that need its binary).
use std::path::Path;
use std::process::Command;

use primus_testkit::free_port;

fn primus() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_primus"))
}

#[test]
fn up_check_starts_every_service_healthy_and_stops_them_cleanly() {
    let bin_dir = primus().parent().expect("target folder");
    for service in ["primus-api-server", "primus-master", "primus-serving-sync"] {
        assert!(
            bin_dir.join(service).is_file(),
            "{service} not built in {}: run `cargo test --workspace`",
            bin_dir.display()
        );
    }
    let data = tempfile::tempdir().expect("tempdir");
    let ort = "/opt/onnxruntime/lib/libonnxruntime.so";
    let output = Command::new(primus())
        .args(["up", "--check", "--data-dir"])
        .arg(data.path())
        .env("ORT_DYLIB_PATH", ort)
        .args(["--nats-port", &free_port().expect("port").to_string()])
        .args(["--redis-port", &free_port().expect("port").to_string()])
        .output()
        .expect("run primus up");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}\n{stdout}\n{stderr}",
        output.status
    );
    assert_eq!(stdout.matches("SERVING").count(), 4, "{stdout}");
    assert_eq!(stdout.matches("stopped (exit 0)").count(), 4, "{stdout}");
    for per_job in ["primus-data-executor", "primus-trainer"] {
        assert!(
            !stdout.contains(per_job),
            "the master starts {per_job}: {stdout}"
        );
    }
    assert!(data.path().join("logs/primus-master.log").is_file());
    // The master's settings file holds everything it was started with: started again from
    // it (in a shell without ORT_DYLIB_PATH), it gives serving replicas ONNX Runtime.
    let printed = Command::new(bin_dir.join("primus-master"))
        .arg("--config")
        .arg(data.path().join("logs/primus-master.yaml"))
        .arg("--print-settings")
        .env_remove("ORT_DYLIB_PATH")
        .output()
        .expect("primus-master --print-settings");
    let settings = String::from_utf8_lossy(&printed.stdout);
    assert!(
        printed.status.success(),
        "{settings}{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    assert!(
        settings.contains(&format!("ORT_DYLIB_PATH = \"{ort}\"")),
        "{settings}"
    );
}

#[test]
fn health_of_nothing_exits_1_and_says_unreachable() {
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    let output = Command::new(primus())
        .args(["health", &addr])
        .output()
        .expect("run primus health");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("UNREACHABLE"), "{stdout}");
}

#[test]
fn bad_arguments_exit_2() {
    let output = Command::new(primus())
        .args(["up", "--nats-port", "not-a-port"])
        .output()
        .expect("run primus");
    assert_eq!(output.status.code(), Some(2));
}
