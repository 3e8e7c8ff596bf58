//! The `primus` command: resources (`apply`, `get`, `describe`, `delete`, `watch`) against
//! the API server, `up` (a local playground cluster), `health`, `datagen`, `import`,
//! `cluster` (RecD's clustering of stored data), `simulate` (the cluster simulator) and
//! `crds` (the custom resources' definitions for Kubernetes).
//!
//! Exit codes: 0 ok; 1 the server or the connection failed (or a watched Job failed);
//! 2 bad input, found locally (a file, a flag, a kind) or by the server (INVALID_ARGUMENT,
//! FAILED_PRECONDITION).

#![allow(
    clippy::print_stdout,
    reason = "the command's output is what it prints"
)]

pub mod cluster;
pub mod connection;
pub mod datagen;
pub mod import;
pub mod output;
pub mod replay;
pub mod resources;
pub mod simulate;
pub mod up;
pub mod watch;

use std::time::Duration;

use primus_config::DEFAULT_PORTS;
use primus_testkit::service::{ServingStatus, health_status};

/// The service binaries that run on their own, with their default ports, in start order.
/// Data executors and trainers are not among them: each serves one job, so the master
/// starts them.
pub fn services() -> [(&'static str, u16); 4] {
    [
        ("primus-api-server", DEFAULT_PORTS.api_server),
        ("primus-master", DEFAULT_PORTS.master),
        ("primus-ps", DEFAULT_PORTS.ps),
        ("primus-serving-sync", DEFAULT_PORTS.serving_sync),
    ]
}

/// One line of a health table.
pub struct HealthRow {
    pub name: String,
    pub addr: String,
    pub status: Result<ServingStatus, String>,
}

impl HealthRow {
    pub fn serving(&self) -> bool {
        matches!(self.status, Ok(ServingStatus::Serving))
    }
}

pub async fn probe(name: &str, addr: &str) -> HealthRow {
    let status = tokio::time::timeout(Duration::from_secs(3), health_status(addr, ""))
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
    HealthRow {
        name: name.into(),
        addr: addr.into(),
        status,
    }
}

pub fn print_table(rows: &[HealthRow]) {
    println!("{:<22} {:<18} STATUS", "SERVICE", "ADDRESS");
    for row in rows {
        let status = match &row.status {
            Ok(s) => format!("{s:?}").to_uppercase(),
            Err(e) => format!("UNREACHABLE ({e})"),
        };
        println!("{:<22} {:<18} {status}", row.name, row.addr);
    }
}

/// An error and the exit code it ends the command with.
#[derive(Debug)]
pub struct Failure {
    pub exit_code: u8,
    pub error: anyhow::Error,
}

impl Failure {
    /// The user's input is wrong: exit 2.
    pub fn input(error: anyhow::Error) -> Self {
        Self {
            exit_code: 2,
            error,
        }
    }

    /// The server or the connection failed: exit 1.
    pub fn server(error: anyhow::Error) -> Self {
        Self {
            exit_code: 1,
            error,
        }
    }
}

/// Prints the CustomResourceDefinitions of Primus's custom resources.
#[cfg(feature = "kubernetes")]
pub fn print_crds() -> Result<(), Failure> {
    let definitions =
        primus_kube_resources::crd::definitions_yaml().map_err(|e| Failure::server(e.into()))?;
    print!("{definitions}");
    Ok(())
}

/// Prints the CustomResourceDefinitions of Primus's custom resources.
#[cfg(not(feature = "kubernetes"))]
pub fn print_crds() -> Result<(), Failure> {
    Err(without_kubernetes("crds"))
}

/// What a Kubernetes command or flag answers in a `primus` built without them.
#[cfg(not(feature = "kubernetes"))]
pub fn without_kubernetes(what: &str) -> Failure {
    Failure::input(anyhow::anyhow!(
        "{what}: this primus was built without its kubernetes feature (cargo build -p primus-cli --features kubernetes)"
    ))
}

impl Failure {
    /// The same failure, with `context` before its message.
    pub fn context(self, context: String) -> Self {
        Self {
            exit_code: self.exit_code,
            error: self.error.context(context),
        }
    }
}

impl From<primus_api_client::ClientError> for Failure {
    fn from(error: primus_api_client::ClientError) -> Self {
        use tonic::Code;
        match error.code() {
            Some(Code::InvalidArgument | Code::FailedPrecondition) => Self::input(error.into()),
            _ => Self::server(error.into()),
        }
    }
}
