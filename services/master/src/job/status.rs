//! The status writer of one Job: its phase, conditions, progress, replicas and events,
//! written through the API server's UpdateStatus.

use primus_api_client::ApiClient;
use primus_spec::Kind;
use primus_spec::status::{Condition, Phase, Status};

use crate::driver::now_ms;

pub(crate) struct JobStatus {
    api: ApiClient,
    name: String,
    pub(crate) status: Status,
}

impl JobStatus {
    /// The writer of `name`, whose current status is `status`, observing `generation`.
    pub(crate) fn new(api: ApiClient, name: String, mut status: Status, generation: u64) -> Self {
        status.observed_generation = generation;
        Self { api, name, status }
    }

    /// Sets condition `kind` (its transition time moves only when it changes).
    pub(crate) fn condition(&mut self, kind: &str, holds: bool, reason: &str, message: String) {
        let now = now_ms();
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

    /// Records an event in the status (written with the next write) and the log.
    pub(crate) fn event(&mut self, reason: &str, message: String) {
        tracing::info!(job = %self.name, reason, %message, "Job event");
        self.status.push_event(now_ms(), reason, message);
    }

    /// Moves the Job to `phase` with condition `kind` saying why, and writes the status.
    pub(crate) async fn set(&mut self, phase: Phase, kind: &str, reason: &str, message: String) {
        self.status.phase = phase;
        self.condition(kind, phase != Phase::Failed, reason, message);
        self.write().await;
    }

    /// Writes the status; a failure is logged (the next write carries the same state).
    pub(crate) async fn write(&self) {
        if let Err(e) = self
            .api
            .update_status(Kind::Job, &self.name, &self.status, 0)
            .await
        {
            tracing::warn!(job = %self.name, error = %e, "writing Job status");
        }
    }
}
