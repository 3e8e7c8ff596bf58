//! The task service (gRPC `TaskService`): data executors register, acquire tasks, report
//! offsets and finish tasks. Every call is also a heartbeat of the calling executor. The
//! same jobs' `CheckpointService` takes trainers' barrier alignments and tells a starting
//! trainer the totals to continue from.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use primus_proto::v1::checkpoint_service_server::CheckpointService;
use primus_proto::v1::task_service_server::TaskService;
use primus_proto::v1::{
    AcquireTaskRequest, AcquireTaskResponse, FinishTaskRequest, FinishTaskResponse,
    RegisterExecutorRequest, RegisterExecutorResponse, ReportProgressRequest,
    ReportProgressResponse, ReportReceivedRequest, ReportReceivedResponse, TrainerAlignedRequest,
    TrainerAlignedResponse, TrainerTotalsRequest, TrainerTotalsResponse,
};
use tonic::{Request, Response, Status};

use crate::checkpoint::{Alignments, KnownTotals, TrainerTotals};
use crate::topology::Topologies;
use primus_config::TaskSettings;
use primus_data_tasks::queue::{Acquired, Finished, QueueError, TaskQueue};
use primus_data_tasks::received::ReceivedRanges;
use primus_spec::time::unix_ms;

/// What the task service needs of one job.
#[derive(Clone)]
pub struct JobTasks {
    pub queue: TaskQueue,
    /// Set once every bounded stream is planned and no stream binding exists: then an
    /// empty queue means the job's data is exhausted.
    pub bounded: Arc<std::sync::atomic::AtomicBool>,
    /// The checkpoint barrier in progress, if any.
    pub alignments: Arc<Alignments>,
    /// Each trainer's highest totals so far.
    pub trainer_totals: Arc<KnownTotals>,
    /// The data executors found much slower than their peers: they get fewer tasks.
    pub stragglers: Arc<Stragglers>,
    /// Task rows trainers received from executors that died.
    pub received: Arc<ReceivedRanges>,
}

impl JobTasks {
    /// Waits (for `patience` at most) for the Job's trainers to report what they received
    /// from `executor`'s lost process (it restarted, or stopped heartbeating), when it held
    /// work that is about to go back to the queue: the reports move its tasks on through
    /// those rows first. A trainer lost itself, or one that trained on for
    /// `TRAINED_ON_STEPS` steps and `TRAINED_ON_FOR` without a report, is not waited for.
    pub async fn await_received_reports(
        &self,
        job: &str,
        topologies: &Topologies,
        executor: &str,
        patience: Duration,
    ) -> Result<(), QueueError> {
        if !self.queue.holds_work(executor).await? {
            return Ok(());
        }
        let trainers: Vec<String> = (topologies.get(job))
            .map(|(_, endpoints)| {
                primus_proto::role_endpoints(&endpoints, primus_proto::v1::Role::Trainer)
            })
            .unwrap_or_default()
            .into_iter()
            .map(|endpoint| endpoint.id)
            .collect();
        let since = TrainedOn::new(&self.trainer_totals, &trainers);
        let missing = (self.received)
            .await_reports(executor, &trainers, patience, |t| since.trained_on(t))
            .await;
        if !missing.is_empty() {
            tracing::warn!(
                job,
                executor,
                ?missing,
                "trainers did not report the rows they received from the executor's lost process; rows they trained may be served again"
            );
        }
        Ok(())
    }
}

/// Whether each of a Job's trainers went on training since a data executor was lost,
/// counted from its first progress report after the loss: the report before may be a
/// report interval behind the steps a stalled trainer took.
struct TrainedOn<'a> {
    totals: &'a KnownTotals,
    started: tokio::time::Instant,
    steps_then: HashMap<String, u64>,
    counted_from: std::sync::Mutex<HashMap<String, u64>>,
}

impl<'a> TrainedOn<'a> {
    fn new(totals: &'a KnownTotals, trainers: &[String]) -> Self {
        Self {
            totals,
            started: tokio::time::Instant::now(),
            steps_then: (trainers.iter())
                .map(|t| (t.clone(), totals.steps(t)))
                .collect(),
            counted_from: Default::default(),
        }
    }

    /// Whether `trainer` trained `TRAINED_ON_STEPS` steps since its first report after
    /// the loss, and `TRAINED_ON_FOR` passed.
    fn trained_on(&self, trainer: &str) -> bool {
        let now = self.totals.steps(trainer);
        let mut counted_from = (self.counted_from.lock()).unwrap_or_else(|p| p.into_inner());
        match counted_from.get(trainer) {
            Some(from) => {
                self.started.elapsed() >= TRAINED_ON_FOR && now >= from + TRAINED_ON_STEPS
            }
            None => {
                if (self.steps_then.get(trainer)).is_some_and(|then| now > *then) {
                    counted_from.insert(trainer.to_owned(), now);
                }
                false
            }
        }
    }
}

/// The data executors of a job that are stragglers now.
#[derive(Debug, Default)]
pub struct Stragglers(RwLock<BTreeSet<String>>);

impl Stragglers {
    /// Makes `now` the stragglers; returns the previous ones.
    pub fn replace(&self, now: BTreeSet<String>) -> BTreeSet<String> {
        std::mem::replace(&mut *self.0.write().unwrap_or_else(|p| p.into_inner()), now)
    }

    pub fn contains(&self, executor: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(executor)
    }
}

/// The jobs this master drives, by name.
pub type JobRegistry = Arc<RwLock<HashMap<String, JobTasks>>>;

pub struct Tasks {
    jobs: JobRegistry,
    topologies: Topologies,
    settings: TaskSettings,
}

/// How long a restarted data executor's tasks wait for the Job's trainers to report the
/// rows they received from its lost process. A trainer reports when it next reads, within
/// a step once it is not stalled; one stalled longer (or cut off from the master) is not
/// waited for, and what it trained of those rows may be served again.
pub const RESTART_REPORTS_PATIENCE: Duration = Duration::from_secs(120);

/// As [`RESTART_REPORTS_PATIENCE`] for an executor that stopped heartbeating: it may be
/// alive with its streams open, so its trainers may have nothing to report.
pub const SILENT_REPORTS_PATIENCE: Duration = Duration::from_secs(10);

/// A trainer that trains this many steps (counted from its first progress report after a
/// data executor was lost), over [`TRAINED_ON_FOR`] at least, without reporting on it
/// read nothing from it: its reads run a few minibatches ahead of its steps, a read that
/// finds a stream broken reports before it yields, and a trainer reports its progress as
/// it steps.
const TRAINED_ON_STEPS: u64 = 8;
const TRAINED_ON_FOR: Duration = Duration::from_secs(2);

impl Tasks {
    pub fn new(jobs: JobRegistry, topologies: Topologies, settings: TaskSettings) -> Self {
        Self {
            jobs,
            topologies,
            settings,
        }
    }

    fn job(&self, job: &str) -> Result<JobTasks, Status> {
        self.jobs
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(job)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("job {job:?} is not driven by this master")))
    }
}

/// A straggler takes a task only while more than one is waiting and it holds none: the
/// last tasks go to faster executors. The answer to a straggler that may not take one now.
async fn straggler_refused(
    job: &JobTasks,
    executor: &str,
) -> Result<Option<AcquireTaskResponse>, Status> {
    let counts = job.queue.counts().await.map_err(unavailable)?;
    let refused = if counts.pending > 1 {
        let running = job.queue.running().await.map_err(unavailable)?;
        running.values().any(|holder| holder == executor)
    } else {
        true
    };
    let bounded = job.bounded.load(std::sync::atomic::Ordering::Acquire);
    Ok(refused.then_some(AcquireTaskResponse {
        task: None,
        exhausted: bounded && counts.pending == 0 && counts.running == 0,
    }))
}

fn unavailable(error: QueueError) -> Status {
    Status::unavailable(format!("task queue: {error}"))
}

fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("`{field}` is required")));
    }
    Ok(value)
}

#[tonic::async_trait]
impl TaskService for Tasks {
    async fn register_executor(
        &self,
        request: Request<RegisterExecutorRequest>,
    ) -> Result<Response<RegisterExecutorResponse>, Status> {
        let request = request.into_inner();
        let endpoint = request
            .endpoint
            .ok_or_else(|| Status::invalid_argument("`endpoint` is required"))?;
        let id = required("endpoint.id", &endpoint.id)?;
        let job = self.job(&request.job)?;
        // A registration is a new incarnation: whatever this id held before is lost work,
        // taken back once the trainers said what of it they received.
        (job.await_received_reports(&request.job, &self.topologies, id, RESTART_REPORTS_PATIENCE)
            .await)
            .map_err(unavailable)?;
        let requeued = job
            .queue
            .requeue_executor(id, self.settings.max_attempts)
            .await
            .map_err(unavailable)?;
        if requeued > 0 {
            tracing::warn!(job = %request.job, executor = id, requeued, "executor restarted; its tasks are re-queued");
        }
        job.queue.touch(id, unix_ms()).await.map_err(unavailable)?;
        job.received.registered(id);
        tracing::info!(job = %request.job, executor = id, addr = %endpoint.grpc_addr, "executor registered");
        Ok(Response::new(RegisterExecutorResponse {
            heartbeat_interval_ms: self.settings.heartbeat_interval_ms,
        }))
    }

    async fn acquire_task(
        &self,
        request: Request<AcquireTaskRequest>,
    ) -> Result<Response<AcquireTaskResponse>, Status> {
        let request = request.into_inner();
        let executor = required("executor_id", &request.executor_id)?;
        let job = self.job(&request.job)?;
        if job.stragglers.contains(executor)
            && let Some(refused) = straggler_refused(&job, executor).await?
        {
            return Ok(Response::new(refused));
        }
        let acquired = job
            .queue
            .acquire(
                executor,
                &request.request_id,
                unix_ms(),
                self.settings.max_lead_hours,
            )
            .await
            .map_err(unavailable)?;
        let (task, exhausted) = match acquired {
            Acquired::Task(task) => (Some(*task), false),
            Acquired::Throttled => (None, false),
            Acquired::Empty => {
                let bounded = job.bounded.load(std::sync::atomic::Ordering::Acquire);
                // Counted after the acquire: a task that failed in between went back to
                // pending, and the data is not exhausted while it waits there.
                let counts = job.queue.counts().await.map_err(unavailable)?;
                (None, bounded && counts.pending == 0 && counts.running == 0)
            }
        };
        Ok(Response::new(AcquireTaskResponse { task, exhausted }))
    }

    async fn report_progress(
        &self,
        request: Request<ReportProgressRequest>,
    ) -> Result<Response<ReportProgressResponse>, Status> {
        let request = request.into_inner();
        let executor = required("executor_id", &request.executor_id)?;
        let task = required("task_id", &request.task_id)?;
        let job = self.job(&request.job)?;
        let owned = job
            .queue
            .report_progress(
                executor,
                task,
                request.offset,
                request.stream_position.as_ref(),
                unix_ms(),
            )
            .await
            .map_err(unavailable)?;
        if !owned {
            return Err(not_owner(executor, task));
        }
        Ok(Response::new(ReportProgressResponse {}))
    }

    async fn finish_task(
        &self,
        request: Request<FinishTaskRequest>,
    ) -> Result<Response<FinishTaskResponse>, Status> {
        let request = request.into_inner();
        let executor = required("executor_id", &request.executor_id)?;
        let task = required("task_id", &request.task_id)?;
        let job = self.job(&request.job)?;
        let finished = job
            .queue
            .finish(
                executor,
                task,
                &request.error,
                self.settings.max_attempts,
                unix_ms(),
            )
            .await
            .map_err(unavailable)?;
        match finished {
            Finished::NotOwner => return Err(not_owner(executor, task)),
            Finished::Failed => {
                tracing::warn!(job = %request.job, task, error = %request.error, "task failed for good")
            }
            Finished::Requeued => {
                tracing::info!(job = %request.job, task, error = %request.error, "task failed; re-queued")
            }
            Finished::Succeeded => {}
        }
        Ok(Response::new(FinishTaskResponse {}))
    }

    async fn report_received(
        &self,
        request: Request<ReportReceivedRequest>,
    ) -> Result<Response<ReportReceivedResponse>, Status> {
        let request = request.into_inner();
        let executor = required("executor_id", &request.executor_id)?;
        let trainer = required("trainer_id", &request.trainer_id)?;
        for (i, range) in request.ranges.iter().enumerate() {
            required(&format!("ranges[{i}].task_id"), &range.task_id)?;
            if range.end < range.first {
                return Err(Status::invalid_argument(format!(
                    "ranges[{i}]: `end` {} is before `first` {}",
                    range.end, range.first
                )));
            }
        }
        let job = self.job(&request.job)?;
        let tasks = job.received.add(executor, request.ranges);
        let moved = move_on_received(&job, &request.job, executor, trainer, tasks).await;
        // On success or not, the executor's tasks need not wait for this trainer longer.
        job.received.reported(executor, trainer);
        Ok(Response::new(ReportReceivedResponse {
            tasks_moved: moved?,
        }))
    }
}

#[tonic::async_trait]
impl CheckpointService for Tasks {
    async fn trainer_aligned(
        &self,
        request: Request<TrainerAlignedRequest>,
    ) -> Result<Response<TrainerAlignedResponse>, Status> {
        let request = request.into_inner();
        let trainer = required("trainer_id", &request.trainer_id)?;
        let job = self.job(&request.job)?;
        let totals = TrainerTotals::new(request.steps, request.samples, request.source_samples);
        job.trainer_totals.raise(trainer, totals.clone());
        if !job.alignments.ack(request.checkpoint_id, trainer, totals) {
            return Err(Status::failed_precondition(format!(
                "checkpoint {} of job {:?} is not in progress (it finished or timed out)",
                request.checkpoint_id, request.job
            )));
        }
        Ok(Response::new(TrainerAlignedResponse {}))
    }

    async fn trainer_totals(
        &self,
        request: Request<TrainerTotalsRequest>,
    ) -> Result<Response<TrainerTotalsResponse>, Status> {
        let request = request.into_inner();
        let trainer = required("trainer_id", &request.trainer_id)?;
        let totals = self.job(&request.job)?.trainer_totals.get(trainer);
        Ok(Response::new(TrainerTotalsResponse {
            steps: totals.steps,
            samples: totals.samples,
            source_samples: totals.sources.into_iter().collect(),
        }))
    }
}

/// Moves each of `tasks`, still `executor`'s, on through the ranges trainers received that
/// continue its offset; returns how many moved.
async fn move_on_received(
    job: &JobTasks,
    name: &str,
    executor: &str,
    trainer: &str,
    tasks: BTreeSet<String>,
) -> Result<u32, Status> {
    let offsets = job.queue.offsets().await.map_err(unavailable)?;
    let mut moved = 0;
    for task in tasks {
        let offset = offsets.get(&task).copied().unwrap_or(0);
        let Some((end, position)) = job.received.continuation(executor, &task, offset) else {
            continue;
        };
        let owned = (job.queue)
            .advance_received(executor, &task, end, position.as_ref())
            .await
            .map_err(unavailable)?;
        if owned {
            moved += 1;
            tracing::info!(
                job = name,
                executor,
                trainer,
                task,
                from = offset,
                to = end,
                "rows a dead executor served, reported by their trainer"
            );
        } else if job.queue.succeeded(&task).await.map_err(unavailable)? {
            // Its last offset counted every row it served, these among them.
            tracing::debug!(
                job = name,
                executor,
                trainer,
                task,
                "rows a dead executor served, of a task that succeeded before the report"
            );
        } else {
            tracing::warn!(
                job = name,
                executor,
                trainer,
                task,
                "the task left the executor before its trainer reported rows {offset}..{end}; they may be served again"
            );
        }
    }
    Ok(moved)
}

fn not_owner(executor: &str, task: &str) -> Status {
    Status::failed_precondition(format!(
        "task {task:?} is not assigned to {executor} (it was re-queued after a missed heartbeat); drop it and acquire again"
    ))
}

#[cfg(test)]
mod tests {
    use primus_proto::v1::ServedRange;

    use super::*;

    /// A trainer's steps count from its first report after the loss (the one before may
    /// lag its steps by a report interval), and only once enough time passed too.
    #[tokio::test]
    async fn a_trainer_trained_on_after_steps_counted_from_a_fresh_report() {
        let totals = KnownTotals::default();
        let steps = |n: u64| TrainerTotals::new(n, n * 256, Default::default());
        totals.raise("trainer-0", steps(100));
        let since = TrainedOn::new(&totals, &["trainer-0".to_owned()]);
        totals.raise("trainer-0", steps(101));
        assert!(!since.trained_on("trainer-0"), "counted from 101");
        totals.raise("trainer-0", steps(101 + TRAINED_ON_STEPS));
        assert!(!since.trained_on("trainer-0"), "too soon");
        tokio::time::sleep(TRAINED_ON_FOR).await;
        assert!(since.trained_on("trainer-0"));

        // A stalled trainer's first report after the loss jumps by the steps it took
        // before the loss that its last report missed: it only sets the count.
        let since = TrainedOn::new(&totals, &["trainer-0".to_owned()]);
        tokio::time::sleep(TRAINED_ON_FOR).await;
        let first = 101 + 3 * TRAINED_ON_STEPS;
        totals.raise("trainer-0", steps(first));
        assert!(
            !since.trained_on("trainer-0"),
            "a first report only sets the count"
        );
        totals.raise("trainer-0", steps(first + TRAINED_ON_STEPS - 1));
        assert!(!since.trained_on("trainer-0"), "one step short");
        totals.raise("trainer-0", steps(first + TRAINED_ON_STEPS));
        assert!(since.trained_on("trainer-0"));
        assert!(
            !since.trained_on("trainer-1"),
            "not one of the Job's trainers then"
        );
    }

    fn range(task_id: &str, first: u64, end: u64) -> ServedRange {
        ServedRange {
            task_id: task_id.into(),
            first,
            end,
            end_position: None,
        }
    }

    /// A trainer's report of received rows is checked whole before anything moves.
    #[tokio::test]
    async fn a_report_of_received_rows_names_what_is_wrong_with_it() {
        let tasks = Tasks::new(
            JobRegistry::default(),
            Topologies::default(),
            TaskSettings::default(),
        );
        let report = |executor: &str, ranges: Vec<ServedRange>| ReportReceivedRequest {
            job: "j".into(),
            trainer_id: "trainer-0".into(),
            executor_id: executor.into(),
            ranges,
        };
        let refused = |request| async {
            let status = (tasks.report_received(Request::new(request)).await).expect_err("refused");
            (status.code(), status.message().to_owned())
        };
        let (code, message) = refused(report("", vec![])).await;
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(message.contains("executor_id"), "{message}");
        let (code, message) =
            refused(report("de-0", vec![range("t", 0, 5), range("", 5, 9)])).await;
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(message.contains("ranges[1].task_id"), "{message}");
        let (code, message) = refused(report("de-0", vec![range("t", 9, 5)])).await;
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(
            message.contains("ranges[0]") && message.contains("before"),
            "{message}"
        );
        let (code, message) = refused(report("de-0", vec![range("t", 0, 5)])).await;
        assert_eq!(code, tonic::Code::NotFound, "{message}");
    }
}
