//! A Docker engine of the test's own ([`DockerEngine`]): Debian's dockerd (with the
//! containerd it starts) inside a network namespace joined to the host by a veth pair,
//! its data, state, socket and cgroups under a folder of its own, so that it never meets
//! another engine and its bridges, iptables rules and published ports stay inside that
//! namespace. A watchdog (`host.rs`) removes all of it when the engine is dropped or
//! the test process ends in any way.
//!
//! ```text
//!  host 10.201.0.1 ── veth ── engine namespace 10.201.0.2 (dockerd, its bridges, containers)
//! ```
//!
//! Published ports are reached from the host at [`DockerEngine::ip`]. The engine has no
//! network beyond the host: images come from [`crate::images`] (`docker load`) or are
//! built from them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::host::{Daemon, Watchdog, in_netns, run, sh, wait_for};
use crate::images::system_tool;
use crate::process::Error;

const HOST_IP: &str = "10.201.0.1";
const ENGINE_IP: &str = "10.201.0.2";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const TEARDOWN: &str = include_str!("teardown.sh");

/// A running Docker engine. See the module documentation.
pub struct DockerEngine {
    dir: PathBuf,
    socket: PathBuf,
    docker: PathBuf,
    daemon: Mutex<Option<Daemon>>,
    watchdog: Mutex<Watchdog>,
}

impl DockerEngine {
    /// The one engine of this test process, started on first use.
    pub fn shared() -> Result<&'static DockerEngine, Error> {
        static SHARED: OnceLock<Result<DockerEngine, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| DockerEngine::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|detail| Error::FailedEarlier {
                what: "the Docker engine (shared)".into(),
                detail: detail.clone(),
            })
    }

    /// Starts an engine; waits for another test process's engine to be torn down first.
    pub fn start() -> Result<Self, Error> {
        let started = Instant::now();
        let dockerd = system_tool("dockerd")?;
        let docker = system_tool("docker")?;
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("primus-docker-{pid}"));
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("create {}", dir.display())))?;
        let mut watchdog = Watchdog::start("docker", &dir, TEARDOWN)?;
        crate::host::remove_stale("primus-docker-", &dir);
        let netns = format!("primus-d{pid}");
        let cgroup_parent = format!("/primus-docker-{pid}");
        std::fs::write(dir.join("netns"), format!("{netns}\n"))
            .and_then(|()| std::fs::write(dir.join("cgroups"), format!("{cgroup_parent}\n")))
            .map_err(Error::io(format!("write the files of {}", dir.display())))?;
        let host_if = format!("pd{pid}");
        let made = sh(&format!(
            "ip netns add {netns}
             ip link add {host_if} type veth peer name eth0 netns {netns}
             ip addr add {HOST_IP}/24 dev {host_if}
             ip link set {host_if} up
             ip -n {netns} addr add {ENGINE_IP}/24 dev eth0
             ip -n {netns} link set lo up
             ip -n {netns} link set eth0 up
             ip -n {netns} route add default via {HOST_IP} dev eth0"
        ));
        if let Err(error) = made {
            watchdog.tear_down();
            return Err(error);
        }
        let socket = dir.join("docker.sock");
        let mut command = in_netns(&netns);
        command.extend([
            dockerd.display().to_string(),
            format!("--data-root={}", dir.join("data").display()),
            format!("--exec-root={}", dir.join("docker-exec").display()),
            format!("--pidfile={}", dir.join("dockerd.pid").display()),
            format!("--host=unix://{}", socket.display()),
            format!("--cgroup-parent={cgroup_parent}"),
            "--exec-opt=native.cgroupdriver=cgroupfs".into(),
            "--storage-driver=overlay2".into(),
        ]);
        let mut daemon = match Daemon::spawn("10-dockerd", &command, &dir, &[]) {
            Ok(daemon) => daemon,
            Err(error) => {
                watchdog.tear_down();
                return Err(error);
            }
        };
        let docker_path = docker.display().to_string();
        let host = format!("unix://{}", socket.display());
        let ready = wait_for("dockerd", READY_TIMEOUT, Some(&mut daemon), || {
            run(
                &docker_path,
                &["-H", &host, "version", "--format", "{{.Server.Version}}"],
            )
            .map(|_| ())
            .map_err(|e| e.to_string())
        });
        if let Err(error) = ready {
            watchdog.tear_down();
            return Err(error);
        }
        eprintln!(
            "[testkit] Docker engine up in {:.1}s (DOCKER_HOST={host})",
            started.elapsed().as_secs_f64()
        );
        Ok(Self {
            dir,
            socket,
            docker,
            daemon: Mutex::new(Some(daemon)),
            watchdog: Mutex::new(watchdog),
        })
    }

    /// `DOCKER_HOST` of the engine.
    pub fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The engine's address as the host reaches it (where its published ports listen).
    pub fn ip(&self) -> &'static str {
        ENGINE_IP
    }

    /// The engine's folder (its log under `logs/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `docker` talking to this engine.
    pub fn docker(&self) -> Command {
        let mut command = Command::new(&self.docker);
        command.env("DOCKER_HOST", self.host());
        command
    }

    /// Runs `docker ARGS` to completion and returns its output; a failure carries stderr.
    pub fn docker_run(&self, args: &[&str]) -> Result<String, Error> {
        let host = self.host();
        let mut all = vec!["-H", &host];
        all.extend_from_slice(args);
        run(&self.docker.display().to_string(), &all)
    }

    /// Loads a docker-archive tar (see [`crate::images`]).
    pub fn load(&self, archive: &Path) -> Result<(), Error> {
        self.docker_run(&["load", "--quiet", "--input", &archive.display().to_string()])
            .map(|_| ())
    }

    /// Stops the engine now and removes everything it made.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for DockerEngine {
    fn drop(&mut self) {
        if let Some(daemon) = (self.daemon.lock().unwrap_or_else(PoisonError::into_inner)).take() {
            daemon.stop(Duration::from_secs(15));
        }
        (self.watchdog.lock().unwrap_or_else(PoisonError::into_inner)).tear_down();
    }
}
