//! The `primus` command. Today: `up` (a local playground cluster) and `health`.

pub mod up;

use std::time::Duration;

use primus_config::DEFAULT_PORTS;
use primus_testkit::service::{ServingStatus, health_status};

/// The six service binaries and their default ports, in start order.
pub fn services() -> [(&'static str, u16); 6] {
    [
        ("primus-api-server", DEFAULT_PORTS.api_server),
        ("primus-master", DEFAULT_PORTS.master),
        ("primus-data-executor", DEFAULT_PORTS.data_executor),
        ("primus-trainer", DEFAULT_PORTS.trainer),
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
