//! The dataset server (Primus §5.2): streams minibatches to trainers, each from the serving
//! buffer Algorithm 2 picks, encoded as Arrow IPC (jagged, or IKJT when asked).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use primus_batch::ipc;
use primus_proto::v1::dataset_service_server::DatasetService;
use primus_proto::v1::{Minibatch, MinibatchRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::buffer::Served;
use crate::executor::Executor;

pub struct DatasetServer {
    pub executor: Arc<Executor>,
}

/// Minibatches encoded ahead of the trainer's reads, per stream.
const PREFETCH: usize = 2;

impl DatasetServer {
    /// The next minibatch; `Ok(None)` ends the stream cleanly (no more data from here).
    async fn next(executor: &Executor, rows: usize) -> Result<Option<Served>, Status> {
        loop {
            if let Some(served) = executor.buffers.try_pop(rows) {
                return Ok(Some(served));
            }
            if executor.drained() {
                return Ok(None);
            }
            if executor.shutdown.is_triggered() {
                // Stopping with nothing of ours unserved is a clean end; otherwise the
                // trainer must know that rows remain (their tasks go to another executor).
                return match executor.idle() {
                    true => Ok(None),
                    false => Err(Status::unavailable(
                        "data executor stopping; its unserved rows will be served by another",
                    )),
                };
            }
            executor.buffers.wait_for_rows().await;
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
    })
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
        if request.job != executor.identity.job {
            return Err(Status::not_found(format!(
                "job {:?}: this data executor serves job {:?}",
                request.job, executor.identity.job
            )));
        }
        if request.batch_size == 0 {
            return Err(Status::invalid_argument("batch_size: must be at least 1"));
        }
        let (tx, rx) = mpsc::channel(PREFETCH);
        tokio::spawn(async move {
            // Reserve the slot first: rows leave the buffer only when they can be sent.
            while let Ok(permit) = tx.reserve().await {
                let served = match Self::next(&executor, request.batch_size as usize).await {
                    Ok(Some(served)) => served,
                    Ok(None) => break,
                    Err(status) => {
                        permit.send(Err(status));
                        break;
                    }
                };
                let rows = served.batch.rows() as u64;
                let message = encode(&executor, served, request.grouped);
                let failed = message.is_err();
                permit.send(message);
                executor.rows_served.fetch_add(rows, Ordering::AcqRel);
                if failed {
                    break;
                }
            }
            tracing::info!(trainer = %request.trainer_id, "minibatch stream ended");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
