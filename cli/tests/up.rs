//! `primus up --check` and `primus health` as a user runs them.
//!
//! The service binaries are found next to `primus` in the target folder; `cargo test
//! --workspace` builds them (each service crate has integration tests that need its binary).
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use primus_testkit::free_port;
use primus_testkit::service::signal;

/// `primus up` puts the services on their default ports: one run at a time.
static DEFAULT_PORTS: Mutex<()> = Mutex::new(());

fn primus() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_primus"))
}

#[test]
fn up_check_starts_every_service_healthy_and_stops_them_cleanly() {
    let _ports = DEFAULT_PORTS.lock().unwrap_or_else(|p| p.into_inner());
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
    assert!(
        stdout.contains("dashboard  http://127.0.0.1:7080/  (sign in with the API token)"),
        "the dashboard answered: {stdout}"
    );
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
    // Predict is closed: the master gives its serving replicas a token of their own,
    // readable by this user only and not the API's.
    let predict_tokens = data.path().join("predict-token");
    assert!(
        settings.contains(&format!(
            "predict_token_file = \"{}\"",
            predict_tokens.display()
        )),
        "{settings}"
    );
    assert!(
        stdout.contains(&format!("Predict token in {}", predict_tokens.display())),
        "{stdout}"
    );
    let mode = std::fs::metadata(&predict_tokens)
        .expect("the Predict token file")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    let read = |name: &str| std::fs::read_to_string(data.path().join(name)).expect(name);
    assert_eq!(read("predict-token").trim().len(), 48);
    assert_ne!(read("predict-token"), read("token"));
}

/// The child of `parent` running `name`.
fn child_named(parent: u32, name: &str) -> Option<u32> {
    let processes = std::fs::read_dir("/proc").expect("/proc");
    processes.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let (comm, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (comm == name && ppid == parent).then_some(pid)
    })
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what} within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A master killed and started again by hand from the settings file `primus up` wrote:
/// stopping `primus up` stops that master too, and exits 0.
#[test]
fn up_stops_a_master_started_again_by_hand() {
    let _ports = DEFAULT_PORTS.lock().unwrap_or_else(|p| p.into_inner());
    let bin_dir = primus().parent().expect("target folder");
    let data = tempfile::tempdir().expect("tempdir");
    let mut up = Command::new(primus())
        .args(["up", "--data-dir"])
        .arg(data.path())
        .args(["--nats-port", &free_port().expect("port").to_string()])
        .args(["--redis-port", &free_port().expect("port").to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run primus up");
    let lines = std::sync::Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let (stdout, lines) = (up.stdout.take().expect("stdout"), lines.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        })
    };
    let said = |text: &str| {
        (lines.lock().unwrap_or_else(|p| p.into_inner()).iter()).any(|l| l.contains(text))
    };
    wait_until("primus up says the cluster is up", || said("cluster up"));
    let master = child_named(up.id(), "primus-master").expect("the master of primus up");
    let master_addr = format!("127.0.0.1:{}", primus_config::DEFAULT_PORTS.master);
    signal(master, "KILL").expect("kill the master");
    wait_until("the master's port is free", || {
        TcpStream::connect(&master_addr).is_err()
    });
    let mut again = Command::new(bin_dir.join("primus-master"))
        .arg("--config")
        .arg(data.path().join("logs/primus-master.yaml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the master again");
    wait_until("the master started again listens", || {
        TcpStream::connect(&master_addr).is_ok()
    });

    signal(up.id(), "TERM").expect("stop primus up");
    let status = up.wait().expect("primus up exits");
    reader.join().expect("stdout reader");
    let mut errors = String::new();
    std::io::Read::read_to_string(&mut up.stderr.take().expect("stderr"), &mut errors)
        .expect("stderr");
    let output = lines.lock().unwrap_or_else(|p| p.into_inner()).join("\n") + &errors;
    assert!(status.success(), "{status}\n{output}");
    assert!(
        output.contains(&format!(
            "stopped the one found on {master_addr} (pid {})",
            again.id()
        )),
        "{output}"
    );
    wait_until("the master started again exits", || {
        matches!(again.try_wait(), Ok(Some(_)))
    });
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
