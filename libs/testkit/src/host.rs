//! The host side of the cluster and Docker fixtures: commands run to completion, daemons
//! started (inside a network namespace) with a PID file and a log, and the machine-wide
//! lock that keeps two fixtures from claiming the same addresses.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::Error;

/// Runs `program` with `args` to completion; a failure names the command and carries what
/// it wrote on stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(Error::io(format!("run {program}")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Command {
            command: format!("{program} {}", args.join(" ")),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Runs a shell script to completion (see [`run`]).
pub(crate) fn sh(script: &str) -> Result<String, Error> {
    run("sh", &["-ec", script])
}

/// The command prefix that runs a program inside network namespace `netns`. `nsenter`, not
/// `ip netns exec`: the latter remounts /sys and hides the cgroup hierarchies.
pub(crate) fn in_netns(netns: &str) -> Vec<String> {
    vec!["nsenter".into(), format!("--net=/run/netns/{netns}")]
}

/// A long-running process of a fixture: its PID is written to `<pid_dir>/<name>.pid` (the
/// teardown script kills what those files name, also after the test process died), its
/// output goes to `<log_dir>/<name>.log`.
pub(crate) struct Daemon {
    name: String,
    child: Child,
    pid_file: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Starts `command` (program first) in its own process group.
    pub(crate) fn spawn(
        name: &str,
        command: &[String],
        dir: &Path,
        env: &[(&str, &str)],
    ) -> Result<Self, Error> {
        use std::os::unix::process::CommandExt;
        let log = dir.join("logs").join(format!("{name}.log"));
        let pid_file = dir.join("pids").join(format!("{name}.pid"));
        for folder in [dir.join("logs"), dir.join("pids")] {
            std::fs::create_dir_all(&folder)
                .map_err(Error::io(format!("create {}", folder.display())))?;
        }
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(Error::io(format!("open {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io(format!("open {}", log.display())))?;
        let (program, args) = command.split_first().ok_or_else(|| Error::Command {
            command: name.into(),
            status: "not started".into(),
            stderr: "empty command".into(),
        })?;
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own group: a signal to the test's group (Ctrl-C) reaches the teardown,
            // which stops the daemons in order, not every daemon at once.
            .process_group(0)
            .spawn()
            .map_err(Error::io(format!("start {name} ({program})")))?;
        std::fs::write(&pid_file, child.id().to_string())
            .map_err(Error::io(format!("write {}", pid_file.display())))?;
        Ok(Self {
            name: name.into(),
            child,
            pid_file,
            log,
        })
    }

    /// The daemon's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its log file.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// How it exited, if it has.
    pub(crate) fn exit_status(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("its status could not be read: {e}")),
        }
    }

    /// SIGTERM, then SIGKILL after `grace`; reaped either way, its PID file removed.
    pub(crate) fn stop(mut self, grace: Duration) {
        self.terminate(grace);
    }

    /// SIGKILL now (a crash, a lost machine).
    pub(crate) fn kill(mut self) {
        self.terminate(Duration::ZERO);
    }

    fn terminate(&mut self, grace: Duration) {
        if self.child.try_wait().is_ok_and(|s| s.is_none()) {
            if !grace.is_zero() {
                signal(self.child.id(), Signal::SIGTERM);
                let deadline = Instant::now() + grace;
                while Instant::now() < deadline && self.child.try_wait().is_ok_and(|s| s.is_none())
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

/// Sends `signal` to process `pid`; one that is gone already is not an error.
pub(crate) fn signal(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// The last `lines` lines of a log file (empty when it cannot be read).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Polls `probe` every 200 ms until it answers Ok, failing with its last error at
/// `timeout`, or at once with the end of its log when `daemon` exited.
pub(crate) fn wait_for(
    what: &str,
    timeout: Duration,
    mut daemon: Option<&mut Daemon>,
    mut probe: impl FnMut() -> Result<(), String>,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(daemon) = daemon.as_deref_mut()
            && let Some(status) = daemon.exit_status()
        {
            return Err(Error::Exited {
                what: what.into(),
                status,
                log: format!(
                    "{}:\n{}",
                    daemon.log().display(),
                    log_tail(daemon.log(), 30)
                ),
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
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The guardian of a fixture that claims machine-wide things (network namespaces, fixed
/// addresses, host routes, cgroups, mounts): a shell script in a session of its own that
/// first takes the machine-wide lock `lock_name` (waiting for any other fixture of that
/// kind to finish tearing down), then waits for the test process to exit, and then runs
/// `teardown` (a shell script given the fixture's folder as `$1`) before releasing the lock.
/// So the fixture is removed when the test process ends in any way, and two test
/// processes never hold one at once. Dropped, it tears down now and waits for that.
pub(crate) struct Watchdog {
    child: Option<Child>,
}

/// How long a fixture waits for another test process's fixture of its kind to go.
const LOCK_TIMEOUT: Duration = Duration::from_secs(900);

impl Watchdog {
    /// Starts the watchdog of the fixture in `dir` and returns once it holds the lock.
    pub(crate) fn start(lock_name: &str, dir: &Path, teardown: &str) -> Result<Self, Error> {
        use std::os::unix::process::CommandExt;
        let script = dir.join("teardown.sh");
        std::fs::write(&script, teardown)
            .map_err(Error::io(format!("write {}", script.display())))?;
        let locked = dir.join("watchdog.locked");
        let watchdog = format!(
            "exec 9>/run/primus-testkit-{lock_name}.lock\n\
             flock -w {timeout} 9 || {{ echo 'another test process holds /run/primus-testkit-{lock_name}.lock' >&2; exit 3; }}\n\
             : > '{locked}'\n\
             stop() {{ sh '{script}' '{dir}' >>'{dir}/teardown.log' 2>&1; exit 0; }}\n\
             trap stop TERM INT\n\
             while kill -0 {owner} 2>/dev/null; do sleep 0.5; done\n\
             stop",
            timeout = LOCK_TIMEOUT.as_secs(),
            locked = locked.display(),
            script = script.display(),
            dir = dir.display(),
            owner = std::process::id(),
        );
        let log = dir.join("watchdog.log");
        let stderr = File::create(&log).map_err(Error::io(format!("create {}", log.display())))?;
        let child = Command::new("sh")
            .args(["-c", &watchdog])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .map_err(Error::io("start the fixture's watchdog"))?;
        std::fs::write(dir.join("watchdog.pid"), child.id().to_string())
            .map_err(Error::io("write the watchdog's PID file"))?;
        let mut watchdog = Self { child: Some(child) };
        let deadline = Instant::now() + LOCK_TIMEOUT + Duration::from_secs(5);
        while !locked.exists() {
            if let Some(child) = watchdog.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                watchdog.child = None;
                return Err(Error::Exited {
                    what: format!("the {lock_name} fixture's watchdog"),
                    status: status.to_string(),
                    log: log_tail(&log, 10),
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    what: format!("the machine-wide lock of {lock_name}"),
                    timeout: LOCK_TIMEOUT,
                    detail: "another test process holds it".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(watchdog)
    }

    /// Tears the fixture down now and waits until that is done.
    pub(crate) fn tear_down(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), Signal::SIGTERM);
            let _ = child.wait();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.tear_down();
    }
}

/// Removes the fixtures of test processes that died with their watchdog (SIGKILL of a
/// whole session): the caller's watchdog holds the lock of its kind, so every other folder
/// `<temp>/<prefix>*` is stale. Each goes through the caller's teardown script.
pub(crate) fn remove_stale(prefix: &str, ours: &Path) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let stale = path != ours
            && (path.file_name())
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix));
        if stale {
            let _ = Command::new("sh")
                .arg(ours.join("teardown.sh"))
                .arg(&path)
                .status();
            eprintln!(
                "[testkit] removed {} left by a killed test process",
                path.display()
            );
        }
    }
}
