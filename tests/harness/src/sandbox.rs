//! A cluster sandbox: real NATS and Redis, an API server with a bearer token (in this
//! process, or as a process of its own that a test can kill), and a folder for everything
//! else; a master started from it runs as a real process ([`MasterProcess`]). Dropping the
//! sandbox stops its API server, and its servers and folder go with it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use primus_api_client::{ApiClient, ClientSettings};
use primus_bus::jetstream::JetStream;
use primus_config::{ApiServerSettings, MasterSettings, NatsSettings};
use primus_proto::v1::topology_service_client::TopologyServiceClient;
use primus_proto::v1::{Endpoint, GetTopologyRequest};
use primus_service::Shutdown;
use primus_spec::metric::MetricSpec;
use primus_spec::status::{Condition, Phase, Status};
use primus_spec::{Kind, Resource};
use primus_testkit::service::{ServiceProcess, ServingStatus, signal, wait_for_health};
use primus_testkit::{NatsServer, RedisServer, free_port, restartable_port};

/// The bearer token of every sandbox's API server.
pub const TOKEN: &str = "sandbox-token";

pub struct Sandbox {
    pub nats: NatsServer,
    pub redis: RedisServer,
    dir: tempfile::TempDir,
    api_addr: String,
    /// The API server's dashboard (host:port), when it serves one.
    dashboard_addr: Option<String>,
    api: ApiServer,
}

/// Where a sandbox's API server runs.
enum ApiServer {
    /// In this process, stopped through its shutdown.
    InProcess(Shutdown),
    /// A `primus-api-server` process (killed when dropped).
    Process(ServiceProcess),
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let ApiServer::InProcess(shutdown) = &self.api {
            shutdown.trigger();
        }
    }
}

impl Sandbox {
    /// Starts NATS, Redis and the API server; panics (the test fails) when one cannot start.
    /// An API server that ends before it serves (its ports taken between their choice and
    /// its bind, by another test's server) is started again on other ports, twice at most.
    pub async fn start() -> Self {
        let nats = NatsServer::start().expect("nats-server");
        let redis = RedisServer::start().expect("redis-server");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).expect("token");
        let mut ended = Vec::new();
        for _ in 0..3 {
            let mut settings = ApiServerSettings::default();
            settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
            settings.nats.url = nats.url();
            settings.redis.url = redis.url();
            settings.auth.token_file = Some(dir.path().join("token"));
            settings.store.watch_poll_interval_ms = 200;
            settings.server.http_addr = Some(([127, 0, 0, 1], free_port().expect("port")).into());
            let dashboard_addr = settings.server.http_addr.map(|addr| addr.to_string());
            let api_addr = settings.server.grpc_addr.to_string();
            let api_shutdown = Shutdown::new();
            let mut server = tokio::spawn(primus_api_server::run(settings, api_shutdown.clone()));
            let serving =
                wait_for_health(&api_addr, ServingStatus::Serving, Duration::from_secs(20));
            tokio::select! {
                ready = serving => ready.expect("api-server serving"),
                exited = &mut server => {
                    ended.push(match exited {
                        Ok(Ok(())) => "it returned before serving".to_owned(),
                        Ok(Err(e)) => format!("{e:#}"),
                        Err(e) => e.to_string(),
                    });
                    continue;
                }
            }
            return Self {
                nats,
                redis,
                dir,
                api_addr,
                dashboard_addr,
                api: ApiServer::InProcess(api_shutdown),
            };
        }
        panic!("the API server ended before serving, three times: {ended:?}");
    }

    /// A sandbox whose API server is a process of its own and whose Redis persists what it
    /// acknowledged, so a test can kill either and start it again
    /// ([`Sandbox::restart_api_server`], [`Sandbox::restart_redis`]).
    pub async fn start_restartable() -> Self {
        let nats = NatsServer::start().expect("nats-server");
        let redis = RedisServer::start_persistent().expect("redis-server");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).expect("token");
        // Restarted on the same address: a port no outgoing connection can take meanwhile.
        let port = restartable_port().expect("port");
        let api = start_api_process(dir.path(), port, &nats, &redis).await;
        Self {
            nats,
            redis,
            api_addr: format!("127.0.0.1:{port}"),
            dashboard_addr: None,
            api: ApiServer::Process(api),
            dir,
        }
    }

    /// SIGKILLs the API server process and starts another on its address (a sandbox of
    /// [`Sandbox::start_restartable`]); returns once it serves.
    pub async fn restart_api_server(&mut self) {
        let ApiServer::Process(api) = &self.api else {
            panic!("the API server runs in this process: start the sandbox restartable");
        };
        signal(api.pid(), "KILL").expect("SIGKILL the API server");
        let port = self
            .api_addr
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .expect("the API server's port");
        let next = start_api_process(self.dir.path(), port, &self.nats, &self.redis).await;
        self.api = ApiServer::Process(next);
    }

    /// Kills Redis and starts it again over its data (a sandbox of
    /// [`Sandbox::start_restartable`]); returns once it answers.
    pub fn restart_redis(&mut self) {
        self.redis.restart().expect("redis-server back");
    }

    /// The sandbox's folder (removed with it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The API server, host:port.
    pub fn api_addr(&self) -> &str {
        &self.api_addr
    }

    /// The API server's dashboard, host:port (a sandbox of [`Sandbox::start`]).
    pub fn dashboard_addr(&self) -> Option<&str> {
        self.dashboard_addr.as_deref()
    }

    pub fn token_file(&self) -> PathBuf {
        self.dir().join("token")
    }

    /// Where a master of this sandbox keeps its executors' settings, logs and PID files.
    pub fn work_dir(&self) -> PathBuf {
        self.dir().join("work")
    }

    /// A master's settings for this sandbox: its servers, the API server and token, a free
    /// port, executors under [`Sandbox::work_dir`], and short intervals that suit tests.
    pub fn master_settings(&self) -> MasterSettings {
        let mut settings = MasterSettings::default();
        // A master process binds it a moment later, and may be restarted on it.
        settings.server.grpc_addr = ([127, 0, 0, 1], restartable_port().expect("port")).into();
        settings.server.drain_timeout_ms = 2_000;
        settings.nats.url = self.nats.url();
        settings.redis.url = self.redis.url();
        settings.api.server = format!("http://{}", self.api_addr);
        settings.api.token_file = Some(self.token_file());
        settings.master.status_interval_ms = 200;
        settings.master.planner.poll_interval_ms = 200;
        settings.local.work_dir = self.work_dir();
        settings.local.restart_backoff_ms = 100;
        settings.local.stop_grace_ms = 3_000;
        settings
    }

    /// [`Sandbox::master_settings`] for Jobs that lose processes: tasks of about 1 MiB,
    /// quick heartbeats (an executor silent for 2 s is lost), five attempts per task.
    pub fn recovering_master_settings(&self) -> MasterSettings {
        let mut settings = self.master_settings();
        settings.master.planner.target_task_bytes = 1 << 20;
        settings.master.tasks.heartbeat_interval_ms = 200;
        settings.master.tasks.heartbeat_timeout_ms = 2_000;
        settings.master.tasks.max_attempts = 5;
        settings
    }

    pub async fn client(&self) -> ApiClient {
        ApiClient::connect(&ClientSettings {
            server: format!("http://{}", self.api_addr),
            token: TOKEN.into(),
            ca_file: None,
        })
        .await
        .expect("connect to the API server")
    }

    /// Applies every resource (each must be valid).
    pub async fn apply(&self, resources: impl IntoIterator<Item = Resource>) {
        let client = self.client().await;
        for resource in resources {
            client.apply(&resource, 0).await.expect("apply");
        }
    }

    /// Applies the resources of a YAML file's text (an example as shipped).
    pub async fn apply_yaml(&self, yaml: &str) {
        let resources = primus_spec::parse_documents("test.yaml", yaml).expect("valid resources");
        self.apply(resources).await;
    }

    pub async fn status(&self, job: &str) -> Status {
        let resource = self.client().await.get(Kind::Job, job).await.expect("job");
        serde_json::from_str(&resource.status_json).unwrap_or_default()
    }

    /// Waits for `job` to reach `phase`; fails with the logs when it ends otherwise or
    /// `timeout` passes.
    pub async fn wait_for_phase(&self, job: &str, phase: Phase, timeout: Duration) -> Status {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let status = self.status(job).await;
            if status.phase == phase {
                return status;
            }
            assert!(
                !status.phase.is_terminal() && tokio::time::Instant::now() < deadline,
                "job {job} not {phase:?} (within {timeout:?}): {status:?}\n{}",
                self.logs(job)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits (120 s at most) until `job`'s trainers report exactly `samples`.
    pub async fn wait_for_samples(&self, job: &str, samples: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let status = self.status(job).await;
            let trained = status.progress.as_ref().map_or(0, |p| p.samples);
            if trained == samples {
                return;
            }
            assert!(
                trained < samples
                    && !status.phase.is_terminal()
                    && tokio::time::Instant::now() < deadline,
                "{job}: waiting for {samples} samples: {status:?}\n{}",
                self.logs(job)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits (120 s at most) until `job`'s trainers report at least `samples`, while it
    /// runs; returns its status then.
    pub async fn wait_for_at_least(&self, job: &str, samples: u64) -> Status {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let status = self.status(job).await;
            if status.progress.as_ref().map_or(0, |p| p.samples) >= samples {
                return status;
            }
            assert!(
                !status.phase.is_terminal() && tokio::time::Instant::now() < deadline,
                "{job}: waiting for {samples} samples: {status:?}\n{}",
                self.logs(job)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `job`'s trained samples are still `samples` 3 s later.
    pub async fn assert_samples_stay(&self, job: &str, samples: u64) {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let status = self.status(job).await;
        assert_eq!(
            status.progress.as_ref().map(|p| p.samples),
            Some(samples),
            "{status:?}"
        );
    }

    /// The latest value of each of `names` in `job`'s Metric resource, once all exist.
    pub async fn latest_metrics(&self, job: &str, names: &[&str]) -> Option<Vec<f64>> {
        let metric = self.client().await.get(Kind::Metric, job).await.ok()?;
        let spec: MetricSpec = serde_json::from_str(&metric.spec_json).ok()?;
        names
            .iter()
            .map(|name| {
                let series = spec.series.iter().find(|s| s.name == *name)?;
                series.points.last().map(|p| p.value)
            })
            .collect()
    }

    /// A JetStream context on the sandbox's NATS server.
    pub async fn jetstream(&self) -> JetStream {
        let settings = NatsSettings {
            url: self.nats.url(),
            ..Default::default()
        };
        primus_bus::Bus::connect(&settings)
            .await
            .expect("nats")
            .jetstream()
    }

    /// serving-sync as a process following the master at `master` (exporting spans to
    /// `otlp` when given); returns once it serves.
    pub async fn start_serving_sync(&self, master: &str, otlp: Option<&str>) -> ServiceProcess {
        let mut settings = format!(
            "nats:\n  url: {}\napi:\n  server: http://{}\n  token_file: {}\nsync:\n  master_addrs: [\"{master}\"]\n  discovery_interval_ms: 200\n",
            self.nats.url(),
            self.api_addr(),
            self.token_file().display(),
        );
        if let Some(otlp) = otlp {
            settings.push_str(&format!("telemetry:\n  otlp_endpoint: {otlp}\n"));
        }
        let binary = binary("primus-serving-sync");
        let mut sync = ServiceProcess::start(&binary, self.dir(), &settings).expect("serving-sync");
        sync.wait_healthy(Duration::from_secs(30))
            .await
            .expect("serving-sync serving");
        sync
    }

    /// Deletes `job` and waits (20 s at most) until every process it had is gone and the
    /// backend has removed their PID files, which it does once it has reaped each one.
    pub async fn delete_job(&self, job: &str) {
        let pids = self.pids(job);
        self.client()
            .await
            .delete(Kind::Job, job, 0)
            .await
            .expect("delete");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while pids.values().any(|pid| alive(*pid)) || !self.pids(job).is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{job}: processes left behind: {pids:?}, PID files left: {:?}",
                self.pids(job)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// PIDs of `job`'s executors by id, from the local backend's PID files.
    pub fn pids(&self, job: &str) -> HashMap<String, u32> {
        let Ok(files) = std::fs::read_dir(self.work_dir().join(job)) else {
            return HashMap::new();
        };
        files
            .flatten()
            .filter(|f| f.path().extension().is_some_and(|e| e == "pid"))
            .filter_map(|f| {
                let text = std::fs::read_to_string(f.path()).ok()?;
                let pid = text.lines().next()?.parse().ok()?;
                let id = f.path().file_stem()?.to_str()?.to_owned();
                Some((id, pid))
            })
            .collect()
    }

    /// The master's log and the end of each of `job`'s executor logs, for a failure message.
    pub fn logs(&self, job: &str) -> String {
        let mut text = format!(
            "master log:\n{}",
            std::fs::read_to_string(self.dir().join("master.log")).unwrap_or_default()
        );
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.work_dir().join(job))
            .map(|files| files.flatten().map(|f| f.path()).collect())
            .unwrap_or_default();
        logs.retain(|path| path.extension().is_some_and(|e| e == "log"));
        logs.sort();
        for log in logs {
            let content = std::fs::read_to_string(&log).unwrap_or_default();
            let lines = without_backtraces(&content);
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            text.push_str(&format!(
                "\n--- {} (last 30 lines, backtraces left out):\n{tail}",
                log.display()
            ));
        }
        text
    }
}

/// The lines of a log without the frames of its backtraces, which would otherwise fill a
/// log's tail and hide the error above them.
fn without_backtraces(log: &str) -> Vec<&str> {
    let mut in_backtrace = false;
    log.lines()
        .filter(|line| {
            if line.trim_end() == "Stack backtrace:" || line.starts_with("stack backtrace:") {
                in_backtrace = true;
                return false;
            }
            in_backtrace &= line.starts_with(char::is_whitespace);
            !in_backtrace
        })
        .collect()
}

/// Whether process `pid` runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// `primus-api-server` as a process on `port`, over `nats` and `redis`, with the sandbox's
/// token; once it serves.
async fn start_api_process(
    dir: &Path,
    port: u16,
    nats: &NatsServer,
    redis: &RedisServer,
) -> ServiceProcess {
    let settings = format!(
        "nats:\n  url: {}\nredis:\n  url: {}\nauth:\n  token_file: {}\nstore:\n  watch_poll_interval_ms: 200\n",
        nats.url(),
        redis.url(),
        dir.join("token").display()
    );
    let mut api = ServiceProcess::start_on(&binary("primus-api-server"), dir, port, &settings)
        .expect("start primus-api-server");
    api.wait_healthy(Duration::from_secs(30))
        .await
        .expect("api-server serving");
    api
}

/// Where the workspace's binaries are: beside the running test's `deps` folder, as
/// `cargo test --workspace` builds them.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("a folder");
    deps.parent().unwrap_or(deps).to_path_buf()
}

/// The workspace binary `name`, which must be built.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo test --workspace`",
        path.display()
    );
    path
}

/// `primus-master` as a real process (so a test can kill it), with its settings file
/// written from typed settings and its log at `<sandbox>/master.log`. Stopped with
/// [`MasterProcess::stop`]; killed if dropped running.
pub struct MasterProcess {
    child: Child,
    addr: String,
}

impl MasterProcess {
    /// Starts the master of `sandbox` with `settings` and extra environment `env`.
    pub fn start(sandbox: &Sandbox, settings: &MasterSettings, env: &[(&str, &str)]) -> Self {
        Self::start_as(sandbox, "master", settings, env)
    }

    /// Starts a master of `sandbox` whose settings file and log are `<name>.toml` and
    /// `<name>.log` (a second master beside [`MasterProcess::start`]'s).
    pub fn start_as(
        sandbox: &Sandbox,
        name: &str,
        settings: &MasterSettings,
        env: &[(&str, &str)],
    ) -> Self {
        let config = sandbox.dir().join(format!("{name}.toml"));
        let text = primus_config::to_toml(settings).expect("master settings as TOML");
        std::fs::write(&config, text).expect("master settings file");
        let log =
            std::fs::File::create(sandbox.dir().join(format!("{name}.log"))).expect("master log");
        let child = Command::new(binary("primus-master"))
            .arg("--config")
            .arg(&config)
            .envs(env.iter().copied())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start primus-master");
        Self {
            child,
            addr: settings.server.grpc_addr.to_string(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The master's gRPC address, host:port.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// SIGTERM, then waits for it to exit.
    pub fn stop(mut self) {
        signal(self.child.id(), "TERM").expect("stop master");
        self.child.wait().expect("master exits");
    }

    /// SIGKILL, then waits for it to be gone (its executors stay: a new master kills them).
    pub fn kill(mut self) {
        signal(self.child.id(), "KILL").expect("kill master");
        self.child.wait().expect("master gone");
    }

    /// SIGKILLs this master, waits until it is gone (its address free again), and starts
    /// another in its place with `settings` and `env`.
    pub fn kill_and_start(
        &mut self,
        sandbox: &Sandbox,
        settings: &MasterSettings,
        env: &[(&str, &str)],
    ) {
        signal(self.child.id(), "KILL").expect("kill master");
        self.child.wait().expect("master gone");
        *self = MasterProcess::start(sandbox, settings, env);
    }
}

impl Drop for MasterProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = signal(self.child.id(), "TERM");
            let _ = self.child.wait();
        }
    }
}

/// The endpoints of `job` as the master at `master` (host:port) publishes them.
pub async fn topology(master: &str, job: &str) -> Vec<Endpoint> {
    TopologyServiceClient::connect(format!("http://{master}"))
        .await
        .expect("master")
        .get_topology(GetTopologyRequest { job: job.into() })
        .await
        .expect("topology")
        .into_inner()
        .endpoints
}

/// The status's condition `kind`; a test that expects one fails naming those it has.
pub fn condition<'a>(status: &'a Status, kind: &str) -> &'a Condition {
    status
        .conditions
        .iter()
        .find(|c| c.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} condition in {:?}", status.conditions))
}

#[cfg(test)]
mod tests {
    use super::without_backtraces;

    #[test]
    fn a_log_tail_keeps_the_error_and_what_follows_its_backtrace() {
        let log = "starting\nError: ps.tables[0].dim: must be > 0\n\nStack backtrace:\n   0: anyhow::error\n             at src/error.rs:1:1\n   1: main\nrestarted\nthread 'main' panicked at x.rs:1:1:\nboom\nstack backtrace:\n   0: core::panicking\n";
        assert_eq!(
            without_backtraces(log),
            [
                "starting",
                "Error: ps.tables[0].dim: must be > 0",
                "",
                "restarted",
                "thread 'main' panicked at x.rs:1:1:",
                "boom"
            ]
        );
    }
}
