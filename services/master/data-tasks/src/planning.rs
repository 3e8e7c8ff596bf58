//! The planning of one job's data (Primus §4.3.1): which sources its mode reads, the
//! Dataset's streams as plans, its batch windows planned into the job's [`TaskQueue`]
//! (resuming from the queue's cursors after a restart), and its stream bindings.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use primus_proto::v1::{DataTask, JoinWork, StreamWork, data_task};
use primus_spec::dataset::{DataSource, DatasetSpec, StreamOrder};
use primus_spec::job::TrainingMode;

use crate::plan::{self, BatchSource, Catalog, ListingCache, PlanError, PlanOptions, StreamPlan};
use crate::queue::{QueueError, TaskQueue};
use primus_config::PlannerSettings;
use primus_spec::time;

#[derive(Debug, thiserror::Error)]
pub enum PlanningError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("dataset: {0}")]
    Dataset(String),
    #[error(
        "{error} (the store was out of reach for {waited_s} s, master.planner.store_outage_timeout_s)"
    )]
    StoreOutOfReach { error: PlanError, waited_s: u64 },
}

/// Why a Parquet source of a Dataset cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("source `{source_name}`: nothing under prefix {uri}")]
    Missing { source_name: String, uri: String },
    #[error("source `{source_name}`: {error}")]
    Unreadable {
        source_name: String,
        error: PlanError,
    },
}

impl SourceError {
    /// Whether the source's store was out of reach, so that the check may pass later.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unreadable { error, .. } if error.is_transient())
    }
}

/// How soon an out-of-reach Redis or store is tried again (by the planner: or the poll
/// interval, if shorter).
pub const OUTAGE_RETRY: Duration = Duration::from_secs(2);

/// Whether the mode reads batch sources, and stream sources.
pub fn reads(mode: TrainingMode) -> (bool, bool) {
    match mode {
        TrainingMode::Batch => (true, false),
        TrainingMode::Stream => (false, true),
        TrainingMode::BatchThenStream | TrainingMode::Mixture => (true, true),
    }
}

/// Refuses a mode that finds nothing to read in the Dataset: `batch` without a Parquet
/// source would end at once, `stream` without a JetStream source would wait forever.
pub fn check_mode(mode: TrainingMode, dataset: &DatasetSpec) -> Result<(), String> {
    let sources = || dataset.streams.iter().flat_map(|s| &s.sources);
    let has_parquet = sources().any(|s| s.parquet.is_some());
    let has_jetstream = sources().any(DataSource::is_stream);
    let needs = match mode {
        TrainingMode::Batch => (!has_parquet).then_some("a Parquet source"),
        TrainingMode::Stream => (!has_jetstream).then_some("a JetStream source"),
        TrainingMode::BatchThenStream | TrainingMode::Mixture => {
            (!(has_parquet && has_jetstream)).then_some("both a Parquet and a JetStream source")
        }
    };
    match needs {
        None => Ok(()),
        Some(needs) => {
            let name = serde_json::to_value(mode).unwrap_or_default();
            Err(format!(
                "spec.mode {}: needs {needs} in the Dataset",
                name.as_str().unwrap_or_default()
            ))
        }
    }
}

/// Checks once that every Parquet source's prefix holds something: a source pointing at a
/// missing prefix would yield empty windows forever.
pub async fn check_sources<C: Catalog>(
    catalog: &C,
    dataset: &DatasetSpec,
) -> Result<(), SourceError> {
    for source in dataset.streams.iter().flat_map(|s| &s.sources) {
        let Some(parquet) = &source.parquet else {
            continue;
        };
        match catalog.exists(&parquet.uri).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(SourceError::Missing {
                    source_name: source.name.clone(),
                    uri: parquet.uri.clone(),
                });
            }
            Err(error) => {
                return Err(SourceError::Unreadable {
                    source_name: source.name.clone(),
                    error,
                });
            }
        }
    }
    Ok(())
}

/// The batch side of every stream that has Parquet sources, ready for the planner.
pub fn stream_plans(dataset: &DatasetSpec) -> Result<Vec<StreamPlan>, PlanningError> {
    let mut plans = Vec::new();
    let mut starts = Vec::new();
    for stream in &dataset.streams {
        let start = time::parse_window_time(&stream.window.start).ok_or_else(|| {
            PlanningError::Dataset(format!("stream {}: bad window.start", stream.name))
        })?;
        let end = match &stream.window.end {
            Some(end) => Some(time::parse_window_time(end).ok_or_else(|| {
                PlanningError::Dataset(format!("stream {}: bad window.end", stream.name))
            })?),
            None => None,
        };
        starts.push((start, end));
    }
    let epoch = starts.iter().map(|(s, _)| *s).min().unwrap_or(0);
    let total_sources = dataset
        .streams
        .iter()
        .flat_map(|s| &s.sources)
        .filter(|s| s.parquet.is_some())
        .count() as u64;
    let mut first_source_index = 0;
    for (rank, (stream, (start, end))) in dataset.streams.iter().zip(starts).enumerate() {
        let sources: Vec<BatchSource> = stream
            .sources
            .iter()
            .filter_map(|s: &DataSource| {
                Some(BatchSource {
                    name: s.name.clone(),
                    uri: s.parquet.as_ref()?.uri.clone(),
                })
            })
            .collect();
        let count = sources.len() as u64;
        plans.push(StreamPlan {
            name: stream.name.clone(),
            rank: match dataset.order {
                StreamOrder::Sequential => rank as u64,
                StreamOrder::Simultaneous => 0,
            },
            unit: stream.window.unit,
            start,
            end,
            epoch,
            first_source_index,
            total_sources: total_sources.max(1),
            sources,
        });
        first_source_index += count;
    }
    // A stream of JetStream sources only has no batch side: planning it would never end,
    // and a batch-then-stream Job would wait for it forever.
    plans.retain(|plan| !plan.sources.is_empty());
    Ok(plans)
}

/// The stream bindings of every JetStream and joiner source.
pub fn stream_tasks(job: &str, dataset: &DatasetSpec) -> Vec<DataTask> {
    dataset
        .streams
        .iter()
        .flat_map(|s| &s.sources)
        .filter_map(|source| {
            let durable = source.durable(job);
            let work = match (&source.jetstream, &source.join) {
                (Some(js), _) => data_task::Work::Stream(StreamWork {
                    stream: js.stream.clone(),
                    subject: js.subject.clone(),
                    durable,
                }),
                (None, Some(join)) => data_task::Work::Join(JoinWork {
                    stream: join.stream.clone(),
                    features_subject: join.features.clone(),
                    actions_subject: join.actions.clone(),
                    request_id_column: join.request_id.clone(),
                    wait_ms: (join.wait_seconds * 1000.0).round() as u64,
                    memory_rows: join.memory_rows,
                    features_durable: format!("{durable}-features"),
                    actions_durable: format!("{durable}-actions"),
                    negative_sample_rate: dataset.schema.negative_sample_rate,
                }),
                (None, None) => return None,
            };
            Some(DataTask {
                id: format!("{}/stream", source.name),
                job: job.to_owned(),
                source: source.name.clone(),
                work: Some(work),
                ..DataTask::default()
            })
        })
        .collect()
}

/// Plans every window of `stream` that has ended, resuming at the queue's cursor, until
/// the stream's end (bounded) or forever (open-ended, checking every `poll_interval_ms`).
/// Redis out of reach (restarting, a timeout) is waited out, and so is a source's store for
/// up to `store_outage_timeout_s`: each round starts again from the cursor, which moves only
/// with the window's tasks (one script), so nothing is planned twice or skipped.
pub async fn plan_stream<C: Catalog>(
    queue: TaskQueue,
    cache: Arc<ListingCache<C>>,
    job: Arc<str>,
    stream: Arc<StreamPlan>,
    settings: PlannerSettings,
) -> Result<(), PlanningError> {
    let options = PlanOptions {
        target_task_bytes: settings.target_task_bytes,
        parallelism: settings.parallelism,
    };
    let poll = Duration::from_millis(settings.poll_interval_ms.max(100));
    let outage_timeout = Duration::from_secs(settings.store_outage_timeout_s);
    let mut store_out_since: Option<Instant> = None;
    loop {
        let pause = match plan_ended_windows(&queue, &cache, &job, &stream, options).await {
            Ok(true) => return Ok(()),
            Ok(false) => {
                store_out_since = None;
                poll
            }
            Err(PlanningError::Queue(QueueError::Redis(e))) if out_of_reach(&e) => {
                tracing::warn!(job = %job, stream = %stream.name, error = %e, "planning waits for Redis");
                OUTAGE_RETRY.min(poll)
            }
            Err(PlanningError::Plan(error)) if error.is_transient() => {
                let waited = store_out_since.get_or_insert_with(Instant::now).elapsed();
                if waited >= outage_timeout {
                    let waited_s = waited.as_secs();
                    return Err(PlanningError::StoreOutOfReach { error, waited_s });
                }
                tracing::warn!(job = %job, stream = %stream.name, %error, "planning waits for the store");
                OUTAGE_RETRY.min(poll)
            }
            Err(e) => return Err(e),
        };
        tokio::time::sleep(pause).await;
    }
}

/// Whether a Redis error says the server is out of reach (down, slow, restarting) rather
/// than refusing the call.
fn out_of_reach(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
}

/// Plans the windows that ended since the queue's cursor; true once the stream's last
/// window is planned.
async fn plan_ended_windows<C: Catalog>(
    queue: &TaskQueue,
    cache: &Arc<ListingCache<C>>,
    job: &Arc<str>,
    stream: &Arc<StreamPlan>,
    options: PlanOptions,
) -> Result<bool, PlanningError> {
    let step = time::window_seconds(stream.unit);
    let (cursor, planned_all) = queue.cursor(&stream.name).await?;
    if planned_all {
        return Ok(true);
    }
    let from = cursor.unwrap_or(stream.start);
    let ended = (time::unix_ms() / 1000).div_euclid(step) * step;
    let until = stream.end.map_or(ended, |end| end.min(ended));
    let mut windows = std::pin::pin!(plan::plan_windows(
        cache.clone(),
        stream.clone(),
        job.clone(),
        from,
        until,
        options,
    ));
    while let Some(window) = windows.next().await {
        let window = window?;
        let last = stream.end.is_some_and(|end| window.end >= end);
        queue
            .enqueue_window(&stream.name, window.end, last, &window.tasks)
            .await?;
        tracing::debug!(job = %job, stream = %stream.name, start = window.start, tasks = window.tasks.len(), "window planned");
        if last {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dataset(sources: &str) -> DatasetSpec {
        serde_yaml_ng::from_str(&format!(
            "streams: [{{name: s, window: {{unit: hourly, start: \"2026-11-01T00\"}}, sources: [{sources}]}}]\nschema: {{label: label, sparse: [{{name: c1, table: t}}]}}"
        ))
        .expect("dataset")
    }

    #[test]
    fn a_mode_needs_the_sources_it_reads() {
        let parquet = dataset("{name: p, parquet: {uri: /data}}");
        let jetstream = dataset("{name: j, jetstream: {stream: S, subject: s.x}}");
        let join =
            dataset("{name: j, join: {stream: S, features: s.f, actions: s.a, request_id: rid}}");
        let both = dataset(
            "{name: p, parquet: {uri: /data}}, {name: j, jetstream: {stream: S, subject: s.x}}",
        );
        use TrainingMode::*;
        for mode in [Batch, Stream, BatchThenStream, Mixture] {
            assert_eq!(check_mode(mode, &both), Ok(()), "{mode:?}");
        }
        assert_eq!(check_mode(Batch, &parquet), Ok(()));
        assert_eq!(check_mode(Stream, &jetstream), Ok(()));
        assert_eq!(check_mode(Stream, &join), Ok(()));
        assert_eq!(
            check_mode(Batch, &jetstream),
            Err("spec.mode batch: needs a Parquet source in the Dataset".into())
        );
        assert_eq!(
            check_mode(Stream, &parquet),
            Err("spec.mode stream: needs a JetStream source in the Dataset".into())
        );
        assert_eq!(
            check_mode(Mixture, &parquet),
            Err(
                "spec.mode mixture: needs both a Parquet and a JetStream source in the Dataset"
                    .into()
            )
        );
    }

    #[test]
    fn a_join_source_is_one_binding_with_a_durable_per_subject() {
        let tasks = stream_tasks(
            "ctr",
            &dataset(
                "{name: p, parquet: {uri: /data}}, {name: j, join: {stream: S, features: s.f, actions: s.a, request_id: rid, wait_seconds: 1.5}}",
            ),
        );
        assert_eq!(tasks.len(), 1);
        assert_eq!(tasks[0].id, "j/stream");
        let Some(data_task::Work::Join(work)) = &tasks[0].work else {
            panic!("a join binding: {:?}", tasks[0].work)
        };
        assert_eq!(work.wait_ms, 1500);
        assert_eq!(
            (
                work.features_durable.as_str(),
                work.actions_durable.as_str()
            ),
            ("ctr-j-features", "ctr-j-actions")
        );
    }
}
