//! Primus's `rebalance` stream loading (Table 2): in `forward` mode each executor
//! pre-processes only the stream partitions bound to it, so a hot partition lags while the
//! other executors idle. In `rebalance` mode an executor whose own partitions are caught
//! up also pulls raw messages of a partition that is behind from that partition's durable
//! consumer (JetStream hands each message to one puller), pre-processes them and serves
//! them from its own buffer of that source. Messages are acked once buffered, as the
//! holder does, so a helper that dies loses nothing unbuffered either.
//!
//! Rows a helper buffers belong to a ledger of its own that is never reported to the
//! master: a stream binding's offsets are its holder's, and stream sources are not
//! rolled back on restore.

use std::collections::HashMap;
use std::sync::Arc;

use primus_bus::jetstream::Consumer;
use primus_proto::v1::{SampleRows, StreamWork};

use crate::buffer::SourceIndex;
use crate::ledger::TaskLedger;
use crate::stream::{StreamGauges, StreamInputs, StreamRunner};

/// A stream source another executor may hold.
#[derive(Clone)]
pub(crate) struct StreamPartition {
    pub name: String,
    pub buffer: SourceIndex,
    pub work: StreamWork,
}

pub(crate) struct Rebalancer<'a> {
    pub inputs: StreamInputs<'a>,
    pub partitions: Vec<StreamPartition>,
}

/// What a helper keeps per partition it looked at.
struct Helping {
    consumer: Consumer<SampleRows>,
    ledger: Arc<TaskLedger>,
    offset: u64,
}

impl Rebalancer<'_> {
    /// A partition is behind, and this executor's own are caught up, when at least a
    /// full fetch of messages waits undelivered.
    fn behind(&self, pending: u64) -> bool {
        pending >= self.inputs.fetching.messages as u64
    }

    /// Helps until the future is dropped. `gauges` are the executor's per-source stream
    /// gauges; `holds` says whether this executor holds a source's binding.
    pub(crate) async fn run(
        &self,
        gauges: impl Fn(&str) -> Arc<StreamGauges>,
        holds: impl Fn(&str) -> bool,
    ) {
        let mut helping: HashMap<String, Helping> = HashMap::new();
        loop {
            let own_behind = self
                .partitions
                .iter()
                .filter(|p| holds(&p.name))
                .any(|p| self.behind(gauges(&p.name).pending()));
            let mut helped = false;
            if !own_behind {
                for partition in &self.partitions {
                    if holds(&partition.name) {
                        continue;
                    }
                    let gauges = gauges(&partition.name);
                    helped |= self.help(partition, &gauges, &mut helping).await;
                }
            }
            if !helped {
                tokio::time::sleep(self.inputs.fetching.wait).await;
            }
        }
    }

    /// Takes one fetch of `partition` when it is behind; whether it did.
    async fn help(
        &self,
        partition: &StreamPartition,
        gauges: &StreamGauges,
        helping: &mut HashMap<String, Helping>,
    ) -> bool {
        if !helping.contains_key(&partition.name) {
            // Only a partition whose holder opened its consumer: a stream not bound yet
            // (batch-then-stream) is not started early by a helper.
            let Ok(consumer) = self
                .inputs
                .jetstream
                .existing_consumer::<SampleRows>(&partition.work.stream, &partition.work.durable)
                .await
            else {
                return false;
            };
            let ledger = Arc::new(TaskLedger::new(format!("{}/help", partition.name), 0));
            helping.insert(
                partition.name.clone(),
                Helping {
                    consumer,
                    ledger,
                    offset: 0,
                },
            );
        }
        let Some(state) = helping.get_mut(&partition.name) else {
            return false;
        };
        let Ok(backlog) = state.consumer.backlog().await else {
            return false;
        };
        gauges.set_pending(backlog.pending + backlog.ack_pending);
        if !self.behind(backlog.pending) {
            return false;
        }
        let Ok(fetched) = state
            .consumer
            .fetch(self.inputs.fetching.messages, self.inputs.fetching.wait)
            .await
        else {
            return false;
        };
        if state.offset == 0 && !fetched.deliveries.is_empty() {
            tracing::info!(partition = %partition.name, pending = backlog.pending, "helping with a partition that is behind");
        }
        let runner = StreamRunner {
            inputs: self.inputs,
            gauges,
        };
        runner
            .take(
                partition.buffer,
                &partition.work,
                &fetched,
                &state.consumer,
                &state.ledger,
                &mut state.offset,
            )
            .await;
        !fetched.deliveries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use primus_batch::FeaturePipeline;
    use primus_bus::jetstream::JetStream;
    use primus_proto::v1::SourceKind;
    use primus_spec::job::StreamLoading;
    use primus_testkit::NatsServer;

    use super::*;
    use crate::buffer::Buffers;
    use crate::stream::Fetching;
    use crate::stream::tests::{connect, sample_rows};

    const HOT_MESSAGES: u64 = 60;
    const ROWS_PER_MESSAGE: u64 = 40;
    const COLD_ROWS: u64 = 20;

    fn partitions() -> Vec<StreamPartition> {
        ["hot", "b", "c"]
            .iter()
            .enumerate()
            .map(|(buffer, name)| StreamPartition {
                name: (*name).into(),
                buffer,
                work: StreamWork {
                    stream: "FEED".into(),
                    subject: format!("feed.{name}"),
                    durable: format!("job-{name}"),
                },
            })
            .collect()
    }

    /// One simulated executor: all three sources' buffers (64 rows each), its stream
    /// gauges, and how many rows its trainer took.
    struct Executor {
        buffers: Buffers,
        gauges: HashMap<String, Arc<StreamGauges>>,
        rejected: AtomicU64,
        served: AtomicU64,
    }

    impl Executor {
        fn new() -> Self {
            let sources = ["hot", "b", "c"];
            Self {
                buffers: Buffers::new(
                    sources
                        .iter()
                        .map(|s| ((*s).to_owned(), SourceKind::Stream, 1.0))
                        .collect(),
                    64,
                ),
                gauges: sources
                    .iter()
                    .map(|s| ((*s).to_owned(), Arc::default()))
                    .collect(),
                rejected: AtomicU64::new(0),
                served: AtomicU64::new(0),
            }
        }

        /// The executor's lag: its most lagging source's.
        fn lag_seconds(&self, now_ms: i64) -> f64 {
            self.gauges
                .values()
                .map(|g| g.lag_seconds(now_ms))
                .fold(0.0, f64::max)
        }

        /// Holds partition `own`, helps with the others when rebalancing, and serves a
        /// trainer taking up to 16 rows every 20 ms (800 rows/s).
        async fn run(
            &self,
            own: &StreamPartition,
            jetstream: &JetStream,
            pipeline: &FeaturePipeline,
            loading: StreamLoading,
        ) {
            let inputs = StreamInputs {
                buffers: &self.buffers,
                pipeline,
                jetstream,
                fetching: Fetching {
                    messages: 4,
                    wait: Duration::from_millis(100),
                    ack_wait: Duration::from_secs(2),
                },
                rejected: &self.rejected,
            };
            let runner = StreamRunner {
                inputs,
                gauges: &self.gauges[&own.name],
            };
            let ledger = Arc::new(TaskLedger::new(format!("{}/stream", own.name), 0));
            let rebalancer = Rebalancer {
                inputs,
                partitions: partitions(),
            };
            let helping = async {
                match loading {
                    StreamLoading::Rebalance => {
                        rebalancer
                            .run(|s| self.gauges[s].clone(), |s| s == own.name)
                            .await
                    }
                    StreamLoading::Forward => std::future::pending().await,
                }
            };
            let training = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    if let Some(served) = self.buffers.try_pop(16) {
                        self.served
                            .fetch_add(served.batch.rows() as u64, Ordering::Relaxed);
                    }
                }
            };
            tokio::join!(
                runner.run_shared(own.buffer, &own.work, 0, &ledger),
                helping,
                training
            );
        }
    }

    /// A burst on the hot partition, a little on the two others, three executors each
    /// holding one: each executor's lag averaged over the time the hot partition still
    /// had undelivered messages, and the rows each trainer took.
    async fn burst(loading: StreamLoading) -> (Vec<f64>, Vec<u64>) {
        let nats = NatsServer::start().expect("nats-server");
        let js = connect(&nats).await;
        js.ensure_stream("FEED", vec!["feed.>".into()])
            .await
            .expect("stream");
        for i in 0..HOT_MESSAGES {
            let first = i * ROWS_PER_MESSAGE;
            let rows = sample_rows("c1", first..first + ROWS_PER_MESSAGE);
            js.publish("feed.hot".into(), &rows).await.expect("publish");
        }
        for subject in ["feed.b", "feed.c"] {
            let rows = sample_rows("c1", 0..COLD_ROWS);
            js.publish(subject.into(), &rows).await.expect("publish");
        }
        let pipeline = FeaturePipeline::new(&crate::runner::tests::schema());
        let executors = [Executor::new(), Executor::new(), Executor::new()];
        let partitions = partitions();
        let running = futures::future::join_all(
            executors
                .iter()
                .zip(&partitions)
                .map(|(executor, own)| executor.run(own, &js, &pipeline, loading)),
        );
        let sampling = async {
            let mut sums = [0.0; 3];
            let mut samples = 0;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let Ok(hot) = js.existing_consumer::<SampleRows>("FEED", "job-hot").await else {
                    continue;
                };
                if hot.backlog().await.expect("backlog").pending == 0 {
                    break;
                }
                let now_ms = primus_spec::time::unix_ms();
                for (sum, executor) in sums.iter_mut().zip(&executors) {
                    *sum += executor.lag_seconds(now_ms);
                }
                samples += 1;
            }
            let lags: Vec<f64> = sums.iter().map(|s| s / f64::from(samples.max(1))).collect();
            let served = executors
                .iter()
                .map(|e| e.served.load(Ordering::Relaxed))
                .collect();
            (lags, served)
        };
        tokio::select! {
            _ = running => unreachable!("executors run until dropped"),
            result = sampling => result,
        }
    }

    /// Primus Table 2: with one hot partition, `forward` leaves its executor far behind
    /// the others (over 2x the mean lag), while `rebalance` spreads the hot partition's
    /// messages over all three and keeps every executor's lag within 2x of the mean.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rebalance_keeps_every_executor_within_twice_the_mean_lag_and_forward_does_not() {
        let (forward, forward_served) = burst(StreamLoading::Forward).await;
        let (rebalance, rebalance_served) = burst(StreamLoading::Rebalance).await;
        let spread = |lags: &[f64]| {
            let mean = lags.iter().sum::<f64>() / lags.len() as f64;
            lags.iter().fold(0.0, |m: f64, l| m.max(*l)) / mean
        };
        assert!(
            spread(&forward) > 2.0,
            "forward: per-executor lags {forward:?}, rows trained {forward_served:?}"
        );
        assert!(
            spread(&rebalance) <= 2.0,
            "rebalance: per-executor lags {rebalance:?}, rows trained {rebalance_served:?}"
        );
        // The helpers trained hot rows: each took far more than its own 20 cold rows.
        assert!(
            rebalance_served[1..]
                .iter()
                .all(|&rows| rows > 4 * COLD_ROWS),
            "rebalance: rows trained {rebalance_served:?}"
        );
    }
}
