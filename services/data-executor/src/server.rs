//! The dataset server (Primus §5.2): streams minibatches to trainers, each from the serving
//! buffer Algorithm 2 picks, encoded as Arrow IPC (jagged, or IKJT when asked), and pauses
//! for the master's checkpoint barrier (a marker on every stream, then nothing until resumed).
//! Membership changes end streams cleanly: a stopping executor sends `leaving` on each (its
//! unserved rows go back to the queue), and a leaving trainer's streams end once it asks.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use primus_batch::ipc;
use primus_proto::v1::dataset_service_server::DatasetService;
use primus_proto::v1::{
    EndMinibatchesRequest, EndMinibatchesResponse, Minibatch, MinibatchRequest, PauseRequest,
    PauseResponse, ResumeRequest, ResumeResponse, YieldTaskRequest, YieldTaskResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::barrier::BarrierError;
use crate::buffer::Served;
use crate::executor::Executor;

pub(crate) struct DatasetServer {
    pub executor: Arc<Executor>,
}

/// Minibatches encoded ahead of the trainer's reads, per stream.
const PREFETCH: usize = 2;

/// What a stream sends next.
enum Next {
    Batch(Box<Served>),
    /// The marker of the checkpoint the executor paused for.
    Barrier(u64),
    /// No more data from here: the stream ends cleanly.
    End,
    /// The executor is stopping: a `leaving` message, then the stream ends.
    Leaving,
}

impl DatasetServer {
    /// The next minibatch or barrier marker for `trainer`. `marked` is the last checkpoint
    /// whose marker this stream sent: a paused stream sends it once and then waits for the
    /// resume.
    async fn next(
        executor: &Executor,
        trainer: &str,
        rows: usize,
        marked: &mut u64,
    ) -> Result<Next, Status> {
        let mut changes = executor.barrier.subscribe();
        let mut departures = executor.departures();
        loop {
            if departures.borrow_and_update().contains(trainer) {
                return Ok(Next::End);
            }
            if executor.shutdown.is_triggered() {
                // Nothing more leaves the buffers: what is unserved goes back to the queue
                // at the served offsets this executor reports before it exits.
                return Ok(match executor.drained() {
                    true => Next::End,
                    false => Next::Leaving,
                });
            }
            let popped = executor
                .barrier
                .unless_paused(|| executor.buffers.try_pop(rows));
            match popped {
                Ok(Some(served)) => return Ok(Next::Batch(Box::new(served))),
                Err(id) if *marked != id => {
                    *marked = id;
                    return Ok(Next::Barrier(id));
                }
                _ => {}
            }
            let paused = popped.is_err();
            if !paused && executor.drained() {
                return Ok(Next::End);
            }
            tokio::select! {
                _ = executor.buffers.wait_for_rows(), if !paused => {}
                _ = changes.changed() => {}
                _ = departures.changed() => {}
                _ = executor.shutdown.wait() => {}
            }
        }
    }
}

fn encode(executor: &Executor, served: Served, grouped: bool) -> Result<Minibatch, Status> {
    let rows = served.batch.rows();
    let groups = executor.pipeline.groups();
    let batch = if grouped && !groups.is_empty() {
        served
            .batch
            .grouped(groups)
            .map_err(|e| Status::internal(format!("grouping a minibatch: {e}")))?
    } else {
        served.batch
    };
    let arrow_ipc =
        ipc::encode(&batch).map_err(|e| Status::internal(format!("encoding a minibatch: {e}")))?;
    Ok(Minibatch {
        source_kind: served.kind as i32,
        source: served.source,
        rows: rows as u32,
        arrow_ipc,
        trace_context: served.trace,
        barrier: 0,
        leaving: false,
    })
}

fn barrier_marker(id: u64) -> Minibatch {
    Minibatch {
        barrier: id,
        ..Minibatch::default()
    }
}

fn leaving_marker() -> Minibatch {
    Minibatch {
        leaving: true,
        ..Minibatch::default()
    }
}

fn barrier_status(e: BarrierError) -> Status {
    Status::failed_precondition(e.to_string())
}

#[tonic::async_trait]
impl DatasetService for DatasetServer {
    type StreamMinibatchesStream = ReceiverStream<Result<Minibatch, Status>>;

    async fn stream_minibatches(
        &self,
        request: Request<MinibatchRequest>,
    ) -> Result<Response<Self::StreamMinibatchesStream>, Status> {
        let request = request.into_inner();
        let executor = self.executor.clone();
        executor.check_job(&request.job)?;
        if request.batch_size == 0 {
            return Err(Status::invalid_argument("batch_size: must be at least 1"));
        }
        let (tx, rx) = mpsc::channel(PREFETCH);
        // A trainer started again under a departed id is served again.
        executor.rejoin(&request.trainer_id);
        let open = executor.open_stream();
        tokio::spawn(async move {
            // Reserve the slot first: rows leave the buffer only when they can be sent.
            let mut marked = 0;
            let trainer = request.trainer_id.as_str();
            while let Ok(permit) = tx.reserve().await {
                let rows = request.batch_size as usize;
                let served = match Self::next(&executor, trainer, rows, &mut marked).await {
                    Ok(Next::Batch(served)) => served,
                    Ok(Next::Barrier(id)) => {
                        permit.send(Ok(barrier_marker(id)));
                        continue;
                    }
                    Ok(Next::End) => break,
                    Ok(Next::Leaving) => {
                        permit.send(Ok(leaving_marker()));
                        break;
                    }
                    Err(status) => {
                        permit.send(Err(status));
                        break;
                    }
                };
                let rows = served.batch.rows() as u64;
                let message = encode(&executor, *served, request.grouped);
                let failed = message.is_err();
                permit.send(message);
                executor.rows_served.fetch_add(rows, Ordering::AcqRel);
                if failed {
                    break;
                }
            }
            drop(open);
            tracing::info!(%trainer, "minibatch stream ended");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn pause(
        &self,
        request: Request<PauseRequest>,
    ) -> Result<Response<PauseResponse>, Status> {
        let request = request.into_inner();
        let executor = &self.executor;
        executor.check_job(&request.job)?;
        if request.checkpoint_id == 0 {
            return Err(Status::invalid_argument(
                "checkpoint_id: must be at least 1",
            ));
        }
        let generation = executor
            .barrier
            .pause(request.checkpoint_id)
            .map_err(barrier_status)?;
        let timeout = Duration::from_millis(request.timeout_ms.max(1000));
        let expiring = executor.clone();
        tokio::spawn(async move { expiring.barrier.expire(generation, timeout).await });
        tracing::info!(
            checkpoint = request.checkpoint_id,
            "paused for a checkpoint"
        );
        let (served_offsets, stream_positions) = executor.served_offsets();
        Ok(Response::new(PauseResponse {
            served_offsets,
            stream_positions,
        }))
    }

    async fn resume(
        &self,
        request: Request<ResumeRequest>,
    ) -> Result<Response<ResumeResponse>, Status> {
        let request = request.into_inner();
        self.executor.check_job(&request.job)?;
        self.executor
            .barrier
            .resume(request.checkpoint_id)
            .map_err(barrier_status)?;
        tracing::info!(
            checkpoint = request.checkpoint_id,
            "resumed after a checkpoint"
        );
        Ok(Response::new(ResumeResponse {}))
    }

    async fn end_minibatches(
        &self,
        request: Request<EndMinibatchesRequest>,
    ) -> Result<Response<EndMinibatchesResponse>, Status> {
        let request = request.into_inner();
        self.executor.check_job(&request.job)?;
        self.executor.depart(&request.trainer_id);
        tracing::info!(trainer = %request.trainer_id, "trainer leaving: its streams end");
        Ok(Response::new(EndMinibatchesResponse {}))
    }

    async fn yield_task(
        &self,
        request: Request<YieldTaskRequest>,
    ) -> Result<Response<YieldTaskResponse>, Status> {
        let request = request.into_inner();
        self.executor.check_job(&request.job)?;
        let served_offset = self.executor.yield_task(&request.task_id)?;
        tracing::info!(task = %request.task_id, served_offset, "task taken back by the master");
        Ok(Response::new(YieldTaskResponse { served_offset }))
    }
}
