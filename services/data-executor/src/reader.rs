//! The trainer's side of the dataset server: one minibatch stream per data executor of the
//! job, merged, each minibatch decoded from Arrow IPC.

use futures::stream::{BoxStream, SelectAll};
use futures::{Stream, StreamExt};
use primus_batch::Minibatch;
use primus_proto::v1::dataset_service_client::DatasetServiceClient;
use primus_proto::v1::topology_service_client::TopologyServiceClient;
use primus_proto::v1::{GetTopologyRequest, MinibatchRequest, Role, SourceKind};
use primus_telemetry::propagation::TraceCarrier;

#[derive(Debug, thiserror::Error)]
pub enum ReaderError {
    #[error("connecting to {addr}: {message}")]
    Connect { addr: String, message: String },
    #[error("{addr}: {status}")]
    Status { addr: String, status: tonic::Status },
    #[error("minibatch from {addr}: {source}")]
    Decode {
        addr: String,
        source: primus_batch::BatchError,
    },
}

/// A decoded minibatch and where it came from.
pub struct ReceivedBatch {
    pub executor: String,
    pub source: String,
    pub kind: SourceKind,
    pub batch: Minibatch,
    /// The trace of the data task that read it (see `Minibatch.trace_context`).
    pub trace: TraceCarrier,
}

/// What a trainer asks every data executor for.
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    pub job: String,
    pub trainer_id: String,
    pub batch_size: u32,
    /// Ask for RecD dedup groups as IKJT.
    pub grouped: bool,
}

/// gRPC addresses of the job's data executors, from the master's topology.
pub async fn data_executors(master_addr: &str, job: &str) -> Result<Vec<String>, ReaderError> {
    let connect_error = |e: tonic::transport::Error| ReaderError::Connect {
        addr: master_addr.to_owned(),
        message: e.to_string(),
    };
    let mut client = TopologyServiceClient::connect(format!("http://{master_addr}"))
        .await
        .map_err(connect_error)?;
    let topology = client
        .get_topology(GetTopologyRequest {
            job: job.to_owned(),
        })
        .await
        .map_err(|status| ReaderError::Status {
            addr: master_addr.to_owned(),
            status,
        })?
        .into_inner();
    Ok(topology
        .endpoints
        .into_iter()
        .filter(|e| e.role == Role::DataExecutor as i32)
        .map(|e| e.grpc_addr)
        .collect())
}

type Batches = BoxStream<'static, Result<ReceivedBatch, ReaderError>>;

async fn open_one(addr: String, options: ReaderOptions) -> Result<Batches, ReaderError> {
    let mut client = DatasetServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| ReaderError::Connect {
            addr: addr.clone(),
            message: e.to_string(),
        })?
        .max_decoding_message_size(usize::MAX);
    let request = MinibatchRequest {
        job: options.job,
        trainer_id: options.trainer_id,
        batch_size: options.batch_size,
        grouped: options.grouped,
    };
    let stream = client
        .stream_minibatches(request)
        .await
        .map_err(|status| ReaderError::Status {
            addr: addr.clone(),
            status,
        })?
        .into_inner();
    Ok(stream
        .map(move |item| {
            let message = item.map_err(|status| ReaderError::Status {
                addr: addr.clone(),
                status,
            })?;
            let batch = primus_batch::ipc::decode(&message.arrow_ipc).map_err(|source| {
                ReaderError::Decode {
                    addr: addr.clone(),
                    source,
                }
            })?;
            Ok(ReceivedBatch {
                executor: addr.clone(),
                kind: SourceKind::try_from(message.source_kind).unwrap_or(SourceKind::Unspecified),
                source: message.source,
                batch,
                trace: message.trace_context,
            })
        })
        .boxed())
}

/// Minibatches from every executor in `addrs`, in arrival order; ends when all streams end.
pub async fn read(
    addrs: &[String],
    options: &ReaderOptions,
) -> Result<impl Stream<Item = Result<ReceivedBatch, ReaderError>> + use<>, ReaderError> {
    let mut merged: SelectAll<Batches> = SelectAll::new();
    for addr in addrs {
        merged.push(open_one(addr.clone(), options.clone()).await?);
    }
    Ok(merged)
}
