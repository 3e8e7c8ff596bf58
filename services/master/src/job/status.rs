//! The status writer of one Job: its phase, conditions, progress, replicas, executors and
//! events, written to the master's resources' source (and each event recorded there).

use primus_proto::v1::{Endpoint, Role};
use primus_spec::status::{Condition, ExecutorState, ExecutorStatus, Phase, Status};

use primus_spec::time::unix_ms;

use crate::resources::Resources;
pub(crate) use crate::resources::SUSPENDED;

pub(crate) struct JobStatus {
    resources: Resources,
    name: String,
    pub(crate) status: Status,
}

impl JobStatus {
    /// The writer of `name`, whose current status is `status`, observing `generation`.
    pub(crate) fn new(
        resources: Resources,
        name: String,
        mut status: Status,
        generation: u64,
    ) -> Self {
        status.observed_generation = generation;
        Self {
            resources,
            name,
            status,
        }
    }

    /// Sets condition `kind` (its transition time moves only when it changes).
    pub(crate) fn condition(&mut self, kind: &str, holds: bool, reason: &str, message: String) {
        let now = unix_ms();
        let conditions = &mut self.status.conditions;
        match conditions.iter_mut().find(|c| c.kind == kind) {
            Some(c) => {
                if c.status != holds || c.reason != reason {
                    c.last_transition_unix_ms = now;
                }
                c.status = holds;
                c.reason = reason.into();
                c.message = message;
            }
            None => conditions.push(Condition {
                kind: kind.into(),
                status: holds,
                reason: reason.into(),
                message,
                last_transition_unix_ms: now,
            }),
        }
    }

    /// The executors are those of `endpoints` now: new ones Running, those gone dropped, the
    /// rest as they were (their restarts count on, under this master and the next).
    pub(crate) fn show_executors(&mut self, endpoints: &[Endpoint]) {
        let now = unix_ms();
        let known = std::mem::take(&mut self.status.executors);
        self.status.executors = endpoints
            .iter()
            .map(|endpoint| {
                let role = Role::try_from(endpoint.role).unwrap_or(Role::Unspecified);
                let role = role
                    .as_str_name()
                    .trim_start_matches("ROLE_")
                    .to_ascii_lowercase();
                match known.iter().find(|e| e.id == endpoint.id) {
                    Some(e) => ExecutorStatus {
                        address: endpoint.grpc_addr.clone(),
                        role,
                        ..e.clone()
                    },
                    None => ExecutorStatus {
                        id: endpoint.id.clone(),
                        role,
                        address: endpoint.grpc_addr.clone(),
                        state: ExecutorState::Running,
                        restarts: 0,
                        last_exit: None,
                        since_unix_ms: now,
                    },
                }
            })
            .collect();
        self.status.executors.sort_by(|a, b| a.id.cmp(&b.id));
    }

    /// Executor `id` is in `state` now, its last run having ended with `exit`; `restarted`
    /// when the backend started it again.
    pub(crate) fn executor_changed(
        &mut self,
        id: &str,
        state: ExecutorState,
        exit: String,
        restarted: bool,
    ) {
        if let Some(executor) = self.status.executors.iter_mut().find(|e| e.id == id) {
            executor.state = state;
            executor.since_unix_ms = unix_ms();
            executor.last_exit = Some(exit);
            executor.restarts += u32::from(restarted);
        }
    }

    /// Every executor still shown as Running, but those `kept`, was stopped by the master
    /// as the Job ended.
    pub(crate) fn executors_stopped(&mut self, kept: impl Fn(&ExecutorStatus) -> bool) {
        let now = unix_ms();
        for executor in &mut self.status.executors {
            if executor.state == ExecutorState::Running && !kept(executor) {
                executor.state = ExecutorState::Stopped;
                executor.since_unix_ms = now;
            }
        }
    }

    /// Records an event in the status (written with the next write) and the log.
    pub(crate) fn event(&mut self, reason: &str, message: String) {
        tracing::info!(job = %self.name, reason, %message, "Job event");
        (self.resources).record_event(&self.name, reason, &message, false);
        self.status.push_event(unix_ms(), reason, message);
    }

    /// Moves the Job to `phase` with condition `kind` saying why, and writes the status.
    pub(crate) async fn set(&mut self, phase: Phase, kind: &str, reason: &str, message: String) {
        let changed = self.status.phase != phase;
        self.status.phase = phase;
        if changed {
            let warning = phase == Phase::Failed;
            (self.resources).record_event(&self.name, reason, &message, warning);
        }
        self.condition(kind, phase != Phase::Failed, reason, message);
        self.write().await;
    }

    /// Writes the status; a failure is logged (the next write carries the same state).
    pub(crate) async fn write(&self) {
        if let Err(e) = self.resources.write_status(&self.name, &self.status).await {
            tracing::warn!(job = %self.name, error = %e, "writing Job status");
        }
    }
}
