//! The trainer's side of the dataset server: one minibatch stream per data executor of the
//! job, merged, each minibatch decoded from Arrow IPC, and checkpoint barriers aligned: a
//! barrier is passed on once every stream still open has sent its marker, so everything
//! served before the executors paused comes before it. A stream that breaks because its
//! executor died is opened again at the same address (where the backend restarts it) for
//! up to [`RECONNECT_FOR`]. What becomes of the dead executor's rows is the task queue's
//! and the stream's business: a file task resumes from its last reported offset, a stream's
//! buffered rows are lost (acked once buffered) and its unacked messages redelivered.

#![warn(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::stream::{self, BoxStream, SelectAll};
use futures::{Stream, StreamExt};
use primus_batch::Minibatch;
use primus_proto::v1::dataset_service_client::DatasetServiceClient;
use primus_proto::v1::topology_service_client::TopologyServiceClient;
use primus_proto::v1::{GetTopologyRequest, MinibatchRequest, Role, SourceKind};
use primus_telemetry::propagation::TraceCarrier;

/// Why minibatches could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReaderError {
    /// A data executor cannot be reached.
    #[error("connecting to {addr}: {message}")]
    Connect {
        /// Its address.
        addr: String,
        /// Why.
        message: String,
    },
    /// A data executor's stream failed.
    #[error("{addr}: {status}")]
    Status {
        /// Its address.
        addr: String,
        /// What it said.
        status: tonic::Status,
    },
    /// A minibatch does not decode.
    #[error("minibatch from {addr}: {source}")]
    Decode {
        /// The executor that sent it.
        addr: String,
        /// What is wrong with it.
        source: primus_batch::BatchError,
    },
}

/// A decoded minibatch and where it came from.
pub struct ReceivedBatch {
    /// The data executor that served it.
    pub executor: String,
    /// The source its rows came from.
    pub source: String,
    /// Batch (Parquet) or stream.
    pub kind: SourceKind,
    /// The minibatch.
    pub batch: Minibatch,
    /// The trace of the data task that read it (see `Minibatch.trace_context`).
    pub trace: TraceCarrier,
}

/// What the merged streams yield.
pub enum Received {
    /// A minibatch.
    Batch(Box<ReceivedBatch>),
    /// Every minibatch served before the data executors paused for this checkpoint has
    /// been yielded; nothing more comes until they resume.
    Barrier(u64),
}

/// What a trainer asks every data executor for.
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    /// The Job read.
    pub job: String,
    /// The reading trainer's id.
    pub trainer_id: String,
    /// Samples per minibatch.
    pub batch_size: u32,
    /// Ask for RecD dedup groups as IKJT.
    pub grouped: bool,
}

/// gRPC addresses of the job's data executors, from the master's topology.
pub async fn data_executors(master_addr: &str, job: &str) -> Result<Vec<String>, ReaderError> {
    let connect_error = |e: tonic::transport::Error| ReaderError::Connect {
        addr: master_addr.to_owned(),
        message: primus_telemetry::error_chain(&e),
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

/// One executor stream's items, tagged with the stream's index; `Ended` follows its last.
enum Tagged {
    Item(usize, Box<Result<Item, ReaderError>>),
    Ended(usize),
}

enum Item {
    Batch(Box<ReceivedBatch>),
    Marker(u64),
}

type Items = BoxStream<'static, Result<Item, ReaderError>>;

async fn open_one(addr: String, options: ReaderOptions) -> Result<Items, ReaderError> {
    let mut client = DatasetServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| ReaderError::Connect {
            addr: addr.clone(),
            message: primus_telemetry::error_chain(&e),
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
            if message.barrier != 0 {
                return Ok(Item::Marker(message.barrier));
            }
            let batch = primus_batch::ipc::decode(&message.arrow_ipc).map_err(|source| {
                ReaderError::Decode {
                    addr: addr.clone(),
                    source,
                }
            })?;
            Ok(Item::Batch(Box::new(ReceivedBatch {
                executor: addr.clone(),
                kind: SourceKind::try_from(message.source_kind).unwrap_or(SourceKind::Unspecified),
                source: message.source,
                batch,
                trace: message.trace_context,
            })))
        })
        .boxed())
}

/// How long a broken executor stream is retried before the reader gives up.
pub const RECONNECT_FOR: Duration = Duration::from_secs(60);
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// Whether `status` means the connection broke (the executor died), not that it refused.
fn connection_lost(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    )
}

struct Reconnecting {
    addr: String,
    options: ReaderOptions,
    items: Option<Items>,
    failed: bool,
}

/// `items` of the executor at `addr`, opened again whenever its connection is lost.
fn reconnecting(addr: String, options: ReaderOptions, items: Items) -> Items {
    let state = Reconnecting {
        addr,
        options,
        items: Some(items),
        failed: false,
    };
    stream::unfold(state, |mut state| async move {
        loop {
            if state.failed {
                return None;
            }
            if let Some(items) = state.items.as_mut() {
                match items.next().await {
                    Some(Err(ReaderError::Status { status, .. })) if connection_lost(&status) => {
                        tracing::warn!(addr = %state.addr, %status, "data executor stream lost; reconnecting");
                        state.items = None;
                    }
                    Some(item) => return Some((item, state)),
                    None => return None,
                }
            }
            match reopen(&state.addr, &state.options).await {
                Ok(items) => state.items = Some(items),
                Err(e) => {
                    state.failed = true;
                    return Some((Err(e), state));
                }
            }
        }
    })
    .boxed()
}

/// Opens the stream of `addr` again, retrying for [`RECONNECT_FOR`].
async fn reopen(addr: &str, options: &ReaderOptions) -> Result<Items, ReaderError> {
    let deadline = tokio::time::Instant::now() + RECONNECT_FOR;
    loop {
        match open_one(addr.to_owned(), options.clone()).await {
            Ok(items) => return Ok(items),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(RECONNECT_PAUSE).await,
        }
    }
}

/// Which streams have sent which checkpoint's marker, and which have ended.
struct Alignment {
    streams: usize,
    ended: BTreeSet<usize>,
    marked: BTreeMap<u64, BTreeSet<usize>>,
}

impl Alignment {
    /// The checkpoints whose marker every open stream has now sent.
    fn complete(&mut self) -> Vec<u64> {
        let ended = &self.ended;
        let open = self.streams - ended.len();
        let done: Vec<u64> = self
            .marked
            .iter()
            .filter(|(_, streams)| streams.iter().filter(|i| !ended.contains(i)).count() >= open)
            .map(|(id, _)| *id)
            .collect();
        for id in &done {
            self.marked.remove(id);
        }
        done
    }

    fn take(&mut self, tagged: Tagged) -> Vec<Result<Received, ReaderError>> {
        let tagged = match tagged {
            Tagged::Item(stream, item) => Ok((stream, *item)),
            Tagged::Ended(stream) => Err(stream),
        };
        match tagged {
            Ok((_, Ok(Item::Batch(batch)))) => vec![Ok(Received::Batch(batch))],
            Ok((_, Err(e))) => vec![Err(e)],
            Ok((stream, Ok(Item::Marker(id)))) => {
                self.marked.entry(id).or_default().insert(stream);
                self.complete()
                    .into_iter()
                    .map(|id| Ok(Received::Barrier(id)))
                    .collect()
            }
            Err(stream) => {
                self.ended.insert(stream);
                self.complete()
                    .into_iter()
                    .map(|id| Ok(Received::Barrier(id)))
                    .collect()
            }
        }
    }
}

/// Minibatches from every executor in `addrs`, in arrival order, and the checkpoint
/// barriers once aligned; ends when all streams end.
pub async fn read(
    addrs: &[String],
    options: &ReaderOptions,
) -> Result<impl Stream<Item = Result<Received, ReaderError>> + use<>, ReaderError> {
    let mut merged: SelectAll<BoxStream<'static, Tagged>> = SelectAll::new();
    for (index, addr) in addrs.iter().enumerate() {
        let items = open_one(addr.clone(), options.clone()).await?;
        let items = reconnecting(addr.clone(), options.clone(), items);
        let tagged = items
            .map(move |item| Tagged::Item(index, Box::new(item)))
            .chain(stream::once(async move { Tagged::Ended(index) }));
        merged.push(tagged.boxed());
    }
    let mut alignment = Alignment {
        streams: addrs.len(),
        ended: BTreeSet::new(),
        marked: BTreeMap::new(),
    };
    Ok(merged.flat_map(move |tagged| stream::iter(alignment.take(tagged))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn barriers(out: Vec<Result<Received, ReaderError>>) -> Vec<u64> {
        out.into_iter()
            .map(|r| match r {
                Ok(Received::Barrier(id)) => id,
                _ => panic!("only barriers expected"),
            })
            .collect()
    }

    #[test]
    fn a_barrier_passes_once_every_open_stream_sent_its_marker() {
        let mut alignment = Alignment {
            streams: 3,
            ended: BTreeSet::new(),
            marked: BTreeMap::new(),
        };
        let marker = |stream, id| Tagged::Item(stream, Box::new(Ok(Item::Marker(id))));
        assert!(barriers(alignment.take(marker(0, 5))).is_empty());
        assert!(barriers(alignment.take(marker(1, 5))).is_empty());
        // The last stream ends instead of pausing (its data ran out): no longer awaited.
        assert_eq!(barriers(alignment.take(Tagged::Ended(2))), vec![5]);
        assert!(barriers(alignment.take(marker(0, 6))).is_empty());
        assert_eq!(barriers(alignment.take(marker(1, 6))), vec![6]);
    }
}
