//! Stream task runner: turns each `SampleRows` message of a stream source's JetStream
//! subject into a chunk of the source's serving buffer. A missing stream is created over
//! the source's subject, so a Job may start before anything was published. A message that
//! cannot be decoded or does not fit the schema is skipped and counted, and the stream
//! goes on.
//!
//! `forward` loading ([`StreamRunner::read_in_order`]): the binding's holder reads the
//! subject in stream order from the binding's position, and the task ledger's cursor
//! turns the served offset back into a position. Whoever reads the binding next (after
//! this executor died or left, or after a checkpoint restore) starts at the position last
//! reported or recorded, so rows this executor buffered but did not serve are read again.
//!
//! `rebalance` loading ([`StreamRunner::run_shared`]): the holder and its helpers share
//! the durable consumer the master named; a message is acked once all its rows are
//! buffered, and what was delivered but not acked is delivered again after the ack wait.
//! Rows buffered but not served by an executor that dies are lost, and such bindings are
//! not rewound by a restore.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::TryFutureExt;
use primus_batch::{FeaturePipeline, Minibatch, ipc};
use primus_bus::jetstream::{Consumer, Delivery, Fetched, JetStream};
use primus_bus::{BusError, Received};
use primus_proto::v1::{SampleRows, StreamPosition, StreamWork};

use crate::buffer::{Buffers, Chunk, SourceIndex};
use crate::ledger::{ReadEnd, TaskLedger};
use crate::position::StreamCursor;

/// How far a stream source is behind its stream, for the executor's metrics.
#[derive(Default)]
pub(crate) struct StreamGauges {
    /// Messages not yet delivered plus delivered and not yet acked, at the last check.
    pending: AtomicU64,
    /// When the stream stored the newest buffered message (unix ms; 0: none yet).
    newest_buffered_ms: AtomicI64,
}

impl StreamGauges {
    pub(crate) fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    pub(crate) fn set_pending(&self, messages: u64) {
        self.pending.store(messages, Ordering::Relaxed);
    }

    /// A message the stream stored at `stored_ms` is in this executor's hands.
    pub(crate) fn taken_in(&self, stored_ms: i64) {
        self.newest_buffered_ms
            .fetch_max(stored_ms, Ordering::Relaxed);
    }

    /// Seconds between now and the newest buffered message's arrival in the stream while
    /// messages are pending; 0 when caught up (a quiet stream is not a lagging one).
    pub(crate) fn lag_seconds(&self, now_ms: i64) -> f64 {
        let newest = self.newest_buffered_ms.load(Ordering::Relaxed);
        if self.pending() == 0 || newest == 0 {
            return 0.0;
        }
        (now_ms - newest).max(0) as f64 / 1000.0
    }
}

/// How often the consumer's backlog is asked for.
const BACKLOG_INTERVAL: Duration = Duration::from_secs(1);

/// How stream runners fetch from JetStream (`data.stream_*` settings).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fetching {
    /// Messages asked for per fetch.
    pub messages: usize,
    /// How long one fetch waits for messages.
    pub wait: Duration,
    /// A delivered message not acked within this long is delivered again.
    pub ack_wait: Duration,
}

impl Fetching {
    /// The stream fetch settings, each raised to a workable minimum.
    pub(crate) fn from_settings(settings: &primus_config::DataSettings) -> Self {
        Self {
            messages: settings.stream_fetch_messages.max(1),
            wait: Duration::from_millis(settings.stream_fetch_wait_ms.max(10)),
            ack_wait: Duration::from_millis(settings.stream_ack_wait_ms.max(1000)),
        }
    }
}

/// What every stream consumer of an executor (forward, rebalancing helper, joiner) reads
/// from and writes to.
#[derive(Clone, Copy)]
pub(crate) struct StreamInputs<'a> {
    pub buffers: &'a Buffers,
    pub pipeline: &'a FeaturePipeline,
    pub jetstream: &'a JetStream,
    pub fetching: Fetching,
    /// Messages terminated because they did not decode, join or fit the schema.
    pub rejected: &'a AtomicU64,
}

pub(crate) struct StreamRunner<'a> {
    pub inputs: StreamInputs<'a>,
    pub gauges: &'a StreamGauges,
}

impl StreamRunner<'_> {
    /// Reads the binding's subject in stream order from `start` until the binding is taken
    /// back or the future is dropped (the executor stops); `ledger` keeps the cursor
    /// ([`TaskLedger::for_stream`]). A stream has no end; a reader that cannot be opened
    /// fails the task.
    pub(crate) async fn read_in_order(
        &self,
        source: SourceIndex,
        work: &StreamWork,
        (start_offset, start): (u64, StreamPosition),
        ledger: &Arc<TaskLedger>,
    ) {
        let reader = self
            .inputs
            .jetstream
            .ensure_stream(&work.stream, vec![work.subject.clone()])
            .and_then(|_| {
                self.inputs.jetstream.ordered_reader::<SampleRows>(
                    &work.stream,
                    work.subject.clone(),
                    start.sequence,
                )
            })
            .await;
        let mut reader = match reader {
            Ok(reader) => reader,
            Err(e) => return not_opened(ledger, work, start_offset, &e),
        };
        tracing::info!(stream = %work.stream, subject = %work.subject, sequence = start.sequence, rows = start.rows, "reading in order");
        let mut offset = start_offset;
        let mut writing = None;
        while !ledger.is_taken_back() {
            let message = match reader.next(self.inputs.fetching.wait).await {
                None => {
                    // Nothing within the wait: caught up, and a short buffer may serve.
                    writing = None;
                    self.gauges.set_pending(0);
                    continue;
                }
                Some(Err(e)) => {
                    // The reader goes on from its last message once NATS answers again.
                    tracing::warn!(stream = %work.stream, error = %e, "reading the stream");
                    tokio::time::sleep(self.inputs.fetching.wait).await;
                    continue;
                }
                Some(Ok(message)) => message,
            };
            self.gauges.set_pending(message.pending);
            // Writing while more messages are at hand: a short buffer waits for them.
            if writing.is_none() {
                writing = Some(self.inputs.buffers.writer(source));
            }
            let skip = StreamCursor::skip_of(&start, message.sequence);
            let rows = match self.rows_after(message.decoded, skip) {
                Ok(batch) => batch,
                Err(error) => {
                    self.skip_unfit(work, message.sequence, &error);
                    ledger.stream_read(message.sequence, offset, 0, 0);
                    continue;
                }
            };
            let count = rows.rows() as u64;
            ledger.stream_read(message.sequence, offset, skip, count);
            if count == 0 {
                continue;
            }
            let chunk = Chunk {
                batch: rows,
                task: ledger.clone(),
                first_offset: offset,
            };
            self.inputs.buffers.push(source, chunk).await;
            offset += count;
            self.gauges.taken_in(message.stored_unix_ms);
            if message.pending == 0 {
                writing = None;
            }
        }
    }

    /// The rows of a message read in order, without the first `skip` (served before).
    fn rows_after(
        &self,
        decoded: Result<Received<SampleRows>, BusError>,
        skip: u64,
    ) -> Result<Minibatch, String> {
        let received = decoded.map_err(|e| format!("not SampleRows: {e}"))?;
        let rows = ipc::decode_rows(&received.message.arrow_ipc)
            .map_err(|e| format!("not Arrow IPC rows: {e}"))?;
        let skip = (skip as usize).min(rows.num_rows());
        let rows = rows.slice(skip, rows.num_rows() - skip);
        self.inputs
            .pipeline
            .minibatch(&rows)
            .map_err(|e| e.to_string())
    }

    fn skip_unfit(&self, work: &StreamWork, sequence: u64, error: &str) {
        tracing::warn!(stream = %work.stream, sequence, %error, "message skipped: its rows do not fit the Dataset's schema");
        self.inputs.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// `rebalance` loading: consumes the shared durable consumer until the binding is
    /// taken back or the future is dropped (the executor stops). A stream has no end; a
    /// consumer that cannot be opened fails the task.
    pub(crate) async fn run_shared(
        &self,
        source: SourceIndex,
        work: &StreamWork,
        start_offset: u64,
        ledger: &Arc<TaskLedger>,
    ) {
        // The stream is created when missing, so a Job may start before its producer.
        let consumer = match self
            .inputs
            .jetstream
            .ensure_stream(&work.stream, vec![work.subject.clone()])
            .and_then(|_| {
                self.inputs.jetstream.durable_consumer::<SampleRows>(
                    &work.stream,
                    &work.durable,
                    Some(work.subject.clone()),
                    self.inputs.fetching.ack_wait,
                )
            })
            .await
        {
            Ok(consumer) => consumer,
            Err(e) => return not_opened(ledger, work, start_offset, &e),
        };
        tracing::info!(stream = %work.stream, subject = %work.subject, durable = %work.durable, "consuming");
        let mut offset = start_offset;
        let mut backlog_checked: Option<Instant> = None;
        while !ledger.is_taken_back() {
            if backlog_checked.is_none_or(|at| at.elapsed() >= BACKLOG_INTERVAL) {
                self.check_backlog(&consumer).await;
                backlog_checked = Some(Instant::now());
            }
            let fetched = match consumer
                .fetch(self.inputs.fetching.messages, self.inputs.fetching.wait)
                .await
            {
                Ok(fetched) => fetched,
                Err(e) => {
                    // NATS reconnects on its own; what was delivered and not acked comes back.
                    tracing::warn!(stream = %work.stream, error = %e, "fetching from the stream");
                    tokio::time::sleep(self.inputs.fetching.wait).await;
                    continue;
                }
            };
            if fetched.deliveries.is_empty() {
                // Idle: refresh the backlog now, so a caught-up stream shows no lag.
                self.check_backlog(&consumer).await;
                backlog_checked = Some(Instant::now());
            }
            self.take(source, work, &fetched, &consumer, ledger, &mut offset)
                .await;
        }
    }

    /// Buffers the rows of one fetch as chunks of `ledger` from `offset` on, acking each
    /// message once its rows are buffered; terminates those that do not fit.
    pub(crate) async fn take(
        &self,
        source: SourceIndex,
        work: &StreamWork,
        fetched: &Fetched<SampleRows>,
        consumer: &Consumer<SampleRows>,
        ledger: &Arc<TaskLedger>,
        offset: &mut u64,
    ) {
        for error in &fetched.rejected {
            tracing::warn!(stream = %work.stream, %error, "message terminated: not SampleRows");
            self.inputs.rejected.fetch_add(1, Ordering::Relaxed);
        }
        if fetched.deliveries.is_empty() {
            return;
        }
        tracing::debug!(stream = %work.stream, messages = fetched.deliveries.len(), "fetched");
        // Writing only while messages are in hand: an idle stream's short buffer serves.
        let _writing = self.inputs.buffers.writer(source);
        for (i, delivery) in fetched.deliveries.iter().enumerate() {
            let batch = match self.rows(delivery) {
                Ok(batch) => batch,
                Err(error) => {
                    self.reject(work, delivery, &error).await;
                    continue;
                }
            };
            let rows = batch.rows() as u64;
            let chunk = Chunk {
                batch,
                task: ledger.clone(),
                first_offset: *offset,
            };
            self.buffer(source, chunk, consumer, &fetched.deliveries[i..])
                .await;
            *offset += rows;
            if let Ok(stored) = delivery.stored_unix_ms() {
                self.gauges.taken_in(stored);
            }
            if let Err(e) = delivery.ack().await {
                // Buffered but unacked: it will be delivered again (at most a duplicate).
                tracing::warn!(stream = %work.stream, error = %e, "acking a buffered message");
            }
        }
    }

    pub(crate) async fn check_backlog(&self, consumer: &Consumer<SampleRows>) {
        if let Ok(backlog) = consumer.backlog().await {
            self.gauges
                .set_pending(backlog.pending + backlog.ack_pending);
        }
    }

    fn rows(&self, delivery: &Delivery<SampleRows>) -> Result<Minibatch, String> {
        let rows = ipc::decode_rows(&delivery.received.message.arrow_ipc)
            .map_err(|e| format!("not Arrow IPC rows: {e}"))?;
        self.inputs
            .pipeline
            .minibatch(&rows)
            .map_err(|e| e.to_string())
    }

    async fn reject(&self, work: &StreamWork, delivery: &Delivery<SampleRows>, error: &str) {
        let sequence = delivery.sequence().unwrap_or_default();
        tracing::warn!(
            stream = %work.stream,
            subject = %delivery.received.subject,
            sequence,
            %error,
            "message terminated: its rows do not fit the Dataset's schema"
        );
        self.inputs.rejected.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = delivery.reject().await {
            tracing::warn!(stream = %work.stream, error = %e, "terminating a message");
        }
    }

    /// Pushes `chunk`, keeping the fetch's unacked messages alive while a full buffer
    /// makes it wait: otherwise they would be redelivered and trained twice.
    async fn buffer(
        &self,
        source: SourceIndex,
        chunk: Chunk,
        consumer: &Consumer<SampleRows>,
        unacked: &[Delivery<SampleRows>],
    ) {
        let interval = self.inputs.fetching.ack_wait / 3;
        let keep_alive = move || async move {
            for delivery in unacked {
                // A lost keep-alive only risks a redelivery, which the ack wait allows.
                let _ = delivery.in_progress().await;
            }
            self.check_backlog(consumer).await;
        };
        self.inputs
            .buffers
            .push_ticking(source, chunk, interval, keep_alive)
            .await;
    }
}

/// A stream that cannot be read fails its binding, naming the stream and subject.
fn not_opened(ledger: &TaskLedger, work: &StreamWork, start_offset: u64, error: &BusError) {
    ledger.finish_reading(ReadEnd::Failed {
        rows: start_offset,
        error: format!(
            "JetStream stream {:?}, subject {:?}: {error}",
            work.stream, work.subject
        ),
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use arrow_array::{ArrayRef, RecordBatch, UInt64Array};
    use primus_bus::Bus;
    use primus_config::NatsSettings;
    use primus_proto::v1::SourceKind;
    use primus_testkit::NatsServer;

    use super::*;

    const STREAM: &str = "CLICKS";

    fn pipeline() -> FeaturePipeline {
        FeaturePipeline::new(&crate::runner::tests::schema())
    }

    fn work() -> StreamWork {
        StreamWork {
            stream: STREAM.into(),
            subject: "clicks.>".into(),
            durable: "job-clicks".into(),
        }
    }

    /// Rows with ids `ids` in column c1 (or `column`), as a `SampleRows` message.
    pub(crate) fn sample_rows(column: &str, ids: std::ops::Range<u64>) -> SampleRows {
        let labels: ArrayRef = Arc::new(UInt64Array::from_iter_values(ids.clone().map(|i| i % 2)));
        let values: ArrayRef = Arc::new(UInt64Array::from_iter_values(ids));
        let rows = RecordBatch::try_from_iter([("label", labels), (column, values)]).expect("rows");
        SampleRows {
            arrow_ipc: ipc::encode_rows(&rows).expect("encode"),
        }
    }

    /// The key the pipeline makes of c1 = `id`, mapped back to the id.
    pub(crate) fn ids_by_key(ids: std::ops::Range<u64>) -> BTreeMap<u64, u64> {
        let seed = primus_batch::hash::feature_seed("c1");
        ids.map(|id| (primus_batch::hash::int_key(seed, id), id))
            .collect()
    }

    pub(crate) async fn connect(nats: &NatsServer) -> JetStream {
        let settings = NatsSettings {
            url: nats.url(),
            ..Default::default()
        };
        Bus::connect(&settings).await.expect("connect").jetstream()
    }

    async fn jetstream(nats: &NatsServer) -> JetStream {
        let js = connect(nats).await;
        js.ensure_stream(STREAM, vec!["clicks.>".into()])
            .await
            .expect("stream");
        js
    }

    #[derive(Default)]
    struct Counters {
        rejected: AtomicU64,
        gauges: StreamGauges,
    }

    /// Inputs that fetch small batches with short waits, so tests see redeliveries soon.
    pub(crate) fn quick_inputs<'a>(
        buffers: &'a Buffers,
        pipeline: &'a FeaturePipeline,
        jetstream: &'a JetStream,
        rejected: &'a AtomicU64,
    ) -> StreamInputs<'a> {
        StreamInputs {
            buffers,
            pipeline,
            jetstream,
            fetching: Fetching {
                messages: 16,
                wait: Duration::from_millis(200),
                ack_wait: Duration::from_secs(1),
            },
            rejected,
        }
    }

    fn runner<'a>(
        buffers: &'a Buffers,
        pipeline: &'a FeaturePipeline,
        jetstream: &'a JetStream,
        counters: &'a Counters,
    ) -> StreamRunner<'a> {
        StreamRunner {
            inputs: quick_inputs(buffers, pipeline, jetstream, &counters.rejected),
            gauges: &counters.gauges,
        }
    }

    /// Pops served rows' ids until `n` arrived (or 20 s passed).
    async fn collect(buffers: &Buffers, n: usize) -> Vec<u64> {
        let by_key = ids_by_key(0..1000);
        let mut ids = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while ids.len() < n && tokio::time::Instant::now() < deadline {
            match buffers.try_pop(1000) {
                Some(served) => {
                    let kjt = served.batch.to_kjt().expect("kjt");
                    ids.extend(kjt.features[0].values.iter().map(|k| by_key[k]));
                }
                None => buffers.wait_for_rows().await,
            }
        }
        ids
    }

    fn buffers(capacity_rows: usize) -> Buffers {
        Buffers::new(
            vec![("clicks".into(), SourceKind::Stream, 1.0)],
            capacity_rows,
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_row_is_buffered_once_and_bad_messages_are_terminated() {
        let nats = NatsServer::start().expect("nats-server");
        let js = jetstream(&nats).await;
        let mut next = 0;
        for rows in 1..=8 {
            js.publish("clicks.a".into(), &sample_rows("c1", next..next + rows))
                .await
                .expect("publish");
            next += rows;
        }
        let bad = [
            SampleRows {
                arrow_ipc: b"not arrow".to_vec(),
            },
            sample_rows("c2", 500..503),
        ];
        for message in &bad {
            js.publish("clicks.b".into(), message)
                .await
                .expect("publish");
        }
        let (buffers, pipeline, counters) = (buffers(10_000), pipeline(), Counters::default());
        let work = work();
        let ledger = Arc::new(TaskLedger::new("clicks/stream".into(), 0));
        let runner = runner(&buffers, &pipeline, &js, &counters);
        let mut ids = tokio::select! {
            _ = runner.run_shared(0, &work, 0, &ledger) => panic!("a stream does not end"),
            ids = collect(&buffers, next as usize) => ids,
        };
        ids.sort_unstable();
        assert_eq!(ids, (0..next).collect::<Vec<_>>(), "every row once");
        assert_eq!(counters.rejected.load(Ordering::Relaxed), 2);
        assert_eq!(ledger.finished(), None, "a stream task stays open");

        let consumer = js
            .durable_consumer::<SampleRows>(
                STREAM,
                "job-clicks",
                Some("clicks.>".into()),
                Duration::from_secs(1),
            )
            .await
            .expect("same durable");
        assert_eq!(
            consumer.backlog().await.expect("backlog"),
            primus_bus::jetstream::Backlog {
                pending: 0,
                ack_pending: 0
            },
            "every message acked or terminated"
        );
    }

    /// An executor whose full buffer holds a fetch back keeps its messages (a peer on the
    /// same durable gets none of them); once it dies, the peer gets what it had not
    /// buffered, and nothing it had.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unbuffered_messages_of_a_dead_executor_go_to_its_peer_and_buffered_ones_do_not() {
        let nats = NatsServer::start().expect("nats-server");
        let js = jetstream(&nats).await;
        for i in 0..6 {
            js.publish("clicks.a".into(), &sample_rows("c1", 2 * i..2 * i + 2))
                .await
                .expect("publish");
        }
        let (pipeline, work) = (pipeline(), work());
        let (first, first_counters) = (buffers(4), Counters::default());
        let (peer, peer_counters) = (buffers(100), Counters::default());
        let first_ledger = Arc::new(TaskLedger::new("clicks/stream".into(), 0));
        let peer_ledger = Arc::new(TaskLedger::new("clicks/stream".into(), 0));
        let first_runner = runner(&first, &pipeline, &js, &first_counters);
        let peer_runner = runner(&peer, &pipeline, &js, &peer_counters);

        // The first executor fetches all six messages, buffers two (4 rows, its capacity)
        // and holds the other four for 2.5 ack waits while the peer consumes too.
        let peer_joins_later = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            tokio::select! {
                _ = peer_runner.run_shared(0, &work, 0, &peer_ledger) => panic!("a stream does not end"),
                _ = tokio::time::sleep(Duration::from_millis(2500)) => {}
            }
        };
        tokio::select! {
            _ = first_runner.run_shared(0, &work, 0, &first_ledger) => panic!("a stream does not end"),
            _ = peer_joins_later => {}
        }
        // Four messages were still pending, the newest buffered one ~2.5 s old.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        assert_eq!(first_counters.gauges.pending(), 4);
        let lag = first_counters.gauges.lag_seconds(now_ms);
        assert!((2.0..10.0).contains(&lag), "lag {lag} s");
        let mut buffered = collect(&first, 4).await;
        assert_eq!(buffered.len(), 4);
        assert!(peer.is_empty(), "held messages were not redelivered");

        // The first executor is gone: the peer gets the four it never buffered.
        let mut redelivered = tokio::select! {
            _ = peer_runner.run_shared(0, &work, 0, &peer_ledger) => panic!("a stream does not end"),
            ids = collect(&peer, 8) => ids,
        };
        buffered.append(&mut redelivered);
        buffered.sort_unstable();
        assert_eq!(buffered, (0..12).collect::<Vec<_>>(), "every row once");
    }

    /// Waits until `buffers` hold `rows` rows.
    async fn wait_for_fill(buffers: &Buffers, rows: usize) {
        while buffers.fill().iter().map(|(_, r)| r).sum::<usize>() < rows {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn ids_of(served: &crate::buffer::Served) -> Vec<u64> {
        let by_key = ids_by_key(0..1000);
        let kjt = served.batch.to_kjt().expect("kjt");
        kjt.features[0].values.iter().map(|k| by_key[k]).collect()
    }

    /// `forward` loading: an executor reads its subject in order (another subject of the
    /// stream between its messages, a bad message among them), serves 25 rows (stopping
    /// inside a message) and stops; one started at the position it reported serves the
    /// rest. Every row once; the bad message is skipped by both.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_binding_read_again_from_its_position_serves_every_row_once() {
        let nats = NatsServer::start().expect("nats-server");
        let js = jetstream(&nats).await;
        let mut sequences = Vec::new();
        for i in 0..6 {
            let rows = sample_rows("c1", 10 * i..10 * i + 10);
            sequences.push(js.publish("clicks.a".into(), &rows).await.expect("publish"));
            let other = sample_rows("c1", 900..905);
            js.publish("clicks.b".into(), &other)
                .await
                .expect("publish");
            if i == 3 {
                let bad = SampleRows {
                    arrow_ipc: b"not arrow".to_vec(),
                };
                js.publish("clicks.a".into(), &bad).await.expect("publish");
            }
        }
        let work = StreamWork {
            subject: "clicks.a".into(),
            ..work()
        };
        let pipeline = pipeline();
        let (first, first_counters) = (buffers(10_000), Counters::default());
        let ledger = Arc::new(TaskLedger::for_stream(
            "clicks/stream".into(),
            0,
            StreamPosition::default(),
        ));
        let reader = runner(&first, &pipeline, &js, &first_counters);
        let mut ids = tokio::select! {
            _ = reader.read_in_order(0, &work, (0, StreamPosition::default()), &ledger) => panic!("a stream does not end"),
            served = async {
                wait_for_fill(&first, 60).await;
                first.try_pop(25).expect("25 rows")
            } => ids_of(&served),
        };
        let position = ledger.stream_position().expect("a position");
        assert_eq!(
            position,
            StreamPosition {
                sequence: sequences[2],
                rows: 5
            }
        );
        assert_eq!(first_counters.rejected.load(Ordering::Relaxed), 1);

        let (second, second_counters) = (buffers(10_000), Counters::default());
        let ledger = Arc::new(TaskLedger::for_stream("clicks/stream".into(), 25, position));
        let reader = runner(&second, &pipeline, &js, &second_counters);
        let rest = tokio::select! {
            _ = reader.read_in_order(0, &work, (25, position), &ledger) => panic!("a stream does not end"),
            served = async {
                wait_for_fill(&second, 35).await;
                second.try_pop(35).expect("35 rows")
            } => ids_of(&served),
        };
        ids.extend(rest);
        ids.sort_unstable();
        assert_eq!(ids, (0..60).collect::<Vec<_>>(), "every row once");
        assert_eq!(second_counters.rejected.load(Ordering::Relaxed), 1);
        assert_eq!(ledger.served(), 60);
        assert_eq!(
            ledger.stream_position(),
            Some(StreamPosition {
                sequence: sequences[5] + 1,
                rows: 0
            }),
            "everything read is served"
        );
    }

    /// A Job may start before its producer: the runner creates the stream, and what is
    /// published afterwards arrives.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_stream_is_created_and_later_rows_arrive() {
        let nats = NatsServer::start().expect("nats-server");
        let js = connect(&nats).await;
        let (buffers, pipeline, counters) = (buffers(100), pipeline(), Counters::default());
        let (work, ledger) = (work(), Arc::new(TaskLedger::new("clicks/stream".into(), 0)));
        let runner = runner(&buffers, &pipeline, &js, &counters);
        let publish_once_the_stream_exists = async {
            while js
                .publish("clicks.a".into(), &sample_rows("c1", 0..5))
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            collect(&buffers, 5).await
        };
        let ids = tokio::select! {
            _ = runner.read_in_order(0, &work, (0, StreamPosition::default()), &ledger) => panic!("the stream could not be consumed: {:?}", ledger.finished()),
            ids = publish_once_the_stream_exists => ids,
        };
        assert_eq!(ids, vec![0, 1, 2, 3, 4]);
    }
}
