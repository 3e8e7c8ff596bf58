//! Primus service binaries as real processes: start with a settings file, wait for gRPC
//! health, stop with SIGTERM and read the exit status.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use prost_types::FileDescriptorProto;
use tonic_health::pb::HealthCheckRequest;
pub use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::process::{Error, restartable_port};

/// The gRPC health status of `service` ("" for the whole process) at `addr` (host:port).
pub async fn health_status(addr: &str, service: &str) -> Result<ServingStatus, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(2));
    let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok(response.into_inner().status())
}

/// What gRPC reflection at `addr` answers to one request (as grpcurl asks it).
async fn reflect(addr: &str, request: MessageRequest) -> Result<MessageResponse, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::once(request))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let answer = answers
        .message()
        .await
        .map_err(|e| e.to_string())?
        .ok_or("reflection answered nothing")?;
    match answer.message_response {
        Some(MessageResponse::ErrorResponse(e)) => Err(format!(
            "reflection error {}: {}",
            e.error_code, e.error_message
        )),
        Some(response) => Ok(response),
        None => Err("an empty reflection answer".into()),
    }
}

/// The gRPC services reflection at `addr` lists, sorted.
pub async fn reflected_services(addr: &str) -> Result<Vec<String>, String> {
    match reflect(addr, MessageRequest::ListServices(String::new())).await? {
        MessageResponse::ListServicesResponse(list) => {
            let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            names.sort();
            Ok(names)
        }
        other => Err(format!("not a service list: {other:?}")),
    }
}

/// The fully qualified messages and services of the files reflection at `addr` sends for
/// `symbol` (the file defining it and those it imports).
pub async fn reflected_symbols(addr: &str, symbol: &str) -> Result<Vec<String>, String> {
    let request = MessageRequest::FileContainingSymbol(symbol.to_owned());
    let MessageResponse::FileDescriptorResponse(files) = reflect(addr, request).await? else {
        return Err(format!("no file descriptors for {symbol}"));
    };
    let mut symbols = Vec::new();
    for bytes in files.file_descriptor_proto {
        let file = <FileDescriptorProto as prost::Message>::decode(bytes.as_slice())
            .map_err(|e| format!("a file descriptor for {symbol}: {e}"))?;
        let package = file.package().to_owned();
        let names = file
            .message_type
            .iter()
            .map(|m| m.name())
            .chain(file.service.iter().map(|s| s.name()));
        symbols.extend(names.map(|name| format!("{package}.{name}")));
    }
    Ok(symbols)
}

/// One HTTP/1.1 request to `addr` (host:port) on a fresh connection, with `headers` and
/// `body`: the answer's status code and body.
pub async fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("send to {addr}: {e}"))?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .map_err(|_| format!("no answer from {addr} in 10 s"))?
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP answer: {answer:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// Waits until `addr` reports `wanted`, or fails with the last status or error seen.
pub async fn wait_for_health(
    addr: &str,
    wanted: ServingStatus,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match health_status(addr, "").await {
            Ok(status) if status == wanted => return Ok(()),
            Ok(status) => format!("{status:?}"),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "{addr} not {wanted:?} after {timeout:?}; last: {seen}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A running service binary; killed if dropped without [`ServiceProcess::terminate`].
pub struct ServiceProcess {
    name: String,
    child: Child,
    addr: String,
    log: PathBuf,
}

impl ServiceProcess {
    /// Starts `exe --config <dir>/<name>.yaml` with the listener on a free port; `settings`
    /// is the rest of the YAML file (other sections). Output goes to `<dir>/<name>.log`.
    /// The port is below the ephemeral range: the process binds it only once it has
    /// started, and meanwhile any outgoing connection could take an ephemeral one.
    pub fn start(exe: &Path, dir: &Path, settings: &str) -> Result<Self, Error> {
        let port = restartable_port()?;
        Self::start_on(exe, dir, port, settings)
    }

    /// Like [`ServiceProcess::start`], on a given port.
    pub fn start_on(exe: &Path, dir: &Path, port: u16, settings: &str) -> Result<Self, Error> {
        Self::start_with_server(exe, dir, port, "", settings)
    }

    /// Like [`ServiceProcess::start_on`], with more keys of the `server` section
    /// (`server_keys`: lines indented by two spaces, e.g. `  http_addr: 127.0.0.1:7080\n`).
    pub fn start_with_server(
        exe: &Path,
        dir: &Path,
        port: u16,
        server_keys: &str,
        settings: &str,
    ) -> Result<Self, Error> {
        let name = exe
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "service".into());
        let addr = format!("127.0.0.1:{port}");
        let config = dir.join(format!("{name}.yaml"));
        let body = format!(
            "server:\n  grpc_addr: {addr}\n  drain_timeout_ms: 5000\n{server_keys}{settings}"
        );
        std::fs::write(&config, body).map_err(Error::io(format!("write {}", config.display())))?;
        let log = dir.join(format!("{name}.log"));
        let out =
            std::fs::File::create(&log).map_err(Error::io(format!("create {}", log.display())))?;
        let err = out.try_clone().map_err(Error::io("clone a log handle"))?;
        let child = Command::new(exe)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(Error::io(format!("start {}", exe.display())))?;
        Ok(Self {
            name,
            child,
            addr,
            log,
        })
    }

    /// The binary's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its address, host:port.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How it exited, if it has.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The process's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for SERVING; the error carries the service's log.
    pub async fn wait_healthy(&mut self, timeout: Duration) -> Result<(), String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Err(format!(
                "{} exited with {status}:\n{}",
                self.name,
                self.log()
            ));
        }
        wait_for_health(&self.addr, ServingStatus::Serving, timeout)
            .await
            .map_err(|e| format!("{}: {e}\n--- log ---\n{}", self.name, self.log()))
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit.
    pub fn terminate(mut self, timeout: Duration) -> Result<ExitStatus, String> {
        signal(self.child.id(), "TERM")?;
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Ok(None) => {
                    return Err(format!(
                        "{} still running {timeout:?} after SIGTERM\n--- log ---\n{}",
                        self.name,
                        self.log()
                    ));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends a signal by name (`TERM`, `KILL`) to a process.
pub fn signal(pid: u32, name: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("kill -{name} {pid}: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or(format!("kill -{name} {pid} exited with {status}"))
}

/// The checks every service binary must pass: `--help` exits 0 and documents `--config`;
/// with `settings` it becomes healthy; SIGTERM makes it exit 0; a bad setting makes it exit
/// non-zero naming the key.
pub async fn check_service_binary(exe: &Path, settings: &str) -> Result<(), String> {
    let help = Command::new(exe)
        .arg("--help")
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&help.stdout);
    if !help.status.success() || !text.contains("--config") || !text.contains("PRIMUS_") {
        return Err(format!("--help: {}\n{text}", help.status));
    }

    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut process =
        ServiceProcess::start(exe, dir.path(), settings).map_err(|e| e.to_string())?;
    process.wait_healthy(Duration::from_secs(30)).await?;
    let status = process.terminate(Duration::from_secs(15))?;
    if !status.success() {
        return Err(format!("exit after SIGTERM: {status}"));
    }

    let bad = Command::new(exe)
        .env("PRIMUS_SERVER__GRPC_ADDR", "not-an-address")
        .output()
        .map_err(|e| e.to_string())?;
    let err = String::from_utf8_lossy(&bad.stderr);
    if bad.status.success() || !err.contains("server.grpc_addr") || !err.contains("environment") {
        return Err(format!("bad setting: {}\n{err}", bad.status));
    }
    Ok(())
}
