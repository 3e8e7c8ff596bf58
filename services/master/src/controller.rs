//! The job controller: follows Jobs through the API server's Watch (listing again when the
//! watch falls behind, resuming from its last version when the stream drops), and runs one
//! [`drive_job`] task per Job of this master's shard. A driver moves its Job through
//! Pending -> Starting -> Running -> Succeeded | Failed, with a condition saying why;
//! deleting the Job stops its executors and drops its task queue.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use primus_api_client::{ApiClient, ClientError};
use primus_bus::Bus;
use primus_model::ModelLayout;
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{Endpoint, EventType, MetricsReport, Resource, Role, SnapshotRequest};
use primus_service::Shutdown;
use primus_spec::Kind;
use primus_spec::dataset::DatasetSpec;
use primus_spec::job::{Device, JobSpec};
use primus_spec::status::{Condition, Phase, Status};
use redis::aio::ConnectionManager;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backend::{BackendEvent, ExecutorRole, ExecutorSpec, ResourceBackend};
use crate::checkpoint::{
    self, Alignments, CheckpointError, CheckpointRecord, KnownTotals, ShardRecovery,
};
use crate::driver::{self, now_ms};
use crate::metrics::MetricsFold;
use crate::plan::{Catalog, ListingCache};
use crate::queue::TaskQueue;
use crate::settings::{MasterSettings, owns_job};
use crate::tasks::{JobRegistry, JobTasks};
use crate::topology::Topologies;

/// Everything the job drivers share.
pub struct Context<B, C> {
    pub api: ApiClient,
    pub bus: Bus,
    pub redis: ConnectionManager,
    pub settings: MasterSettings,
    pub shard: (u32, u32),
    pub backend: Arc<B>,
    pub cache: Arc<ListingCache<C>>,
    pub jobs: JobRegistry,
    pub topologies: Topologies,
}

struct Running {
    cancel: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Follows Jobs until `shutdown`; then stops every driver (leaving Job status and queues
/// as they are, for the next master).
pub async fn run<B: ResourceBackend, C: Catalog>(context: Arc<Context<B, C>>, shutdown: Shutdown) {
    let mut drivers: HashMap<String, Running> = HashMap::new();
    let mut since = 0u64;
    let mut listed = false;
    while !shutdown.is_triggered() {
        if !listed {
            match context.api.list(Kind::Job, HashMap::new()).await {
                Ok(list) => {
                    let names: Vec<&str> = list.resources.iter().map(|r| r.name.as_str()).collect();
                    drivers.retain(|name, _| names.contains(&name.as_str()));
                    for resource in list.resources {
                        observe(&context, &mut drivers, EventType::Added, resource).await;
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
        let mut events = match context.api.watch(Some(Kind::Job), None, since).await {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(error = %e, "watching Jobs; retrying");
                listed = !matches!(e.code(), Some(tonic::Code::OutOfRange));
                pause(&shutdown, Duration::from_secs(1)).await;
                continue;
            }
        };
        loop {
            let message = tokio::select! {
                message = events.message() => message,
                _ = shutdown.wait() => break,
            };
            match message {
                Ok(Some(event)) => {
                    let Some(resource) = event.resource else {
                        continue;
                    };
                    since = since.max(resource.resource_version);
                    let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Modified);
                    observe(&context, &mut drivers, kind, resource).await;
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::warn!(error = %status, since, "Job watch ended; resuming");
                    listed = status.code() != tonic::Code::OutOfRange;
                    break;
                }
            }
        }
        drivers.retain(|_, running| !running.task.is_finished());
    }
    for (_, running) in drivers {
        let _ = running.cancel.send(true);
        let _ = running.task.await;
    }
}

async fn pause(shutdown: &Shutdown, duration: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(duration) => {}
        _ = shutdown.wait() => {}
    }
}

async fn observe<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    drivers: &mut HashMap<String, Running>,
    kind: EventType,
    resource: Resource,
) {
    let name = resource.name.clone();
    if !owns_job(context.shard, &name) {
        return;
    }
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
        return;
    }
    if drivers.get(&name).is_some_and(|r| !r.task.is_finished()) {
        return;
    }
    let status: Status = serde_json::from_str(&resource.status_json).unwrap_or_default();
    if status.phase.is_terminal() {
        return;
    }
    let (cancel, cancelled) = watch::channel(false);
    let task = tokio::spawn(drive_job(context.clone(), resource, status, cancelled));
    drivers.insert(name, Running { cancel, task });
}

/// Why a job ended, as its final condition.
struct Outcome {
    phase: Phase,
    reason: &'static str,
    message: String,
}

impl Outcome {
    fn failed(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            phase: Phase::Failed,
            reason,
            message: message.into(),
        }
    }
}

/// The status writer of one Job.
struct JobStatus {
    api: ApiClient,
    name: String,
    status: Status,
}

impl JobStatus {
    fn condition(&mut self, kind: &str, holds: bool, reason: &str, message: String) {
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

    async fn set(&mut self, phase: Phase, kind: &str, reason: &str, message: String) {
        self.status.phase = phase;
        self.condition(kind, phase != Phase::Failed, reason, message);
        self.write().await;
    }

    async fn write(&self) {
        if let Err(e) = self
            .api
            .update_status(Kind::Job, &self.name, &self.status, 0)
            .await
        {
            tracing::warn!(job = %self.name, error = %e, "writing Job status");
        }
    }
}

async fn drive_job<B: ResourceBackend, C: Catalog>(
    context: Arc<Context<B, C>>,
    resource: Resource,
    status: Status,
    mut cancelled: watch::Receiver<bool>,
) {
    let name = resource.name.clone();
    let mut writer = JobStatus {
        api: context.api.clone(),
        name: name.clone(),
        status,
    };
    writer.status.observed_generation = resource.generation;
    let mut tasks = Vec::new();
    let outcome = tokio::select! {
        outcome = run_job(&context, &resource, &mut writer, &mut tasks) => Some(outcome),
        _ = cancelled.wait_for(|c| *c) => None,
    };
    for task in tasks {
        task.abort();
    }
    context.backend.release_job(&name).await;
    context.topologies.remove_job(&name);
    context
        .jobs
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&name);
    if let Some(outcome) = outcome {
        tracing::info!(job = %name, phase = ?outcome.phase, reason = outcome.reason, message = %outcome.message, "Job ended");
        writer
            .set(outcome.phase, "Complete", outcome.reason, outcome.message)
            .await;
    }
}

/// Runs the Job until it ends; the tasks it spawns are aborted by the caller.
async fn run_job<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    resource: &Resource,
    writer: &mut JobStatus,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Outcome {
    let name = resource.name.as_str();
    let spec: JobSpec = match serde_json::from_str(&resource.spec_json) {
        Ok(spec) => spec,
        Err(e) => return Outcome::failed("InvalidSpec", format!("spec: {e}")),
    };
    let dataset = match load_dataset(&context.api, &spec.dataset).await {
        Ok(dataset) => dataset,
        Err(outcome) => return outcome,
    };
    let layout = match ModelLayout::new(&spec.model, &dataset.schema) {
        Ok(layout) => layout,
        Err(e) => return Outcome::failed("ModelMismatch", e.to_string()),
    };
    let (reads_batch, reads_streams) = driver::reads(spec.mode);
    if let Err(message) = driver::check_mode(spec.mode, &dataset) {
        return Outcome::failed("ModeMismatch", message);
    }
    if reads_batch && let Err(outcome) = check_sources(&context.cache, &dataset).await {
        return outcome;
    }
    let plans = match driver::stream_plans(&dataset) {
        Ok(plans) => plans,
        Err(e) => return Outcome::failed("InvalidDataset", e.to_string()),
    };
    writer
        .set(
            Phase::Starting,
            "Scheduled",
            "ExecutorsRequested",
            format!(
                "{} PS, {} data executors, {} trainers",
                spec.topology.ps.replicas,
                spec.topology.data_executors.replicas,
                spec.topology.trainers.replicas
            ),
        )
        .await;

    let queue = TaskQueue::new(
        context.redis.clone(),
        &context.settings.redis.key_prefix,
        name,
    );
    let bounded = Arc::new(AtomicBool::new(false));
    let alignments = Arc::new(Alignments::default());
    let trainer_totals = Arc::new(KnownTotals::default());
    context
        .jobs
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            name.to_owned(),
            JobTasks {
                queue: queue.clone(),
                bounded: bounded.clone(),
                alignments: alignments.clone(),
                trainer_totals: trainer_totals.clone(),
            },
        );
    // Executors of a previous master (same ids as the ones about to start) are gone: their
    // tasks go back to pending without using up an attempt.
    if let Err(e) = queue.requeue_previous_executors().await {
        return Outcome::failed("TaskQueueUnavailable", e.to_string());
    }
    // The model restarts from the latest checkpoint, so the data does too.
    let restored = match &spec.checkpoint {
        Some(_) => match rollback_queue(name, &queue).await {
            Ok(restored) => restored,
            Err(e) => return Outcome::failed("CheckpointRestoreFailed", e.to_string()),
        },
        None => None,
    };
    // Trainers continue from their totals in the checkpoint (they ask at start).
    for (trainer, totals) in restored.iter().flat_map(|r| &r.trainers) {
        trainer_totals.raise(trainer, *totals);
    }
    let stream_bindings = driver::stream_tasks(name, &dataset);
    if reads_streams
        && spec.mode != primus_spec::job::TrainingMode::BatchThenStream
        && let Err(e) = queue.add_stream_tasks(&stream_bindings).await
    {
        return Outcome::failed("TaskQueueUnavailable", e.to_string());
    }
    let planner = reads_batch.then(|| {
        let job: Arc<str> = Arc::from(name);
        let settings = context.settings.master.planner.clone();
        let handles: Vec<_> = plans
            .into_iter()
            .map(|plan| {
                tokio::spawn(driver::plan_stream(
                    queue.clone(),
                    context.cache.clone(),
                    job.clone(),
                    Arc::new(plan),
                    settings.clone(),
                ))
            })
            .collect();
        handles
    });
    tasks.push(tokio::spawn(driver::monitor(
        queue.clone(),
        context.bus.clone(),
        name.to_owned(),
        context.settings.master.tasks.clone(),
    )));
    let mut fold = MetricsFold::default();
    let (reports_tx, mut reports) = tokio::sync::mpsc::channel::<MetricsReport>(1024);
    tasks.push(tokio::spawn(follow_metrics(
        context.bus.clone(),
        name.to_owned(),
        reports_tx,
    )));

    let mut backend_events = context.backend.events();
    let recovery = Arc::new(ShardRecovery::default());
    let (recovered_tx, mut recovered) = tokio::sync::mpsc::channel(16);
    tasks.push(tokio::spawn(recover_restarted_shards(
        context.backend.events(),
        queue.clone(),
        context.topologies.clone(),
        name.to_owned(),
        recovery.clone(),
        recovered_tx,
    )));
    // PS shards (and serving replicas) first: a restored checkpoint must be in them before
    // any trainer offers its initial parameters or reads a row.
    let job = JobParts {
        name,
        spec: &spec,
        dataset: &dataset,
        layout: &layout,
    };
    if let Err(outcome) =
        start_executors(context, &job, &[ExecutorRole::Ps, ExecutorRole::Serving]).await
    {
        return outcome;
    }
    if let Err(outcome) = wait_ready(context, name).await {
        return outcome;
    }
    if let Some(record) = &restored {
        let endpoints = context
            .topologies
            .get(name)
            .map(|(_, e)| e)
            .unwrap_or_default();
        let shards: Vec<&Endpoint> = with_role(&endpoints, Role::Ps);
        if let Err(e) = checkpoint::restore_ps(record, &shards).await {
            return Outcome::failed("CheckpointRestoreFailed", e.to_string());
        }
        let message = format!(
            "from checkpoint {} ({}): {} samples trained, {} tasks done, {} in progress",
            record.id,
            record.uri,
            record.samples(),
            record.succeeded_tasks,
            record.offsets.len()
        );
        tracing::info!(job = name, %message, "restored");
        writer.condition("Restored", true, "FromCheckpoint", message);
    }
    if let Err(outcome) = start_executors(
        context,
        &job,
        &[ExecutorRole::DataExecutor, ExecutorRole::Trainer],
    )
    .await
    {
        return outcome;
    }
    let ready = match wait_ready(context, name).await {
        Ok(ready) => ready,
        Err(outcome) => return outcome,
    };
    writer
        .set(
            Phase::Running,
            "Ready",
            "ExecutorsReady",
            format!("{ready} executors serving"),
        )
        .await;

    let mut planners = planner.unwrap_or_default();
    let mut ticks = tokio::time::interval(Duration::from_millis(
        context.settings.master.status_interval_ms.max(50),
    ));
    let mut batch_done_declared = false;
    let mut trainers_done = BTreeSet::new();
    let checkpoint_every = spec
        .checkpoint
        .as_ref()
        .map(|c| Duration::from_secs(c.interval_seconds));
    // Without `spec.checkpoint` the branch below is disabled and the period never matters.
    let period = checkpoint_every.unwrap_or(Duration::from_secs(3600));
    let mut checkpoint_ticks =
        tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    checkpoint_ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut committed = restored.clone();
    let mut next_checkpoint = committed.as_ref().map_or(0, |r| r.id) + 1;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = checkpoint_ticks.tick(), if checkpoint_every.is_some() => {
                let Some(target) = &spec.checkpoint else { continue };
                let finishing = match queue.counts().await {
                    Ok(c) => reads_batch && planners.is_empty() && c.pending == 0 && c.running == 0,
                    Err(_) => false,
                };
                // Once every task is done the trainers are finishing: the final snapshot
                // follows, and a trainer whose streams ended would never align.
                if !finishing {
                    let coordinator = checkpoint::Coordinator {
                        job: name,
                        queue: &queue,
                        alignments: &alignments,
                        recovery: &recovery,
                        storage: &context.settings.storage,
                        uri: &target.uri,
                        full_every: u64::from(target.full_every),
                        limits: checkpoint_limits(&context.settings),
                    };
                    let previous = committed.as_ref();
                    if let Some(record) = take_checkpoint(context, &coordinator, (next_checkpoint, previous), &trainers_done, writer).await {
                        committed = Some(record);
                    }
                    next_checkpoint += 1;
                }
                continue;
            }
            Some(report) = reports.recv() => {
                if let Some(trainer) = report.endpoint.as_ref().filter(|e| e.role == Role::Trainer as i32) {
                    let totals = checkpoint::TrainerTotals { steps: report.steps, samples: report.samples };
                    trainer_totals.raise(&trainer.id, totals);
                }
                fold.add(report);
                continue;
            }
            Some(outcome) = recovered.recv() => {
                match outcome {
                    Ok((reason, message)) => {
                        tracing::warn!(job = name, %message, "PS shard restarted");
                        writer.condition("ShardRestored", true, reason, message);
                        writer.write().await;
                    }
                    Err(message) => return Outcome::failed("ShardRestoreFailed", message),
                }
                continue;
            }
            event = backend_events.recv() => {
                match event {
                    Ok(BackendEvent::GaveUp { job, id, status }) if job == name => {
                        return Outcome::failed("ExecutorFailed", format!("{id} keeps crashing: {status}"));
                    }
                    Ok(BackendEvent::Completed { job, id }) if job == name
                        && id.starts_with(ExecutorRole::Trainer.as_str()) => {
                        trainers_done.insert(id);
                    }
                    _ => {}
                }
                continue;
            }
        }
        for handle in planners.iter_mut().filter(|h| h.is_finished()) {
            match handle.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Outcome::failed("PlanningFailed", e.to_string()),
                Err(e) => return Outcome::failed("PlanningFailed", e.to_string()),
            }
        }
        planners.retain(|h| !h.is_finished());
        let all_planned = reads_batch && planners.is_empty();
        let has_streams = reads_streams && !stream_bindings.is_empty();
        bounded.store(all_planned && !has_streams, Ordering::Release);
        let counts = match queue.counts().await {
            Ok(counts) => counts,
            Err(e) => {
                tracing::warn!(job = name, error = %e, "reading the task queue");
                continue;
            }
        };
        if counts.failed > 0 {
            let failures = queue.failures().await.unwrap_or_default();
            let (task, error) = failures.into_iter().next().unwrap_or_default();
            return Outcome::failed("TaskFailed", format!("task {task}: {error}"));
        }
        let batch_finished = all_planned && counts.pending == 0 && counts.running == 0;
        // A batch job ends when its data is read and every trainer has trained on all it
        // was served (a trainer exits 0 when its minibatch streams end).
        let trainers = spec.topology.trainers.replicas as usize;
        if batch_finished && !has_streams && trainers_done.len() >= trainers {
            write_final_metrics(context, name, &mut fold, &mut reports, writer).await;
            let mut message = format!(
                "all {} data tasks succeeded; {trainers} trainers finished",
                counts.succeeded
            );
            if let Some(checkpoint) = &spec.checkpoint {
                match final_checkpoint(context, name, &checkpoint.uri).await {
                    Ok(manifests) => {
                        message.push_str(&format!("; checkpoint: {}", manifests.join(", ")))
                    }
                    Err(e) => return Outcome::failed("CheckpointFailed", e),
                }
            }
            return Outcome {
                phase: Phase::Succeeded,
                reason: "DataExhausted",
                message,
            };
        }
        if batch_finished
            && spec.mode == primus_spec::job::TrainingMode::BatchThenStream
            && !batch_done_declared
        {
            if let Err(e) = queue.add_stream_tasks(&stream_bindings).await {
                tracing::warn!(job = name, error = %e, "declaring stream bindings");
                continue;
            }
            batch_done_declared = true;
        }
        let fraction = (all_planned && !has_streams && counts.total > 0)
            .then(|| counts.succeeded as f64 / counts.total as f64);
        let metrics_changed = fold.tick(now_ms());
        let progress = fold.progress(fraction).or_else(|| {
            fraction.map(|f| primus_spec::status::Progress {
                fraction: Some(f),
                ..Default::default()
            })
        });
        if progress != writer.status.progress {
            writer.status.progress = progress;
            writer.write().await;
        }
        if metrics_changed {
            write_metrics(&context.api, name, &fold).await;
        }
    }
}

/// Puts the queue back to the latest committed checkpoint (to the start when there is
/// none) and returns that checkpoint.
async fn rollback_queue(
    job: &str,
    queue: &TaskQueue,
) -> Result<Option<CheckpointRecord>, CheckpointError> {
    let restored = checkpoint::latest(queue).await?;
    let reopened = queue.rollback(restored.as_ref().map(|r| r.id)).await?;
    if reopened > 0 || restored.is_some() {
        let checkpoint = restored.as_ref().map(|r| r.id);
        tracing::info!(job, ?checkpoint, reopened, "task queue rolled back");
    }
    Ok(restored)
}

fn checkpoint_limits(settings: &MasterSettings) -> checkpoint::Limits {
    let settings = &settings.master.checkpoint;
    checkpoint::Limits {
        keep: settings.keep,
        align: Duration::from_millis(settings.align_timeout_ms),
        pause: Duration::from_millis(settings.pause_timeout_ms),
    }
}

fn with_role(endpoints: &[Endpoint], role: Role) -> Vec<&Endpoint> {
    endpoints.iter().filter(|e| e.role == role as i32).collect()
}

/// Monolith's PS recovery (§2.3): a PS shard that crashed and was restarted by the backend
/// gets back its rows of the job's latest committed checkpoint. The updates it took since
/// then are lost and the other shards keep theirs; a job with no committed checkpoint goes
/// on with the shard empty. Sends the condition reason and message of each recovery, or
/// the error that should fail the job.
async fn recover_restarted_shards(
    mut events: tokio::sync::broadcast::Receiver<BackendEvent>,
    queue: TaskQueue,
    topologies: Topologies,
    job: String,
    recovery: Arc<ShardRecovery>,
    outcomes: tokio::sync::mpsc::Sender<Result<(&'static str, String), String>>,
) {
    loop {
        let shard = match events.recv().await {
            Ok(BackendEvent::Restarting { job: of, id, .. })
                if of == job && id.starts_with(ExecutorRole::Ps.as_str()) =>
            {
                id
            }
            Ok(_) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(
                    job,
                    missed,
                    "backend events missed: a PS restart among them goes unrestored"
                );
                continue;
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        let endpoints = topologies.get(&job).map(|(_, e)| e).unwrap_or_default();
        let Some(endpoint) = endpoints.into_iter().find(|e| e.id == shard) else {
            continue;
        };
        recovery.restarting(&shard);
        let outcome = recover_shard(&queue, &endpoint).await;
        recovery.restored();
        if outcomes.send(outcome).await.is_err() {
            return;
        }
    }
}

async fn recover_shard(
    queue: &TaskQueue,
    shard: &Endpoint,
) -> Result<(&'static str, String), String> {
    // The crashed process is gone once the backend reports the restart, so the first
    // SERVING answer comes from its successor.
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    while !serving(&shard.grpc_addr).await {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{} at {} did not serve again within {}s of its restart",
                shard.id,
                shard.grpc_addr,
                READY_TIMEOUT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let Some(record) = checkpoint::latest(queue).await.map_err(|e| e.to_string())? else {
        return Ok((
            "NoCheckpoint",
            format!("{} restarted empty: no checkpoint committed yet", shard.id),
        ));
    };
    let rows = checkpoint::restore_shard(&record, shard)
        .await
        .map_err(|e| e.to_string())?;
    Ok((
        "FromCheckpoint",
        format!(
            "{} restarted and restored from checkpoint {} ({}): {rows} rows",
            shard.id, record.id, record.uri
        ),
    ))
}

/// Takes checkpoint `id` (the last committed one being `previous`) and says how it went
/// in the Job's `Checkpoint` condition (a failed one is reported and training goes on).
/// Its record once committed.
async fn take_checkpoint<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    coordinator: &checkpoint::Coordinator<'_>,
    (id, previous): (u64, Option<&checkpoint::CheckpointRecord>),
    trainers_done: &BTreeSet<String>,
    writer: &mut JobStatus,
) -> Option<checkpoint::CheckpointRecord> {
    let job = coordinator.job;
    let endpoints = context
        .topologies
        .get(job)
        .map(|(_, e)| e)
        .unwrap_or_default();
    let participants = checkpoint::Participants {
        data_executors: with_role(&endpoints, Role::DataExecutor),
        ps: with_role(&endpoints, Role::Ps),
        trainers: with_role(&endpoints, Role::Trainer)
            .into_iter()
            .map(|e| e.id.clone())
            .filter(|id| !trainers_done.contains(id))
            .collect(),
    };
    let committed = match coordinator.take(id, previous, &participants).await {
        Ok(taken) => {
            let record = taken.record;
            let kind = if record.chain_start == id {
                "full".to_owned()
            } else {
                format!(
                    "incremental, chained to full checkpoint {}",
                    record.chain_start
                )
            };
            let message = format!(
                "checkpoint {id} ({kind}) at {}: {} samples trained, {} tasks done, {} in progress; paused {} ms",
                record.uri,
                record.samples(),
                record.succeeded_tasks,
                record.offsets.len(),
                taken.paused.as_millis()
            );
            tracing::info!(job, %message, "checkpoint committed");
            writer.condition("Checkpoint", true, "Checkpointed", message);
            Some(record)
        }
        Err(e) => {
            tracing::warn!(job, checkpoint = id, error = %e, "checkpoint abandoned");
            writer.condition(
                "Checkpoint",
                false,
                "CheckpointFailed",
                format!("checkpoint {id}: {e}"),
            );
            None
        }
    };
    writer.write().await;
    committed
}

async fn load_dataset(api: &ApiClient, name: &str) -> Result<DatasetSpec, Outcome> {
    let resource = match api.get(Kind::Dataset, name).await {
        Ok(resource) => resource,
        Err(e @ ClientError::Status(_)) if e.code() == Some(tonic::Code::NotFound) => {
            return Err(Outcome::failed(
                "DatasetMissing",
                format!("spec.dataset: Dataset {name:?} does not exist"),
            ));
        }
        Err(e) => return Err(Outcome::failed("DatasetUnreadable", e.to_string())),
    };
    serde_json::from_str(&resource.spec_json)
        .map_err(|e| Outcome::failed("InvalidDataset", format!("Dataset {name:?}: {e}")))
}

/// Every Parquet source's prefix must hold something.
async fn check_sources<C: Catalog>(
    cache: &ListingCache<C>,
    dataset: &DatasetSpec,
) -> Result<(), Outcome> {
    for source in dataset.streams.iter().flat_map(|s| &s.sources) {
        let Some(parquet) = &source.parquet else {
            continue;
        };
        match cache.catalog().exists(&parquet.uri).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(Outcome::failed(
                    "DataSourceMissing",
                    format!(
                        "source `{}`: nothing under prefix {}",
                        source.name, parquet.uri
                    ),
                ));
            }
            Err(e) => {
                return Err(Outcome::failed(
                    "DataSourceUnreadable",
                    format!("source `{}`: {e}", source.name),
                ));
            }
        }
    }
    Ok(())
}

/// A settings value as TOML; a value TOML cannot hold is logged and left out.
fn to_toml<T: serde::Serialize>(key: &str, value: &T) -> Option<toml::Value> {
    toml::Value::try_from(value)
        .inspect_err(|e| tracing::error!(key, error = %e, "a setting cannot be written as TOML"))
        .ok()
}

/// A settings table of the keys that have a value.
fn table_of(entries: Vec<(&str, Option<toml::Value>)>) -> toml::Table {
    entries
        .into_iter()
        .filter_map(|(key, value)| Some((key.to_owned(), value?)))
        .collect()
}

fn section(entries: Vec<(&str, Option<toml::Value>)>) -> Option<toml::Value> {
    Some(toml::Value::Table(table_of(entries)))
}

/// The settings file of one executor: the master's NATS and telemetry sections, plus the
/// storage section, the PS tables (the model's and their companions) and the dense optimizer
/// for PS shards, the storage section and the Dataset for data executors, the model, the
/// Dataset's schema and the Job's training settings for trainers, the tables, model and
/// schema for serving replicas.
fn executor_settings(
    settings: &MasterSettings,
    executor: &ExecutorSpec,
    job: &JobParts,
) -> toml::Table {
    let (role, spec, dataset, layout) = (executor.role, job.spec, job.dataset, job.layout);
    let job = job.name;
    let mut entries = vec![
        ("nats", to_toml("nats", &settings.nats)),
        ("telemetry", to_toml("telemetry", &settings.telemetry)),
    ];
    match role {
        ExecutorRole::Ps => {
            entries.push(("storage", to_toml("storage", &settings.storage)));
            let tables = to_toml("ps.tables", &layout.ps_tables());
            let dense_optimizer = to_toml("ps.dense_optimizer", &spec.model.dense.optimizer);
            let device = spec.topology.ps.device;
            // Each shard of a table on a GPU is a kernel launch per call: fewer, bigger ones.
            let shards = (device == Device::Cuda).then_some(toml::Value::Integer(4));
            entries.push((
                "ps",
                section(vec![
                    ("tables", tables),
                    ("dense_optimizer", dense_optimizer),
                    ("device", to_toml("ps.device", &device)),
                    ("shards_per_table", shards),
                ]),
            ));
        }
        ExecutorRole::Serving => {
            let string = |s: &str| Some(toml::Value::String(s.to_owned()));
            entries.push((
                "ps",
                section(vec![
                    ("role", string("serving")),
                    ("tables", to_toml("ps.tables", &layout.ps_tables())),
                ]),
            ));
            let rate = spec
                .serving_sync
                .negative_sample_rate
                .map(toml::Value::Float);
            entries.push((
                "serving",
                section(vec![
                    ("job", string(job)),
                    ("model", to_toml("serving.model", &spec.model)),
                    ("schema", to_toml("serving.schema", &dataset.schema)),
                    ("negative_sample_rate", rate),
                ]),
            ));
        }
        ExecutorRole::DataExecutor => {
            entries.push(("storage", to_toml("storage", &settings.storage)));
            let dataset = to_toml("data.dataset", dataset);
            let loading = to_toml("data.stream_loading", &spec.training.stream_loading);
            entries.push((
                "data",
                section(vec![("dataset", dataset), ("stream_loading", loading)]),
            ));
        }
        ExecutorRole::Trainer => {
            let model = to_toml("trainer.model", &spec.model);
            let schema = to_toml("trainer.schema", &dataset.schema);
            let training = &spec.training;
            let number = |n: u32| Some(toml::Value::Integer(n.into()));
            entries.push((
                "trainer",
                section(vec![
                    ("model", model),
                    ("schema", schema),
                    ("batch_size", number(training.batch_size)),
                    ("dense_pull_every", number(training.dense_pull_every)),
                    ("eval_window", number(training.eval_window)),
                    ("hot_set", to_toml("trainer.hot_set", &training.hot_set)),
                    (
                        "device",
                        to_toml("trainer.device", &spec.topology.trainers.device),
                    ),
                ]),
            ));
        }
    }
    table_of(entries)
}

/// A Job as its executors are configured from it.
struct JobParts<'a> {
    name: &'a str,
    spec: &'a JobSpec,
    dataset: &'a DatasetSpec,
    layout: &'a ModelLayout,
}

async fn start_executors<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    job: &JobParts<'_>,
    roles: &[ExecutorRole],
) -> Result<(), Outcome> {
    let topology = &job.spec.topology;
    for &role in roles {
        let role_spec = match role {
            ExecutorRole::Ps => &topology.ps,
            ExecutorRole::DataExecutor => &topology.data_executors,
            ExecutorRole::Trainer => &topology.trainers,
            ExecutorRole::Serving => match &topology.serving {
                Some(serving) => serving,
                None => continue,
            },
        };
        for index in 0..role_spec.replicas {
            let mut request = ExecutorSpec {
                job: job.name.to_owned(),
                role,
                index,
                settings: toml::Table::new(),
                cpu: role_spec.cpu,
                memory_bytes: primus_spec::job::parse_memory(&role_spec.memory).unwrap_or(0),
            };
            request.settings = executor_settings(&context.settings, &request, job);
            let executor = context
                .backend
                .request(request)
                .await
                .map_err(|e| Outcome::failed("ExecutorStartFailed", e.to_string()))?;
            context.topologies.add(
                job.name,
                Endpoint {
                    role: role.proto() as i32,
                    id: executor.id,
                    grpc_addr: executor.grpc_addr.to_string(),
                },
            );
        }
    }
    Ok(())
}

/// Waits until every executor's gRPC health says SERVING.
async fn wait_ready<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    job: &str,
) -> Result<usize, Outcome> {
    let endpoints = context
        .topologies
        .get(job)
        .map(|(_, e)| e)
        .unwrap_or_default();
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    for endpoint in &endpoints {
        loop {
            if serving(&endpoint.grpc_addr).await {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Outcome::failed(
                    "ExecutorsNotReady",
                    format!(
                        "{} at {} did not report SERVING within {}s",
                        endpoint.id,
                        endpoint.grpc_addr,
                        READY_TIMEOUT.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(endpoints.len())
}

const READY_TIMEOUT: Duration = Duration::from_secs(60);

async fn serving(addr: &str) -> bool {
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(format!("http://{addr}")) else {
        return false;
    };
    let Ok(channel) = endpoint
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
    else {
        return false;
    };
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    matches!(
        health.check(request).await.map(|r| r.into_inner().status),
        Ok(status) if status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    )
}

async fn follow_metrics(bus: Bus, job: String, reports: tokio::sync::mpsc::Sender<MetricsReport>) {
    let subject = match bus.subjects().metrics(&job, "*", "*") {
        Ok(subject) => subject,
        Err(e) => return tracing::error!(%job, error = %e, "metrics subject"),
    };
    let mut messages = match bus.subscribe::<MetricsReport>(subject).await {
        Ok(messages) => messages,
        Err(e) => return tracing::error!(%job, error = %e, "metrics subscription"),
    };
    while let Some(message) = messages.next().await {
        match message {
            Ok(received) => {
                if reports.send(received.message).await.is_err() {
                    return;
                }
            }
            Err(e) => tracing::warn!(%job, error = %e, "undecodable metrics report"),
        }
    }
}

/// Snapshots every PS shard of the finished job under `uri/final/<shard id>`; returns
/// the manifest URIs. (Periodic checkpoints aligned with data offsets are not built yet.)
async fn final_checkpoint<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    job: &str,
    uri: &str,
) -> Result<Vec<String>, String> {
    let (_, endpoints) = context.topologies.get(job).unwrap_or_default();
    let shards = endpoints
        .iter()
        .filter(|e| e.role == primus_proto::v1::Role::Ps as i32);
    let mut manifests = Vec::new();
    for shard in shards {
        let target = format!("{}/final/{}", uri.trim_end_matches('/'), shard.id);
        let mut client = ParameterServerClient::connect(format!("http://{}", shard.grpc_addr))
            .await
            .map_err(|e| format!("{}: {e}", shard.id))?;
        let response = client
            .snapshot(SnapshotRequest {
                uri: target,
                base_manifest_uri: String::new(),
            })
            .await
            .map_err(|status| format!("{}: {}", shard.id, status.message()))?;
        manifests.push(response.into_inner().manifest_uri);
    }
    Ok(manifests)
}

/// Folds the reports still in flight (a trainer's last one is sent just before it exits)
/// into the Job's final progress and its Metric resource.
async fn write_final_metrics<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    job: &str,
    fold: &mut MetricsFold,
    reports: &mut tokio::sync::mpsc::Receiver<MetricsReport>,
    writer: &mut JobStatus,
) {
    while let Ok(Some(report)) =
        tokio::time::timeout(Duration::from_millis(300), reports.recv()).await
    {
        fold.add(report);
    }
    fold.tick(now_ms());
    writer.status.progress = fold.progress(Some(1.0)).or(writer.status.progress.take());
    write_metrics(&context.api, job, fold).await;
}

async fn write_metrics(api: &ApiClient, job: &str, fold: &MetricsFold) {
    let resource = primus_spec::Resource::Metric(Box::new(primus_spec::Object {
        metadata: primus_spec::Metadata {
            name: job.to_owned(),
            labels: Default::default(),
        },
        spec: fold.spec(job),
    }));
    if let Err(e) = api.apply(&resource, 0).await {
        tracing::warn!(%job, error = %e, "writing the Metric resource");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ExecutorRole;
    use primus_spec::{Resource, parse_documents};

    const EXAMPLE: &str = include_str!("../../../examples/criteo-like.yaml");

    fn section_of(example: &str, role: ExecutorRole, name: &str) -> toml::Table {
        let resources = parse_documents("criteo-like.yaml", example).expect("example parses");
        let (mut job, mut dataset) = (None, None);
        for resource in resources {
            match resource {
                Resource::Job(j) => job = Some(j.spec),
                Resource::Dataset(d) => dataset = Some(d.spec),
                _ => {}
            }
        }
        let (spec, dataset) = (job.expect("a job"), dataset.expect("a dataset"));
        let layout = ModelLayout::new(&spec.model, &dataset.schema).expect("layout");
        let parts = JobParts {
            name: "criteo-like",
            spec: &spec,
            dataset: &dataset,
            layout: &layout,
        };
        let executor = ExecutorSpec {
            job: "criteo-like".into(),
            role,
            index: 0,
            settings: toml::Table::new(),
            cpu: 1.0,
            memory_bytes: 1 << 30,
        };
        let settings = executor_settings(&MasterSettings::default(), &executor, &parts);
        match settings.get(name) {
            Some(toml::Value::Table(section)) => section.clone(),
            other => panic!("no {name} section: {other:?}"),
        }
    }

    fn ps_section(example: &str) -> toml::Table {
        section_of(example, ExecutorRole::Ps, "ps")
    }

    #[test]
    fn a_trainer_is_told_its_device() {
        let trainer = |example: &str| section_of(example, ExecutorRole::Trainer, "trainer");
        let device = |section: toml::Table| section.get("device").cloned();
        assert_eq!(device(trainer(EXAMPLE)), Some("cpu".into()));
        let on_gpu = EXAMPLE.replace(
            "trainers: {replicas: 1, cpu: 1, memory: 2Gi}",
            "trainers: {replicas: 1, cpu: 1, memory: 2Gi, device: cuda}",
        );
        assert_ne!(on_gpu, EXAMPLE, "the example's trainers line changed");
        assert_eq!(device(trainer(&on_gpu)), Some("cuda".into()));
    }

    #[test]
    fn a_ps_is_told_its_device_and_gets_few_shards_on_a_gpu() {
        let on_cpu = ps_section(EXAMPLE);
        assert_eq!(on_cpu.get("device").and_then(|v| v.as_str()), Some("cpu"));
        assert!(on_cpu.get("shards_per_table").is_none());
        let on_gpu = ps_section(&EXAMPLE.replace(
            "ps: {replicas: 2, cpu: 0.5, memory: 2Gi}",
            "ps: {replicas: 2, cpu: 0.5, memory: 2Gi, device: cuda}",
        ));
        assert_eq!(on_gpu.get("device").and_then(|v| v.as_str()), Some("cuda"));
        assert_eq!(
            on_gpu.get("shards_per_table").and_then(|v| v.as_integer()),
            Some(4)
        );
    }
}
