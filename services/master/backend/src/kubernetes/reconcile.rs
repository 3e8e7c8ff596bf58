//! Reconciliation as plain code: one executor's wanted pod against the pod observed for
//! it, producing the actions that bring them together and the backend events the Job
//! sees. Nothing here talks to a cluster.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, Secret};

use super::render::{ANNOTATION_EXECUTOR, ANNOTATION_JOB, ANNOTATION_SPEC};
use crate::BackendEvent;

/// The pod an executor should have (with its settings Secret), with its resources.
#[derive(Debug, Clone)]
pub struct Wanted {
    pub job: String,
    pub id: String,
    pub pod: Pod,
    pub settings: Secret,
    pub digest: String,
    pub cpu: f64,
    pub memory_bytes: u64,
    /// The port it serves gRPC on.
    pub port: u16,
}

/// A pod's phase as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

/// How a container run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub reason: String,
    pub exit_code: i32,
}

impl Exit {
    fn describe(&self) -> String {
        format!("exit code {} ({})", self.exit_code, self.reason)
    }
}

/// What the backend reads of one of its pods.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedPod {
    pub name: String,
    pub uid: String,
    pub job: String,
    pub id: String,
    pub digest: Option<String>,
    pub phase: Phase,
    pub ip: Option<IpAddr>,
    /// Deletion asked for (by anyone): the pod is going away.
    pub deleting: bool,
    /// `status.reason` (`Evicted`, `NodeLost`, ...) or a `DisruptionTarget` condition's.
    pub reason: Option<String>,
    /// Restarts of the executor's container in this pod.
    pub restarts: u32,
    /// How the container's previous run ended.
    pub last_exit: Option<Exit>,
    /// How its current run ended, when it has.
    pub exit: Option<Exit>,
    /// Whether its container runs now (not waiting to start again, not ended).
    pub running: bool,
    /// CPU (millicores) and memory (bytes) the pod's spec gives its container.
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl ObservedPod {
    /// The parts of `pod` reconciliation uses; `None` for a pod that is not an executor's.
    pub fn of(pod: &Pod) -> Option<Self> {
        let meta = &pod.metadata;
        let annotations = meta.annotations.as_ref()?;
        let status = pod.status.clone().unwrap_or_default();
        let container: Option<ContainerStatus> =
            (status.container_statuses.unwrap_or_default().into_iter()).next();
        let exit_of = |state: Option<&k8s_openapi::api::core::v1::ContainerState>| {
            state.and_then(|s| s.terminated.as_ref()).map(|t| Exit {
                reason: t.reason.clone().unwrap_or_else(|| "Error".into()),
                exit_code: t.exit_code,
            })
        };
        let disruption = (status.conditions.unwrap_or_default().into_iter())
            .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
            .map(|c| c.reason.unwrap_or_else(|| "DisruptionTarget".into()));
        let limits = (pod.spec.as_ref())
            .and_then(|s| s.containers.first())
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        Some(Self {
            name: meta.name.clone()?,
            uid: meta.uid.clone().unwrap_or_default(),
            job: annotations.get(ANNOTATION_JOB)?.clone(),
            id: annotations.get(ANNOTATION_EXECUTOR)?.clone(),
            digest: annotations.get(ANNOTATION_SPEC).cloned(),
            phase: match status.phase.as_deref() {
                Some("Running") => Phase::Running,
                Some("Succeeded") => Phase::Succeeded,
                Some("Failed") => Phase::Failed,
                Some("Unknown") => Phase::Unknown,
                _ => Phase::Pending,
            },
            ip: status.pod_ip.as_deref().and_then(|ip| ip.parse().ok()),
            deleting: meta.deletion_timestamp.is_some(),
            reason: status.reason.or(disruption),
            restarts: container
                .as_ref()
                .map_or(0, |c| u32::try_from(c.restart_count).unwrap_or(0)),
            last_exit: container
                .as_ref()
                .and_then(|c| exit_of(c.last_state.as_ref())),
            exit: container.as_ref().and_then(|c| exit_of(c.state.as_ref())),
            running: (container.as_ref())
                .and_then(|c| c.state.as_ref())
                .is_some_and(|s| s.running.is_some()),
            cpu_millis: limits
                .get("cpu")
                .and_then(|q| cpu_millis(&q.0))
                .unwrap_or(0),
            memory_bytes: (limits.get("memory"))
                .and_then(|q| primus_spec::job::parse_memory(&q.0).ok())
                .unwrap_or(0),
        })
    }
}

impl ObservedPod {
    /// Whether its node is gone (its kubelet will never confirm a deletion).
    pub fn node_gone(&self) -> bool {
        lost(self).is_some_and(|reason| node_gone(self, &reason))
    }
}

/// `500m`, `2`, `1.5`, `250000000n` (as the metrics API writes) as millicores.
pub fn cpu_millis(quantity: &str) -> Option<u64> {
    let (number, per_core) = match quantity.char_indices().last()? {
        (at, 'm') => (&quantity[..at], 1e3),
        (at, 'u') => (&quantity[..at], 1e6),
        (at, 'n') => (&quantity[..at], 1e9),
        _ => (quantity, 1.0),
    };
    let cores = number.parse::<f64>().ok()? / per_core;
    (cores.is_finite() && cores >= 0.0).then(|| (cores * 1000.0).round() as u64)
}

/// What the backend remembers of one executor between observations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tracked {
    /// The pod last observed for it.
    pub pod_uid: Option<String>,
    /// Its container's restarts already counted.
    pub seen_restarts: u32,
    /// Crashes and replacements so far, across its pods.
    pub restarts: u32,
    /// The IP it was last reached at.
    pub ip: Option<IpAddr>,
    /// Completed, or given up on: it gets no new pod.
    pub done: bool,
    /// A restart to report once the replacement pod has its address (so a recovery that
    /// follows the report reaches the new pod).
    pub pending: Option<BackendEvent>,
    /// The pod whose loss was counted (it may be observed again before it is gone).
    pub lost_uid: Option<String>,
}

/// Limits reconciliation works within.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_restarts: u32,
    /// A pod with no wanted executor is left alone this long after the backend starts, so
    /// a restarted master adopts the pods of the Jobs it drives again.
    pub adoption: Duration,
}

/// What to do about an executor.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create its pod (and settings Secret).
    Create,
    /// Delete pod `name`; `force` skips the grace period (its node is gone).
    Delete { name: String, force: bool },
    /// Change the pod's CPU and memory (in place where the cluster can, else by a new pod).
    Resize { name: String },
    /// Send `event`, with the last log lines of `log_of`'s previous container run added to
    /// its status when set.
    Report {
        event: BackendEvent,
        log_of: Option<String>,
    },
}

/// The actions for one executor: `wanted` (none once released) against `observed` (none
/// while it has no pod), `since_start` the time since the backend started.
pub fn reconcile(
    wanted: Option<&Wanted>,
    observed: Option<&ObservedPod>,
    tracked: &mut Tracked,
    limits: Limits,
    since_start: Duration,
) -> Vec<Action> {
    let Some(wanted) = wanted else {
        return match observed {
            Some(pod) if !pod.deleting && since_start >= limits.adoption => vec![Action::Delete {
                name: pod.name.clone(),
                force: false,
            }],
            _ => Vec::new(),
        };
    };
    let Some(pod) = observed else {
        if tracked.done {
            return Vec::new();
        }
        // Its pod went away without this backend deleting it (`kubectl delete pod`, a node
        // drain): the replacement starts as empty as after a crash.
        if let Some(uid) = tracked.pod_uid.take()
            && tracked.pending.is_none()
            && tracked.lost_uid.as_deref() != Some(uid.as_str())
        {
            tracked.restarts += 1;
            tracked.pending = Some(replaced(wanted, tracked, "its pod was deleted"));
        }
        return vec![Action::Create];
    };
    if tracked.pod_uid.as_deref() != Some(pod.uid.as_str()) {
        // A new pod, or one adopted after a master restart: its earlier restarts are not news.
        tracked.pod_uid = Some(pod.uid.clone());
        tracked.seen_restarts = pod.restarts;
    }
    let mut actions = Vec::new();
    if pod.deleting {
        // A pod whose node is gone stays Terminating until that node returns (only its
        // kubelet confirms a deletion): it is removed at once, so that its replacement,
        // which takes its name, can start on another node.
        return match lost(pod) {
            Some(reason) if node_gone(pod, &reason) => {
                replace_lost(wanted, pod, tracked, limits, reason)
            }
            _ => actions,
        };
    }
    if tracked.done {
        if pod.phase != Phase::Succeeded {
            actions.push(delete(pod, false));
        }
        return actions;
    }
    if pod.digest.as_deref() != Some(wanted.digest.as_str()) {
        // Runs something else than wanted (its Job changed while the master was away): a
        // new pod replaces it, and starts as empty as after a crash.
        actions.push(delete(pod, false));
        tracked.pending = Some(replaced(wanted, tracked, "its spec changed"));
        return actions;
    }
    if let Some(reason) = lost(pod) {
        return replace_lost(wanted, pod, tracked, limits, reason);
    }
    if pod.phase == Phase::Succeeded || pod.exit.as_ref().is_some_and(|e| e.exit_code == 0) {
        tracked.done = true;
        actions.push(report(BackendEvent::Completed {
            job: wanted.job.clone(),
            id: wanted.id.clone(),
        }));
        return actions;
    }
    if pod.restarts > tracked.seen_restarts {
        tracked.restarts += pod.restarts - tracked.seen_restarts;
        tracked.seen_restarts = pod.restarts;
        let exit = pod.last_exit.clone().unwrap_or(Exit {
            reason: "Unknown".into(),
            exit_code: -1,
        });
        if exit.reason == "OOMKilled" {
            actions.push(report(BackendEvent::OutOfMemory {
                job: wanted.job.clone(),
                id: wanted.id.clone(),
                memory_bytes: pod.memory_bytes,
            }));
        }
        let status = exit.describe();
        let event = crashed(wanted, tracked, limits, status);
        if tracked.done {
            actions.push(delete(pod, false));
        }
        actions.push(Action::Report {
            event,
            log_of: Some(pod.name.clone()),
        });
        return actions;
    }
    if let Some(ip) = pod.ip {
        if tracked.ip.is_some_and(|known| known != ip) {
            actions.push(report(BackendEvent::Moved {
                job: wanted.job.clone(),
                id: wanted.id.clone(),
                grpc_addr: SocketAddr::new(ip, wanted.port),
            }));
        }
        tracked.ip = Some(ip);
        if let Some(event) = tracked.pending.take() {
            actions.push(report(event));
        }
    }
    let wanted_millis = (wanted.cpu > 0.0).then(|| (wanted.cpu * 1000.0).ceil() as u64);
    let cpu_differs = wanted_millis.is_some_and(|m| m != pod.cpu_millis);
    let memory_differs = wanted.memory_bytes > 0 && wanted.memory_bytes != pod.memory_bytes;
    if pod.phase == Phase::Running && (cpu_differs || memory_differs) {
        if pod.running {
            actions.push(Action::Resize {
                name: pod.name.clone(),
            });
        } else {
            // A container that is not running (crash-looping, as after an OOM kill) starts
            // again within its pod's old limits: a new pod has the new ones everywhere.
            actions.push(delete(pod, false));
            tracked.pending = Some(replaced(wanted, tracked, "resized while not running"));
        }
    }
    actions
}

/// Why a pod is gone for good (its node, an eviction, a pod-level failure), if it is.
fn lost(pod: &ObservedPod) -> Option<String> {
    let reason = pod.reason.clone();
    match pod.phase {
        Phase::Failed => Some(reason.unwrap_or_else(|| "Failed".into())),
        Phase::Unknown => Some(reason.unwrap_or_else(|| "NodeLost".into())),
        _ => reason.filter(|r| r == "NodeLost" || r.starts_with("DeletionByTaint")),
    }
}

/// Whether a lost pod's node is gone (its kubelet will never confirm a deletion).
fn node_gone(pod: &ObservedPod, reason: &str) -> bool {
    pod.phase == Phase::Unknown
        || reason.contains("NodeLost")
        || reason.starts_with("DeletionByTaint")
}

/// Deletes a lost pod (at once where its node is gone) and counts the loss once per pod:
/// the restart is reported when the replacement has its address, or GaveUp at once.
fn replace_lost(
    wanted: &Wanted,
    pod: &ObservedPod,
    tracked: &mut Tracked,
    limits: Limits,
    reason: String,
) -> Vec<Action> {
    let mut actions = vec![delete(pod, node_gone(pod, &reason))];
    if tracked.lost_uid.as_deref() == Some(pod.uid.as_str()) {
        return actions;
    }
    tracked.lost_uid = Some(pod.uid.clone());
    tracked.restarts += 1;
    let event = crashed(
        wanted,
        tracked,
        limits,
        format!("pod {} lost: {reason}", pod.name),
    );
    match tracked.done {
        true => actions.push(report(event)),
        false => tracked.pending = Some(event),
    }
    actions
}

fn delete(pod: &ObservedPod, force: bool) -> Action {
    Action::Delete {
        name: pod.name.clone(),
        force,
    }
}

fn report(event: BackendEvent) -> Action {
    Action::Report {
        event,
        log_of: None,
    }
}

/// The restart a replacement of the executor's pod amounts to, for `why`: reported once
/// the new pod has its address.
pub fn replaced(wanted: &Wanted, tracked: &Tracked, why: &str) -> BackendEvent {
    BackendEvent::Restarting {
        job: wanted.job.clone(),
        id: wanted.id.clone(),
        status: format!("pod replaced: {why}"),
        restart: tracked.restarts,
    }
}

/// Restarting, or GaveUp (and done) past the allowed restarts.
fn crashed(wanted: &Wanted, tracked: &mut Tracked, limits: Limits, status: String) -> BackendEvent {
    let (job, id) = (wanted.job.clone(), wanted.id.clone());
    match tracked.restarts > limits.max_restarts {
        true => {
            tracked.done = true;
            BackendEvent::GaveUp {
                job,
                id,
                status: format!("{status}; crashed {} times", tracked.restarts),
            }
        }
        false => BackendEvent::Restarting {
            job,
            id,
            status,
            restart: tracked.restarts,
        },
    }
}
