//! Jobs from the Primus API server: a List, then a Watch from the listed version, resumed
//! from the last version seen when the stream drops, listed again when that version is no
//! longer replayable (OUT_OF_RANGE).

use std::collections::HashMap;
use std::time::Duration;

use primus_api_client::ApiClient;
use primus_proto::v1::EventType;
use primus_service::Shutdown;
use primus_spec::Kind;
use tokio::sync::mpsc;

use super::JobEvent;
use crate::shard::owns_job;

pub(super) async fn follow_jobs(
    api: ApiClient,
    shard: (u32, u32),
    events: mpsc::Sender<JobEvent>,
    shutdown: Shutdown,
) {
    let mut since = 0u64;
    let mut listed = false;
    while !shutdown.is_triggered() {
        if !listed {
            match api.list(Kind::Job, HashMap::new()).await {
                Ok(list) => {
                    let owned = (list.resources.into_iter())
                        .filter(|r| owns_job(shard, &r.name))
                        .collect();
                    if events.send(JobEvent::Listed(owned)).await.is_err() {
                        return;
                    }
                    since = list.resource_version;
                    listed = true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "listing Jobs; retrying");
                    pause(&shutdown, Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        let mut stream = match api.watch(Some(Kind::Job), None, since).await {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "watching Jobs; retrying");
                listed = !matches!(e.code(), Some(tonic::Code::OutOfRange));
                pause(&shutdown, Duration::from_secs(1)).await;
                continue;
            }
        };
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                _ = shutdown.wait() => return,
            };
            match message {
                Ok(Some(event)) => {
                    let Some(resource) = event.resource else {
                        continue;
                    };
                    since = since.max(resource.resource_version);
                    if !owns_job(shard, &resource.name) {
                        continue;
                    }
                    let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Modified);
                    if events
                        .send(JobEvent::Changed(kind, resource))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::warn!(error = %status, since, "Job watch ended; resuming");
                    listed = status.code() != tonic::Code::OutOfRange;
                    break;
                }
            }
        }
    }
}

async fn pause(shutdown: &Shutdown, duration: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(duration) => {}
        _ = shutdown.wait() => {}
    }
}
