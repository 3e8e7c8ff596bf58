//! The task monitor of one job: takes its data executors' heartbeats from NATS and gives
//! the work of those that went silent back to the queue.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use primus_bus::Bus;
use primus_config::TaskSettings;
use primus_proto::v1::Heartbeat;
use primus_spec::time;

use crate::queue::{QueueError, TaskQueue};
use crate::received::ReceivedRanges;

/// Re-queues the work of executors silent for longer than the heartbeat timeout, once
/// `received_reports(executor)` returned (the Job's trainers reported what they received
/// from it; an executor the backend restarts gets its work back when it registers), and
/// takes heartbeats from NATS. Runs until aborted.
pub async fn monitor<W, Waited>(
    queue: TaskQueue,
    received: Arc<ReceivedRanges>,
    received_reports: W,
    bus: Bus,
    job: String,
    settings: TaskSettings,
) where
    W: Fn(String) -> Waited,
    Waited: Future<Output = Result<(), QueueError>>,
{
    let queue = &queue;
    let heartbeats = async {
        let subject = match bus.subjects().heartbeat(&job, "data_executor", "*") {
            Ok(subject) => subject,
            Err(e) => return tracing::error!(%job, error = %e, "heartbeat subject"),
        };
        let mut beats = match bus.subscribe::<Heartbeat>(subject).await {
            Ok(beats) => beats,
            Err(e) => return tracing::error!(%job, error = %e, "heartbeat subscription"),
        };
        while let Some(beat) = beats.next().await {
            let Ok(beat) = beat else { continue };
            if let Some(endpoint) = beat.message.endpoint {
                // Only executors the queue knows (registered, not yet declared lost).
                if let Err(e) = queue.touch_known(&endpoint.id, time::unix_ms()).await {
                    tracing::warn!(%job, error = %e, "recording a heartbeat");
                }
            }
        }
    };
    let sweeps = async {
        let timeout = settings.heartbeat_timeout_ms as i64;
        let mut ticks = tokio::time::interval(Duration::from_millis(
            (settings.heartbeat_timeout_ms / 4).max(50),
        ));
        loop {
            ticks.tick().await;
            let silent_before = time::unix_ms() - timeout;
            let silent = match queue.silent_executors(silent_before).await {
                Ok(silent) => silent,
                Err(e) => {
                    tracing::warn!(%job, error = %e, "task monitor");
                    continue;
                }
            };
            for executor in silent {
                if received.restarting(&executor) {
                    // Its restart takes its tasks back once it registers.
                    continue;
                }
                // As for a restart: the trainers' reports move its tasks on through the
                // rows they received, before a successor reads them again.
                if let Err(e) = received_reports(executor.clone()).await {
                    tracing::warn!(%job, %executor, error = %e, "waiting for received rows");
                }
                // Meanwhile it may have registered again (a restart) and taken new work.
                let requeued = (queue.requeue_silent_executor(
                    &executor,
                    settings.max_attempts,
                    silent_before,
                ))
                .await;
                match requeued {
                    Ok(Some(requeued)) => {
                        tracing::warn!(%job, %executor, requeued, "executor stopped heartbeating; its tasks are re-queued")
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(%job, %executor, error = %e, "re-queueing"),
                }
            }
        }
    };
    tokio::join!(heartbeats, sweeps);
}
