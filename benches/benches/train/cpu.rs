//! CPU time per process over a run, read from /proc: what a minibatch costs the machine
//! through the services (every process the bench started, and the bench's own master and
//! API server) against the in-process trainer. Where the cores are the limit, the services'
//! rate cannot pass in-process CPU / services CPU of the in-process rate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// /proc's clock ticks a second (USER_HZ: 100 on every Linux ABI).
const TICKS_PER_SECOND: f64 = 100.0;
/// How often the children found so far are read: what a process spends in its last
/// interval before it exits is not counted.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Every how many reads all of `/proc` is scanned for new children. A scan reads every
/// process's `stat` and costs this process's CPU, which the bench counts against the
/// services; a child's ticks count from its start whenever it is found, so only a child
/// that exits within its first second is missed.
const SCAN_EVERY: u32 = 10;

/// One process's name and CPU ticks (user + system), from `/proc/<pid>/stat`.
struct ProcStat {
    name: String,
    parent: u32,
    ticks: u64,
}

fn read_stat(pid: &str) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name is in parentheses and may itself hold spaces or parentheses.
    let (open, close) = (text.find('(')?, text.rfind(')')?);
    let name = text.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = text.get(close + 2..)?.split(' ').collect();
    // After the name: state, ppid, ... utime (the 12th), stime (the 13th).
    let parent = fields.get(1)?.parse().ok()?;
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(ProcStat {
        name,
        parent,
        ticks: user + system,
    })
}

/// This process's CPU seconds so far.
pub(crate) fn own_seconds() -> Option<f64> {
    read_stat("self").map(|s| s.ticks as f64 / TICKS_PER_SECOND)
}

/// Children's latest CPU ticks by pid, kept after they exit.
type Seen = Arc<Mutex<HashMap<u32, (String, u64)>>>;

/// Reads this process's children every [`SAMPLE_EVERY`] until [`ChildrenCpu::stop`].
pub(crate) struct ChildrenCpu {
    seen: Seen,
    own_start: Option<f64>,
    sampler: tokio::task::JoinHandle<()>,
}

impl ChildrenCpu {
    pub(crate) fn start() -> Self {
        let seen = Seen::default();
        let sampler = tokio::spawn(sample(seen.clone()));
        Self {
            seen,
            own_start: own_seconds(),
            sampler,
        }
    }

    /// CPU seconds by process name (children) and `this process` (the bench's own).
    pub(crate) fn stop(self) -> Vec<(String, f64)> {
        self.sampler.abort();
        record_children(&self.seen);
        let mut by_name: HashMap<String, f64> = HashMap::new();
        let seen = self.seen.lock().expect("seen");
        for (name, ticks) in seen.values() {
            *by_name.entry(name.clone()).or_default() += *ticks as f64 / TICKS_PER_SECOND;
        }
        if let (Some(start), Some(end)) = (self.own_start, own_seconds()) {
            by_name.insert("this process".into(), end - start);
        }
        let mut totals: Vec<_> = by_name.into_iter().collect();
        totals.sort_by(|a, b| b.1.total_cmp(&a.1));
        totals
    }
}

async fn sample(seen: Seen) {
    for read in (0..SCAN_EVERY).cycle() {
        if read == 0 {
            record_children(&seen);
        } else {
            record_known(&seen);
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// Reads again the children found so far that are still running (an exited child's pid
/// taken by another process is not this process's child).
fn record_known(seen: &Seen) {
    let own = std::process::id();
    let mut seen = seen.lock().expect("seen");
    for (pid, (_, ticks)) in seen.iter_mut() {
        if let Some(stat) = read_stat(&pid.to_string())
            && stat.parent == own
        {
            *ticks = stat.ticks;
        }
    }
}

fn record_children(seen: &Seen) {
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let children = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, read_stat(&pid.to_string())?)))
        .filter(|(_, stat)| stat.parent == own);
    let mut seen = seen.lock().expect("seen");
    for (pid, stat) in children {
        seen.insert(pid, (stat.name, stat.ticks));
    }
}

/// `totals` per minibatch in ms, as `name a.b ms` parts, and their sum.
pub(crate) fn per_minibatch(totals: &[(String, f64)], minibatches: f64) -> (String, f64) {
    let ms = |seconds: f64| 1000.0 * seconds / minibatches.max(1.0);
    let parts = totals
        .iter()
        .map(|(name, seconds)| format!("{} {:.1}", label(name), ms(*seconds)))
        .collect::<Vec<_>>()
        .join(", ");
    (parts, ms(totals.iter().map(|(_, s)| s).sum()))
}

/// What a process is to the reader (`/proc` cuts names at 15 bytes).
fn label(name: &str) -> &str {
    match name {
        "primus-trainer" => "trainer",
        "primus-ps" => "PS shards",
        "primus-data-exe" => "data executor",
        "nats-server" => "NATS",
        "redis-server" => "Redis",
        "this process" => "master and API server (the bench's process)",
        other => other,
    }
}
