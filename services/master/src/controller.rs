//! The job controller: follows the Jobs of this master's shard from its resources' source
//! (`crate::resources`: the API server's Watch or the Kubernetes API's), and runs one
//! `job::drive` task per Job, passing it each new generation of the
//! Job's spec (a running Job applies the replicas it asks for). A driver moves its Job through
//! Pending -> Starting -> Running -> Succeeded | Failed, with a condition saying why;
//! deleting the Job stops its executors and drops its task queue.

use std::collections::HashMap;
use std::sync::Arc;

use primus_proto::v1::{EventType, Resource};
use primus_service::Shutdown;
use primus_spec::status::{Phase, Status};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::context::Context;
use crate::job;
use crate::job::status::{JobStatus, SUSPENDED};
use crate::resources::JobEvent;
use primus_backend::ResourceBackend;
use primus_data_tasks::plan::Catalog;
use primus_data_tasks::queue::TaskQueue;

struct Running {
    cancel: watch::Sender<bool>,
    /// The Job's resource as last seen: a new generation reaches the running driver.
    spec: watch::Sender<Resource>,
    task: JoinHandle<()>,
}

/// Follows Jobs until `shutdown`; then stops every driver (leaving Job status and queues
/// as they are, for the next master).
pub async fn run<B: ResourceBackend, C: Catalog>(context: Arc<Context<B, C>>, shutdown: Shutdown) {
    let mut drivers: HashMap<String, Running> = HashMap::new();
    let mut events = context
        .resources
        .follow_jobs(context.shard, shutdown.clone());
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            _ = shutdown.wait() => None,
        };
        match event {
            None => break,
            Some(JobEvent::Listed(resources)) => {
                let names: Vec<String> = resources.iter().map(|r| r.name.clone()).collect();
                drivers.retain(|name, _| names.contains(name));
                context.backend.release_jobs_not_listed(&names).await;
                for resource in resources {
                    observe(&context, &mut drivers, EventType::Added, resource).await;
                }
            }
            Some(JobEvent::Changed(kind, resource)) => {
                observe(&context, &mut drivers, kind, resource).await;
            }
        }
        drivers.retain(|_, running| !running.task.is_finished());
    }
    for (_, running) in drivers {
        let _ = running.cancel.send(true);
        let _ = running.task.await;
    }
}

async fn observe<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    drivers: &mut HashMap<String, Running>,
    kind: EventType,
    resource: Resource,
) {
    let name = resource.name.clone();
    if kind == EventType::Deleted {
        if let Some(running) = drivers.remove(&name) {
            let _ = running.cancel.send(true);
            let _ = running.task.await;
        }
        context.backend.release_job(&name).await;
        let queue = TaskQueue::new(
            context.redis.clone(),
            &context.settings.redis.key_prefix,
            &name,
        );
        if let Err(e) = queue.delete().await {
            tracing::warn!(job = %name, error = %e, "dropping the task queue of a deleted Job");
        }
        tracing::info!(job = %name, "Job deleted: executors stopped, task queue dropped");
        context.resources.released(&name).await;
        return;
    }
    let suspended = is_suspended(&resource);
    if suspended && let Some(running) = drivers.remove(&name) {
        let _ = running.cancel.send(true);
        let _ = running.task.await;
        context.backend.release_job(&name).await;
    }
    if let Some(running) = drivers.get(&name).filter(|r| !r.task.is_finished()) {
        running.spec.send_if_modified(|seen| {
            let newer = resource.generation > seen.generation;
            if newer {
                *seen = resource;
            }
            newer
        });
        return;
    }
    let status: Status = serde_json::from_str(&resource.status_json).unwrap_or_default();
    if status.phase.is_terminal() {
        return;
    }
    if suspended {
        hold_suspended(context, &resource, status).await;
        return;
    }
    let (cancel, cancelled) = watch::channel(false);
    let (spec, specs) = watch::channel(resource.clone());
    let task = tokio::spawn(job::drive(
        context.clone(),
        resource,
        status,
        specs,
        cancelled,
    ));
    drivers.insert(name, Running { cancel, spec, task });
}

/// Whether the Job's spec asks it to be suspended (a spec that does not parse is the
/// driver's to refuse).
fn is_suspended(resource: &Resource) -> bool {
    serde_json::from_str::<primus_spec::job::JobSpec>(&resource.spec_json).is_ok_and(|s| s.suspend)
}

/// A suspended Job runs nothing: Pending, with condition `Suspended` saying so (written
/// once per generation).
async fn hold_suspended<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    resource: &Resource,
    status: Status,
) {
    let shown = status.observed_generation == resource.generation
        && status.phase == Phase::Pending
        && (status.conditions.iter()).any(|c| c.kind == SUSPENDED && c.status);
    if shown {
        return;
    }
    let mut writer = JobStatus::new(
        context.resources.clone(),
        resource.name.clone(),
        status,
        resource.generation,
    );
    let message = "spec.suspend is true: no executor runs until it is false".to_owned();
    writer
        .set(Phase::Pending, SUSPENDED, "Suspended", message)
        .await;
    tracing::info!(job = %resource.name, "Job suspended");
}
