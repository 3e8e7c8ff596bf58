//! A minimal data executor for the master's tests: registers with the task service,
//! acquires batch tasks, reads each task's rows (the `id` column) through primus-storage,
//! reports its offset every `REPORT_EVERY` rows, finishes the task, and exits 0 once the
//! job's data is exhausted. It serves no minibatches: a trainer's stream stays open,
//! empty, until then (or until the trainer leaves) and ends cleanly at exit.
//! `PRIMUS_TASK_READER_DELAY_MS` slows each batch down so a test can kill it mid-task. The
//! real data executor (minibatches for trainers) is `primus-data-executor`.
//!
//! Its ledger, `rows-<executor>.txt` in its working folder, says what each attempt at a
//! task read and what the master acknowledged, a line each, written before the reader goes on:
//! `start <task> <offset>` (the offset the task was handed over at), `row <task> <offset>
//! <id>` (ids flushed before their offset is reported), `reported <task> <offset>` (once
//! the master accepted it) and `finished <task>` (once the master accepted the end).

use std::fmt::Write as _;
use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use primus_config::{DataExecutorSettings, NodeSettings, StorageSettings};
use primus_proto::v1::dataset_service_server::{DatasetService, DatasetServiceServer};
use primus_proto::v1::task_service_client::TaskServiceClient;
use primus_proto::v1::{
    AcquireTaskRequest, ConfirmedTotalsRequest, ConfirmedTotalsResponse, DataTask,
    EndMinibatchesRequest, EndMinibatchesResponse, Endpoint, FinishTaskRequest, Minibatch,
    MinibatchStreamRequest, PauseRequest, PauseResponse, RegisterExecutorRequest,
    ReportProgressRequest, ResumeRequest, ResumeResponse, Role, YieldTaskRequest,
    YieldTaskResponse, data_task, minibatch_stream_request,
};
use primus_service::ExecutorIdentity;
use primus_service::Shutdown;
use primus_storage::parquet::{ReadOptions, metadata, read};
use tonic::transport::Channel;

const REPORT_EVERY: u64 = 50;

/// Streams nothing and ends each stream when the reader shuts down or its trainer leaves.
struct NoMinibatches {
    shutdown: Shutdown,
    /// Named in each stream's header, as the real executor does.
    executor_id: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    /// Trainers that left.
    departed: tokio::sync::watch::Sender<Vec<String>>,
}

#[tonic::async_trait]
impl DatasetService for NoMinibatches {
    type StreamMinibatchesStream = BoxStream<'static, Result<Minibatch, tonic::Status>>;

    async fn stream_minibatches(
        &self,
        request: tonic::Request<tonic::Streaming<MinibatchStreamRequest>>,
    ) -> Result<tonic::Response<Self::StreamMinibatchesStream>, tonic::Status> {
        let shutdown = self.shutdown.clone();
        let opening = request.into_inner().message().await?;
        let Some(minibatch_stream_request::Kind::Open(open)) = opening.and_then(|m| m.kind) else {
            return Err(tonic::Status::invalid_argument(
                "the first message must be `open`",
            ));
        };
        let trainer = open.trainer_id;
        let mut departed = self.departed.subscribe();
        let ended = futures::stream::once(async move {
            tokio::select! {
                () = shutdown.wait() => {}
                _ = departed.wait_for(|left| left.contains(&trainer)) => {}
            }
        })
        .filter_map(|()| async { None });
        let mut response = tonic::Response::new(ended.boxed());
        (response.metadata_mut())
            .insert(primus_proto::EXECUTOR_ID_HEADER, self.executor_id.clone());
        Ok(response)
    }

    async fn end_minibatches(
        &self,
        request: tonic::Request<EndMinibatchesRequest>,
    ) -> Result<tonic::Response<EndMinibatchesResponse>, tonic::Status> {
        let trainer = request.into_inner().trainer_id;
        self.departed.send_modify(|left| left.push(trainer));
        Ok(tonic::Response::new(EndMinibatchesResponse {}))
    }

    async fn pause(
        &self,
        _request: tonic::Request<PauseRequest>,
    ) -> Result<tonic::Response<PauseResponse>, tonic::Status> {
        Err(no_barrier())
    }

    async fn resume(
        &self,
        _request: tonic::Request<ResumeRequest>,
    ) -> Result<tonic::Response<ResumeResponse>, tonic::Status> {
        Err(no_barrier())
    }

    async fn confirmed_totals(
        &self,
        _request: tonic::Request<ConfirmedTotalsRequest>,
    ) -> Result<tonic::Response<ConfirmedTotalsResponse>, tonic::Status> {
        // No minibatch served, none confirmed.
        Ok(tonic::Response::new(ConfirmedTotalsResponse::default()))
    }

    async fn yield_task(
        &self,
        _request: tonic::Request<YieldTaskRequest>,
    ) -> Result<tonic::Response<YieldTaskResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(
            "the test task reader keeps the tasks it takes",
        ))
    }
}

/// Serving nothing, this executor has nothing to pause: its jobs take no checkpoints.
fn no_barrier() -> tonic::Status {
    tonic::Status::unimplemented(
        "the test task reader serves no minibatches: no checkpoint barrier",
    )
}

fn main() -> anyhow::Result<()> {
    primus_service::main(
        "task-reader",
        "Test data executor: reads its tasks' ids and records them",
        DataExecutorSettings::default(),
        |settings, shutdown| Box::pin(run(settings, shutdown)),
    )
}

/// Takes the real data executor's settings (the master writes those), uses the node part.
async fn run(settings: DataExecutorSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let data = &settings.data;
    let identity =
        ExecutorIdentity::resolve("data", &data.job, &data.executor_id, &data.master_addr)?;
    let master = format!("http://{}", identity.master_addr);
    #[expect(
        clippy::disallowed_methods,
        reason = "a test's knob for this stand-in executor, not a setting of a service"
    )]
    let delay = Duration::from_millis(
        std::env::var("PRIMUS_TASK_READER_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let grpc_addr = settings.server.grpc_addr.to_string();
    let executor_id = (identity.executor_id.parse())
        .with_context(|| format!("executor id {:?} as a header", identity.executor_id))?;
    let settings = NodeSettings {
        server: settings.server,
        nats: settings.nats,
        telemetry: settings.telemetry,
    };
    let node = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            primus_service::serve_nats_node(
                "task-reader",
                &settings,
                primus_service::Services::new().grpc(DatasetServiceServer::new(NoMinibatches {
                    shutdown: shutdown.clone(),
                    executor_id,
                    departed: tokio::sync::watch::channel(Vec::new()).0,
                })),
                shutdown,
            )
            .await
        })
    };
    let mut client = TaskServiceClient::connect(master).await?;
    client
        .register_executor(RegisterExecutorRequest {
            job: identity.job.clone(),
            endpoint: Some(Endpoint {
                role: Role::DataExecutor as i32,
                id: identity.executor_id.clone(),
                grpc_addr,
            }),
        })
        .await?;
    let mut ledger = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(format!("rows-{}.txt", identity.executor_id))?;
    while !shutdown.is_triggered() {
        let response = client
            .acquire_task(AcquireTaskRequest {
                job: identity.job.clone(),
                executor_id: identity.executor_id.clone(),
                ..AcquireTaskRequest::default()
            })
            .await?
            .into_inner();
        match response.task {
            Some(task) => {
                record(
                    &mut ledger,
                    &format!("start {} {}", task.id, task.start_offset),
                )?;
                let outcome = read_task(&mut client, &identity, &task, &mut ledger, delay).await;
                let completed = outcome.is_ok();
                client
                    .finish_task(FinishTaskRequest {
                        job: identity.job.clone(),
                        executor_id: identity.executor_id.clone(),
                        task_id: task.id.clone(),
                        error: outcome.err().map(|e| format!("{e:#}")).unwrap_or_default(),
                    })
                    .await?;
                if completed {
                    record(&mut ledger, &format!("finished {}", task.id))?;
                }
            }
            None if response.exhausted => break,
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    shutdown.trigger();
    node.await??;
    Ok(())
}

async fn read_task(
    client: &mut TaskServiceClient<Channel>,
    identity: &ExecutorIdentity,
    task: &DataTask,
    ledger: &mut std::fs::File,
    delay: Duration,
) -> anyhow::Result<()> {
    let Some(data_task::Work::Batch(work)) = &task.work else {
        anyhow::bail!("task {} is not a batch task", task.id);
    };
    let location = primus_storage::open(&work.dir, &StorageSettings::default())?;
    let mut offset = 0u64;
    let mut reported = task.start_offset;
    for file in &work.files {
        let path = location.path(&file.name);
        let meta = metadata(&location, &path).await?;
        let groups: Vec<usize> = (0..meta.num_row_groups())
            .filter(|&i| {
                let start = meta.row_group(i).column(0).byte_range().0;
                file.split_end == 0 || (file.split_start..file.split_end).contains(&start)
            })
            .collect();
        let (Some(first), Some(last)) = (groups.first(), groups.last()) else {
            continue;
        };
        let options = ReadOptions {
            columns: Some(vec!["id".into()]),
            row_groups: Some(*first..last + 1),
            batch_size: REPORT_EVERY as usize,
        };
        let mut batches = std::pin::pin!(read(&location, &path, &options).await?);
        while let Some(batch) = batches.try_next().await? {
            let ids = batch
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::UInt64Array>()
                .context("column `id` is not UInt64")?;
            let mut lines = String::new();
            for id in ids.values() {
                offset += 1;
                if offset > task.start_offset {
                    writeln!(lines, "row {} {offset} {id}", task.id)?;
                }
            }
            ledger.write_all(lines.as_bytes())?;
            if offset > reported {
                client
                    .report_progress(ReportProgressRequest {
                        job: identity.job.clone(),
                        executor_id: identity.executor_id.clone(),
                        task_id: task.id.clone(),
                        offset,
                        stream_position: None,
                    })
                    .await?;
                record(ledger, &format!("reported {} {offset}", task.id))?;
                reported = offset;
            }
            tokio::time::sleep(delay).await;
        }
    }
    Ok(())
}

/// Appends `line` to the ledger in one write, so a kill leaves no partial line.
fn record(ledger: &mut std::fs::File, line: &str) -> std::io::Result<()> {
    ledger.write_all(format!("{line}\n").as_bytes())
}
