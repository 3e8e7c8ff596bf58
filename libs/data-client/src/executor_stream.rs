//! One data executor's minibatch stream: opened with this trainer's identity, decoded into
//! minibatches, markers and the executor's leaving, and, when the connection breaks
//! because the executor died, opened again at the same address after the trainer reported
//! the rows it received on it.

use std::collections::VecDeque;
use std::time::Duration;

use crate::{RECONNECT_FOR, ReaderError, ReaderOptions, Receipt, ReceivedBatch};
use futures::StreamExt;
use futures::channel::mpsc::unbounded;
use futures::stream::{self, BoxStream};
use primus_proto::v1::dataset_service_client::DatasetServiceClient;
use primus_proto::v1::minibatch_stream_request::Kind;
use primus_proto::v1::task_service_client::TaskServiceClient;
use primus_proto::v1::{
    MinibatchRequest, MinibatchStreamRequest, ReportReceivedRequest, ServedRange, SourceKind,
};

pub(crate) enum Item {
    Batch(Box<ReceivedBatch>),
    Marker(u64),
    /// The executor is leaving the job; its stream ends next.
    Leaving,
}

pub(crate) type Items = BoxStream<'static, Result<Item, ReaderError>>;

/// An opened stream: the executor's id (from the stream's header) and its items.
pub(crate) type Opened = (String, Items);

pub(crate) async fn open_one(addr: String, options: ReaderOptions) -> Result<Opened, ReaderError> {
    let failed = |message: String| ReaderError::Connect {
        addr: addr.clone(),
        message,
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| failed(e.to_string()))?
        .max_frame_size(primus_proto::MAX_FRAME_SIZE)
        .connect()
        .await
        .map_err(|e| failed(primus_telemetry::error_chain(&e)))?;
    let mut client = DatasetServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let open = MinibatchRequest {
        job: options.job,
        trainer_id: options.trainer_id,
        batch_size: options.batch_size,
        grouped: options.grouped,
    };
    let (consumed, requests) = unbounded();
    let first = MinibatchStreamRequest {
        kind: Some(Kind::Open(open)),
    };
    let requests = stream::once(async move { first }).chain(requests);
    let response = client
        .stream_minibatches(requests)
        .await
        .map_err(|status| ReaderError::Status {
            addr: addr.clone(),
            status,
        })?;
    let executor_id = (response.metadata().get(primus_proto::EXECUTOR_ID_HEADER))
        .and_then(|id| id.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let items = response
        .into_inner()
        .map(move |item| {
            let message = item.map_err(|status| ReaderError::Status {
                addr: addr.clone(),
                status,
            })?;
            if message.leaving {
                return Ok(Item::Leaving);
            }
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
                receipt: Receipt {
                    sequence: message.sequence,
                    stream: Some(consumed.clone()),
                    minibatch: identity(&message.served),
                },
                served: message.served,
            })))
        })
        .boxed();
    Ok((executor_id, items))
}

/// A hash of `served`'s task rows (0 when there are none; never 0 otherwise).
pub(crate) fn identity(served: &[ServedRange]) -> u64 {
    if served.is_empty() {
        return 0;
    }
    let mut bytes = Vec::new();
    for range in served {
        bytes.extend_from_slice(range.task_id.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(&range.first.to_le_bytes());
        bytes.extend_from_slice(&range.end.to_le_bytes());
    }
    primus_batch::hash::hash_bytes(&bytes).max(1)
}

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
    received: ReceivedRows,
}

/// How long the task rows received on a stream are remembered: the executor reports what
/// its trainers confirmed every progress interval (200 ms by default), and a trainer
/// confirms a minibatch within a step or two, so older rows are in the executor's reports.
const RECEIVED_KEPT_FOR: Duration = Duration::from_secs(60);

/// The task rows received on one executor stream lately, to report if it breaks.
struct ReceivedRows {
    executor_id: String,
    ranges: VecDeque<(tokio::time::Instant, ServedRange)>,
}

impl ReceivedRows {
    fn new(executor_id: String) -> Self {
        Self {
            executor_id,
            ranges: VecDeque::new(),
        }
    }

    fn record(&mut self, batch: &ReceivedBatch) {
        let now = tokio::time::Instant::now();
        for range in &batch.served {
            match self.ranges.back_mut() {
                Some((at, last)) if last.task_id == range.task_id && last.end == range.first => {
                    (*at, last.end, last.end_position) = (now, range.end, range.end_position);
                }
                _ => self.ranges.push_back((now, range.clone())),
            }
        }
        while (self.ranges.front()).is_some_and(|(at, _)| now - *at > RECEIVED_KEPT_FOR) {
            self.ranges.pop_front();
        }
    }

    /// Tells the master the rows received from the executor whose stream broke (none,
    /// too: the master waits for every trainer's report before it hands the executor's
    /// tasks on); a master that cannot be told leaves them to the executor's own reports
    /// (they may then be served again).
    async fn report(&mut self, options: &ReaderOptions) {
        let ranges: Vec<ServedRange> = self.ranges.drain(..).map(|(_, r)| r).collect();
        if options.master_addr.is_empty() || self.executor_id.is_empty() {
            return;
        }
        let request = ReportReceivedRequest {
            job: options.job.clone(),
            trainer_id: options.trainer_id.clone(),
            executor_id: self.executor_id.clone(),
            ranges,
        };
        let executor = request.executor_id.clone();
        let url = format!("http://{}", options.master_addr);
        let reported = tokio::time::timeout(REPORT_TIMEOUT, async {
            let mut client = TaskServiceClient::connect(url)
                .await
                .map_err(|e| primus_telemetry::error_chain(&e))?;
            (client.report_received(request).await)
                .map(|r| r.into_inner().tasks_moved)
                .map_err(|status| status.to_string())
        })
        .await
        .unwrap_or_else(|_| Err("timed out".into()));
        match reported {
            Ok(tasks) => {
                tracing::info!(%executor, tasks, "rows received from a dead data executor reported")
            }
            Err(e) => {
                tracing::warn!(%executor, error = %e, "reporting the rows received from a dead data executor; they may be served again")
            }
        }
    }
}

/// How long the master is given to take a report of received rows.
const REPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The items of the executor at `addr`, opened again whenever its connection is lost.
pub(crate) fn reconnecting(
    addr: String,
    options: ReaderOptions,
    (executor_id, items): Opened,
) -> Items {
    let state = Reconnecting {
        addr,
        options,
        items: Some(items),
        failed: false,
        received: ReceivedRows::new(executor_id),
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
                        state.received.report(&state.options).await;
                    }
                    Some(item) => {
                        if let Ok(Item::Batch(batch)) = &item {
                            state.received.record(batch);
                        }
                        return Some((item, state));
                    }
                    None => return None,
                }
            }
            match reopen(&state.addr, &state.options).await {
                Ok((executor_id, items)) => {
                    state.received = ReceivedRows::new(executor_id);
                    state.items = Some(items);
                }
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
pub(crate) async fn reopen(addr: &str, options: &ReaderOptions) -> Result<Opened, ReaderError> {
    let deadline = tokio::time::Instant::now() + RECONNECT_FOR;
    loop {
        match open_one(addr.to_owned(), options.clone()).await {
            Ok(opened) => return Ok(opened),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(RECONNECT_PAUSE).await,
        }
    }
}
