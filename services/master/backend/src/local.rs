//! The `local` backend: each executor is a child process of the master, started with a
//! settings file written for it, restarted with backoff when it crashes, and stopped with
//! SIGTERM (then SIGKILL) when released. PID files let the next master kill what a crashed
//! master left behind. CPU and memory are recorded, not enforced (no cgroups here).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use super::{BackendError, BackendEvent, Executor, ExecutorSpec, ExecutorUsage, ResourceBackend};
use primus_config::LocalBackendSettings;
use primus_service::usage::UsageSampler;

const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Identity every executor gets in its environment (settings files hold the rest).
pub const ENV_JOB: &str = "PRIMUS_JOB";
pub const ENV_EXECUTOR_ID: &str = "PRIMUS_EXECUTOR_ID";
pub const ENV_MASTER_ADDR: &str = "PRIMUS_MASTER_ADDR";

struct Supervised {
    /// The grace a stop gives the process (SIGTERM, then SIGKILL after it); None: run.
    stop: watch::Sender<Option<Duration>>,
    supervisor: JoinHandle<()>,
    /// The running process's pid (0 while none runs), kept by the supervisor.
    pid: Arc<AtomicU32>,
    /// Measures the process with that pid.
    usage: Mutex<Option<(u32, UsageSampler)>>,
    /// The memory it is allotted: what it started with, or its last resize.
    memory_bytes: AtomicU64,
}

impl Supervised {
    /// CPU cores used since the previous call and resident bytes; none while no process
    /// runs.
    fn measure(&self) -> Option<(f64, u64)> {
        let pid = self.pid.load(Ordering::Acquire);
        if pid == 0 {
            return None;
        }
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if usage.as_ref().is_none_or(|(measured, _)| *measured != pid) {
            *usage = Some((pid, UsageSampler::of_process(pid)));
        }
        let (_, sampler) = usage.as_mut()?;
        Some((sampler.cpu_cores(), sampler.resident_bytes()))
    }
}

pub struct LocalBackend {
    settings: LocalBackendSettings,
    master_addr: String,
    processes: Mutex<HashMap<(String, String), Supervised>>,
    events: broadcast::Sender<BackendEvent>,
    ports: PortPicker,
}

impl LocalBackend {
    /// `master_addr` (host:port) is given to executors so they can reach the task service.
    pub fn new(settings: LocalBackendSettings, master_addr: String) -> Self {
        Self {
            ports: PortPicker::new(settings.executor_ip),
            settings,
            master_addr,
            processes: Mutex::new(HashMap::new()),
            events: broadcast::channel(1024).0,
        }
    }

    /// Kills processes a previous master started and did not stop (it crashed), using the
    /// PID files under `work_dir`. Returns how many were killed.
    pub fn kill_leftovers(&self) -> usize {
        let Ok(jobs) = std::fs::read_dir(&self.settings.work_dir) else {
            return 0;
        };
        let mut killed = 0;
        for pid_file in jobs
            .flatten()
            .filter_map(|job| std::fs::read_dir(job.path()).ok())
            .flat_map(|files| files.flatten().map(|f| f.path()))
            .filter(|path| path.extension().is_some_and(|e| e == "pid"))
        {
            if let Some(pid) = leftover_pid(&pid_file) {
                tracing::warn!(pid, file = %pid_file.display(), "killing an executor left by a previous master");
                if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                    killed += 1;
                }
            }
            let _ = std::fs::remove_file(&pid_file);
        }
        killed
    }

    /// Stops every process this backend started.
    pub async fn shutdown(&self) {
        let all: Vec<Supervised> = self.lock().drain().map(|(_, s)| s).collect();
        stop_all(all, self.grace()).await;
    }

    /// How long a stopped process may take to drain.
    fn grace(&self) -> Duration {
        Duration::from_millis(self.settings.stop_grace_ms)
    }

    /// Executor `id` of `job`, out of the supervised ones.
    fn take(&self, job: &str, id: &str) -> Result<Supervised, BackendError> {
        self.lock()
            .remove(&(job.to_owned(), id.to_owned()))
            .ok_or_else(|| BackendError::Unknown {
                job: job.into(),
                id: id.into(),
            })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Supervised>> {
        self.processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn binary(&self, spec: &ExecutorSpec) -> PathBuf {
        if let Some(path) = self.settings.binaries.get(spec.role.as_str()) {
            return path.clone();
        }
        let dir = self.settings.bin_dir.clone().or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(Path::to_path_buf))
        });
        dir.unwrap_or_default().join(spec.role.binary())
    }
}

/// The PID in `pid_file` if that process still runs the binary recorded next to it.
fn leftover_pid(pid_file: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(pid_file).ok()?;
    let (pid, binary) = text.split_once('\n')?;
    let pid: i32 = pid.trim().parse().ok()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    (exe == Path::new(binary.trim())).then_some(pid)
}

/// Hands out ports on the executors' IP for their gRPC servers from just below the kernel's
/// ephemeral range. A port taken from the ephemeral range (bind to port 0) is free only
/// until the child binds it: meanwhile the kernel may give it to anyone's outgoing
/// connection or port-0 bind, and the executor would crash on every restart. Ports below
/// the range are never handed out by the kernel, so only an explicit bind can take one.
struct PortPicker {
    ip: IpAddr,
    range: std::ops::Range<u16>,
    next: Mutex<u16>,
}

/// How many ports below the ephemeral range the picker uses.
const PICKED_PORTS: u16 = 10_000;

impl PortPicker {
    fn new(ip: IpAddr) -> Self {
        let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32_768);
        let range = ephemeral_low.saturating_sub(PICKED_PORTS).max(1_024)..ephemeral_low;
        // Masters started side by side (tests) begin at different places.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
            ^ std::process::id().wrapping_mul(2_654_435_761);
        let span = u32::from(range.end - range.start).max(1);
        let start = range.start + (seed % span) as u16;
        Self {
            ip,
            range,
            next: Mutex::new(start),
        }
    }

    /// The next port in the range that nothing listens on now.
    fn pick(&self) -> Result<u16, BackendError> {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..self.range.len() {
            let port = *next;
            *next = if port + 1 >= self.range.end {
                self.range.start
            } else {
                port + 1
            };
            if TcpListener::bind((self.ip, port)).is_ok() {
                return Ok(port);
            }
        }
        // No free port below the ephemeral range (or no such range): let the kernel choose.
        TcpListener::bind((self.ip, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| BackendError::Io(format!("no free port on {}: {e}", self.ip)))
    }
}

/// Writes `text` to `path` readable by this user only (an executor's settings hold its
/// storage keys), replacing what was there.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // A file left by an earlier run keeps its mode on open: set it.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(text.as_bytes())
}

impl ResourceBackend for LocalBackend {
    async fn request(&self, spec: ExecutorSpec) -> Result<Executor, BackendError> {
        let id = spec.id();
        let job_dir = self.settings.work_dir.join(&spec.job);
        let io = |what: &str, e: std::io::Error| BackendError::Io(format!("{what}: {e}"));
        std::fs::create_dir_all(&job_dir).map_err(|e| io(&job_dir.display().to_string(), e))?;
        let grpc_addr = SocketAddr::from((self.settings.executor_ip, self.ports.pick()?));
        let mut settings = spec.settings.clone();
        settings.server_mut().grpc_addr = grpc_addr;
        let config = job_dir.join(format!("{id}.toml"));
        let text = settings
            .to_toml()
            .map_err(|e| BackendError::Io(format!("{id}: {e}")))?;
        write_private(&config, &text).map_err(|e| io(&config.display().to_string(), e))?;
        let launch = Launch {
            binary: self.binary(&spec),
            dir: job_dir.clone(),
            config,
            log: job_dir.join(format!("{id}.log")),
            pid_file: job_dir.join(format!("{id}.pid")),
            env: (self.settings.environment.iter())
                .map(|(name, value)| (name.clone(), value.clone()))
                .chain([
                    (ENV_JOB.to_owned(), spec.job.clone()),
                    (ENV_EXECUTOR_ID.to_owned(), id.clone()),
                    (ENV_MASTER_ADDR.to_owned(), self.master_addr.clone()),
                ])
                .collect(),
        };
        let (child, log_start) = launch.spawn().map_err(|message| BackendError::Start {
            id: id.clone(),
            binary: launch.binary.display().to_string(),
            message,
        })?;
        let (stop, stopped) = watch::channel(None);
        let pid = Arc::new(AtomicU32::new(child.id().unwrap_or(0)));
        let supervisor = tokio::spawn(supervise(
            launch,
            child,
            log_start,
            stopped,
            pid.clone(),
            Restarts {
                job: spec.job.clone(),
                id: id.clone(),
                backoff: Duration::from_millis(self.settings.restart_backoff_ms.max(1)),
                max: self.settings.max_restarts,
                grace: Duration::from_millis(self.settings.stop_grace_ms),
                events: self.events.clone(),
            },
        ));
        let supervised = Supervised {
            stop,
            supervisor,
            pid,
            usage: Mutex::new(None),
            memory_bytes: AtomicU64::new(spec.memory_bytes),
        };
        let previous = self
            .lock()
            .insert((spec.job.clone(), id.clone()), supervised);
        if let Some(previous) = previous {
            stop_all(vec![previous], self.grace()).await;
        }
        tracing::info!(job = %spec.job, %id, %grpc_addr, "executor started");
        Ok(Executor {
            job: spec.job,
            id,
            role: spec.role,
            grpc_addr,
        })
    }

    async fn release(&self, job: &str, id: &str) -> Result<(), BackendError> {
        let supervised = self.take(job, id)?;
        stop_all(vec![supervised], self.grace()).await;
        Ok(())
    }

    async fn kill(&self, job: &str, id: &str) -> Result<(), BackendError> {
        let supervised = self.take(job, id)?;
        stop_all(vec![supervised], Duration::ZERO).await;
        Ok(())
    }

    async fn release_job(&self, job: &str) {
        let mine: Vec<Supervised> = {
            let mut processes = self.lock();
            let keys: Vec<_> = processes
                .keys()
                .filter(|(j, _)| j == job)
                .cloned()
                .collect();
            keys.iter().filter_map(|k| processes.remove(k)).collect()
        };
        stop_all(mine, self.grace()).await;
    }

    /// Executors here are processes of this host sharing its memory: one may be given more
    /// while the host has that much more available (`MemAvailable` in `/proc/meminfo`).
    async fn resize(
        &self,
        job: &str,
        id: &str,
        cpu: f64,
        memory_bytes: u64,
    ) -> Result<(), BackendError> {
        let processes = self.lock();
        let supervised = processes
            .get(&(job.to_owned(), id.to_owned()))
            .ok_or_else(|| BackendError::Unknown {
                job: job.into(),
                id: id.into(),
            })?;
        let allotted = supervised.memory_bytes.load(Ordering::Acquire);
        let more = memory_bytes.saturating_sub(allotted);
        let available = host_memory_available().unwrap_or(0);
        if more > available {
            return Err(BackendError::Capacity {
                id: id.into(),
                message: format!("{more} more bytes asked, the host has {available} available"),
            });
        }
        supervised
            .memory_bytes
            .store(memory_bytes, Ordering::Release);
        let _ = self.events.send(BackendEvent::Resized {
            job: job.into(),
            id: id.into(),
            cpu,
            memory_bytes,
        });
        Ok(())
    }

    fn events(&self) -> broadcast::Receiver<BackendEvent> {
        self.events.subscribe()
    }

    /// From `/proc/<pid>` of each running child.
    async fn usage(&self, job: &str) -> Vec<ExecutorUsage> {
        let processes = self.lock();
        processes
            .iter()
            .filter(|((j, _), _)| j == job)
            .filter_map(|((_, id), supervised)| {
                let (cpu_cores, memory_bytes) = supervised.measure()?;
                Some(ExecutorUsage {
                    id: id.clone(),
                    cpu_cores,
                    memory_bytes,
                })
            })
            .collect()
    }
}

async fn stop_all(processes: Vec<Supervised>, grace: Duration) {
    for process in &processes {
        let _ = process.stop.send(Some(grace));
    }
    for process in processes {
        let _ = process.supervisor.await;
    }
}

struct Launch {
    binary: PathBuf,
    /// The job's folder: the process's working directory.
    dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    pid_file: PathBuf,
    env: Vec<(String, String)>,
}

impl Launch {
    /// Starts the process; returns it and where its output starts in the (appended) log.
    fn spawn(&self) -> Result<(Child, u64), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("log file {}: {e}", self.log.display()))?;
        let log_start = log.metadata().map_or(0, |m| m.len());
        let log_err = log
            .try_clone()
            .map_err(|e| format!("log file {}: {e}", self.log.display()))?;
        let mut command = Command::new(&self.binary);
        // The master's own PRIMUS_<SECTION>__<KEY> settings are not the executor's: its
        // settings file holds everything it needs, and an inherited `local.*` or `api.*`
        // would be an unknown setting that stops it from starting.
        #[expect(
            clippy::disallowed_methods,
            reason = "the master's own settings variables are found to be left out, not read"
        )]
        let inherited = std::env::vars_os();
        for (name, _) in inherited {
            if name
                .to_str()
                .is_some_and(primus_config::is_settings_variable)
            {
                command.env_remove(&name);
            }
        }
        let child = command
            .current_dir(&self.dir)
            .arg("--config")
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string())?;
        if let Some(pid) = child.id() {
            let record = format!("{pid}\n{}\n", self.binary.display());
            let _ = std::fs::write(&self.pid_file, record);
        }
        Ok((child, log_start))
    }

    /// The last lines one run of the process wrote (from `start` in its log), so a crash
    /// report says why without anyone opening the log file.
    fn log_tail(&self, start: u64) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut file) = std::fs::File::open(&self.log) else {
            return String::new();
        };
        let end = file.metadata().map_or(0, |m| m.len());
        // Only the end of a long run's output is read.
        let from = start.max(end.saturating_sub(CRASH_LOG_READ_BYTES));
        let mut run = Vec::new();
        if file.seek(SeekFrom::Start(from)).is_err() || file.read_to_end(&mut run).is_err() {
            return String::new();
        }
        let text = strip_ansi(&String::from_utf8_lossy(&run));
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let tail = lines[lines.len().saturating_sub(CRASH_LOG_LINES)..].join(" | ");
        match tail.char_indices().nth_back(CRASH_LOG_CHARS) {
            Some((cut, _)) => format!("...{}", &tail[cut..]),
            None => tail,
        }
    }
}

/// How much of a crashed run's log goes into its crash report.
const CRASH_LOG_LINES: usize = 4;
const CRASH_LOG_CHARS: usize = 800;
const CRASH_LOG_READ_BYTES: u64 = 64 << 10;

/// Removes terminal colour sequences (`ESC [ ... letter`) from log text.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

struct Restarts {
    job: String,
    id: String,
    backoff: Duration,
    max: u32,
    grace: Duration,
    events: broadcast::Sender<BackendEvent>,
}

/// Waits on the child; restarts it after a crash (with doubling backoff) until it has
/// crashed more than `max` times; stops it, with the grace given, when `stop` is set.
async fn supervise(
    launch: Launch,
    mut child: Child,
    mut log_start: u64,
    mut stop: watch::Receiver<Option<Duration>>,
    pid: Arc<AtomicU32>,
    restarts: Restarts,
) {
    let mut crashes = 0;
    let mut backoff = restarts.backoff;
    loop {
        let status = tokio::select! {
            status = child.wait() => status,
            grace = stopped(&mut stop, restarts.grace) => {
                terminate(&mut child, grace).await;
                break;
            }
        };
        pid.store(0, Ordering::Release);
        let status = match status {
            Ok(status) if status.success() => {
                let _ = restarts.events.send(BackendEvent::Completed {
                    job: restarts.job.clone(),
                    id: restarts.id.clone(),
                });
                break;
            }
            Ok(status) => status.to_string(),
            Err(e) => e.to_string(),
        };
        let status = match launch.log_tail(log_start) {
            tail if tail.is_empty() => status,
            tail => format!("{status}; log: {tail}"),
        };
        crashes += 1;
        tracing::warn!(job = %restarts.job, id = %restarts.id, %status, crashes, "executor crashed");
        if crashes > restarts.max {
            let _ = restarts.events.send(BackendEvent::GaveUp {
                job: restarts.job.clone(),
                id: restarts.id.clone(),
                status: format!("{status}; crashed {crashes} times"),
            });
            break;
        }
        let _ = restarts.events.send(BackendEvent::Restarting {
            job: restarts.job.clone(),
            id: restarts.id.clone(),
            status,
            restart: crashes,
        });
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stopped(&mut stop, restarts.grace) => break,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
        (child, log_start) = match launch.spawn() {
            Ok(started) => {
                pid.store(started.0.id().unwrap_or(0), Ordering::Release);
                started
            }
            Err(message) => {
                let _ = restarts.events.send(BackendEvent::GaveUp {
                    job: restarts.job.clone(),
                    id: restarts.id.clone(),
                    status: format!("restart failed: {message}"),
                });
                break;
            }
        };
    }
    let _ = std::fs::remove_file(&launch.pid_file);
}

/// The grace of a stop once one was asked for (`otherwise` when the backend is gone).
async fn stopped(stop: &mut watch::Receiver<Option<Duration>>, otherwise: Duration) -> Duration {
    match stop.wait_for(Option::is_some).await {
        Ok(grace) => grace.unwrap_or(otherwise),
        Err(_) => otherwise,
    }
}

/// SIGTERM, then SIGKILL if it has not exited within `grace`.
async fn terminate(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.kill().await;
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn host_memory_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::{ExecutorRole, ExecutorSettings};

    /// An executable shell script `name` in `dir` running `body`.
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let script = dir.join(name);
        std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).expect("script");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        script
    }

    /// Executor 0 of `role` in job `j`.
    fn first_of_job_j(role: ExecutorRole, settings: ExecutorSettings) -> ExecutorSpec {
        ExecutorSpec {
            job: "j".into(),
            role,
            index: 0,
            settings,
            cpu: 1.0,
            memory_bytes: 1 << 20,
        }
    }

    #[test]
    fn picked_ports_are_below_the_ephemeral_range_and_skip_taken_ones() {
        let picker = PortPicker::new(Ipv4Addr::LOCALHOST.into());
        let first = picker.pick().expect("a port");
        assert!(
            picker.range.contains(&first),
            "{first} in {:?}",
            picker.range
        );
        let next = *picker.next.lock().expect("lock");
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, next));
        let second = picker.pick().expect("a port");
        if taken.is_ok() {
            assert_ne!(second, next, "a port something listens on is skipped");
        }
        assert!(picker.range.contains(&second));
    }

    #[test]
    fn strip_ansi_keeps_the_text_of_a_coloured_line() {
        assert_eq!(
            strip_ansi("\u{1b}[2m2026\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m boom"),
            "2026 ERROR boom"
        );
    }

    /// An executor that keeps failing: the give-up report carries the end of its output.
    #[tokio::test]
    async fn a_crash_report_quotes_the_last_lines_the_process_wrote() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = script(
            dir.path(),
            "crashing-trainer",
            "echo 'starting'\nprintf '\\033[31mError:\\033[0m cannot reach ps-1\\n' >&2\nexit 3",
        );
        let settings = LocalBackendSettings {
            binaries: [("trainer".to_owned(), script)].into(),
            work_dir: dir.path().join("work"),
            restart_backoff_ms: 1,
            max_restarts: 1,
            ..LocalBackendSettings::default()
        };
        let backend = LocalBackend::new(settings, "127.0.0.1:1".into());
        let mut events = backend.events();
        backend
            .request(first_of_job_j(
                ExecutorRole::Trainer,
                ExecutorSettings::Trainer(Box::default()),
            ))
            .await
            .expect("started");
        let mut reports = Vec::new();
        loop {
            let event = tokio::time::timeout(Duration::from_secs(20), events.recv())
                .await
                .expect("an event within 20 s")
                .expect("event");
            match event {
                BackendEvent::Restarting { status, .. } => reports.push(status),
                BackendEvent::GaveUp { status, .. } => {
                    reports.push(status);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(reports.len(), 2, "{reports:?}");
        for report in &reports {
            // Each run's own lines only, though the log file holds both runs.
            assert!(
                report.ends_with("log: starting | Error: cannot reach ps-1")
                    || report
                        .ends_with("log: starting | Error: cannot reach ps-1; crashed 2 times"),
                "{report}"
            );
            assert!(report.starts_with("exit status: 3"), "{report}");
        }
    }

    /// The backend measures a running executor's CPU and memory from /proc, and nothing
    /// once it was released.
    #[tokio::test]
    async fn a_running_executor_is_measured_and_a_released_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = script(dir.path(), "busy-data-executor", "while :; do :; done");
        let settings = LocalBackendSettings {
            binaries: [("data_executor".to_owned(), script)].into(),
            work_dir: dir.path().join("work"),
            stop_grace_ms: 200,
            ..LocalBackendSettings::default()
        };
        let backend = LocalBackend::new(settings, "127.0.0.1:1".into());
        let settings = ExecutorSettings::DataExecutor(Box::default());
        backend
            .request(first_of_job_j(ExecutorRole::DataExecutor, settings))
            .await
            .expect("started");
        backend.usage("j").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let usage = backend.usage("j").await;
        assert_eq!(usage.len(), 1, "{usage:?}");
        assert_eq!(usage[0].id, "data_executor-0");
        assert!(usage[0].cpu_cores > 0.2, "a busy loop: {usage:?}");
        assert!(usage[0].memory_bytes > 0, "{usage:?}");
        assert!(backend.usage("other").await.is_empty());
        backend
            .release("j", "data_executor-0")
            .await
            .expect("released");
        assert!(backend.usage("j").await.is_empty());
    }

    /// A process may be given more memory while the host has that much available, and is
    /// refused, naming the figures, beyond it.
    #[tokio::test]
    async fn an_executor_gets_more_memory_only_while_the_host_has_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = script(dir.path(), "idle-ps", "sleep 30");
        let settings = LocalBackendSettings {
            binaries: [("ps".to_owned(), script)].into(),
            work_dir: dir.path().join("work"),
            stop_grace_ms: 200,
            ..LocalBackendSettings::default()
        };
        let backend = LocalBackend::new(settings, "127.0.0.1:1".into());
        let settings = ExecutorSettings::Ps(Box::default());
        let spec = first_of_job_j(ExecutorRole::Ps, settings);
        let started = spec.memory_bytes;
        backend.request(spec).await.expect("started");
        let mut events = backend.events();
        backend
            .resize("j", "ps-0", 1.0, started + (1 << 20))
            .await
            .expect("a MiB more");
        assert!(matches!(
            events.try_recv(),
            Ok(BackendEvent::Resized { memory_bytes, .. }) if memory_bytes == started + (1 << 20)
        ));
        let available = host_memory_available().expect("/proc/meminfo");
        let refused = backend
            .resize("j", "ps-0", 1.0, started + (1 << 20) + available * 2)
            .await
            .expect_err("more than the host has");
        assert!(refused.to_string().contains("available"), "{refused}");
        backend.release("j", "ps-0").await.expect("released");
    }
}
