use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Why a test server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A server binary is not installed.
    #[error("`{binary}` was not found on PATH or in {tools}; install it with: {install}")]
    MissingBinary {
        /// The binary.
        binary: String,
        /// Where it was looked for.
        tools: String,
        /// How to install it.
        install: String,
    },
    /// A server did not come up in time.
    #[error("{what} did not become ready within {timeout:?}: {detail}")]
    NotReady {
        /// The server.
        what: String,
        /// How long it had.
        timeout: Duration,
        /// The last error seen.
        detail: String,
    },
    /// A server exited before it answered.
    #[error("{what} exited before it was ready ({status}); the end of its log:\n{log}")]
    Exited {
        /// The server.
        what: String,
        /// How it exited.
        status: String,
        /// The last lines of what it wrote.
        log: String,
    },
    /// A server shared by a test binary failed to start on its first use.
    #[error("{what} failed to start earlier in this test binary: {detail}")]
    FailedEarlier {
        /// The server.
        what: String,
        /// Why it failed then.
        detail: String,
    },
    /// An S3 bucket could not be created.
    #[error("creating bucket {bucket}: {detail}")]
    Bucket {
        /// The bucket.
        bucket: String,
        /// What the server said.
        detail: String,
    },
    /// A command run to completion failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// How it exited.
        status: String,
        /// What it wrote on stderr.
        stderr: String,
    },
    /// A fixture cannot run on this machine as it is.
    #[error("{what}: {detail}")]
    Unsupported {
        /// The fixture.
        what: String,
        /// What is missing and how to get it.
        detail: String,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// The operation.
        what: String,
        #[source]
        /// The I/O error.
        source: std::io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// The repository root (the workspace folder, which holds Cargo.lock); `.tools` under it
/// holds what scripts/install-deps.sh installed. Found at run time from the running
/// package's folder (Cargo sets it for tests): this crate's compile-time path goes stale
/// when a shared target folder serves a checkout at another path.
#[expect(
    clippy::disallowed_methods,
    reason = "Cargo sets the package's folder at run time; the compile-time path goes stale under a shared target folder"
)]
pub fn repo_root() -> PathBuf {
    let compiled = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok());
    start
        .and_then(|dir| {
            dir.ancestors()
                .find(|d| d.join("Cargo.lock").is_file())
                .map(Path::to_path_buf)
        })
        .unwrap_or(compiled)
}

/// Finds `binary` on PATH or under `.tools/*/bin` of the repository.
#[expect(clippy::disallowed_methods, reason = "a tool is looked up on PATH")]
pub fn find_binary(binary: &str) -> Result<PathBuf, Error> {
    let tools = repo_root().join(".tools");
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let in_tools = std::fs::read_dir(&tools)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path().join("bin"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(in_tools)
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| Error::MissingBinary {
            binary: binary.into(),
            tools: tools.display().to_string(),
            install: "./scripts/install-deps.sh".into(),
        })
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(Error::io("bind a free port"))?;
    let addr = listener
        .local_addr()
        .map_err(Error::io("read a free port"))?;
    Ok(addr.port())
}

/// A free port on 127.0.0.1 below the kernel's ephemeral range, for a server a test stops
/// and starts again on the same address: a port from the ephemeral range (port 0) may be
/// taken meanwhile by any outgoing connection, one below it only by an explicit bind.
pub fn restartable_port() -> Result<u16, Error> {
    // Exactly one port comes back.
    restartable_ports(1).map(|ports| ports[0])
}

/// `count` distinct free ports as [`restartable_port`] picks them, for a server that binds
/// them seconds after they are chosen (SeaweedFS starts its listeners one after another):
/// a port from the ephemeral range could meanwhile become the source port of some other
/// test's connection.
///
/// A port is handed out at most once per process: until its server binds it, it still
/// looks free, and a test running beside this one would otherwise be given it too.
pub(crate) fn restartable_ports(count: usize) -> Result<Vec<u16>, Error> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let range = low.saturating_sub(8_000).max(1_024)..low;
    let span = u32::from(range.end - range.start).max(1);
    // Other processes pick from the same range (a test binary's servers may outlive it by
    // a moment): each call starts somewhere else in it.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id().wrapping_mul(2_654_435_761);
    let mut ports: Vec<u16> = (0..span)
        .map(|step| range.start + (seed.wrapping_add(step) % span) as u16)
        .filter(|port| !handed_out.contains(port))
        .filter(|port| TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .take(count)
        .collect();
    while ports.len() < count {
        let port = free_port()?;
        if !ports.contains(&port) && !handed_out.contains(&port) {
            ports.push(port);
        }
    }
    handed_out.extend(&ports);
    Ok(ports)
}

/// Polls `probe` every 50 ms while `process` runs, until it answers Ok; fails with its last
/// error at `timeout`, and at once, with the end of the `logs` the process writes, when it
/// exits first (a taken port, a bad flag): it will not answer later.
pub(crate) fn wait_for_start(
    what: &str,
    timeout: Duration,
    process: &mut Guarded,
    logs: &[PathBuf],
    mut probe: impl FnMut() -> Result<(), String>,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = process.exit_status() {
            return Err(Error::Exited {
                what: what.into(),
                status,
                log: log_tails(logs),
            });
        }
        match probe() {
            Ok(()) => return Ok(()),
            Err(detail) if Instant::now() >= deadline => {
                return Err(Error::NotReady {
                    what: what.into(),
                    timeout,
                    detail,
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The last lines of each log that has any, headed by its path.
fn log_tails(logs: &[PathBuf]) -> String {
    const LINES: usize = 20;
    let tails: Vec<String> = logs
        .iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(path).ok()?;
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(LINES)..].join("\n");
            (!tail.is_empty()).then(|| format!("{}:\n{tail}", path.display()))
        })
        .collect();
    if tails.is_empty() {
        "(it wrote nothing)".into()
    } else {
        tails.join("\n")
    }
}

pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A child process that is killed by PID and reaped when dropped: SIGKILL, or SIGTERM for
/// a watchdog script that must clean up after itself.
pub(crate) struct Guarded {
    child: Child,
    graceful: bool,
}

impl Guarded {
    pub(crate) fn new(child: Child) -> Self {
        Self {
            child,
            graceful: false,
        }
    }

    pub(crate) fn with_stop_signal(child: Child) -> Self {
        Self {
            child,
            graceful: true,
        }
    }

    /// Kills the child now (SIGKILL) and reaps it.
    pub(crate) fn kill_now(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// How the child exited, if it has.
    pub(crate) fn exit_status(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("its status could not be read: {e}")),
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // A child already reaped has no PID of its own any more: signalling it could hit
        // another process that was given the number since.
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let terminated = self.graceful
            && Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status()
                .is_ok_and(|s| s.success());
        if !terminated {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Runs test `name` of this test binary again in a child process whose environment also
/// holds `env`, and panics with its output unless it passes: for a test that needs a
/// variable set in its own process (which a crate that forbids `unsafe` cannot set) or
/// unset from it. The child tells itself apart by one of the variables.
pub fn run_test_again(name: &str, env: &[(&str, &std::ffi::OsStr)], unset: &[&str]) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command.args(["--exact", name, "--nocapture"]);
    for (key, value) in env {
        command.env(key, value);
    }
    for key in unset {
        command.env_remove(key);
    }
    let output = command.output().expect("run the test binary again");
    assert!(
        output.status.success(),
        "{name}, run again in a child process, failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
