//! Kueue (`sigs.k8s.io/kueue`, built by `scripts/install-cluster-tools.sh` with its
//! CustomResourceDefinitions) against a [`KubeCluster`]: the definitions installed, then its
//! controller manager as a process of its own with the administrator's kubeconfig, leader
//! election off, its ports on loopback. No webhook of it is registered with the API server
//! (its webhook server still starts, on a self-signed certificate, as Kueue cannot run
//! without one), so nothing Kueue would default or refuse through a webhook happens.
//!
//! Kueue reads its metrics certificate from a fixed `/etc/kueue/metrics/certs`: the manager
//! runs in a mount namespace of its own with the fixture's folder mounted there (an empty
//! `/etc/kueue` is the one trace it leaves on the host).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rcgen::{CertificateParams, KeyPair};

use super::KubeCluster;
use crate::images::cluster_tools_dir;
use crate::process::{Error, Guarded, restartable_ports, wait_for_start};
use crate::servers::http_status;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Where Kueue reads its metrics certificate, whatever its configuration says.
const METRICS_CERTS: &str = "/etc/kueue";

/// A running Kueue controller manager.
pub struct Kueue {
    _process: Guarded,
    _dir: tempfile::TempDir,
}

impl Kueue {
    /// Installs Kueue's definitions into `cluster` and starts its manager; returns once it
    /// reports ready.
    pub fn start(cluster: &KubeCluster) -> Result<Self, Error> {
        let tools = cluster_tools_dir();
        let manager = tools.join("bin/kueue");
        let crds = tools.join("kueue-crds");
        if !manager.is_file() || !crds.is_dir() {
            return Err(Error::MissingBinary {
                binary: "kueue (and its kueue-crds)".into(),
                tools: tools.display().to_string(),
                install: "./scripts/install-deps.sh (it runs scripts/install-cluster-tools.sh)"
                    .into(),
            });
        }
        // kubectl reads a folder, not a link to one.
        let crds = std::fs::canonicalize(&crds).map_err(Error::io("resolve kueue-crds"))?;
        // The Workload definition is over client-side apply's annotation limit.
        cluster.kubectl_run(&["apply", "--server-side", "-f", &crds.display().to_string()])?;
        // `kubectl wait` fails at once on a definition whose status is not written yet.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while let Err(e) = cluster.kubectl_run(&[
            "wait",
            "--for=condition=Established",
            "crd/workloads.kueue.x-k8s.io",
            "crd/clusterqueues.kueue.x-k8s.io",
            "crd/localqueues.kueue.x-k8s.io",
            "--timeout=10s",
        ]) {
            if std::time::Instant::now() > deadline {
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let dir = tempfile::Builder::new()
            .prefix("primus-kueue-")
            .tempdir()
            .map_err(Error::io("create a temp dir"))?;
        let [webhook, metrics, health] = restartable_ports(3)?[..] else {
            return Err(failed("three ports".into()));
        };
        self_signed(&dir.path().join("webhook"))?;
        self_signed(&dir.path().join("etc-kueue/metrics/certs"))?;
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            configuration(&dir.path().join("webhook"), webhook, metrics, health),
        )
        .map_err(Error::io("write Kueue's configuration"))?;
        std::fs::create_dir_all(METRICS_CERTS)
            .map_err(Error::io(format!("create {METRICS_CERTS}")))?;
        let log = dir.path().join("kueue.log");
        let log_file =
            std::fs::File::create(&log).map_err(Error::io(format!("create {}", log.display())))?;
        let script = format!(
            "mount --bind '{}' {METRICS_CERTS} && exec '{}' --config='{}' --kubeconfig='{}'",
            dir.path().join("etc-kueue").display(),
            manager.display(),
            config.display(),
            cluster.kubeconfig().display()
        );
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(
                log_file
                    .try_clone()
                    .map(Stdio::from)
                    .map_err(Error::io("open kueue.log"))?,
            )
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(Error::io(format!("start {}", manager.display())))?;
        let mut process = Guarded::new(child);
        wait_for_start(
            "kueue",
            READY_TIMEOUT,
            &mut process,
            &[log],
            || match http_status(health, "GET", "/readyz")? {
                200 => Ok(()),
                other => Err(format!("readyz answered {other}")),
            },
        )?;
        Ok(Self {
            _process: process,
            _dir: dir,
        })
    }
}

fn failed(detail: String) -> Error {
    Error::Unsupported {
        what: "kueue".into(),
        detail,
    }
}

/// A self-signed `tls.crt` and `tls.key` for localhost in `dir`.
fn self_signed(dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(Error::io(format!("create {}", dir.display())))?;
    let key = KeyPair::generate().map_err(|e| failed(format!("a key: {e}")))?;
    let params = CertificateParams::new(vec!["localhost".to_owned()])
        .map_err(|e| failed(format!("a certificate: {e}")))?;
    let certificate = params
        .self_signed(&key)
        .map_err(|e| failed(format!("a certificate: {e}")))?;
    std::fs::write(dir.join("tls.crt"), certificate.pem()).map_err(Error::io("write tls.crt"))?;
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).map_err(Error::io("write tls.key"))?;
    Ok(())
}

/// Kueue's configuration: no certificate management, no leader election, loopback ports,
/// no on-demand visibility server (it would need certificates of its own), Primus Jobs
/// known as an external framework.
fn configuration(webhook_certs: &Path, webhook: u16, metrics: u16, health: u16) -> String {
    format!(
        "apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: {webhook}
  certDir: {}
metrics:
  bindAddress: 127.0.0.1:{metrics}
health:
  healthProbeBindAddress: 127.0.0.1:{health}
featureGates:
  VisibilityOnDemand: false
integrations:
  frameworks:
  - batch/job
  externalFrameworks:
  - PrimusJob.v1.primus.dev
",
        webhook_certs.display()
    )
}
