use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::process::{
    Error, Guarded, find_binary, free_port, loopback, restartable_port, restartable_ports,
    wait_for_start,
};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a server keeps its files: a temp dir removed on drop, or a caller's folder.
enum DataDir {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl DataDir {
    fn new(kept: Option<&Path>) -> Result<Self, Error> {
        match kept {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(Error::io(format!("create {}", dir.display())))?;
                Ok(Self::Kept(dir.to_path_buf()))
            }
            None => tempfile::Builder::new()
                .prefix("primus-testkit-")
                .tempdir()
                .map(Self::Temp)
                .map_err(Error::io("create a temp dir")),
        }
    }

    fn path(&self) -> &Path {
        match self {
            Self::Temp(t) => t.path(),
            Self::Kept(p) => p,
        }
    }

    fn log_file(&self, name: &str) -> Result<Stdio, Error> {
        let path = self.path().join(name);
        std::fs::File::create(&path)
            .map(Stdio::from)
            .map_err(Error::io(format!("create {}", path.display())))
    }
}

/// Starts `binary` in `dir` and waits until `probe` answers Ok; fails at once, with the
/// end of its logs, if it exits first.
fn spawn(
    binary: &str,
    args: &[String],
    dir: &DataDir,
    probe: impl FnMut() -> Result<(), String>,
) -> Result<Guarded, Error> {
    let exe = find_binary(binary)?;
    let (out, err) = (format!("{binary}.log"), format!("{binary}.err.log"));
    let child = Command::new(&exe)
        .args(args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(dir.log_file(&out)?)
        .stderr(dir.log_file(&err)?)
        .spawn()
        .map_err(Error::io(format!("start {}", exe.display())))?;
    let mut process = Guarded::new(child);
    let logs = [dir.path().join(out), dir.path().join(err)];
    wait_for_start(binary, READY_TIMEOUT, &mut process, &logs, probe)?;
    Ok(process)
}

/// Sends `request` to 127.0.0.1:`port` and returns the first bytes of the answer.
fn exchange(port: u16, request: &[u8]) -> Result<String, String> {
    exchange_at(loopback(port), request)
}

/// Sends `request` to `addr` and returns the first bytes of the answer.
fn exchange_at(addr: SocketAddr, request: &[u8]) -> Result<String, String> {
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    stream.write_all(request).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 256];
    let n = stream.read(&mut buf).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Status code of a bodiless HTTP/1.1 request.
pub(crate) fn http_status(port: u16, method: &str, path: &str) -> Result<u16, String> {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let answer = exchange(port, request.as_bytes())?;
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {answer:?}"))
}

/// A NATS server with JetStream.
pub struct NatsServer {
    ip: IpAddr,
    port: u16,
    process: Guarded,
    dir: DataDir,
}

impl NatsServer {
    /// On a free port, in a temp dir. The port is below the ephemeral range: one from it
    /// can become another test's outgoing source port before the server binds it (seen:
    /// nats-server exiting at start under the full suite).
    pub fn start() -> Result<Self, Error> {
        Self::start_with(restartable_port()?, None)
    }

    /// On `port`, keeping JetStream data in `dir` when given.
    pub fn start_with(port: u16, dir: Option<&Path>) -> Result<Self, Error> {
        Self::start_on(IpAddr::from([127, 0, 0, 1]), port, dir)
    }

    /// Listening on `ip` (an address of a network the test made, such as the host's
    /// address on a test cluster's network, where its pods reach it) and `port`.
    pub fn start_on(ip: IpAddr, port: u16, dir: Option<&Path>) -> Result<Self, Error> {
        let dir = DataDir::new(dir)?;
        let process = Self::launch(ip, port, &dir)?;
        Ok(Self {
            ip,
            port,
            process,
            dir,
        })
    }

    /// Kills the server (as a crash would) and starts it again on the same port over the
    /// same JetStream data, as a restarted server comes back.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.process.kill_now();
        self.process = Self::launch(self.ip, self.port, &self.dir)?;
        Ok(())
    }

    fn launch(ip: IpAddr, port: u16, dir: &DataDir) -> Result<Guarded, Error> {
        let store = dir.path().join("jetstream");
        let args = [
            "-a".into(),
            ip.to_string(),
            "-p".into(),
            port.to_string(),
            "-js".into(),
            "-sd".into(),
            store.display().to_string(),
        ];
        spawn("nats-server", &args, dir, || {
            let hello = exchange_at(SocketAddr::new(ip, port), b"")?;
            hello
                .starts_with("INFO")
                .then_some(())
                .ok_or(format!("unexpected greeting {hello:?}"))
        })
    }

    /// `nats://<ip>:<port>`.
    pub fn url(&self) -> String {
        format!("nats://{}:{}", self.ip, self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Where the server writes its logs and JetStream data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server now (as a crash would).
    pub fn kill(self) {
        drop(self.process);
    }
}

/// A Redis server.
pub struct RedisServer {
    port: u16,
    process: Guarded,
    dir: DataDir,
    persistent: bool,
}

impl RedisServer {
    /// On a free port below the ephemeral range (as [`NatsServer::start`]), in a temp dir,
    /// without persistence.
    pub fn start() -> Result<Self, Error> {
        Self::start_with(restartable_port()?, None)
    }

    /// On `port`; with `dir`, persisted there (append-only file) so a restart keeps data.
    pub fn start_with(port: u16, dir: Option<&Path>) -> Result<Self, Error> {
        Self::start_in(port, DataDir::new(dir)?, dir.is_some())
    }

    /// On a free port, persisted in a temp dir, so that [`RedisServer::restart`] keeps
    /// what was written.
    pub fn start_persistent() -> Result<Self, Error> {
        Self::start_in(restartable_port()?, DataDir::new(None)?, true)
    }

    fn start_in(port: u16, dir: DataDir, persistent: bool) -> Result<Self, Error> {
        let process = Self::launch(port, &dir, persistent)?;
        Ok(Self {
            port,
            process,
            dir,
            persistent,
        })
    }

    /// Kills the server (as a crash would) and starts it again on the same port; a
    /// persistent one comes back with every write it acknowledged.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.process.kill_now();
        self.process = Self::launch(self.port, &self.dir, self.persistent)?;
        Ok(())
    }

    fn launch(port: u16, dir: &DataDir, persistent: bool) -> Result<Guarded, Error> {
        let mut args: Vec<String> = vec![
            "--bind".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
            "--dir".into(),
            dir.path().display().to_string(),
            "--save".into(),
            String::new(),
        ];
        args.extend([
            "--appendonly".into(),
            if persistent { "yes" } else { "no" }.into(),
        ]);
        spawn("redis-server", &args, dir, || {
            let pong = exchange(port, b"PING\r\n")?;
            pong.starts_with("+PONG")
                .then_some(())
                .ok_or(format!("unexpected answer {pong:?}"))
        })
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Credentials the testkit's SeaweedFS accepts.
pub(crate) const ACCESS_KEY: &str = "primus-test";
pub(crate) const SECRET_KEY: &str = "primus-test-secret";

/// A SeaweedFS server (master, volume, filer, S3 gateway) with one identity.
///
/// SeaweedFS ignores SIGTERM for a long time, so it runs under a small shell watchdog that
/// SIGKILLs it when the owning process exits; that also covers the per-test-binary shared
/// instance, which lives in a static and is never dropped. If SeaweedFS dies on its own
/// while its owner lives, the watchdog leaves its folder (and `weed.log` in it) behind.
pub struct SeaweedS3 {
    s3_port: u16,
    filer_port: u16,
    _watchdog: Guarded,
}

/// How many times [`SeaweedS3::start`] launches SeaweedFS, on fresh ports each time,
/// before it gives up on one that exits while it starts.
const SEAWEED_LAUNCHES: usize = 3;
const SEAWEED_READY_TIMEOUT: Duration = Duration::from_secs(60);

impl SeaweedS3 {
    /// The one instance of this test binary, started on first use.
    pub fn shared() -> Result<&'static SeaweedS3, Error> {
        static SHARED: OnceLock<Result<SeaweedS3, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| SeaweedS3::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|detail| Error::FailedEarlier {
                what: "seaweedfs (shared)".into(),
                detail: detail.clone(),
            })
    }

    /// A new instance on free ports; its files are deleted when it stops. One that exits
    /// while it starts (another process took one of its ten ports) is launched again.
    pub fn start() -> Result<Self, Error> {
        let weed = find_binary("weed")?;
        let mut launches = 1;
        loop {
            match Self::launch(&weed) {
                Err(Error::Exited { .. }) if launches < SEAWEED_LAUNCHES => launches += 1,
                done => return done,
            }
        }
    }

    fn launch(weed: &Path) -> Result<Self, Error> {
        let dir = std::env::temp_dir().join(format!(
            "primus-weed-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("create {}", dir.display())))?;
        let identities = format!(
            r#"{{"identities":[{{"name":"primus","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
        );
        let s3_config = dir.join("s3.json");
        std::fs::write(&s3_config, identities).map_err(Error::io("write s3.json"))?;

        let flags = [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port.grpc",
            "s3.port.grpc",
            "s3.port.iceberg",
            "s3.port.lance",
        ];
        // Every listener gets its own port so instances never collide.
        let ports = restartable_ports(2 + flags.len())?;
        let (s3_port, filer_port) = (ports[0], ports[1]);
        let mut args = vec![
            "server".to_string(),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-dir={}", dir.display()),
            "-master.volumeSizeLimitMB=64".into(),
            "-volume.max=16".into(),
            "-filer".into(),
            format!("-filer.port={filer_port}"),
            format!("-filer.localSocket={}", dir.join("filer.sock").display()),
            "-s3".into(),
            format!("-s3.port={s3_port}"),
            format!("-s3.config={}", s3_config.display()),
            format!("-s3.localSocket={}", dir.join("s3.sock").display()),
        ];
        for (flag, port) in flags.iter().zip(&ports[2..]) {
            args.push(format!("-{flag}={port}"));
        }
        // SeaweedFS leaves /tmp/seaweedfs-<kind>-<port>.sock behind (it ignores TMPDIR).
        let sockets: Vec<String> = ports
            .iter()
            .map(|port| format!("/tmp/seaweedfs-*-{port}.sock"))
            .collect();
        let quoted: Vec<String> = std::iter::once(weed.display().to_string())
            .chain(args)
            .map(|a| format!("'{a}'"))
            .collect();
        let script = format!(
            "{cmd} >'{d}/weed.log' 2>&1 & w=$!\n\
             cleanup() {{ kill -9 $w 2>/dev/null; rm -rf '{d}' {sockets}; }}\n\
             trap 'cleanup; exit 0' TERM INT\n\
             while kill -0 {owner} 2>/dev/null && kill -0 $w 2>/dev/null; do sleep 0.5; done\n\
             if kill -0 {owner} 2>/dev/null; then rm -f {sockets}; exit 3; fi\n\
             cleanup",
            cmd = quoted.join(" "),
            d = dir.display(),
            owner = std::process::id(),
            sockets = sockets.join(" "),
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .spawn()
            .map_err(Error::io("start the seaweedfs watchdog"))?;
        let mut watchdog = Guarded::with_stop_signal(child);
        // An anonymous PUT answers 403 once the S3 gateway is up (500 while it starts).
        let log = [dir.join("weed.log")];
        let started = wait_for_start(
            "seaweedfs",
            SEAWEED_READY_TIMEOUT,
            &mut watchdog,
            &log,
            || match http_status(s3_port, "PUT", "/primus-probe")? {
                403 => Ok(()),
                other => Err(format!("S3 gateway answered {other}")),
            },
        );
        if let Err(error) = started {
            drop(watchdog);
            // The watchdog leaves the folder of a SeaweedFS that died by itself.
            let _ = std::fs::remove_dir_all(&dir);
            return Err(error);
        }
        Ok(Self {
            s3_port,
            filer_port,
            _watchdog: watchdog,
        })
    }

    /// The S3 endpoint (`http://127.0.0.1:<port>`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    /// Creates a new, empty bucket whose name starts with `hint`.
    pub fn bucket(&self, hint: &str) -> Result<S3Bucket, Error> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let clean: String = hint
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let name = format!(
            "{clean}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // A folder under the filer's /buckets is a bucket; this avoids signing a CreateBucket.
        let bucket_error = |detail: String| Error::Bucket {
            bucket: name.clone(),
            detail,
        };
        match http_status(self.filer_port, "POST", &format!("/buckets/{name}/")) {
            Ok(201) => {}
            Ok(status) => return Err(bucket_error(format!("filer answered {status}"))),
            Err(detail) => return Err(bucket_error(detail)),
        }
        Ok(S3Bucket {
            name,
            endpoint: self.endpoint(),
        })
    }
}

/// A bucket on a testkit SeaweedFS, with the credentials that open it.
#[derive(Debug, Clone)]
pub struct S3Bucket {
    /// The bucket's name.
    pub name: String,
    /// The S3 endpoint.
    pub endpoint: String,
}

impl S3Bucket {
    /// The region to sign with.
    pub const REGION: &'static str = "us-east-1";
    /// The access key id.
    pub const ACCESS_KEY: &'static str = ACCESS_KEY;
    /// The secret key.
    pub const SECRET_KEY: &'static str = SECRET_KEY;

    /// `s3://<bucket>`.
    pub fn url(&self) -> String {
        format!("s3://{}", self.name)
    }
}
