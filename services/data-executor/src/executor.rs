//! The executor's work loop: register with the master's task service, acquire tasks while
//! a runner slot is free, report served offsets and finish tasks once their rows are
//! served, and publish heartbeats and metrics on NATS.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use primus_batch::FeaturePipeline;
use primus_bus::Bus;
use primus_bus::jetstream::JetStream;
use primus_config::StorageSettings;
use primus_proto::v1::task_service_client::TaskServiceClient;
use primus_proto::v1::{
    AcquireTaskRequest, DataTask, Endpoint, FinishTaskRequest, Heartbeat, MetricsReport,
    RegisterExecutorRequest, ReportProgressRequest, Role, SourceKind, StreamPosition, StreamWork,
    data_task,
};
use primus_service::usage::{UsageSampler, resident_bytes};
use primus_service::{ExecutorIdentity, Shutdown};
use primus_spec::dataset::DatasetSpec;
use primus_spec::job::StreamLoading;
use tokio::sync::{Semaphore, watch};
use tonic::transport::Channel;
use tracing::Instrument;

use crate::barrier::Barrier;
use crate::buffer::Buffers;
use crate::held::Unconsumed;
use crate::join::{JoinGauges, JoinRunner};
use crate::ledger::{ReadEnd, TaskLedger};
use crate::rebalance::{Rebalancer, StreamPartition};
use crate::runner::BatchRunner;
use crate::stream::{Fetching, StreamGauges, StreamInputs, StreamRunner};
use primus_config::DataSettings;

/// How long a leaving executor waits for its streams to end before its final report.
const FINAL_REPORT_WAIT: Duration = Duration::from_secs(10);

/// State shared by the work loop, the runners and the dataset server.
pub(crate) struct Executor {
    pub identity: ExecutorIdentity,
    pub buffers: Buffers,
    pub pipeline: FeaturePipeline,
    storage: StorageSettings,
    settings: DataSettings,
    ledgers: Mutex<HashMap<String, Arc<TaskLedger>>>,
    running: AtomicU64,
    /// The master said every bounded task is done and no runner is left.
    exhausted: AtomicBool,
    pub rows_served: AtomicU64,
    /// Stream messages terminated because they did not decode or fit the schema.
    rejected_messages: AtomicU64,
    /// Backlog and lag of each stream source this executor consumes, by source name.
    streams: Mutex<HashMap<String, Arc<StreamGauges>>>,
    /// Counters of each join source this executor runs, by source name.
    joins: Mutex<HashMap<String, Arc<JoinGauges>>>,
    /// The Dataset's JetStream sources, which `rebalance` loading may help with.
    partitions: Vec<StreamPartition>,
    /// JetStream sources whose binding this executor holds now.
    held_streams: Mutex<std::collections::HashSet<String>>,
    /// The master's checkpoint pause.
    pub barrier: Barrier,
    /// Trainers that asked their streams to end (they are leaving the job).
    departed: watch::Sender<BTreeSet<String>>,
    /// Minibatch streams open now: the final offsets are reported once none is.
    open_streams: watch::Sender<usize>,
    /// Minibatches served and not consumed yet, or to be served again.
    pub unconsumed: Arc<Unconsumed>,
    pub shutdown: Shutdown,
}

/// Holds one minibatch stream open; dropped when the stream ends.
pub(crate) struct OpenStream(watch::Sender<usize>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.send_modify(|open| *open = open.saturating_sub(1));
    }
}

fn sources(dataset: &DatasetSpec) -> Vec<(String, SourceKind, f64)> {
    dataset
        .streams
        .iter()
        .flat_map(|s| &s.sources)
        .map(|source| {
            let kind = if source.is_stream() {
                SourceKind::Stream
            } else {
                SourceKind::Batch
            };
            (source.name.clone(), kind, source.weight)
        })
        .collect()
}

/// Every JetStream source of the Dataset with its buffer and durable consumer.
fn partitions(job: &str, dataset: &DatasetSpec, buffers: &Buffers) -> Vec<StreamPartition> {
    dataset
        .streams
        .iter()
        .flat_map(|s| &s.sources)
        .filter_map(|source| {
            let js = source.jetstream.as_ref()?;
            Some(StreamPartition {
                name: source.name.clone(),
                buffer: buffers.source_index(&source.name)?,
                work: StreamWork {
                    stream: js.stream.clone(),
                    subject: js.subject.clone(),
                    durable: source.durable(job),
                },
            })
        })
        .collect()
}

impl Executor {
    pub(crate) fn new(
        identity: ExecutorIdentity,
        dataset: &DatasetSpec,
        storage: StorageSettings,
        settings: DataSettings,
        shutdown: Shutdown,
    ) -> Self {
        let buffers = Buffers::new(sources(dataset), settings.buffer_rows);
        Self {
            partitions: partitions(&identity.job, dataset, &buffers),
            held_streams: Mutex::new(Default::default()),
            identity,
            buffers,
            pipeline: FeaturePipeline::new(&dataset.schema),
            storage,
            settings,
            ledgers: Mutex::new(HashMap::new()),
            running: AtomicU64::new(0),
            exhausted: AtomicBool::new(false),
            rows_served: AtomicU64::new(0),
            rejected_messages: AtomicU64::new(0),
            streams: Mutex::new(HashMap::new()),
            joins: Mutex::new(HashMap::new()),
            barrier: Barrier::default(),
            departed: watch::channel(BTreeSet::new()).0,
            open_streams: watch::channel(0).0,
            unconsumed: Arc::default(),
            shutdown,
        }
    }

    /// `trainer` is leaving: its streams end.
    pub(crate) fn depart(&self, trainer: &str) {
        self.departed
            .send_if_modified(|departed| departed.insert(trainer.to_owned()));
    }

    /// `trainer` opens a stream again (started again under its id): it is served.
    pub(crate) fn rejoin(&self, trainer: &str) {
        self.departed
            .send_if_modified(|departed| departed.remove(trainer));
    }

    pub(crate) fn departures(&self) -> watch::Receiver<BTreeSet<String>> {
        self.departed.subscribe()
    }

    /// Counts a minibatch stream as open until the returned guard drops.
    pub(crate) fn open_stream(&self) -> OpenStream {
        self.open_streams.send_modify(|open| *open += 1);
        OpenStream(self.open_streams.clone())
    }

    /// NOT_FOUND unless `job` is the job this executor serves.
    pub(crate) fn check_job(&self, job: &str) -> Result<(), tonic::Status> {
        if job == self.identity.job {
            return Ok(());
        }
        Err(tonic::Status::not_found(format!(
            "job {job:?}: this data executor serves job {:?}",
            self.identity.job
        )))
    }

    /// Gives task `task_id` back to the master: no more of it is read or served, its
    /// buffered rows are dropped; returns the offset served to, where another executor
    /// continues.
    pub(crate) fn yield_task(&self, task_id: &str) -> Result<u64, tonic::Status> {
        let ledger = self.ledgers().get(task_id).cloned().ok_or_else(|| {
            tonic::Status::not_found(format!("task_id: {task_id:?} is not held here"))
        })?;
        if ledger.finished().is_some() {
            return Err(tonic::Status::failed_precondition(format!(
                "task {task_id}: every row is served; it finishes here"
            )));
        }
        // First no chunk of it enters the buffers, then none leaves: the served offset is
        // final once both hold.
        ledger.take_back();
        self.buffers.discard_task(task_id);
        self.ledgers().remove(task_id);
        Ok(ledger.served())
    }

    /// Rows served of every task held, and the position of each stream binding read in
    /// order at those rows (task id -> each).
    pub(crate) fn served_offsets(&self) -> (HashMap<String, u64>, HashMap<String, StreamPosition>) {
        let mut offsets = HashMap::new();
        let mut positions = HashMap::new();
        for (id, ledger) in self.ledgers().iter() {
            offsets.insert(id.clone(), ledger.served());
            if let Some(position) = ledger.stream_position() {
                positions.insert(id.clone(), position);
            }
        }
        (offsets, positions)
    }

    /// No task is left: once the buffers drain, the streams end.
    pub(crate) fn exhaust(&self) {
        self.exhausted.store(true, Ordering::Release);
        self.buffers.wake();
        tracing::info!("the job's data is exhausted");
    }

    /// No more rows will arrive: the data is exhausted, the buffers are drained and every
    /// minibatch served is consumed (one a trainer still holds may come back).
    pub(crate) fn drained(&self) -> bool {
        self.exhausted.load(Ordering::Acquire)
            && self.buffers.is_empty()
            && self.unconsumed.is_empty()
    }

    fn stream_inputs<'a>(&'a self, jetstream: &'a JetStream) -> StreamInputs<'a> {
        StreamInputs {
            buffers: &self.buffers,
            pipeline: &self.pipeline,
            jetstream,
            fetching: Fetching::from_settings(&self.settings),
            rejected: &self.rejected_messages,
        }
    }

    fn stream_gauges(&self, source: &str) -> Arc<StreamGauges> {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.entry(source.to_owned()).or_default().clone()
    }

    /// Where join sources spill waiting feature rows: `data.join_spill_dir`, else a
    /// directory of this executor's under the system's temporary directory.
    fn spill_dir(&self) -> std::path::PathBuf {
        match &self.settings.join_spill_dir {
            Some(dir) => dir.clone(),
            None => std::env::temp_dir().join(format!(
                "primus-join-{}-{}",
                self.identity.job, self.identity.executor_id
            )),
        }
    }

    fn join_gauges(&self, source: &str) -> Arc<JoinGauges> {
        let mut joins = self.joins.lock().unwrap_or_else(|p| p.into_inner());
        joins.entry(source.to_owned()).or_default().clone()
    }

    fn ledgers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TaskLedger>>> {
        self.ledgers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers, then runs tasks until the data is exhausted or `shutdown`.
    pub(crate) async fn work(self: Arc<Self>, grpc_addr: String, bus: Bus) -> anyhow::Result<()> {
        let shutdown = self.shutdown.clone();
        let mut client = match connect(&self.identity.master_addr, &shutdown).await {
            Ok(client) => client,
            // Stopped before the master could be reached: nothing to hand back.
            Err(_) if shutdown.is_triggered() => return Ok(()),
            Err(e) => return Err(e),
        };
        let registering = client.register_executor(RegisterExecutorRequest {
            job: self.identity.job.clone(),
            endpoint: Some(Endpoint {
                role: Role::DataExecutor as i32,
                id: self.identity.executor_id.clone(),
                grpc_addr,
            }),
        });
        // A restart's registration waits for the trainers to report on the lost process,
        // which a stalled trainer may hold up: a stop meanwhile has nothing to hand back.
        let registered = tokio::select! {
            registered = registering => registered.context("registering with the master")?,
            () = shutdown.wait() => return Ok(()),
        }
        .into_inner();
        let heartbeat = Duration::from_millis(registered.heartbeat_interval_ms.max(100));
        let beats = tokio::spawn(self.clone().heartbeats(bus.clone(), heartbeat));
        let reporter = tokio::spawn(self.clone().report_progress(client.clone()));
        let jetstream = bus.jetstream();
        let helper = (self.settings.stream_loading == StreamLoading::Rebalance)
            .then(|| tokio::spawn(self.clone().rebalance(jetstream.clone())));
        let result = self.acquire_tasks(&mut client, &shutdown, &jetstream).await;
        if result.is_ok() {
            // Keep reporting until the last served rows close their tasks.
            while !self.ledgers().is_empty() && !shutdown.is_triggered() {
                tokio::time::sleep(Duration::from_millis(self.settings.progress_interval_ms)).await;
            }
        }
        reporter.abort();
        if shutdown.is_triggered() {
            self.report_final(&mut client).await;
        }
        beats.abort();
        if let Some(helper) = helper {
            helper.abort();
        }
        result
    }

    /// `rebalance` loading: helps with other executors' partitions that are behind.
    async fn rebalance(self: Arc<Self>, jetstream: JetStream) {
        let rebalancer = Rebalancer {
            inputs: self.stream_inputs(&jetstream),
            partitions: self.partitions.clone(),
        };
        let holds = |source: &str| self.held_streams().contains(source);
        tokio::select! {
            _ = rebalancer.run(|source| self.stream_gauges(source), holds) => {}
            _ = self.shutdown.wait() => {}
        }
    }

    fn held_streams(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.held_streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn acquire_tasks(
        self: &Arc<Self>,
        client: &mut TaskServiceClient<Channel>,
        shutdown: &Shutdown,
        jetstream: &JetStream,
    ) -> anyhow::Result<()> {
        let slots = Arc::new(Semaphore::new(self.settings.runners.max(1)));
        let idle = Duration::from_millis(self.settings.idle_poll_ms.max(10));
        let mut requests = AcquireRequests::new();
        while !shutdown.is_triggered() {
            // Batch runners finish their task before freeing a slot: a stop does not wait.
            let slot = tokio::select! {
                slot = slots.clone().acquire_owned() => slot,
                _ = shutdown.wait() => break,
            };
            let Ok(slot) = slot else {
                break;
            };
            let request = AcquireTaskRequest {
                job: self.identity.job.clone(),
                executor_id: self.identity.executor_id.clone(),
                request_id: requests.next(),
            };
            let response = match client.acquire_task(request).await {
                Ok(response) => {
                    requests.answered();
                    response.into_inner()
                }
                Err(status) => {
                    tracing::warn!(%status, "acquiring a task");
                    drop(slot);
                    tokio::time::sleep(idle).await;
                    continue;
                }
            };
            match response.task {
                Some(task) => {
                    let (executor, jetstream) = (self.clone(), jetstream.clone());
                    self.running.fetch_add(1, Ordering::AcqRel);
                    tokio::spawn(async move {
                        executor.run_task(task, &jetstream).await;
                        executor.running.fetch_sub(1, Ordering::AcqRel);
                        drop(slot);
                    });
                }
                None if response.exhausted && self.running.load(Ordering::Acquire) == 0 => {
                    self.exhaust();
                    return Ok(());
                }
                None => {
                    drop(slot);
                    tokio::time::sleep(idle).await;
                }
            }
        }
        Ok(())
    }

    /// Runs one task in its own `data.task` span (the root of the task's trace: the
    /// trainer steps on its rows and their PS calls continue it).
    async fn run_task(&self, task: DataTask, jetstream: &JetStream) {
        let kind = match &task.work {
            Some(data_task::Work::Batch(_)) => "batch",
            Some(data_task::Work::Stream(_)) => "stream",
            Some(data_task::Work::Join(_)) => "join",
            None => "none",
        };
        let files = match &task.work {
            Some(data_task::Work::Batch(work)) => work.files.len(),
            _ => 0,
        };
        let span = tracing::info_span!(
            parent: None,
            "data.task",
            otel.name = %format!("data task {}", task.source),
            primus.job = %self.identity.job,
            primus.executor = %self.identity.executor_id,
            primus.task = %task.id,
            primus.source = %task.source,
            primus.task_kind = kind,
            primus.files = files,
            primus.start_offset = task.start_offset,
        );
        self.read_task(task, jetstream).instrument(span).await
    }

    /// The task's ledger: a stream binding read in order keeps its position in it.
    fn ledger_of(&self, task: &DataTask) -> TaskLedger {
        match &task.work {
            Some(data_task::Work::Stream(_)) if self.reads_streams_in_order() => {
                let start = task.stream_position.unwrap_or_default();
                TaskLedger::for_stream(task.id.clone(), task.start_offset, start)
            }
            _ => TaskLedger::new(task.id.clone(), task.start_offset),
        }
    }

    /// `forward` loading reads each binding in order from its position; `rebalance`
    /// loading shares a durable consumer with helpers.
    fn reads_streams_in_order(&self) -> bool {
        self.settings.stream_loading == StreamLoading::Forward
    }

    async fn read_task(&self, task: DataTask, jetstream: &JetStream) {
        let ledger = Arc::new(self.ledger_of(&task));
        self.ledgers().insert(task.id.clone(), ledger.clone());
        let source = self.buffers.source_index(&task.source);
        tracing::info!(task = %task.id, source = %task.source, offset = task.start_offset, "task started");
        match (&task.work, source) {
            (Some(data_task::Work::Batch(work)), Some(source)) => {
                let runner = BatchRunner {
                    buffers: &self.buffers,
                    pipeline: &self.pipeline,
                    storage: &self.storage,
                    read_batch_rows: self
                        .settings
                        .read_batch_rows
                        .clamp(1, self.buffers.capacity_rows()),
                    read_delay: Duration::from_millis(self.settings.read_delay_ms),
                    storage_retry: Duration::from_millis(self.settings.storage_retry_ms),
                };
                runner.run(source, work, task.start_offset, &ledger).await;
            }
            (_, None) => ledger.finish_reading(ReadEnd::Failed {
                rows: task.start_offset,
                error: format!(
                    "source {:?} is not in the Dataset this executor was given",
                    task.source
                ),
            }),
            (Some(data_task::Work::Stream(work)), Some(source)) => {
                self.held_streams().insert(task.source.clone());
                let runner = StreamRunner {
                    inputs: self.stream_inputs(jetstream),
                    gauges: &self.stream_gauges(&task.source),
                };
                let start = (task.start_offset, task.stream_position.unwrap_or_default());
                let read = async {
                    if self.reads_streams_in_order() {
                        runner.read_in_order(source, work, start, &ledger).await
                    } else {
                        runner
                            .run_shared(source, work, task.start_offset, &ledger)
                            .await
                    }
                };
                tokio::select! {
                    _ = read => {}
                    _ = self.shutdown.wait() => {}
                }
                self.held_streams().remove(&task.source);
            }
            (Some(data_task::Work::Join(work)), Some(source)) => {
                let runner = JoinRunner {
                    inputs: self.stream_inputs(jetstream),
                    spill_dir: self.spill_dir(),
                    gauges: &self.stream_gauges(&task.source),
                    join_gauges: &self.join_gauges(&task.source),
                };
                tokio::select! {
                    _ = runner.run(source, work, task.start_offset, &ledger) => {}
                    _ = self.shutdown.wait() => {}
                }
            }
            (None, Some(_)) => ledger.finish_reading(ReadEnd::Failed {
                rows: task.start_offset,
                error: format!("task {}: no work in it (neither batch nor stream)", task.id),
            }),
        }
    }

    /// Reports served offsets and closes tasks whose rows are all served.
    async fn report_progress(self: Arc<Self>, mut client: TaskServiceClient<Channel>) {
        let mut ticks = tokio::time::interval(Duration::from_millis(
            self.settings.progress_interval_ms.max(10),
        ));
        loop {
            ticks.tick().await;
            let ledgers: Vec<Arc<TaskLedger>> = self.ledgers().values().cloned().collect();
            for ledger in ledgers {
                if let Err(status) = self.report_one(&mut client, &ledger).await {
                    if status.code() == tonic::Code::FailedPrecondition {
                        // The master gave the task to someone else: our rows of it are stale.
                        tracing::warn!(task = %ledger.id, %status, "task taken back; dropping its buffered rows");
                        ledger.take_back();
                        self.buffers.discard_task(&ledger.id);
                        self.ledgers().remove(&ledger.id);
                    } else {
                        tracing::warn!(task = %ledger.id, %status, "reporting task progress");
                    }
                }
            }
        }
    }

    /// Leaving: once no stream is open (every served row is final), reports each task's
    /// served offset, so the master puts the rest back in the queue from there.
    async fn report_final(&self, client: &mut TaskServiceClient<Channel>) {
        let mut open = self.open_streams.subscribe();
        let closed = open.wait_for(|open| *open == 0);
        if tokio::time::timeout(FINAL_REPORT_WAIT, closed)
            .await
            .is_err()
        {
            tracing::warn!("minibatch streams still open; reporting the offsets served so far");
        }
        let ledgers: Vec<Arc<TaskLedger>> = self.ledgers().values().cloned().collect();
        for ledger in ledgers {
            if let Err(status) = self.report_one(client, &ledger).await {
                tracing::warn!(task = %ledger.id, %status, "reporting the final offset");
            }
        }
        tracing::info!("final offsets reported");
    }

    async fn report_one(
        &self,
        client: &mut TaskServiceClient<Channel>,
        ledger: &TaskLedger,
    ) -> Result<(), tonic::Status> {
        // Read before reporting, so a finish never precedes the offset it covers.
        let finished = ledger.finished();
        if let Some((offset, stream_position)) = ledger.progress_to_report() {
            client
                .report_progress(ReportProgressRequest {
                    job: self.identity.job.clone(),
                    executor_id: self.identity.executor_id.clone(),
                    task_id: ledger.id.clone(),
                    offset,
                    stream_position,
                })
                .await?;
            ledger.reported(offset);
        }
        if let Some(error) = finished {
            if error.is_empty() {
                tracing::info!(task = %ledger.id, "task done");
            } else {
                tracing::warn!(task = %ledger.id, %error, "task failed");
            }
            client
                .finish_task(FinishTaskRequest {
                    job: self.identity.job.clone(),
                    executor_id: self.identity.executor_id.clone(),
                    task_id: ledger.id.clone(),
                    error,
                })
                .await?;
            self.ledgers().remove(&ledger.id);
        }
        Ok(())
    }

    async fn heartbeats(self: Arc<Self>, bus: Bus, interval: Duration) {
        let id = &self.identity;
        let subjects = (
            bus.subjects()
                .heartbeat(&id.job, "data_executor", &id.executor_id),
            bus.subjects()
                .metrics(&id.job, "data_executor", &id.executor_id),
        );
        let (Ok(heartbeat_subject), Ok(metrics_subject)) = subjects else {
            return tracing::error!(job = %id.job, "job or executor id is not a valid subject token");
        };
        let endpoint = Endpoint {
            role: Role::DataExecutor as i32,
            id: id.executor_id.clone(),
            grpc_addr: String::new(),
        };
        let mut usage = UsageSampler::new();
        let mut ticks = tokio::time::interval(interval);
        let mut last_served = (std::time::Instant::now(), 0u64);
        loop {
            ticks.tick().await;
            let now_ms = primus_spec::time::unix_ms();
            let beat = Heartbeat {
                job: id.job.clone(),
                endpoint: Some(endpoint.clone()),
                unix_ms: now_ms,
                cpu_cores: usage.cpu_cores(),
                memory_bytes: resident_bytes(),
            };
            if let Err(e) = bus.publish(heartbeat_subject.clone(), &beat).await {
                tracing::warn!(error = %e, "publishing a heartbeat");
            }
            let served = self.rows_served.load(Ordering::Acquire);
            let elapsed = last_served.0.elapsed().as_secs_f64().max(1e-3);
            let fill = self.buffers.fill();
            // Trainers starve only when every buffer is empty: the fullest one counts.
            let capacity = self.buffers.capacity_rows().max(1) as f64;
            let fullest = fill.iter().map(|(_, rows)| *rows).max().unwrap_or(0);
            let mut gauges: HashMap<String, f64> = fill
                .into_iter()
                .map(|(source, rows)| (format!("buffer_rows.{source}"), rows as f64))
                .collect();
            gauges.insert("buffer_fill".into(), fullest as f64 / capacity);
            for (source, stream) in self
                .streams
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
            {
                gauges.insert(
                    format!("stream_pending_messages.{source}"),
                    stream.pending() as f64,
                );
                gauges.insert(
                    format!("stream_lag_seconds.{source}"),
                    stream.lag_seconds(now_ms),
                );
            }
            for (source, join) in self.joins.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                for (name, counter) in [
                    ("join_joined_rows", &join.joined_rows),
                    ("join_negative_rows", &join.negative_rows),
                    ("join_dropped_actions", &join.dropped_actions),
                    ("join_sampled_out_rows", &join.sampled_out_rows),
                    ("join_waiting_memory_rows", &join.waiting_memory_rows),
                    ("join_waiting_disk_rows", &join.waiting_disk_rows),
                ] {
                    gauges.insert(
                        format!("{name}.{source}"),
                        counter.load(Ordering::Relaxed) as f64,
                    );
                }
            }
            gauges.insert(
                "stream_rejected_messages".into(),
                self.rejected_messages.load(Ordering::Relaxed) as f64,
            );
            gauges.insert(
                "rows_served_per_second".into(),
                (served - last_served.1) as f64 / elapsed,
            );
            last_served = (std::time::Instant::now(), served);
            let report = MetricsReport {
                job: id.job.clone(),
                endpoint: Some(endpoint.clone()),
                unix_ms: now_ms,
                gauges,
                samples: served,
                ..MetricsReport::default()
            };
            if let Err(e) = bus.publish(metrics_subject.clone(), &report).await {
                tracing::warn!(error = %e, "publishing metrics");
            }
        }
    }
}

/// The master may still be starting: retry for a while.
async fn connect(addr: &str, shutdown: &Shutdown) -> anyhow::Result<TaskServiceClient<Channel>> {
    let url = format!("http://{addr}");
    let mut last = None;
    for _ in 0..40 {
        if shutdown.is_triggered() {
            break;
        }
        match TaskServiceClient::connect(url.clone()).await {
            Ok(client) => return Ok(client),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(anyhow::anyhow!(
        "cannot reach the master at {url}: {last:?}"
    ))
}

/// The ids of this process's task acquisitions: unique to the process, and the same for a
/// retry of a request that got no answer (the master may have handed it a task whose answer
/// was lost: the retry is given that task).
struct AcquireRequests {
    process: String,
    count: u64,
    answered: bool,
}

impl AcquireRequests {
    fn new() -> Self {
        Self {
            process: format!("{:x}-{}", primus_spec::time::unix_us(), std::process::id()),
            count: 0,
            answered: true,
        }
    }

    /// The id of the next request: a new one once the last was answered.
    fn next(&mut self) -> String {
        if self.answered {
            self.count += 1;
            self.answered = false;
        }
        format!("{}-{}", self.process, self.count)
    }

    fn answered(&mut self) {
        self.answered = true;
    }
}

#[cfg(test)]
mod tests {
    use super::AcquireRequests;

    #[test]
    fn a_request_without_an_answer_is_retried_with_its_id() {
        let mut requests = AcquireRequests::new();
        let first = requests.next();
        assert_eq!(requests.next(), first, "no answer: the same request again");
        requests.answered();
        let second = requests.next();
        assert_ne!(second, first);
        requests.answered();
        assert_ne!(requests.next(), second);
    }
}
