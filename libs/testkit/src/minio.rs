//! MinIO, the S3 server the Kubernetes manifests and docker-compose deploy, as a process on
//! loopback (built by `scripts/install-cluster-tools.sh`; AGPL, so it runs as its own
//! program and is never linked). Buckets are made with curl's AWS signing, as the
//! compose file's `minio-bucket` service makes its own.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::process::{Error, Guarded, find_binary, restartable_ports, wait_for_start};
use crate::servers::{ACCESS_KEY, S3Bucket, SECRET_KEY, http_status};

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A MinIO server on one loopback port with the testkit's S3 credentials
/// ([`S3Bucket::ACCESS_KEY`], [`S3Bucket::SECRET_KEY`]); its files are deleted when it is
/// dropped, and kept across [`MinioS3::stop`] and [`MinioS3::start_again`].
pub struct MinioS3 {
    ports: [u16; 2],
    process: Guarded,
    dir: tempfile::TempDir,
}

impl MinioS3 {
    /// A new server on free ports.
    pub fn start() -> Result<Self, Error> {
        let dir = tempfile::Builder::new()
            .prefix("primus-minio-")
            .tempdir()
            .map_err(Error::io("create a temp dir"))?;
        let ports = restartable_ports(2)?;
        let ports = [ports[0], ports[1]];
        let process = launch(ports, dir.path())?;
        Ok(Self {
            ports,
            process,
            dir,
        })
    }

    /// Kills the server (SIGKILL), as a crash or a cut-off network would take it away; its
    /// files stay.
    pub fn stop(&mut self) {
        self.process.kill_now();
    }

    /// Starts the server again on its port, over its files, after [`MinioS3::stop`].
    pub fn start_again(&mut self) -> Result<(), Error> {
        self.process.kill_now();
        self.process = launch(self.ports, self.dir.path())?;
        Ok(())
    }

    /// The S3 endpoint (`http://127.0.0.1:<port>`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[0])
    }

    /// A new empty bucket whose name starts with `hint`.
    pub fn bucket(&self, hint: &str) -> Result<S3Bucket, Error> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{hint}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // The SHA-256 of an empty body, which S3's signature covers.
        const EMPTY_SHA256: &str =
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let out = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
            .arg(format!("{}/{name}", self.endpoint()))
            .args(["--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
            .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
            .args(["-H", &format!("x-amz-content-sha256: {EMPTY_SHA256}")])
            .output()
            .map_err(Error::io("run curl to create a bucket"))?;
        let code = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if code != "200" {
            return Err(Error::Bucket {
                bucket: name,
                detail: format!(
                    "CreateBucket answered HTTP {code}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(S3Bucket {
            name,
            endpoint: self.endpoint(),
        })
    }
}

/// Runs MinIO on `ports` (S3, console) over the files in `dir`, once it is ready.
fn launch(ports: [u16; 2], dir: &Path) -> Result<Guarded, Error> {
    let minio = find_binary("minio").map_err(|_| Error::MissingBinary {
        binary: "minio".into(),
        tools: "$CLUSTER_TOOLS_DIR/bin (~/.cache/primus-rs/tools/bin)".into(),
        install: "./scripts/install-cluster-tools.sh".into(),
    })?;
    let log = dir.join("minio.log");
    let log_file = (std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log))
    .map_err(Error::io(format!("open {}", log.display())))?;
    let child = Command::new(&minio)
        .arg("server")
        .arg(dir.join("data"))
        .arg(format!("--address=127.0.0.1:{}", ports[0]))
        .arg(format!("--console-address=127.0.0.1:{}", ports[1]))
        .env("MINIO_ROOT_USER", ACCESS_KEY)
        .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
        .env("MINIO_BROWSER", "off")
        .env("MINIO_UPDATE", "off")
        .stdin(Stdio::null())
        .stdout(
            log_file
                .try_clone()
                .map(Stdio::from)
                .map_err(Error::io("open minio.log"))?,
        )
        .stderr(Stdio::from(log_file))
        .spawn()
        .map_err(Error::io(format!("start {}", minio.display())))?;
    let mut process = Guarded::new(child);
    wait_for_start(
        "minio",
        READY_TIMEOUT,
        &mut process,
        &[log],
        || match http_status(ports[0], "GET", "/minio/health/ready")? {
            200 => Ok(()),
            other => Err(format!("health answered {other}")),
        },
    )?;
    Ok(process)
}
