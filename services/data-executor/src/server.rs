//! The dataset server (Primus §5.2): streams minibatches to trainers, each from the serving
//! buffer Algorithm 2 picks, encoded as Arrow IPC (jagged, or IKJT when asked), and pauses
//! for the master's checkpoint barrier (a marker on every stream, then nothing until resumed).
//! Membership changes end streams cleanly: a stopping executor sends `leaving` on each (its
//! unserved rows go back to the queue), and a leaving trainer's streams end once it asks.
//! A minibatch is held until its trainer says it is consumed (`held`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use primus_batch::ipc;
use primus_proto::v1::dataset_service_server::DatasetService;
use primus_proto::v1::minibatch_stream_request::Kind;
use primus_proto::v1::{
    ConfirmedTotalsRequest, ConfirmedTotalsResponse, EndMinibatchesRequest, EndMinibatchesResponse,
    Minibatch, MinibatchRequest, MinibatchStreamRequest, PauseRequest, PauseResponse,
    ResumeRequest, ResumeResponse, YieldTaskRequest, YieldTaskResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::barrier::BarrierError;
use crate::buffer::Served;
use crate::executor::Executor;
use crate::held::HeldBatches;

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
            let popped = executor.barrier.unless_paused(|| {
                (executor.unconsumed.take_returned()).or_else(|| executor.buffers.try_pop(rows))
            });
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

    /// Sends `request`'s trainer minibatches and markers until the stream ends; true when
    /// the executor ended it (not the trainer going away, nor a failure).
    async fn serve(
        executor: &Executor,
        request: &MinibatchRequest,
        tx: &mpsc::Sender<Result<Minibatch, Status>>,
        held: &HeldBatches,
    ) -> bool {
        let mut marked = 0;
        let trainer = request.trainer_id.as_str();
        let rows = request.batch_size as usize;
        // Reserve the slot first: rows leave the buffer only when they can be sent.
        while let Ok(permit) = tx.reserve().await {
            let served = match Self::next(executor, trainer, rows, &mut marked).await {
                Ok(Next::Batch(served)) => served,
                Ok(Next::Barrier(id)) => {
                    permit.send(Ok(barrier_marker(id)));
                    continue;
                }
                Ok(Next::End) => return true,
                Ok(Next::Leaving) => {
                    permit.send(Ok(leaving_marker()));
                    return true;
                }
                Err(status) => {
                    permit.send(Err(status));
                    return false;
                }
            };
            let rows = served.batch.rows() as u64;
            let mut message = match encode(executor, &served, request.grouped) {
                Ok(message) => message,
                Err(status) => {
                    // Served again, to this trainer if it goes on or to another.
                    executor.unconsumed.give_back([*served]);
                    permit.send(Err(status));
                    return false;
                }
            };
            message.sequence = held.hold(*served);
            permit.send(Ok(message));
            executor.rows_served.fetch_add(rows, Ordering::AcqRel);
        }
        false
    }
}

fn encode(executor: &Executor, served: &Served, grouped: bool) -> Result<Minibatch, Status> {
    let groups = executor.pipeline.groups();
    let encoded = if grouped && !groups.is_empty() {
        let batch = (served.batch.grouped(groups))
            .map_err(|e| Status::internal(format!("grouping a minibatch: {e}")))?;
        ipc::encode(&batch)
    } else {
        ipc::encode(&served.batch)
    };
    let arrow_ipc = encoded.map_err(|e| Status::internal(format!("encoding a minibatch: {e}")))?;
    Ok(Minibatch {
        source_kind: served.kind as i32,
        source: served.source.clone(),
        rows: served.batch.rows() as u32,
        arrow_ipc: arrow_ipc.into(),
        trace_context: served.trace.clone(),
        served: served.ranges.iter().map(|(_, r)| r.clone()).collect(),
        ..Minibatch::default()
    })
}

/// The stream's opening request; INVALID_ARGUMENT for anything else.
async fn opening(
    inbound: &mut Streaming<MinibatchStreamRequest>,
) -> Result<MinibatchRequest, Status> {
    match inbound.message().await? {
        Some(MinibatchStreamRequest {
            kind: Some(Kind::Open(open)),
        }) => Ok(open),
        _ => Err(Status::invalid_argument(
            "StreamMinibatches: the first message must be `open`",
        )),
    }
}

/// Reads the trainer's confirmations until its side of the stream ends; then whatever it
/// still holds is served again (unless the executor ended the stream first).
async fn follow_consumption(
    executor: Arc<Executor>,
    held: Arc<HeldBatches>,
    mut inbound: Streaming<MinibatchStreamRequest>,
    trainer: String,
) {
    loop {
        match inbound.message().await {
            Ok(Some(MinibatchStreamRequest {
                kind: Some(Kind::Consumed(consumed)),
            })) => {
                let totals = ConfirmedTotalsResponse {
                    steps: consumed.trainer_steps,
                    samples: consumed.trainer_samples,
                    source_samples: consumed.trainer_source_samples,
                };
                executor.unconsumed.record_totals(&trainer, totals);
                if held.consumed(&consumed.sequences) > 0 {
                    executor.buffers.wake();
                }
            }
            Ok(Some(_)) => {
                tracing::warn!(%trainer, "ignoring a second `open` on a minibatch stream");
            }
            Ok(None) | Err(_) => break,
        }
    }
    let rows = held.trainer_gone();
    if rows > 0 {
        tracing::warn!(%trainer, rows, "trainer gone: the rows it did not train are served again");
        executor.buffers.wake();
    }
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
        request: Request<Streaming<MinibatchStreamRequest>>,
    ) -> Result<Response<Self::StreamMinibatchesStream>, Status> {
        let mut inbound = request.into_inner();
        let request = opening(&mut inbound).await?;
        let executor = self.executor.clone();
        executor.check_job(&request.job)?;
        if request.batch_size == 0 {
            return Err(Status::invalid_argument("batch_size: must be at least 1"));
        }
        let (tx, rx) = mpsc::channel(PREFETCH);
        // A trainer started again under a departed id is served again.
        executor.rejoin(&request.trainer_id);
        let open = executor.open_stream();
        let held = Arc::new(HeldBatches::new(executor.unconsumed.clone()));
        tokio::spawn(follow_consumption(
            executor.clone(),
            held.clone(),
            inbound,
            request.trainer_id.clone(),
        ));
        tokio::spawn(async move {
            let trainer = request.trainer_id.clone();
            if Self::serve(&executor, &request, &tx, &held).await {
                held.ended();
            }
            drop(open);
            tracing::info!(%trainer, "minibatch stream ended");
        });
        let mut response = Response::new(ReceiverStream::new(rx));
        let id = &self.executor.identity.executor_id;
        let id = (id.parse())
            .map_err(|_| Status::internal(format!("executor id {id:?} is not a header value")))?;
        response
            .metadata_mut()
            .insert(primus_proto::EXECUTOR_ID_HEADER, id);
        Ok(response)
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
        let returned = executor.unconsumed.returned_rows();
        if returned > 0 {
            return Err(Status::failed_precondition(format!(
                "{returned} rows of a trainer that went away wait to be served again"
            )));
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

    async fn confirmed_totals(
        &self,
        request: Request<ConfirmedTotalsRequest>,
    ) -> Result<Response<ConfirmedTotalsResponse>, Status> {
        let request = request.into_inner();
        self.executor.check_job(&request.job)?;
        let totals = self.executor.unconsumed.totals_of(&request.trainer_id);
        Ok(Response::new(totals))
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use futures::StreamExt;
    use primus_batch::{DenseMatrix, Kjt, Minibatch, Sparse};
    use primus_data_client::{Membership, ReaderOptions, Received, ReceivedBatch, TrainerTotals};
    use primus_proto::v1::dataset_service_client::DatasetServiceClient;
    use primus_proto::v1::dataset_service_server::DatasetServiceServer;
    use primus_service::ExecutorIdentity;
    use primus_spec::{Resource, parse_documents};
    use tokio_stream::wrappers::TcpListenerStream;

    use super::*;
    use crate::buffer::Chunk;
    use crate::ledger::TaskLedger;

    const DATASET: &str = "
kind: Dataset
metadata: {name: ids}
spec:
  streams:
    - name: s
      window: {unit: hourly, start: '2026-11-20T00', end: '2026-11-20T01'}
      sources: [{name: ids, parquet: {uri: 'file:///nowhere'}}]
  schema: {label: label, dense: [{name: id}], sparse: [{name: c, table: t}]}
";

    /// An executor holding `rows` rows whose one dense value is the row's id, with no
    /// task left to run, serving on a loopback port.
    async fn serving(rows: usize) -> (Arc<Executor>, String) {
        let resources = match parse_documents("ids.yaml", DATASET) {
            Ok(resources) => resources,
            Err(e) => panic!("the test's Dataset: {e}"),
        };
        let Some(Resource::Dataset(dataset)) = resources.into_iter().next() else {
            panic!("a Dataset");
        };
        let identity = ExecutorIdentity {
            job: "j".into(),
            executor_id: "data_executor-0".into(),
            master_addr: "127.0.0.1:1".into(),
        };
        let executor = Arc::new(Executor::new(
            identity,
            &dataset.spec,
            Default::default(),
            Default::default(),
            primus_service::Shutdown::new(),
        ));
        let batch = Minibatch {
            labels: vec![0.0; rows],
            targets: Vec::new(),
            dense: DenseMatrix {
                names: vec!["id".into()],
                values: (0..rows).map(|id| id as f32).collect(),
            },
            sparse: Sparse::Jagged(Kjt {
                rows,
                features: vec![],
            }),
        };
        let task = Arc::new(TaskLedger::new("task".into(), 0));
        let chunk = Chunk {
            batch,
            task,
            first_offset: 0,
        };
        executor.buffers.push(0, chunk).await;
        executor.exhaust();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address").to_string();
        let server = DatasetServiceServer::new(DatasetServer {
            executor: executor.clone(),
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        (executor, addr)
    }

    async fn read(addr: &str, trainer: &str) -> impl futures::Stream<Item = Received> {
        let options = ReaderOptions {
            job: "j".into(),
            trainer_id: trainer.into(),
            batch_size: 10,
            grouped: false,
            master_addr: String::new(),
        };
        let read = primus_data_client::read(&[addr.to_owned()], &options, Membership::fixed())
            .await
            .expect("the stream opens");
        read.map(|item| item.expect("a minibatch"))
    }

    async fn reader(addr: &str, trainer: &str) -> impl futures::Stream<Item = ReceivedBatch> {
        read(addr, trainer).await.filter_map(|item| async move {
            match item {
                Received::Batch(batch) => Some(*batch),
                Received::Again(_) | Received::Barrier(_) => None,
            }
        })
    }

    /// Forwards loopback connections to `to` until [`Relay::cut`] drops those it carries
    /// (both ends see their connection close); it accepts new ones all along.
    struct Relay {
        addr: String,
        carried: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    }

    impl Relay {
        async fn to(to: String) -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a loopback port");
            let addr = listener.local_addr().expect("its address").to_string();
            let carried: Arc<std::sync::Mutex<Vec<_>>> = Arc::default();
            let accepting = carried.clone();
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let to = to.clone();
                    let pipe = tokio::spawn(async move {
                        let mut outbound = (tokio::net::TcpStream::connect(&to).await)
                            .expect("the executor's port");
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    });
                    accepting.lock().expect("connections").push(pipe);
                }
            });
            Self { addr, carried }
        }

        fn cut(&self) {
            (self.carried.lock().expect("connections").drain(..)).for_each(|pipe| pipe.abort());
        }
    }

    fn ids(batch: &ReceivedBatch) -> Vec<u64> {
        batch.batch.dense.values.iter().map(|v| *v as u64).collect()
    }

    #[tokio::test]
    async fn a_minibatch_its_trainer_did_not_consume_is_served_to_the_next_one_and_nothing_twice() {
        let (executor, addr) = serving(100).await;
        let mut trained: BTreeMap<u64, u32> = BTreeMap::new();
        let mut count = |ids: Vec<u64>| {
            ids.into_iter()
                .for_each(|id| *trained.entry(id).or_default() += 1)
        };

        // The first trainer consumes one minibatch, receives two more and dies.
        let mut first = Box::pin(reader(&addr, "trainer-0").await);
        let consumed = first.next().await.expect("a minibatch");
        count(ids(&consumed));
        consumed.receipt.consumed(&totals(1, 10));
        let lost = [first.next().await, first.next().await];
        assert!(lost.iter().all(Option::is_some), "two more were served");
        // Its confirmation is read before the stream breaks.
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(lost);
        drop(first);
        // Rows it did not train wait to be served again: a checkpoint now would count
        // them as trained before its barrier.
        let mut client = DatasetServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("a client");
        let pause = PauseRequest {
            job: "j".into(),
            checkpoint_id: 1,
            timeout_ms: 1000,
        };
        let mut refused = None;
        for _ in 0..50 {
            match client.pause(pause.clone()).await {
                Err(status) => {
                    refused = Some(status);
                    break;
                }
                // The break was not seen yet: resume and ask again.
                Ok(_) => {
                    let resume = ResumeRequest {
                        job: "j".into(),
                        checkpoint_id: 1,
                    };
                    client.resume(resume).await.expect("resume");
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let refused = refused.expect("a Pause refused while rows wait to be served again");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");

        // The next trainer gets every row the first did not consume, then the stream ends.
        let mut second = Box::pin(reader(&addr, "trainer-1").await);
        let mut steps = 0;
        while let Some(batch) = second.next().await {
            count(ids(&batch));
            steps += 1;
            batch.receipt.consumed(&totals(steps, steps * 10));
        }
        assert_eq!(trained.len(), 100, "every row trained: {trained:?}");
        assert!(trained.values().all(|n| *n == 1), "none twice: {trained:?}");
        assert!(executor.unconsumed.is_empty());
        // Started again, each continues the totals it confirmed.
        for (trainer, expected) in [("trainer-0", totals(1, 10)), ("trainer-1", totals(9, 90))] {
            let confirmed = primus_data_client::confirmed_totals(&addr, "j", trainer).await;
            assert_eq!(confirmed.expect("totals"), expected, "{trainer}");
        }
    }

    #[tokio::test]
    async fn a_minibatch_served_again_to_the_trainer_that_had_it_is_confirmed_not_trained_again() {
        let (executor, addr) = serving(100).await;
        let relay = Relay::to(addr).await;
        let mut trained: BTreeMap<u64, u32> = BTreeMap::new();
        let mut items = Box::pin(read(&relay.addr, "trainer-0").await);
        let mut next_batch = async || match items.next().await {
            Some(Received::Batch(batch)) => *batch,
            _ => panic!("a minibatch"),
        };

        // The trainer confirms one minibatch and trains a second, whose confirmation is
        // lost with the connection: the executor, alive, serves that one again.
        let confirmed = next_batch().await;
        let unconfirmed = next_batch().await;
        for batch in [&confirmed, &unconfirmed] {
            ids(batch)
                .into_iter()
                .for_each(|id| *trained.entry(id).or_default() += 1);
        }
        let confirmed_identity = confirmed.receipt.minibatch();
        confirmed.receipt.consumed(&totals(1, 10));
        let again = unconfirmed.receipt.minibatch();
        tokio::time::sleep(Duration::from_millis(100)).await;
        relay.cut();
        unconfirmed.receipt.consumed(&totals(2, 20));

        // The read reconnects through the relay. Every minibatch whose confirmation the cut
        // lost (the one trained before it, and those the connection had delivered
        // already) is served again and comes as its receipt only; the rest come once.
        let mut yielded = vec![confirmed_identity, again];
        let mut served_again = Vec::new();
        let mut steps = 2;
        while let Some(item) = items.next().await {
            match item {
                Received::Batch(batch) => {
                    ids(&batch)
                        .into_iter()
                        .for_each(|id| *trained.entry(id).or_default() += 1);
                    yielded.push(batch.receipt.minibatch());
                    steps += 1;
                    batch.receipt.consumed(&totals(steps, steps * 10));
                }
                Received::Again(receipt) => {
                    let identity = receipt.minibatch();
                    assert!(yielded.contains(&identity), "yielded before it came again");
                    assert!(!served_again.contains(&identity), "served again once");
                    served_again.push(identity);
                    receipt.consumed(&totals(steps, steps * 10));
                }
                Received::Barrier(_) => {}
            }
        }
        assert!(served_again.contains(&again), "{served_again:?}");
        assert_eq!(trained.len(), 100, "every row trained: {trained:?}");
        assert!(trained.values().all(|n| *n == 1), "none twice: {trained:?}");
        assert!(executor.unconsumed.is_empty());
        let confirmed = primus_data_client::confirmed_totals(&relay.addr, "j", "trainer-0").await;
        assert_eq!(confirmed.expect("totals"), totals(10, 100));
    }

    fn totals(steps: u64, samples: u64) -> TrainerTotals {
        TrainerTotals {
            steps,
            samples,
            sources: [("ids".to_owned(), samples)].into(),
        }
    }
}
