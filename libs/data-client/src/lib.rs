//! The trainer's side of the dataset server: one minibatch stream per data executor of the
//! job, merged, each minibatch decoded from Arrow IPC, and checkpoint barriers aligned: a
//! barrier is passed on once every stream still open has sent its marker, so everything
//! served before the executors paused comes before it. A stream that breaks because its
//! executor died is opened again at the same address (where the backend restarts it) for
//! up to [`RECONNECT_FOR`]. Before that, the trainer reports to the master the task rows
//! it received on the broken stream (`TaskService.ReportReceived`): it trains all of them,
//! and the dead executor's own reports lag what it served, so the tasks' offsets move on
//! through them and its successor serves none of them again.
//!
//! The set of executors may change while reading ([`Membership`]): a joining executor's
//! stream is merged in; a leaving one sends `leaving` and its stream ends without ending
//! the read (its unserved rows reach another executor through the task queue); and when
//! the trainer itself leaves, every executor is told to end its streams, and the read ends
//! once they have, so every minibatch sent to this trainer is one it receives.
//!
//! Each minibatch comes with a [`Receipt`]: the trainer confirms it once the minibatch's
//! gradients are pushed, and until then the executor holds it; if this trainer dies
//! first, the executor serves it again to whichever trainer asks next. When only the
//! connection broke, the executor serves what it held again on the reopened stream,
//! confirmations lost with the connection included: a minibatch this read yielded
//! before comes as [`Received::Again`], its receipt only, so it is not trained twice.

#![warn(missing_docs)]

mod executor_stream;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, SelectAll};
use futures::{FutureExt, Stream, StreamExt};
use primus_batch::{Minibatch, RecentIdentities};
use primus_proto::v1::dataset_service_client::DatasetServiceClient;
use primus_proto::v1::minibatch_stream_request::Kind;
use primus_proto::v1::topology_service_client::TopologyServiceClient;
use primus_proto::v1::{
    ConfirmedTotalsRequest, EndMinibatchesRequest, GetTopologyRequest, MinibatchStreamRequest,
    MinibatchesConsumed, Role, ServedRange, SourceKind,
};
use primus_telemetry::propagation::TraceCarrier;

use executor_stream::{Item, Items, open_one, reconnecting, reopen};

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
    /// Confirms the minibatch consumed to its executor.
    pub receipt: Receipt,
    /// The task rows it holds.
    served: Vec<ServedRange>,
}

/// A trainer's counters: steps, samples, and samples per source (Dataset source name).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct TrainerTotals {
    /// Steps taken.
    pub steps: u64,
    /// Samples trained.
    pub samples: u64,
    /// Samples trained per source, summing to `samples`.
    pub sources: BTreeMap<String, u64>,
}

/// A served minibatch's claim on its executor: [`Receipt::consumed`] once its gradients
/// are pushed. Dropped unconfirmed, the minibatch stays held by the executor, which
/// serves it again if this trainer's stream breaks (and counts it consumed if the
/// executor ends the stream itself).
#[derive(Debug)]
pub struct Receipt {
    sequence: u64,
    stream: Option<UnboundedSender<MinibatchStreamRequest>>,
    minibatch: u64,
}

impl Receipt {
    /// A receipt for a minibatch no executor served (benchmarks, tests): confirming it
    /// does nothing.
    pub fn none() -> Self {
        Self {
            sequence: 0,
            stream: None,
            minibatch: 0,
        }
    }

    /// The minibatch's identity: a hash of the task rows it holds, the same when it is
    /// served again after its trainer died; 0 for one that names no task rows. The PS
    /// applies a push of an identity once.
    pub fn minibatch(&self) -> u64 {
        self.minibatch
    }

    /// The minibatch is trained and its gradients pushed; `totals` are the trainer's,
    /// counting it and every minibatch confirmed before. Its stream may have ended
    /// meanwhile (then the executor already counted it consumed, or is gone).
    pub fn consumed(self, totals: &TrainerTotals) {
        if let Some(stream) = self.stream {
            let consumed = MinibatchesConsumed {
                sequences: vec![self.sequence],
                trainer_steps: totals.steps,
                trainer_samples: totals.samples,
                trainer_source_samples: (totals.sources.iter())
                    .map(|(source, n)| (source.clone(), *n))
                    .collect(),
            };
            let _ = stream.unbounded_send(MinibatchStreamRequest {
                kind: Some(Kind::Consumed(consumed)),
            });
        }
    }
}

/// What the merged streams yield.
pub enum Received {
    /// A minibatch.
    Batch(Box<ReceivedBatch>),
    /// A minibatch this read yielded before, served again: its stream broke before the
    /// executor read the confirmation (the executor lives on and serves what it held
    /// again). The trainer trains everything it is fed, in order, so this one is trained
    /// already: its receipt is confirmed, once what came before it is pushed, and it is
    /// neither trained nor counted twice.
    Again(Receipt),
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
    /// The master's gRPC address, told the rows received from an executor that died
    /// (empty: nobody is told).
    pub master_addr: String,
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

/// The highest totals trainer `trainer_id` confirmed to the executor at `addr`.
pub async fn confirmed_totals(
    addr: &str,
    job: &str,
    trainer_id: &str,
) -> Result<TrainerTotals, ReaderError> {
    let mut client = DatasetServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| ReaderError::Connect {
            addr: addr.to_owned(),
            message: primus_telemetry::error_chain(&e),
        })?;
    let request = ConfirmedTotalsRequest {
        job: job.to_owned(),
        trainer_id: trainer_id.to_owned(),
    };
    let totals = (client.confirmed_totals(request).await)
        .map_err(|status| ReaderError::Status {
            addr: addr.to_owned(),
            status,
        })?
        .into_inner();
    Ok(TrainerTotals {
        steps: totals.steps,
        samples: totals.samples,
        sources: totals.source_samples.into_iter().collect(),
    })
}

/// One executor stream's items, tagged with the stream's index; `Ended` follows its last.
enum Tagged {
    Item(usize, Box<Result<Item, ReaderError>>),
    Ended(usize),
}

/// How long a broken executor stream is retried before the reader gives up.
pub const RECONNECT_FOR: Duration = Duration::from_secs(60);

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
            // Its stream ends right after; a leaving executor awaits no barrier.
            Ok((stream, Ok(Item::Leaving))) => self.end(stream),
            Ok((stream, Ok(Item::Marker(id)))) => {
                self.marked.entry(id).or_default().insert(stream);
                self.complete()
                    .into_iter()
                    .map(|id| Ok(Received::Barrier(id)))
                    .collect()
            }
            Err(stream) => self.end(stream),
        }
    }

    fn end(&mut self, stream: usize) -> Vec<Result<Received, ReaderError>> {
        self.ended.insert(stream);
        self.complete()
            .into_iter()
            .map(|id| Ok(Received::Barrier(id)))
            .collect()
    }
}

/// How the job's data executors change while a trainer reads.
pub struct Membership {
    /// Addresses of executors that joined the job, each once.
    pub joined: BoxStream<'static, String>,
    /// Resolves when the trainer leaves the job.
    pub leave: BoxFuture<'static, ()>,
}

impl Membership {
    /// The executors never change and the trainer never leaves.
    pub fn fixed() -> Self {
        Self {
            joined: stream::pending().boxed(),
            leave: std::future::pending().boxed(),
        }
    }
}

/// Minibatches from every executor in `addrs` and every one that joins, in arrival order,
/// and the checkpoint barriers once aligned. Ends when the data is: every stream ended and
/// the last did so because its executor's data ran out (not because it left); or, after
/// `membership.leave`, once every executor ended this trainer's streams.
pub async fn read(
    addrs: &[String],
    options: &ReaderOptions,
    membership: Membership,
) -> Result<impl Stream<Item = Result<Received, ReaderError>> + use<>, ReaderError> {
    let mut merged = Merged::new(options.clone(), membership);
    for addr in addrs {
        let opened = open_one(addr.clone(), options.clone()).await?;
        merged.add(
            addr.clone(),
            reconnecting(addr.clone(), options.clone(), opened),
        );
    }
    let yielded = RecentIdentities::new(YIELDED_REMEMBERED);
    Ok(stream::unfold(
        (merged, yielded),
        |(mut merged, mut yielded)| async move {
            let item = match merged.next().await? {
                Ok(Received::Batch(batch)) => Ok(again_or_new(batch, &mut yielded)),
                other => other,
            };
            Some((item, (merged, yielded)))
        },
    ))
}

/// Minibatch identities a read remembers having yielded: far more than an executor holds
/// for a trainer, which is what it serves again after the stream breaks.
const YIELDED_REMEMBERED: usize = 1 << 16;

/// `batch`, or only its receipt where a minibatch of its identity was yielded already.
fn again_or_new(batch: Box<ReceivedBatch>, yielded: &mut RecentIdentities) -> Received {
    let identity = batch.receipt.minibatch;
    if identity == 0 || yielded.insert(identity) {
        return Received::Batch(batch);
    }
    tracing::info!(
        executor = %batch.executor,
        "a minibatch trained already, served again after its stream broke: confirming it without training it again"
    );
    Received::Again(batch.receipt)
}

/// The state of [`read`]: the executors' streams and what joins or leaves.
struct Merged {
    streams: SelectAll<BoxStream<'static, Tagged>>,
    /// Each stream's executor, by stream index.
    addrs: Vec<String>,
    alignment: Alignment,
    /// Streams whose executor said it is leaving.
    leaving_streams: BTreeSet<usize>,
    /// A stream ended because its executor's data ran out.
    data_ended: bool,
    /// Until this trainer leaves.
    joined: Option<BoxStream<'static, String>>,
    leave: Option<BoxFuture<'static, ()>>,
    options: ReaderOptions,
    ready: std::collections::VecDeque<Result<Received, ReaderError>>,
}

impl Merged {
    fn new(options: ReaderOptions, membership: Membership) -> Self {
        Self {
            streams: SelectAll::new(),
            addrs: Vec::new(),
            alignment: Alignment {
                streams: 0,
                ended: BTreeSet::new(),
                marked: BTreeMap::new(),
            },
            leaving_streams: BTreeSet::new(),
            data_ended: false,
            joined: Some(membership.joined),
            leave: Some(membership.leave),
            options,
            ready: std::collections::VecDeque::new(),
        }
    }

    fn add(&mut self, addr: String, items: Items) {
        let index = self.addrs.len();
        let tagged = items
            .map(move |item| Tagged::Item(index, Box::new(item)))
            .chain(stream::once(async move { Tagged::Ended(index) }));
        self.streams.push(tagged.boxed());
        self.addrs.push(addr);
        self.alignment.streams += 1;
    }

    /// Addresses of the executors whose streams are open.
    fn open_addrs(&self) -> Vec<String> {
        (0..self.addrs.len())
            .filter(|i| !self.alignment.ended.contains(i))
            .map(|i| self.addrs[i].clone())
            .collect()
    }

    /// The read is over: this trainer left, or the data ran out, and no stream is open.
    fn finished(&self) -> bool {
        self.streams.is_empty() && (self.leave.is_none() || self.data_ended)
    }

    async fn next(&mut self) -> Option<Result<Received, ReaderError>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(item);
            }
            if self.finished() {
                return None;
            }
            let open = !self.streams.is_empty();
            let (streams, joined, leave) = (&mut self.streams, &mut self.joined, &mut self.leave);
            let step = tokio::select! {
                tagged = streams.next(), if open => Step::Item(tagged),
                addr = next_join(joined) => Step::Joined(addr),
                () = until_leave(leave) => Step::Leave,
            };
            match step {
                Step::Item(Some(tagged)) => self.take(tagged),
                // The last stream ended: whether the read is over is decided above.
                Step::Item(None) => {}
                Step::Joined(Some(addr)) => self.join(addr),
                Step::Joined(None) => self.joined = None,
                Step::Leave => self.depart().await,
            }
        }
    }

    fn take(&mut self, tagged: Tagged) {
        match &tagged {
            Tagged::Item(stream, item) if matches!(**item, Ok(Item::Leaving)) => {
                tracing::info!(addr = %self.addrs[*stream], "data executor leaving the job");
                self.leaving_streams.insert(*stream);
            }
            Tagged::Ended(stream) if !self.leaving_streams.contains(stream) => {
                self.data_ended = true;
            }
            _ => {}
        }
        self.ready.extend(self.alignment.take(tagged));
    }

    fn join(&mut self, addr: String) {
        if self.open_addrs().contains(&addr) {
            return;
        }
        tracing::info!(%addr, "data executor joined the job");
        let options = self.options.clone();
        let opening = addr.clone();
        let items = stream::once(async move { reopen(&opening, &options).await })
            .flat_map({
                let (addr, options) = (addr.clone(), self.options.clone());
                move |opened| match opened {
                    Ok(opened) => reconnecting(addr.clone(), options.clone(), opened),
                    Err(e) => stream::once(async move { Err(e) }).boxed(),
                }
            })
            .boxed();
        self.add(addr, items);
    }

    /// This trainer leaves: no executor joins any more, and each open one is asked to
    /// end this trainer's streams.
    async fn depart(&mut self) {
        self.joined = None;
        self.leave = None;
        let (job, trainer_id) = (self.options.job.clone(), self.options.trainer_id.clone());
        let asks = self.open_addrs().into_iter().map(|addr| {
            let request = EndMinibatchesRequest {
                job: job.clone(),
                trainer_id: trainer_id.clone(),
            };
            async move {
                let ended = async {
                    let mut client =
                        DatasetServiceClient::connect(format!("http://{addr}")).await?;
                    client.end_minibatches(request).await?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                };
                match tokio::time::timeout(END_ASK_TIMEOUT, ended).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(%addr, error = %e, "asking to end the streams"),
                    Err(_) => tracing::warn!(%addr, "asking to end the streams timed out"),
                }
            }
        });
        futures::future::join_all(asks).await;
        tracing::info!("leaving: every data executor was asked to end its streams");
    }
}

/// What [`Merged::next`] woke up for.
enum Step {
    Item(Option<Tagged>),
    Joined(Option<String>),
    Leave,
}

/// The next joined executor; never, once joins are no longer followed.
async fn next_join(joined: &mut Option<BoxStream<'static, String>>) -> Option<String> {
    match joined.as_mut() {
        Some(joined) => joined.next().await,
        None => std::future::pending().await,
    }
}

/// Resolves when the trainer leaves; never once it has.
async fn until_leave(leave: &mut Option<BoxFuture<'static, ()>>) {
    match leave.as_mut() {
        Some(leave) => leave.await,
        None => std::future::pending().await,
    }
}

/// How long a leaving trainer waits for one executor to take its EndMinibatches.
const END_ASK_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor_stream::identity;

    fn barriers(out: Vec<Result<Received, ReaderError>>) -> Vec<u64> {
        out.into_iter()
            .map(|r| match r {
                Ok(Received::Barrier(id)) => id,
                _ => panic!("only barriers expected"),
            })
            .collect()
    }

    #[test]
    fn a_minibatch_is_identified_by_the_task_rows_it_holds() {
        let range = |task: &str, first, end| ServedRange {
            task_id: task.into(),
            first,
            end,
            end_position: None,
        };
        let held = [range("a/1", 0, 64), range("b/2", 10, 20)];
        assert_eq!(identity(&held), identity(&held.clone()), "served again");
        assert_ne!(identity(&held), identity(&held[..1]));
        assert_ne!(identity(&held[..1]), identity(&[range("a/1", 0, 65)]));
        assert_ne!(identity(&held[..1]), identity(&[range("a/10", 0, 64)]));
        assert_eq!(identity(&[]), 0, "no task rows: no identity");
        assert_ne!(identity(&held[..1]), 0);
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

    fn merged() -> Merged {
        let options = ReaderOptions {
            job: "j".into(),
            trainer_id: "trainer-0".into(),
            batch_size: 1,
            grouped: false,
            master_addr: String::new(),
        };
        Merged::new(options, Membership::fixed())
    }

    fn items(items: Vec<Item>) -> Items {
        stream::iter(items.into_iter().map(Ok)).boxed()
    }

    async fn next_within(merged: &mut Merged) -> Option<Option<Result<Received, ReaderError>>> {
        tokio::time::timeout(Duration::from_millis(200), merged.next())
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_leaving_executor_does_not_end_the_read_and_the_data_running_out_does() {
        let mut merged = merged();
        merged.add("a".into(), items(vec![Item::Leaving]));
        assert!(
            next_within(&mut merged).await.is_none(),
            "waiting for an executor to join"
        );
        // One joins: its marker passes alone (the leaving one awaits no barrier), and its
        // end is the data's.
        merged.add("b".into(), items(vec![Item::Marker(4)]));
        match next_within(&mut merged).await {
            Some(Some(Ok(Received::Barrier(4)))) => {}
            _ => panic!("barrier 4 expected"),
        }
        assert!(
            matches!(next_within(&mut merged).await, Some(None)),
            "the read ended"
        );
    }

    #[tokio::test]
    async fn a_leaving_trainer_reads_until_every_stream_ended() {
        let (leave, left) = tokio::sync::oneshot::channel::<()>();
        let membership = Membership {
            joined: stream::pending().boxed(),
            leave: async move {
                let _ = left.await;
            }
            .boxed(),
        };
        let mut merged = Merged::new(merged().options, membership);
        // An executor whose stream stays open until it is told (here: never) is asked to
        // end it; one that can no longer be reached is given up on.
        merged.add("127.0.0.1:1".into(), stream::pending().boxed());
        let _ = leave.send(());
        assert!(next_within(&mut merged).await.is_none(), "still reading");
        assert!(merged.leave.is_none() && merged.joined.is_none(), "left");
    }
}
