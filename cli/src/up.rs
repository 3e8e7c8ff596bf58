//! `primus up`: NATS, Redis and the standalone services as local processes, like a cluster
//! (the master starts each job's data executors, PS shards and trainers itself).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use primus_testkit::service::ServiceProcess;
use primus_testkit::{NatsServer, RedisServer};

use crate::{HealthRow, print_table, probe, services};

pub struct UpOptions {
    /// Where the servers keep data and the services write logs.
    pub data_dir: PathBuf,
    /// Where the service binaries are.
    pub bin_dir: PathBuf,
    pub nats_port: u16,
    pub redis_port: u16,
    /// Stop everything once healthy (a smoke check) instead of running until Ctrl-C.
    pub check: bool,
}

const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

pub async fn up(options: UpOptions) -> anyhow::Result<()> {
    let data = std::path::absolute(&options.data_dir)?;
    let logs = data.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;

    let nats = NatsServer::start_with(options.nats_port, Some(&data.join("nats")))
        .context("starting nats-server")?;
    let redis = RedisServer::start_with(options.redis_port, Some(&data.join("redis")))
        .context("starting redis-server")?;
    println!("nats   {}   (data in {})", nats.url(), nats.dir().display());
    println!(
        "redis  {}  (data in {})",
        redis.url(),
        redis.dir().display()
    );

    let token_file = ensure_token(&data, "token")?;
    let predict_token_file = ensure_token(&data, "predict-token")?;
    let nats_settings = format!("nats:\n  url: {}\n", nats.url());
    let api_settings = format!(
        "{nats_settings}redis:\n  url: {}\nauth:\n  token_file: {}\n",
        redis.url(),
        token_file.display()
    );
    let master_settings = format!(
        "{nats_settings}redis:\n  url: {}\napi:\n  server: http://127.0.0.1:{}\n  token_file: {}\nmaster:\n  predict_token_file: {}\nlocal:\n  work_dir: {}\n{}",
        redis.url(),
        primus_config::DEFAULT_PORTS.api_server,
        token_file.display(),
        predict_token_file.display(),
        data.join("work").display(),
        executor_environment()
    );
    let sync_settings = format!(
        "{nats_settings}api:\n  server: http://127.0.0.1:{}\n  token_file: {}\nsync:\n  master_addrs: [\"127.0.0.1:{}\"]\n",
        primus_config::DEFAULT_PORTS.api_server,
        token_file.display(),
        primus_config::DEFAULT_PORTS.master,
    );
    let mut running = Vec::new();
    for (name, port) in services() {
        // Only the api-server and the master talk to Redis (only they accept `redis`);
        // the master and serving-sync read resources from the API server.
        let settings = match name {
            "primus-api-server" => &api_settings,
            "primus-master" => &master_settings,
            "primus-serving-sync" => &sync_settings,
            _ => &nats_settings,
        };
        let server_keys = match name {
            "primus-api-server" => format!("  http_addr: {}\n", dashboard_addr()),
            _ => String::new(),
        };
        running.push(start(
            &options.bin_dir,
            &logs,
            name,
            port,
            &server_keys,
            settings,
        )?);
    }
    for process in &mut running {
        process
            .wait_healthy(HEALTH_TIMEOUT)
            .await
            .map_err(anyhow::Error::msg)?;
    }
    let mut rows = Vec::new();
    for process in &running {
        rows.push(probe(process.name(), process.addr()).await);
    }
    print_table(&rows);
    if !rows.iter().all(HealthRow::serving) {
        bail!("not every service is serving (logs in {})", logs.display());
    }

    println!(
        "API token in {0}; for the CLI: export PRIMUS_SERVER=http://127.0.0.1:{1} PRIMUS_TOKEN=$(cat {0})",
        token_file.display(),
        primus_config::DEFAULT_PORTS.api_server
    );
    println!(
        "Predict token in {}: serving replicas answer Predict only with `authorization: Bearer <it>`",
        predict_token_file.display()
    );
    let dashboard = dashboard_addr();
    match primus_testkit::service::http_request(&dashboard, "GET", "/", &[], "").await {
        Ok((200, _)) => println!("dashboard  http://{dashboard}/  (sign in with the API token)"),
        Ok((status, _)) => bail!("the dashboard at {dashboard} answered HTTP {status}"),
        Err(e) => bail!("the dashboard at {dashboard}: {e}"),
    }
    if options.check {
        println!("all services healthy; stopping them (--check)");
    } else {
        println!("cluster up; logs in {}. Ctrl-C stops it.", logs.display());
        wait_for_stop_signal().await?;
    }
    stop(running)
}

/// Stops the process listening on `exited`'s port, if any: the pid it stopped.
fn stop_successor(exited: &ServiceProcess) -> anyhow::Result<Option<u32>> {
    let port = (exited.addr().rsplit_once(':'))
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .with_context(|| format!("the address {}", exited.addr()))?;
    let Some(pid) = listener_pid(port) else {
        return Ok(None);
    };
    primus_testkit::service::signal(pid, "TERM").map_err(anyhow::Error::msg)?;
    let deadline = std::time::Instant::now() + STOP_TIMEOUT;
    while running(pid) {
        if std::time::Instant::now() > deadline {
            bail!("pid {pid} on port {port} still running {STOP_TIMEOUT:?} after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Some(pid))
}

/// Whether `pid` still runs (a zombie waiting for its parent to reap it does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        state != Some('Z')
    })
}

/// The process of this user listening on TCP `port` (from `/proc/net/tcp{,6}` and the
/// processes' open sockets).
fn listener_pid(port: u16) -> Option<u32> {
    const LISTEN: &str = "0A";
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| {
            (table.lines().skip(1))
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let local_port = fields.get(1)?.rsplit_once(':')?.1;
                    let listening = fields.get(3) == Some(&LISTEN);
                    (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                        .then(|| fields.get(9).map(|inode| format!("socket:[{inode}]")))
                        .flatten()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let processes = std::fs::read_dir("/proc").ok()?;
    processes.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let fds = std::fs::read_dir(entry.path().join("fd")).ok()?;
        fds.flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
            .then_some(pid)
    })
}

/// What executors need from this shell's environment, as `local.environment` settings:
/// a master restarted from its settings file (`<data>/logs/primus-master.yaml`) then starts
/// the same executors without it.
#[expect(
    clippy::disallowed_methods,
    reason = "the local cluster's executors get the ONNX Runtime library this shell names"
)]
fn executor_environment() -> String {
    let ort = std::env::var("ORT_DYLIB_PATH").ok();
    match ort {
        Some(path) => format!(
            "  environment:\n    ORT_DYLIB_PATH: {}\n",
            serde_json::Value::String(path)
        ),
        None => String::new(),
    }
}

/// A token of the local cluster in file `name` of `data` (the API's, Predict's): made once
/// (random, readable by this user only), then kept so clients survive a restart of the
/// cluster.
fn ensure_token(data: &Path, name: &str) -> anyhow::Result<PathBuf> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data.join(name);
    if path.is_file() {
        return Ok(path);
    }
    let mut random = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .with_context(|| format!("reading /dev/urandom for {}", path.display()))?;
    let token: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())
        .with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// Where `primus up`'s API server serves its dashboard.
fn dashboard_addr() -> String {
    format!("127.0.0.1:{}", primus_config::DEFAULT_PORTS.dashboard)
}

fn start(
    bin_dir: &Path,
    logs: &Path,
    name: &str,
    port: u16,
    server_keys: &str,
    settings: &str,
) -> anyhow::Result<ServiceProcess> {
    let exe = bin_dir.join(name);
    if !exe.is_file() {
        bail!(
            "{} not found (build with `cargo build --workspace`, or pass --bin-dir)",
            exe.display()
        );
    }
    ServiceProcess::start_with_server(&exe, logs, port, server_keys, settings)
        .with_context(|| format!("starting {name} on port {port}"))
}

async fn wait_for_stop_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    Ok(())
}

/// SIGTERM to every service, newest first; each must exit 0. A service that exited
/// meanwhile may have been started again by hand (from its settings file in the logs
/// folder): whatever listens on its port is stopped instead.
fn stop(running: Vec<ServiceProcess>) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    for mut process in running.into_iter().rev() {
        let name = process.name().to_owned();
        if let Some(status) = process.exited() {
            match stop_successor(&process) {
                Ok(Some(pid)) => println!(
                    "{name:<22} had exited ({status}); stopped the one found on {} (pid {pid})",
                    process.addr()
                ),
                Ok(None) => failed.push(format!("{name}: had exited ({status})")),
                Err(e) => failed.push(format!("{name}: {e}")),
            }
            continue;
        }
        match process.terminate(STOP_TIMEOUT) {
            Ok(status) if status.success() => println!("{name:<22} stopped (exit 0)"),
            Ok(status) => failed.push(format!("{name}: {status}")),
            Err(e) => failed.push(e),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("services did not stop cleanly: {}", failed.join("; "))
    }
}
