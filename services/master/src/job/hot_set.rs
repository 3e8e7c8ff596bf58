//! A Job's hot set, seen from the master: when one of its trainers crashes, the master
//! says so on the Job's hot-set subject, so the other members end a group it was in at once
//! instead of waiting out `training.hot_set.sync_timeout_ms` in their next round, while the
//! Job rolls back (`recovery.rs`).

use primus_bus::Bus;
use primus_proto::v1::hot_message::Kind;
use primus_proto::v1::{HotMemberCrashed, HotMessage};
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;

use crate::backend::{BackendEvent, ExecutorRole};

/// Publishes every crash of one of `job`'s trainers that the backend reports.
pub(super) async fn announce_crashed_trainers(
    mut events: Receiver<BackendEvent>,
    bus: Bus,
    job: String,
) {
    let subject = match bus.subjects().hot(&job) {
        Ok(subject) => subject,
        Err(e) => {
            tracing::warn!(job, error = %e, "no hot-set subject: trainer crashes go unannounced");
            return;
        }
    };
    loop {
        let trainer_id = match events.recv().await {
            Ok(
                BackendEvent::Restarting { job: of, id, .. }
                | BackendEvent::GaveUp { job: of, id, .. },
            ) if of == job && id.starts_with(ExecutorRole::Trainer.as_str()) => id,
            Ok(_) | Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        };
        let message = HotMessage {
            kind: Some(Kind::Crashed(HotMemberCrashed {
                trainer_id: trainer_id.clone(),
            })),
        };
        match bus.publish(subject.clone(), &message).await {
            Ok(()) => {
                tracing::info!(job, trainer = %trainer_id, "hot-set members told of a crashed trainer")
            }
            Err(e) => {
                tracing::warn!(job, trainer = %trainer_id, error = %e, "announcing a crashed trainer to the hot set")
            }
        }
    }
}
