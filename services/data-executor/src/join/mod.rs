//! Online joiner task runner (Monolith §2.2.2): one executor holds a join source's binding
//! and consumes its two subjects through two durable consumers, feature rows on one and
//! action rows (request id + label) on the other. [`table::JoinTable`] pairs them by
//! request id; joined rows, and feature rows whose wait ran out (as negatives), go into
//! the source's serving buffer, negatives at the Dataset's sample rate.
//!
//! A message is acked only once every row of it is buffered (a feature message) or no
//! longer waits (an action message), so an executor that dies loses nothing: JetStream
//! delivers what it held to whoever takes the binding next. Held messages are kept alive
//! with in-progress acks every third of the stream ack wait, and a consumer may hold
//! [`MAX_HELD_MESSAGES`] unacked, so holding messages for the whole join wait is normal,
//! while a dead joiner's messages come back within one ack wait: soon enough to still
//! join in its successor. What a dead joiner had buffered from a message it had not
//! finished is buffered again: the unacked window of a joiner is its wait. Waits run on
//! [`clock::JoinClock`], the streams' own time while a subject has a backlog.

mod clock;
mod spill;
mod table;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use primus_batch::{Minibatch, ipc};
use primus_bus::jetstream::{Consumer, Delivery, Fetched};
use primus_proto::v1::{JoinWork, SampleRows};
use tokio::sync::mpsc;

use crate::buffer::{Chunk, SourceIndex};
use crate::ledger::{ReadEnd, TaskLedger};
use crate::stream::{StreamGauges, StreamInputs};
use clock::JoinClock;
use spill::SpillStore;
use table::{JoinTable, MessageId, NegativeSampling, Output};

#[derive(Debug, thiserror::Error)]
pub(crate) enum JoinError {
    /// A message's rows cannot be joined (the message is refused whole).
    #[error("{0}")]
    Rows(String),
    #[error("joiner spill: {0}")]
    Spill(String),
}

/// Delivered, unacked messages one join consumer may hold: a wait of minutes at hundreds
/// of messages a second.
pub(crate) const MAX_HELD_MESSAGES: i64 = 1_000_000;

/// Spill segments roll over at this size, so drained ones can be deleted.
const SEGMENT_BYTES: u64 = 64 << 20;

/// How often the consumers' backlog is asked for.
const BACKLOG_INTERVAL: Duration = Duration::from_secs(1);

/// A join source's counters, for the executor's metrics.
#[derive(Default)]
pub(crate) struct JoinGauges {
    pub joined_rows: AtomicU64,
    pub negative_rows: AtomicU64,
    pub dropped_actions: AtomicU64,
    pub sampled_out_rows: AtomicU64,
    pub waiting_memory_rows: AtomicU64,
    pub waiting_disk_rows: AtomicU64,
}

impl JoinGauges {
    /// The running totals: cheap, so every round.
    fn record_totals(&self, table: &JoinTable) {
        let totals = table.totals();
        self.joined_rows
            .store(totals.joined_rows, Ordering::Relaxed);
        self.negative_rows
            .store(totals.negative_rows, Ordering::Relaxed);
        self.dropped_actions
            .store(totals.dropped_actions, Ordering::Relaxed);
        self.sampled_out_rows
            .store(totals.sampled_out_rows, Ordering::Relaxed);
    }

    /// The waiting rows: a walk over every held message, so with the backlog check.
    fn record_waiting(&self, table: &JoinTable) {
        let (memory, disk) = table.waiting_rows();
        self.waiting_memory_rows
            .store(memory as u64, Ordering::Relaxed);
        self.waiting_disk_rows.store(disk as u64, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy)]
enum Side {
    Features,
    Actions,
}

pub(crate) struct JoinRunner<'a> {
    pub inputs: StreamInputs<'a>,
    /// Where feature rows beyond the memory budget go (a directory per binding below it).
    pub spill_dir: PathBuf,
    pub gauges: &'a StreamGauges,
    pub join_gauges: &'a JoinGauges,
}

/// The joiner's loop state.
struct Joining<'a> {
    table: JoinTable,
    clock: JoinClock,
    /// Deliveries of the messages the table holds, acked once they are done.
    held: HashMap<MessageId, Delivery<SampleRows>>,
    /// Columns a feature message must carry: the schema's, but the label.
    feature_columns: Vec<String>,
    work: &'a JoinWork,
    offset: u64,
}

impl JoinRunner<'_> {
    /// Joins until the binding is taken back or the future is dropped. Consumers that
    /// cannot be opened, or a spill that fails, fail the task.
    pub(crate) async fn run(
        &self,
        source: SourceIndex,
        work: &JoinWork,
        start_offset: u64,
        ledger: &Arc<TaskLedger>,
    ) {
        if let Err((rows, error)) = self.join(source, work, start_offset, ledger).await {
            tracing::error!(stream = %work.stream, %error, "join source failed");
            ledger.finish_reading(ReadEnd::Failed { rows, error });
        }
    }

    async fn join(
        &self,
        source: SourceIndex,
        work: &JoinWork,
        start_offset: u64,
        ledger: &Arc<TaskLedger>,
    ) -> Result<(), (u64, String)> {
        let failed = |e: String| (start_offset, e);
        let features = self
            .consumer(work, &work.features_subject, &work.features_durable)
            .await
            .map_err(failed)?;
        let actions = self
            .consumer(work, &work.actions_subject, &work.actions_durable)
            .await
            .map_err(failed)?;
        let spill = SpillStore::open(self.spill_dir.join(&work.features_durable), SEGMENT_BYTES)
            .map_err(|e| failed(e.to_string()))?;
        let label = self.inputs.pipeline.columns().swap_remove(0);
        let mut joining = Joining {
            table: JoinTable::new(
                work.request_id_column.clone(),
                label.clone(),
                work.wait_ms,
                usize::try_from(work.memory_rows).unwrap_or(usize::MAX),
                NegativeSampling::new(work.negative_sample_rate),
                spill,
            ),
            clock: JoinClock::default(),
            held: HashMap::new(),
            feature_columns: self
                .inputs
                .pipeline
                .columns()
                .into_iter()
                .filter(|c| *c != label)
                .collect(),
            work,
            offset: start_offset,
        };
        tracing::info!(stream = %work.stream, features = %work.features_subject, actions = %work.actions_subject, "joining");
        let (sender, mut received) = mpsc::channel(2);
        let fetching = async {
            tokio::join!(
                self.fetch_into(&features, Side::Features, sender.clone()),
                self.fetch_into(&actions, Side::Actions, sender),
            )
        };
        let joining_loop = async {
            let tick = self.inputs.fetching.wait.min(Duration::from_millis(200));
            let mut backlog_checked: Option<Instant> = None;
            let mut kept_alive = Instant::now();
            while !ledger.is_taken_back() {
                if backlog_checked.is_none_or(|at| at.elapsed() >= BACKLOG_INTERVAL) {
                    self.check_backlog(&features, &actions).await;
                    self.join_gauges.record_waiting(&joining.table);
                    backlog_checked = Some(Instant::now());
                }
                if kept_alive.elapsed() >= self.inputs.fetching.ack_wait / 3 {
                    keep_alive(&joining.held).await;
                    kept_alive = Instant::now();
                }
                if let Ok(Some((side, fetched))) = tokio::time::timeout(tick, received.recv()).await
                {
                    self.take_in(&mut joining, side, fetched).await;
                }
                joining
                    .table
                    .expire(joining.clock.now(primus_spec::time::unix_ms()));
                let output = joining
                    .table
                    .take_output()
                    .map_err(|e| (joining.offset, e.to_string()))?;
                self.hand_out(&mut joining, source, ledger, &features, output)
                    .await;
                self.join_gauges.record_totals(&joining.table);
            }
            Ok(())
        };
        tokio::select! {
            result = joining_loop => result,
            _ = fetching => Err((start_offset, "the join consumers stopped".into())),
        }
    }

    async fn consumer(
        &self,
        work: &JoinWork,
        subject: &str,
        durable: &str,
    ) -> Result<Consumer<SampleRows>, String> {
        let subjects = vec![work.features_subject.clone(), work.actions_subject.clone()];
        let opened = async {
            self.inputs
                .jetstream
                .ensure_stream(&work.stream, subjects)
                .await?;
            self.inputs
                .jetstream
                .durable_consumer_with_window::<SampleRows>(
                    &work.stream,
                    durable,
                    Some(subject.to_owned()),
                    self.inputs.fetching.ack_wait,
                    MAX_HELD_MESSAGES,
                )
                .await
        };
        opened.await.map_err(|e| {
            format!(
                "JetStream stream {:?}, subject {subject:?}: {e}",
                work.stream
            )
        })
    }

    /// Fetches from one consumer forever, handing what arrives to the joining loop.
    async fn fetch_into(
        &self,
        consumer: &Consumer<SampleRows>,
        side: Side,
        sender: mpsc::Sender<(Side, Fetched<SampleRows>)>,
    ) {
        loop {
            match consumer
                .fetch(self.inputs.fetching.messages, self.inputs.fetching.wait)
                .await
            {
                // An empty fetch goes to the loop too: it says the subject is read to
                // its end, after what this loop sent before it.
                Ok(fetched) => {
                    if sender.send((side, fetched)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    // NATS reconnects on its own; what was delivered and not acked comes back.
                    tracing::warn!(error = %e, "fetching for the joiner");
                    tokio::time::sleep(self.inputs.fetching.wait).await;
                }
            }
        }
    }

    async fn check_backlog(&self, features: &Consumer<SampleRows>, actions: &Consumer<SampleRows>) {
        // Held messages are the join's wait, not lag: only undelivered ones count.
        if let (Ok(f), Ok(a)) = (features.backlog().await, actions.backlog().await) {
            self.gauges.set_pending(f.pending + a.pending);
        }
    }

    async fn take_in(&self, joining: &mut Joining<'_>, side: Side, fetched: Fetched<SampleRows>) {
        if fetched.deliveries.is_empty() && fetched.rejected.is_empty() {
            joining.clock.read_to_end(side);
            return;
        }
        for error in &fetched.rejected {
            tracing::warn!(stream = %joining.work.stream, %error, "message terminated: not SampleRows");
            self.inputs.rejected.fetch_add(1, Ordering::Relaxed);
        }
        for delivery in fetched.deliveries {
            let (Ok(message), Ok(stored_ms), Ok(pending)) = (
                delivery.sequence(),
                delivery.stored_unix_ms(),
                delivery.pending(),
            ) else {
                self.reject(joining.work, &delivery, "no stream sequence or time")
                    .await;
                continue;
            };
            joining.clock.took(side, stored_ms, pending);
            if joining.table.holds(message) {
                // Redelivered while held: the newest delivery is the one to ack.
                joining.held.insert(message, delivery);
                continue;
            }
            let added = match side {
                Side::Features => feature_rows(&delivery, &joining.feature_columns)
                    .and_then(|rows| joining.table.add_features(message, stored_ms, rows)),
                Side::Actions => decode(&delivery)
                    .and_then(|rows| joining.table.add_actions(message, stored_ms, &rows)),
            };
            match added {
                Ok(()) => {
                    self.gauges.taken_in(stored_ms);
                    joining.held.insert(message, delivery);
                }
                Err(error) => {
                    self.reject(joining.work, &delivery, &error.to_string())
                        .await
                }
            }
        }
    }

    /// Buffers the output's rows, then acks the messages it finished.
    async fn hand_out(
        &self,
        joining: &mut Joining<'_>,
        source: SourceIndex,
        ledger: &Arc<TaskLedger>,
        features: &Consumer<SampleRows>,
        output: Output,
    ) {
        let mut parts = Vec::new();
        for rows in &output.batches {
            match self.inputs.pipeline.minibatch(rows) {
                Ok(batch) => parts.push(batch),
                Err(error) => {
                    // The columns were there; their values were not usable. Counted, logged.
                    tracing::warn!(stream = %joining.work.stream, rows = rows.num_rows(), %error, "joined rows dropped: they do not fit the schema");
                    self.inputs.rejected.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let batch = match parts.len() {
            0 => None,
            1 => parts.pop(),
            _ => Minibatch::concat(&parts)
                .inspect_err(|e| tracing::warn!(error = %e, "joining minibatches"))
                .ok(),
        };
        if let Some(batch) = batch {
            let rows = batch.rows() as u64;
            let chunk = Chunk {
                batch,
                task: ledger.clone(),
                first_offset: joining.offset,
            };
            let _writing = self.inputs.buffers.writer(source);
            self.buffer(source, chunk, features, &joining.held).await;
            joining.offset += rows;
        }
        for message in output.done {
            if let Some(delivery) = joining.held.remove(&message)
                && let Err(e) = delivery.ack().await
            {
                // Handled but unacked: delivered again (its rows at most once more).
                tracing::warn!(stream = %joining.work.stream, error = %e, "acking a joined message");
            }
        }
    }

    /// Pushes `chunk`, keeping every held message alive while a full buffer makes it wait.
    async fn buffer(
        &self,
        source: SourceIndex,
        chunk: Chunk,
        features: &Consumer<SampleRows>,
        held: &HashMap<MessageId, Delivery<SampleRows>>,
    ) {
        let interval = self.inputs.fetching.ack_wait / 3;
        let keep_alive = move || async move {
            keep_alive(held).await;
            if let Ok(backlog) = features.backlog().await {
                self.gauges.set_pending(backlog.pending);
            }
        };
        self.inputs
            .buffers
            .push_ticking(source, chunk, interval, keep_alive)
            .await;
    }

    async fn reject(&self, work: &JoinWork, delivery: &Delivery<SampleRows>, error: &str) {
        tracing::warn!(
            stream = %work.stream,
            subject = %delivery.received.subject,
            sequence = delivery.sequence().unwrap_or_default(),
            %error,
            "message terminated: its rows cannot be joined"
        );
        self.inputs.rejected.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = delivery.reject().await {
            tracing::warn!(stream = %work.stream, error = %e, "terminating a message");
        }
    }
}

/// Restarts the ack-wait clock of every held message.
async fn keep_alive(held: &HashMap<MessageId, Delivery<SampleRows>>) {
    for delivery in held.values() {
        // A lost keep-alive only risks a redelivery, which the table ignores while it
        // holds the message.
        let _ = delivery.in_progress().await;
    }
}

fn decode(delivery: &Delivery<SampleRows>) -> Result<RecordBatch, JoinError> {
    ipc::decode_rows(&delivery.received.message.arrow_ipc)
        .map_err(|e| JoinError::Rows(format!("not Arrow IPC rows: {e}")))
}

/// A feature message's rows, refused when a column the schema needs is missing.
fn feature_rows(
    delivery: &Delivery<SampleRows>,
    columns: &[String],
) -> Result<RecordBatch, JoinError> {
    let rows = decode(delivery)?;
    let missing: Vec<&str> = columns
        .iter()
        .filter(|c| rows.column_by_name(c).is_none())
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(JoinError::Rows(format!(
            "feature rows lack column(s) {missing:?} of the Dataset's schema"
        )));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow_array::{ArrayRef, UInt64Array};
    use primus_batch::FeaturePipeline;
    use primus_bus::jetstream::JetStream;
    use primus_proto::v1::SourceKind;
    use primus_testkit::NatsServer;

    use super::*;
    use crate::buffer::Buffers;
    use crate::stream::tests::{connect, ids_by_key, quick_inputs};

    const STREAM: &str = "LOG";

    fn work(wait_ms: u64, memory_rows: u64) -> JoinWork {
        JoinWork {
            stream: STREAM.into(),
            features_subject: "log.features".into(),
            actions_subject: "log.actions".into(),
            request_id_column: "rid".into(),
            wait_ms,
            memory_rows,
            features_durable: "job-log-features".into(),
            actions_durable: "job-log-actions".into(),
            negative_sample_rate: None,
        }
    }

    /// Feature rows of request ids `rids`, each with feature c1 = its request id.
    fn features(rids: &[u64]) -> SampleRows {
        let ids: ArrayRef = Arc::new(UInt64Array::from(rids.to_vec()));
        let rows = RecordBatch::try_from_iter([("rid", ids.clone()), ("c1", ids)]).expect("rows");
        SampleRows {
            arrow_ipc: ipc::encode_rows(&rows).expect("encode"),
        }
    }

    /// Action rows: every request id in `rids` with label 1.
    fn clicks(rids: &[u64]) -> SampleRows {
        let ids: ArrayRef = Arc::new(UInt64Array::from(rids.to_vec()));
        let labels: ArrayRef = Arc::new(UInt64Array::from(vec![1; rids.len()]));
        let rows = RecordBatch::try_from_iter([("rid", ids), ("label", labels)]).expect("rows");
        SampleRows {
            arrow_ipc: ipc::encode_rows(&rows).expect("encode"),
        }
    }

    struct Source {
        buffers: Buffers,
        rejected: AtomicU64,
        gauges: StreamGauges,
        join_gauges: JoinGauges,
        spill: tempfile::TempDir,
    }

    impl Source {
        fn new() -> Self {
            Self {
                buffers: Buffers::new(vec![("log".into(), SourceKind::Stream, 1.0)], 10_000),
                rejected: AtomicU64::new(0),
                gauges: StreamGauges::default(),
                join_gauges: JoinGauges::default(),
                spill: tempfile::tempdir().expect("tempdir"),
            }
        }

        fn runner<'a>(
            &'a self,
            pipeline: &'a FeaturePipeline,
            jetstream: &'a JetStream,
        ) -> JoinRunner<'a> {
            JoinRunner {
                inputs: quick_inputs(&self.buffers, pipeline, jetstream, &self.rejected),
                spill_dir: self.spill.path().to_owned(),
                gauges: &self.gauges,
                join_gauges: &self.join_gauges,
            }
        }

        /// Request id -> label of served rows until `n` arrived (or 20 s passed), failing
        /// on a row served twice.
        async fn collect(&self, n: usize) -> BTreeMap<u64, f32> {
            let by_key = ids_by_key(0..1000);
            let mut rows = BTreeMap::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while rows.len() < n && tokio::time::Instant::now() < deadline {
                match self.buffers.try_pop(1000) {
                    Some(served) => {
                        let kjt = served.batch.to_kjt().expect("kjt");
                        let keys = &kjt.features[0].values;
                        for (key, label) in keys.iter().zip(&served.batch.labels) {
                            let rid = by_key[key];
                            assert!(rows.insert(rid, *label).is_none(), "row {rid} twice");
                        }
                    }
                    None => self.buffers.wait_for_rows().await,
                }
            }
            rows
        }
    }

    /// A NATS server holding stream `LOG` over `log.>`, and a JetStream context on it.
    async fn log_stream() -> (NatsServer, JetStream) {
        let nats = NatsServer::start().expect("nats-server");
        let js = connect(&nats).await;
        js.ensure_stream(STREAM, vec!["log.>".into()])
            .await
            .expect("stream");
        (nats, js)
    }

    async fn publish(js: &JetStream, subject: &str, message: &SampleRows) {
        js.publish(subject.into(), message).await.expect("publish");
    }

    /// Waits until neither consumer has anything delivered and unacked (or 10 s passed).
    async fn all_acked(js: &JetStream, work: &JoinWork) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            let mut held = 0;
            for durable in [&work.features_durable, &work.actions_durable] {
                let consumer = js
                    .durable_consumer::<SampleRows>(STREAM, durable, None, Duration::from_secs(1))
                    .await
                    .expect("consumer");
                let backlog = consumer.backlog().await.expect("backlog");
                held += backlog.pending + backlog.ack_pending;
            }
            if held == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Actions before and after their features, features that never get one (negatives
    /// after the wait), actions without features (dropped), feature rows spilled to disk
    /// (a memory budget of 4 rows): every feature row is served once, with its label.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn out_of_order_features_and_actions_join_once_and_the_rest_time_out() {
        let (_nats, js) = log_stream().await;
        publish(&js, "log.actions", &clicks(&[0, 1, 2, 100])).await;
        for first in (0..20).step_by(4) {
            let rids: Vec<u64> = (first..first + 4).collect();
            publish(&js, "log.features", &features(&rids)).await;
        }
        publish(&js, "log.actions", &clicks(&[3, 4, 5, 6, 7, 8, 101])).await;
        publish(&js, "log.actions", &clicks(&[9, 10, 11, 102])).await;

        let pipeline = FeaturePipeline::new(&crate::runner::tests::schema());
        let source = Source::new();
        let work = work(1500, 4);
        let ledger = Arc::new(TaskLedger::new("log/stream".into(), 0));
        let runner = source.runner(&pipeline, &js);
        let (rows, acked) = tokio::select! {
            _ = runner.run(0, &work, 0, &ledger) => panic!("a join does not end: {:?}", ledger.finished()),
            rows = async {
                let rows = source.collect(20).await;
                (rows, all_acked(&js, &work).await)
            } => rows,
        };
        let expected: BTreeMap<u64, f32> = (0..20)
            .map(|rid| (rid, if rid < 12 { 1.0 } else { 0.0 }))
            .collect();
        assert_eq!(
            rows, expected,
            "clicked rows positive, the rest negative, each once"
        );
        assert!(acked, "every message acked once handled");
        let gauge = |g: &AtomicU64| g.load(Ordering::Relaxed);
        let gauges = &source.join_gauges;
        assert_eq!(
            (
                gauge(&gauges.joined_rows),
                gauge(&gauges.negative_rows),
                gauge(&gauges.dropped_actions)
            ),
            (12, 8, 3)
        );
        assert_eq!(gauge(&source.rejected), 0);
    }

    /// A joiner started long after its subjects were published (a backlog older than the
    /// wait) pairs the rows as they were published: the clicked ones join, the rest time
    /// out once both subjects are read past their wait (measured on the wall clock, every
    /// row would time out as it is taken in).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backlog_older_than_the_wait_joins_as_it_was_published() {
        let (_nats, js) = log_stream().await;
        for first in (0..20).step_by(4) {
            let rids: Vec<u64> = (first..first + 4).collect();
            publish(&js, "log.features", &features(&rids)).await;
            let clicked: Vec<u64> = rids.into_iter().filter(|r| r % 2 == 0).collect();
            publish(&js, "log.actions", &clicks(&clicked)).await;
        }
        let work = work(1000, 100);
        tokio::time::sleep(Duration::from_millis(2500)).await;

        let pipeline = FeaturePipeline::new(&crate::runner::tests::schema());
        let source = Source::new();
        let ledger = Arc::new(TaskLedger::new("log/stream".into(), 0));
        let runner = source.runner(&pipeline, &js);
        let rows = tokio::select! {
            _ = runner.run(0, &work, 0, &ledger) => panic!("a join does not end: {:?}", ledger.finished()),
            rows = source.collect(20) => rows,
        };
        let expected: BTreeMap<u64, f32> = (0..20)
            .map(|rid| (rid, if rid % 2 == 0 { 1.0 } else { 0.0 }))
            .collect();
        assert_eq!(rows, expected, "the clicked rows positive, each row once");
    }

    /// A joiner that dies holds messages: its successor gets them within an ack wait,
    /// joins them with actions that arrived meanwhile, and what the first one served
    /// (finished messages, acked) is not served again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_joiners_held_messages_join_in_its_successor_and_nothing_twice() {
        let (_nats, js) = log_stream().await;
        publish(&js, "log.actions", &clicks(&[0, 1])).await;
        for rid in 0..6 {
            publish(&js, "log.features", &features(&[rid])).await;
        }
        let pipeline = FeaturePipeline::new(&crate::runner::tests::schema());
        let work = work(4000, 100);
        let (first, second) = (Source::new(), Source::new());
        let first_ledger = Arc::new(TaskLedger::new("log/stream".into(), 0));
        let first_runner = first.runner(&pipeline, &js);
        let mut served = tokio::select! {
            _ = first_runner.run(0, &work, 0, &first_ledger) => panic!("a join does not end"),
            rows = async {
                let rows = first.collect(2).await;
                // Its acks of the two finished messages go out.
                tokio::time::sleep(Duration::from_millis(300)).await;
                rows
            } => rows,
        };
        assert_eq!(served, BTreeMap::from([(0, 1.0), (1, 1.0)]));

        // The first joiner is gone, holding features 2..6; clicks on 2 and 3 arrive.
        publish(&js, "log.actions", &clicks(&[2, 3])).await;
        let second_ledger = Arc::new(TaskLedger::new("log/stream".into(), 0));
        let second_runner = second.runner(&pipeline, &js);
        let rest = tokio::select! {
            _ = second_runner.run(0, &work, 0, &second_ledger) => panic!("a join does not end"),
            rows = second.collect(4) => rows,
        };
        for (rid, label) in rest {
            assert!(
                served.insert(rid, label).is_none(),
                "row {rid} served twice"
            );
        }
        assert_eq!(
            served,
            BTreeMap::from([(0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0), (4, 0.0), (5, 0.0)])
        );
    }
}
