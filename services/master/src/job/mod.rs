//! One Job from start to end. [`drive`] runs it until it ends or is cancelled (deleted, or
//! master shutdown), then stops its executors. [`JobRun::start`] checks the Job against its
//! Dataset, sets up its task queue (rolled back to the latest checkpoint), starts its PS
//! shards, restores them, and starts its data executors and trainers; [`JobRun::follow`]
//! then waits for events (a status tick, a checkpoint tick, a checkpoint done, a metrics
//! report, a restarted PS shard's recovery, a backend event, a new generation of the spec),
//! each with its own handler. Any handler may end the Job with an [`Outcome`].
//!
//! A status tick is observe, decide, act: [`JobRun::observe`] builds one
//! [`Snapshot`] of the Job (members, usage, buffers, held tasks, PS memory,
//! progress); each policy (the optimizer, executor and PS memory, the autoscaler, the
//! stragglers) decides on it alone, with no backend, Redis or executor call, and returns
//! [`Action`]s (the policies are primus-job-policy's, which the simulator runs too);
//! [`JobRun::apply`] carries them out and records their events.

mod actions;
mod checked;
mod checkpoints;
pub(crate) mod executors;
mod performance;
mod progress;
mod recovery;
mod reshard;
mod rollback;
mod scaling;
mod serving;
mod snapshot;
pub(crate) mod status;
mod warm_start;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use primus_job_policy::{Action, Market, Policies, Snapshot};
use primus_proto::v1::{DataTask, Endpoint, MetricsReport, Resource, Role};
use primus_spec::job::{AllocationPolicy, TrainingMode};
use primus_spec::status::{ExecutorState, Phase, Status};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::checkpoint::{self, Alignments, CheckpointRecord, KnownTotals, ShardRecovery};
use crate::config_db::ConfigDb;
use crate::context::Context;
use crate::metrics::{self, MetricsFold};
use crate::tasks::{JobTasks, SILENT_REPORTS_PATIENCE};
use crate::topology::Topologies;
use checked::CheckedJob;
use executors::{start_executors, start_executors_together, wait_ready};
use futures::future::BoxFuture;
use primus_backend::{BackendEvent, ExecutorRole, ResourceBackend};
use primus_data_tasks::monitor;
use primus_data_tasks::plan::{Catalog, StreamPlan};
use primus_data_tasks::planning::{self, PlanningError};
use primus_data_tasks::queue::{QueueCounts, QueueError, TaskQueue};
use recovery::{Recovered, Restart, ShardRestarts, recover_restarted_shards};
use serving::KeptServing;
use status::JobStatus;

/// Runs the Job of `resource` (whose status is `status`) until it ends, then writes its
/// final condition; or until `cancelled`, leaving its status as it is. Either way its
/// executors are stopped.
pub(crate) async fn drive<B: ResourceBackend, C: Catalog>(
    context: Arc<Context<B, C>>,
    resource: Resource,
    status: Status,
    specs: watch::Receiver<Resource>,
    mut cancelled: watch::Receiver<bool>,
) {
    let name = resource.name.clone();
    let mut writer = JobStatus::new(
        context.resources.clone(),
        name.clone(),
        status,
        resource.generation,
    );
    if (writer.status.conditions.iter()).any(|c| c.kind == status::SUSPENDED && c.status) {
        let message = "spec.suspend is false".to_owned();
        writer.condition(status::SUSPENDED, false, "Resumed", message);
    }
    let outcome = tokio::select! {
        outcome = run(&context, &resource, specs, &mut writer) => Some(outcome),
        _ = cancelled.wait_for(|c| *c) => None,
    };
    let kept = match outcome {
        Some(outcome) => {
            tracing::info!(job = %name, phase = ?outcome.phase, reason = outcome.reason, message = %outcome.message, "Job ended");
            let serving = outcome.kept.is_some();
            // Stopped below (the PS shards and data executors of a succeeded Job already).
            writer.executors_stopped(|e| serving && e.role == ExecutorRole::Serving.as_str());
            writer
                .set(outcome.phase, "Complete", outcome.reason, outcome.message)
                .await;
            outcome.kept
        }
        None => None,
    };
    if let Some(kept) = &kept {
        kept.wait(&mut cancelled).await;
    }
    // A master that stops leaves executors that outlive it running: the next master takes
    // the Job over with them (a deleted Job's are stopped by the controller).
    let stopping = *cancelled.borrow();
    if stopping && context.backend.executors_outlive_master() {
        tracing::info!(job = %name, "master stopping: the Job's executors are left to the next master");
    } else {
        context.backend.release_job(&name).await;
    }
    if kept.is_some() && !stopping {
        tracing::info!(job = %name, "serving replicas of the succeeded Job stopped");
        writer.executors_stopped(|_| false);
        writer.write().await;
    }
    context.topologies.remove_job(&name);
    context
        .jobs
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&name);
}

async fn run<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    resource: &Resource,
    specs: watch::Receiver<Resource>,
    writer: &mut JobStatus,
) -> Outcome {
    match JobRun::start(context, resource, specs, writer).await {
        Ok(mut job) => job.follow().await,
        Err(outcome) => outcome,
    }
}

/// Why a Job ended, as its final condition.
pub(crate) struct Outcome {
    phase: Phase,
    reason: &'static str,
    message: String,
    /// The serving replicas go on after the end.
    kept: Option<KeptServing>,
}

impl Outcome {
    pub(crate) fn failed(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            phase: Phase::Failed,
            reason,
            message: message.into(),
            kept: None,
        }
    }
}

/// A running Job: what its event handlers share.
pub(crate) struct JobRun<'a, B, C> {
    context: &'a Arc<Context<B, C>>,
    writer: &'a mut JobStatus,
    name: String,
    job: CheckedJob,
    /// The Job reads stream sources and the Dataset has some.
    has_streams: bool,
    stream_bindings: Vec<DataTask>,
    /// The queue and barrier state the task and checkpoint services see.
    tasks: JobTasks,
    recovery: Arc<ShardRecovery>,
    /// The batch planners still running (aborted when the run ends).
    planners: Vec<JoinHandle<Result<(), PlanningError>>>,
    /// The windows of the streams they plan.
    batch_windows: Vec<progress::BatchWindows>,
    /// The task monitor, the metrics follower and the shard recovery (aborted when the
    /// run ends).
    background: Vec<JoinHandle<()>>,
    fold: MetricsFold,
    reports: mpsc::Receiver<MetricsReport>,
    recovered: mpsc::Receiver<Restart>,
    backend_events: broadcast::Receiver<BackendEvent>,
    /// The Job's resource as last applied (a new generation may change its replicas).
    specs: watch::Receiver<Resource>,
    shard_memory: snapshot::ShardMemoryProbe,
    /// Memory executors were given beyond their role's, by id.
    memory_given: HashMap<String, u64>,
    /// Executors reported short of memory.
    memory_short: HashSet<String>,
    /// The status tick's policies and what they keep between ticks.
    policies: Policies,
    trainers_done: BTreeSet<String>,
    batch_done_declared: bool,
    committed: Option<CheckpointRecord>,
    next_checkpoint: u64,
    /// The checkpoint being taken: its id and outcome once done (aborted when the run ends).
    checkpoint_in_flight: Option<JoinHandle<TakenCheckpoint>>,
    /// Samples trained before rollbacks and trained again since.
    retrained_samples: u64,
    /// The same per source.
    retrained_sources: BTreeMap<String, u64>,
}

/// A checkpoint's id and how taking it went.
type TakenCheckpoint = (u64, Result<checkpoint::Taken, checkpoint::CheckpointError>);

/// What the run waits for.
enum Event {
    StatusTick,
    CheckpointTick,
    CheckpointDone(Result<TakenCheckpoint, tokio::task::JoinError>),
    Report(MetricsReport),
    Restarted(Restart),
    Backend(Result<BackendEvent, broadcast::error::RecvError>),
    SpecChanged(Resource),
}

impl<B, C> Drop for JobRun<'_, B, C> {
    fn drop(&mut self) {
        self.context.cluster.leave(&self.name);
        for planner in &self.planners {
            planner.abort();
        }
        for task in &self.background {
            task.abort();
        }
        if let Some(checkpoint) = &self.checkpoint_in_flight {
            checkpoint.abort();
        }
    }
}

impl<'a, B: ResourceBackend, C: Catalog> JobRun<'a, B, C> {
    /// Checks the Job, sets up its queue, starts and restores its executors: the Job is
    /// Running when this returns.
    async fn start(
        context: &'a Arc<Context<B, C>>,
        resource: &Resource,
        specs: watch::Receiver<Resource>,
        writer: &'a mut JobStatus,
    ) -> Result<Self, Outcome> {
        let name = resource.name.clone();
        let mut checked = CheckedJob::check(context, resource, writer).await?;
        if checked.spec.scaling.policy == AllocationPolicy::Auto {
            let db = ConfigDb::new(context.redis.clone(), &context.settings.redis.key_prefix);
            let (applied, reason, message) =
                warm_start::apply(&db, &mut checked.spec, &checked.layout).await;
            tracing::info!(job = name, reason, %message, "warm start");
            writer.condition("WarmStart", applied, reason, message);
        }
        let topology = &checked.spec.topology;
        let requested = format!(
            "{} PS, {} data executors, {} trainers",
            topology.ps.replicas, topology.data_executors.replicas, topology.trainers.replicas
        );
        writer
            .set(
                Phase::Starting,
                "Scheduled",
                "ExecutorsRequested",
                requested,
            )
            .await;
        // A previous master's executors may still run. The Job resumes from its latest
        // checkpoint: its data executors and trainers go before the queue is rolled back;
        // its PS shards and serving replicas are taken over and restored in place.
        let roles = [ExecutorRole::DataExecutor, ExecutorRole::Trainer];
        let previous = (context.backend.kill_previous(&name, &roles).await)
            .map_err(|e| Outcome::failed("ExecutorStopFailed", e.to_string()))?;
        if !previous.is_empty() {
            let message = format!("the previous master's {} stopped", previous.join(", "));
            tracing::info!(job = name, %message, "taking the Job over");
            writer.event("TakenOver", message);
            // Written now: a master that stops again before the Job runs leaves the next
            // one nothing to kill, and the takeover would otherwise go unrecorded.
            writer.write().await;
        }
        let mut run = Self::open(context, writer, name, checked, specs).await?;
        let mut events = context.backend.events();
        // PS shards (and serving replicas) first: a restored checkpoint must be in them
        // before any trainer offers its initial parameters or reads a row. A gang starts
        // whole: its trainers hold their calls until the shards open (UNAVAILABLE).
        let (first, rest) = (
            [ExecutorRole::Ps, ExecutorRole::Serving],
            [ExecutorRole::DataExecutor, ExecutorRole::Trainer],
        );
        let gang = context.backend.schedules_gangs();
        let parts = run.job.parts(&run.name, &run.memory_given);
        if gang {
            let members = executors::gang(&context.settings, &parts, &ExecutorRole::ALL);
            (context.backend.form_gang(&run.name, &members).await)
                .map_err(|e| Outcome::failed("GangNotFormed", e.to_string()))?;
            start_executors_together(context, &parts, &ExecutorRole::ALL).await?;
        } else {
            start_executors(context, &parts, &first).await?;
        }
        wait_ready(context, &run.name, &first, &mut events).await?;
        run.restore_or_open_ps(false).await?;
        if !gang {
            let parts = run.job.parts(&run.name, &run.memory_given);
            start_executors(context, &parts, &rest).await?;
        }
        let ready = wait_ready(context, &run.name, &ExecutorRole::ALL, &mut events).await?;
        let message = format!("{ready} executors serving");
        run.show_replicas();
        run.policies.serving_from(Instant::now());
        run.writer
            .set(Phase::Running, "Ready", "ExecutorsReady", message)
            .await;
        Ok(run)
    }

    /// Registers the Job's queue with the task service, takes back what a previous
    /// master's executors held, rolls the queue back to the latest checkpoint, declares
    /// the stream bindings, and starts the batch planners, the task monitor, the metrics
    /// follower and the recovery of restarted PS shards.
    async fn open(
        context: &'a Arc<Context<B, C>>,
        writer: &'a mut JobStatus,
        name: String,
        mut checked: CheckedJob,
        specs: watch::Receiver<Resource>,
    ) -> Result<Self, Outcome> {
        let tasks = JobTasks {
            queue: TaskQueue::new(
                context.redis.clone(),
                &context.settings.redis.key_prefix,
                &name,
            ),
            bounded: Arc::new(AtomicBool::new(false)),
            alignments: Arc::new(Alignments::default()),
            trainer_totals: Arc::new(KnownTotals::default()),
            stragglers: Arc::default(),
            received: Arc::default(),
        };
        context
            .jobs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), tasks.clone());
        let queue = &tasks.queue;
        // Executors of a previous master (same ids as the ones about to start) are gone:
        // their tasks go back to pending without using up an attempt.
        queue
            .requeue_previous_executors()
            .await
            .map_err(|e| Outcome::failed("TaskQueueUnavailable", e.to_string()))?;
        // The model restarts from the latest checkpoint, so the data does too.
        let restored = match &checked.spec.checkpoint {
            Some(_) => checkpoints::rollback_queue(&name, queue)
                .await
                .map_err(|e| Outcome::failed("CheckpointRestoreFailed", e.to_string()))?,
            None => None,
        };
        // Trainers continue from their totals in the checkpoint (they ask at start).
        for (trainer, totals) in restored.iter().flat_map(|r| &r.trainers) {
            tasks.trainer_totals.raise(trainer, totals.clone());
        }
        let stream_bindings = planning::stream_tasks(&name, &checked.dataset);
        if checked.reads_streams && checked.spec.mode != TrainingMode::BatchThenStream {
            queue
                .add_stream_tasks(&stream_bindings)
                .await
                .map_err(|e| Outcome::failed("TaskQueueUnavailable", e.to_string()))?;
        }
        let plans = std::mem::take(&mut checked.plans);
        let batch_windows = plans.iter().map(progress::BatchWindows::of).collect();
        let planners = match checked.reads_batch {
            true => plan_batches(context, &name, queue, plans),
            false => Vec::new(),
        };
        let recovery = Arc::new(ShardRecovery::default());
        let backend_events = context.backend.events();
        let (reports_tx, reports) = mpsc::channel(1024);
        let (recovered_tx, recovered) = mpsc::channel(16);
        let background = vec![
            tokio::spawn(monitor::monitor(
                tasks.queue.clone(),
                tasks.received.clone(),
                received_reports(&tasks, &context.topologies, &name),
                context.bus.clone(),
                name.clone(),
                context.settings.master.tasks.clone(),
            )),
            tokio::spawn(metrics::follow(
                context.bus.clone(),
                name.clone(),
                reports_tx,
            )),
            tokio::spawn(checkpoints::abandon_on_crash(
                context.backend.events(),
                name.clone(),
                tasks.alignments.clone(),
            )),
            tokio::spawn(recover_restarted_shards(
                context.backend.events(),
                ShardRestarts {
                    job: name.clone(),
                    queue: queue.clone(),
                    topologies: context.topologies.clone(),
                    recovery: recovery.clone(),
                    totals: tasks.trainer_totals.clone(),
                    policy: (checked.spec.checkpoint.as_ref())
                        .map(|c| c.on_ps_failure)
                        .unwrap_or_default(),
                    workers: (checked.spec.checkpoint.as_ref())
                        .map(|c| c.on_worker_failure)
                        .unwrap_or_default(),
                    hot_set: checked.spec.training.hot_set.enabled,
                },
                recovered_tx,
            )),
        ];
        let shape = performance::job_shape(&checked.spec, &checked.layout);
        Ok(Self {
            context,
            writer,
            has_streams: checked.reads_streams && !stream_bindings.is_empty(),
            job: checked,
            stream_bindings,
            tasks,
            recovery,
            planners,
            batch_windows,
            background,
            fold: MetricsFold::default(),
            reports,
            recovered,
            backend_events,
            specs,
            policies: Policies::new(shape, Instant::now()),
            shard_memory: snapshot::ShardMemoryProbe::default(),
            memory_given: HashMap::new(),
            memory_short: HashSet::new(),
            trainers_done: BTreeSet::new(),
            batch_done_declared: false,
            next_checkpoint: restored.as_ref().map_or(0, |r| r.id) + 1,
            checkpoint_in_flight: None,
            retrained_samples: 0,
            retrained_sources: BTreeMap::new(),
            committed: restored,
            name,
        })
    }

    /// Handles events until the Job ends.
    async fn follow(&mut self) -> Outcome {
        let mut status_ticks = tokio::time::interval(Duration::from_millis(
            self.context.settings.master.status_interval_ms.max(50),
        ));
        let mut checkpoint_ticks = self.checkpoint_ticks();
        loop {
            let event = tokio::select! {
                _ = status_ticks.tick() => Event::StatusTick,
                _ = tick(&mut checkpoint_ticks) => Event::CheckpointTick,
                taken = finished(&mut self.checkpoint_in_flight) => Event::CheckpointDone(taken),
                Some(report) = self.reports.recv() => Event::Report(report),
                Some(restart) = self.recovered.recv() => Event::Restarted(restart),
                event = self.backend_events.recv() => Event::Backend(event),
                // A new generation may stop executors the barrier waits for: after it.
                Ok(()) = self.specs.changed(), if self.checkpoint_in_flight.is_none() => {
                    Event::SpecChanged(self.specs.borrow_and_update().clone())
                }
            };
            let flow = match event {
                Event::StatusTick => {
                    let started = Instant::now();
                    let flow = self.on_status_tick().await;
                    self.context.ticks.record(started.elapsed());
                    flow
                }
                Event::CheckpointTick => self.on_checkpoint_tick().await,
                Event::CheckpointDone(Ok((id, taken))) => self.on_checkpoint_done(id, taken).await,
                Event::CheckpointDone(Err(e)) => {
                    let message = format!("the checkpoint task ended: {e}");
                    self.writer
                        .condition("Checkpoint", false, "CheckpointFailed", message);
                    ControlFlow::Continue(())
                }
                Event::Report(report) => self.on_report(report),
                Event::Restarted(Restart::Restored(recovered)) => {
                    self.on_shard_recovered(recovered).await
                }
                Event::Restarted(Restart::RollBack(crashed)) => self.roll_back(&crashed).await,
                Event::Backend(event) => self.on_backend_event(event).await,
                Event::SpecChanged(resource) => self.on_spec_changed(resource).await,
            };
            if let ControlFlow::Break(outcome) = flow {
                return outcome;
            }
        }
    }

    /// Every `spec.checkpoint.interval_seconds`, first one period after the start; none
    /// without `spec.checkpoint`.
    fn checkpoint_ticks(&self) -> Option<Interval> {
        let period = Duration::from_secs(self.job.spec.checkpoint.as_ref()?.interval_seconds);
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Some(ticks)
    }

    fn on_report(&mut self, report: MetricsReport) -> ControlFlow<Outcome> {
        let trainer = report
            .endpoint
            .as_ref()
            .filter(|e| e.role == Role::Trainer as i32);
        if let Some(trainer) = trainer {
            let totals = checkpoint::TrainerTotals::new(
                report.steps,
                report.samples,
                report.source_samples.clone(),
            );
            self.tasks.trainer_totals.raise(&trainer.id, totals);
        }
        self.fold.add(report);
        ControlFlow::Continue(())
    }

    async fn on_shard_recovered(&mut self, recovered: Recovered) -> ControlFlow<Outcome> {
        match recovered {
            Ok((reason, message)) => {
                tracing::warn!(job = self.name, %message, "PS shard restarted");
                self.writer
                    .condition("ShardRestored", true, reason, message);
                self.writer.write().await;
                ControlFlow::Continue(())
            }
            Err(message) => ControlFlow::Break(Outcome::failed("ShardRestoreFailed", message)),
        }
    }

    async fn on_backend_event(
        &mut self,
        event: Result<BackendEvent, broadcast::error::RecvError>,
    ) -> ControlFlow<Outcome> {
        if let Ok(
            BackendEvent::Restarting { job, id, .. }
            | BackendEvent::GaveUp { job, id, .. }
            | BackendEvent::Completed { job, id },
        ) = &event
            && *job == self.name
            && id.starts_with(ExecutorRole::Trainer.as_str())
        {
            // Nothing it received from a lost data executor will be reported now.
            self.tasks.received.trainer_lost(id);
        }
        if let Ok(BackendEvent::Restarting { job, id, .. }) = &event
            && *job == self.name
            && id.starts_with(ExecutorRole::DataExecutor.as_str())
        {
            self.tasks.received.executor_crashed(id);
        }
        match event {
            Ok(BackendEvent::OutOfMemory {
                job,
                id,
                memory_bytes,
            }) if job == self.name => {
                let endpoints = self.endpoints();
                if let Some(endpoint) = endpoints.iter().find(|e| e.id == id) {
                    let given = &self.memory_given;
                    let action = primus_job_policy::memory::after_out_of_memory(
                        &self.job.spec,
                        given,
                        endpoint,
                        memory_bytes,
                    );
                    self.apply(vec![action]).await;
                }
            }
            Ok(BackendEvent::GaveUp { job, id, status }) if job == self.name => {
                let message = format!("{id} keeps crashing: {status}");
                self.writer
                    .executor_changed(&id, ExecutorState::Failed, status, false);
                return ControlFlow::Break(Outcome::failed("ExecutorFailed", message));
            }
            Ok(BackendEvent::Restarting {
                job, id, status, ..
            }) if job == self.name => {
                self.writer
                    .executor_changed(&id, ExecutorState::Running, status, true);
                self.writer.write().await;
            }
            Ok(BackendEvent::Completed { job, id }) if job == self.name => {
                let exit = "exit status: 0".to_owned();
                self.writer
                    .executor_changed(&id, ExecutorState::Completed, exit, false);
                if id.starts_with(ExecutorRole::Trainer.as_str()) {
                    self.trainers_done.insert(id);
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    /// Checks the planners and the queue: fails the Job on a failed task or planner,
    /// succeeds it once a batch Job's data is read and trained, declares the stream
    /// bindings of `batch-then-stream` once its batch part is done, and writes progress
    /// and metrics.
    async fn on_status_tick(&mut self) -> ControlFlow<Outcome> {
        self.settle_planners().await?;
        let all_planned = self.all_planned();
        self.tasks
            .bounded
            .store(all_planned && !self.has_streams, Ordering::Release);
        let counts = match self.tasks.queue.counts().await {
            Ok(counts) => counts,
            Err(e) => {
                tracing::warn!(job = self.name, error = %e, "reading the task queue");
                return ControlFlow::Continue(());
            }
        };
        if counts.failed > 0 {
            let failures = self.tasks.queue.failures().await.unwrap_or_default();
            let (task, error) = failures.into_iter().next().unwrap_or_default();
            let message = format!("task {task}: {error}");
            return ControlFlow::Break(Outcome::failed("TaskFailed", message));
        }
        if self.checkpoint_in_flight.is_some() {
            // Its barrier holds the data executors paused and waits for the trainers:
            // nothing that ends, stops or moves them runs before it is done, but progress
            // is written as usual.
            self.report_progress(&counts, all_planned).await;
            return ControlFlow::Continue(());
        }
        let batch_finished = all_planned && counts.pending == 0 && counts.running == 0;
        // A batch Job ends when its data is read and every trainer has trained on all it
        // was served (a trainer exits 0 when its minibatch streams end).
        if batch_finished && !self.has_streams && self.trainers_finished() {
            return ControlFlow::Break(self.succeed(&counts).await);
        }
        if batch_finished && self.job.spec.mode == TrainingMode::BatchThenStream {
            self.declare_stream_bindings().await;
        }
        self.report_progress(&counts, all_planned).await;
        self.show_waiting_windows(&counts).await;
        let snapshot = self.observe(counts).await;
        self.record_performance(&snapshot);
        let actions = self.decide(&snapshot);
        self.apply(actions).await;
        ControlFlow::Continue(())
    }

    /// What the policies of the status tick decide on `snapshot`, in order.
    fn decide(&mut self, snapshot: &Snapshot) -> Vec<Action> {
        let market = Market {
            job: &self.name,
            cluster: &self.context.cluster,
            capacity: &self.context.capacity,
        };
        self.policies.decide(snapshot, &market)
    }

    /// Every batch window is planned (the Job reads batch sources and no planner runs).
    fn all_planned(&self) -> bool {
        self.job.reads_batch && self.planners.is_empty()
    }

    /// Collects the planners that finished; one that failed fails the Job.
    async fn settle_planners(&mut self) -> ControlFlow<Outcome> {
        let (finished, running) = std::mem::take(&mut self.planners)
            .into_iter()
            .partition::<Vec<_>, _>(|h| h.is_finished());
        self.planners = running;
        for handle in finished {
            let error = match handle.await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            return ControlFlow::Break(Outcome::failed("PlanningFailed", error));
        }
        ControlFlow::Continue(())
    }

    /// `batch-then-stream`: the stream bindings are declared once the batch part is done.
    async fn declare_stream_bindings(&mut self) {
        if self.batch_done_declared {
            return;
        }
        match self
            .tasks
            .queue
            .add_stream_tasks(&self.stream_bindings)
            .await
        {
            Ok(()) => self.batch_done_declared = true,
            Err(e) => tracing::warn!(job = self.name, error = %e, "declaring stream bindings"),
        }
    }

    /// Ends a batch Job whose data is read and trained: the reports still in flight are
    /// folded in, and the PS shards are snapshotted when the Job has a checkpoint.
    async fn succeed(&mut self, counts: &QueueCounts) -> Outcome {
        self.write_final_metrics(counts).await;
        let trainers = self.members(ExecutorRole::Trainer).len();
        let mut message = format!(
            "all {} data tasks succeeded; {trainers} trainers finished",
            counts.succeeded
        );
        let mut manifests = None;
        if let Some(checkpoint) = &self.job.spec.checkpoint {
            match self
                .final_checkpoint(&checkpoint.uri, counts.succeeded)
                .await
            {
                Ok(written) => {
                    message.push_str(&format!("; checkpoint: {}", written.join(", ")));
                    manifests = Some(written);
                }
                Err(e) => return Outcome::failed("CheckpointFailed", e),
            }
        }
        self.record_in_config_db().await;
        let kept = self.keep_serving(manifests.as_deref(), &mut message).await;
        Outcome {
            phase: Phase::Succeeded,
            reason: "DataExhausted",
            message,
            kept,
        }
    }

    /// Every executor of the Job's topology.
    fn endpoints(&self) -> Vec<Endpoint> {
        executors::endpoints(self.context, &self.name)
    }
}

/// Waits for the checkpoint in flight to finish and clears it; forever when there is none.
async fn finished(
    in_flight: &mut Option<JoinHandle<TakenCheckpoint>>,
) -> Result<TakenCheckpoint, tokio::task::JoinError> {
    let Some(handle) = in_flight else {
        return std::future::pending().await;
    };
    let taken = handle.await;
    *in_flight = None;
    taken
}

/// Waits for the next tick of `ticks`; forever when there are none.
async fn tick(ticks: &mut Option<Interval>) {
    match ticks {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// One planner task per stream with batch sources.
fn plan_batches<B, C: Catalog>(
    context: &Context<B, C>,
    name: &str,
    queue: &TaskQueue,
    plans: Vec<StreamPlan>,
) -> Vec<JoinHandle<Result<(), PlanningError>>> {
    let job: Arc<str> = Arc::from(name);
    let settings = &context.settings.master.planner;
    plans
        .into_iter()
        .map(|plan| {
            tokio::spawn(planning::plan_stream(
                queue.clone(),
                context.cache.clone(),
                job.clone(),
                Arc::new(plan),
                settings.clone(),
            ))
        })
        .collect()
}

/// What the task monitor waits for before it gives a silent data executor's work back:
/// the Job's trainers' reports of the rows they received from it.
fn received_reports(
    tasks: &JobTasks,
    topologies: &Topologies,
    job: &str,
) -> impl Fn(String) -> BoxFuture<'static, Result<(), QueueError>> + Send + 'static {
    let (tasks, topologies, job) = (tasks.clone(), topologies.clone(), job.to_owned());
    move |executor| {
        let (tasks, topologies, job) = (tasks.clone(), topologies.clone(), job.clone());
        Box::pin(async move {
            (tasks.await_received_reports(&job, &topologies, &executor, SILENT_REPORTS_PATIENCE))
                .await
        })
    }
}
