//! The data task planner: Primus's data task graph generation (DTGG, §4.2).
//!
//! For each data stream, *timer ops* are its windows (up to a bound, which moves forward
//! for open-ended streams); each window runs one *source op* per batch source (the files of
//! the window's own partition, `date=D` or `date=D/hour=H`, from a listing cache that every
//! stream naming the source shares: fused source ops and cached listings); a *joiner*
//! interleaves the sources' tasks of the window; the *sink* is the ordered stream
//! [`plan_windows`] returns: windows are generated in parallel (one tokio task each,
//! `parallelism` at a time) but released strictly in time order. A window lists only its
//! own partition, so windows never wait on each other's listings.
//!
//! A batch task is one source in one window: a run of consecutive files totalling about
//! `target_task_bytes`, or one byte split of a larger file.

mod catalog;
use primus_spec::time;

use std::sync::Arc;

use futures::{Stream, StreamExt};
use primus_proto::v1::{BatchWork, DataTask, TaskFile, data_task};
use primus_spec::dataset::WindowUnit;

pub use catalog::{Catalog, FileEntry, ListingCache, StoreCatalog};

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Storage(#[from] primus_storage::StorageError),
    #[error(
        "window {partition} of source `{source_name}` yields {tasks} tasks; at most {max} fit one window (raise planner.target_task_bytes)"
    )]
    TooManyTasks {
        source_name: String,
        partition: String,
        tasks: usize,
        max: usize,
    },
    #[error("a planner task stopped: {0}")]
    Join(String),
}

impl PlanError {
    /// Whether the store was out of reach or failed on its side, so that the same listing
    /// may succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Storage(e) if e.is_transient())
    }
}

/// How the planner cuts and paces work.
#[derive(Debug, Clone, Copy)]
pub struct PlanOptions {
    /// Files are grouped (and large files split) into tasks of about this many bytes.
    pub target_task_bytes: u64,
    /// Windows generated at once.
    pub parallelism: usize,
}

/// A batch source of a stream.
#[derive(Debug, Clone)]
pub struct BatchSource {
    pub name: String,
    pub uri: String,
}

/// One data stream's batch side, as the planner needs it.
#[derive(Debug, Clone)]
pub struct StreamPlan {
    pub name: String,
    /// Streams served one after another get increasing ranks; simultaneous streams share one.
    pub rank: u64,
    pub unit: WindowUnit,
    /// First window start of the stream (unix seconds).
    pub start: i64,
    /// End of the last window (exclusive); `None` for open-ended streams.
    pub end: Option<i64>,
    /// Start of the earliest window of the whole dataset: queue orders count hours from it.
    pub epoch: i64,
    /// Position of each source among all of the dataset's batch sources, and their count,
    /// so simultaneous streams interleave without order collisions.
    pub first_source_index: u64,
    pub total_sources: u64,
    pub sources: Vec<BatchSource>,
}

/// Bits of a queue order: `rank << 43 | hours since epoch << 24 | position in window`.
const POSITION_BITS: u32 = 24;
const HOUR_BITS: u32 = 19;
pub const MAX_TASKS_PER_WINDOW: usize = 1 << POSITION_BITS;
/// `order / ORDER_WINDOW_DIVISOR` is the window key (rank and hour) of a queue order;
/// assignment throttling compares these.
pub const ORDER_WINDOW_DIVISOR: u64 = 1 << POSITION_BITS;

/// A task and its place in the queue (ascending order = serving order).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTask {
    pub order: u64,
    pub task: DataTask,
}

/// Every task of one window of one stream.
#[derive(Debug, Clone)]
pub struct WindowTasks {
    pub stream: String,
    pub start: i64,
    pub end: i64,
    pub tasks: Vec<PlannedTask>,
    pub files: u64,
    pub bytes: u64,
}

/// The windows of `stream` starting in `[from, until)`, in time order.
pub fn plan_windows<C: Catalog>(
    cache: Arc<ListingCache<C>>,
    stream: Arc<StreamPlan>,
    job: Arc<str>,
    from: i64,
    until: i64,
    options: PlanOptions,
) -> impl Stream<Item = Result<WindowTasks, PlanError>> + Send {
    let step = time::window_seconds(stream.unit);
    let starts = (from..until).step_by(step as usize);
    futures::stream::iter(starts)
        .map(move |start| {
            tokio::spawn(plan_window(
                cache.clone(),
                stream.clone(),
                job.clone(),
                start,
                options,
            ))
        })
        .buffered(options.parallelism.max(1))
        .map(|joined| joined.map_err(|e| PlanError::Join(e.to_string()))?)
}

async fn plan_window<C: Catalog>(
    cache: Arc<ListingCache<C>>,
    stream: Arc<StreamPlan>,
    job: Arc<str>,
    start: i64,
    options: PlanOptions,
) -> Result<WindowTasks, PlanError> {
    let end = start + time::window_seconds(stream.unit);
    let partition = time::partition(stream.unit, start);
    let hours = u64::try_from((start - stream.epoch) / time::HOUR).unwrap_or(0);
    let window_key = (stream.rank << HOUR_BITS | hours) << POSITION_BITS;
    let mut window = WindowTasks {
        stream: stream.name.clone(),
        start,
        end,
        tasks: Vec::new(),
        files: 0,
        bytes: 0,
    };
    for (i, source) in stream.sources.iter().enumerate() {
        let listing = cache.partition(&source.uri, &partition).await?;
        let dir = format!("{}/{partition}", source.uri.trim_end_matches('/'));
        let groups = group_files(&listing, options.target_task_bytes);
        let per_source = groups.len();
        if per_source * stream.total_sources as usize > MAX_TASKS_PER_WINDOW {
            return Err(PlanError::TooManyTasks {
                source_name: source.name.clone(),
                partition,
                tasks: per_source,
                max: MAX_TASKS_PER_WINDOW / stream.total_sources as usize,
            });
        }
        let source_index = stream.first_source_index + i as u64;
        for (k, files) in groups.into_iter().enumerate() {
            window.files += files.len() as u64;
            window.bytes += files.iter().map(task_file_bytes).sum::<u64>();
            let task = DataTask {
                id: format!("{}/{start}/{k}", source.name),
                job: job.to_string(),
                source: source.name.clone(),
                window_start_unix_s: start,
                window_end_unix_s: end,
                work: Some(data_task::Work::Batch(BatchWork {
                    dir: dir.clone(),
                    files,
                })),
                start_offset: 0,
                attempt: 0,
                stream_position: None,
            };
            // Sources interleave inside a window so every source is served from its start.
            let position = k as u64 * stream.total_sources + source_index;
            window.tasks.push(PlannedTask {
                order: window_key | position,
                task,
            });
        }
    }
    window.tasks.sort_unstable_by_key(|t| t.order);
    Ok(window)
}

/// Hidden files and markers (`_SUCCESS`, `.crc`) are not data.
fn is_data_file(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    !(base.is_empty() || base.starts_with('_') || base.starts_with('.'))
}

/// Bytes a batch task reads (0 for a stream binding).
pub fn task_bytes(task: &DataTask) -> u64 {
    match &task.work {
        Some(data_task::Work::Batch(batch)) => batch.files.iter().map(task_file_bytes).sum(),
        _ => 0,
    }
}

fn task_file_bytes(file: &TaskFile) -> u64 {
    if file.split_end > 0 {
        file.split_end - file.split_start
    } else {
        file.size_bytes
    }
}

/// Consecutive files up to `target` bytes per task; a file larger than `target` is cut into
/// byte splits of its own. Names are relative to the window's partition directory.
fn group_files(files: &[FileEntry], target: u64) -> Vec<Vec<TaskFile>> {
    let target = target.max(1);
    let mut groups = Vec::new();
    let mut current: Vec<TaskFile> = Vec::new();
    let mut current_bytes = 0u64;
    for file in files.iter().filter(|f| is_data_file(&f.name)) {
        let name = file.name.clone();
        if file.size > target {
            let mut split_start = 0;
            while split_start < file.size {
                let split_end = (split_start + target).min(file.size);
                groups.push(vec![TaskFile {
                    name: name.clone(),
                    size_bytes: file.size,
                    split_start,
                    split_end,
                }]);
                split_start = split_end;
            }
            continue;
        }
        current_bytes += file.size;
        current.push(TaskFile {
            name,
            size_bytes: file.size,
            split_start: 0,
            split_end: 0,
        });
        if current_bytes >= target {
            groups.push(std::mem::take(&mut current));
            current_bytes = 0;
        }
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, size: u64) -> FileEntry {
        FileEntry {
            name: name.into(),
            size,
        }
    }

    #[test]
    fn small_files_group_and_large_files_split() {
        let files = [
            entry("a.parquet", 40),
            entry("b.parquet", 70),
            entry("_SUCCESS", 0),
            entry("c.parquet", 250),
            entry("sub/.d.crc", 1),
            entry("d.parquet", 10),
        ];
        let groups = group_files(&files, 100);
        let shape: Vec<Vec<(&str, u64, u64)>> = groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|f| (f.name.as_str(), f.split_start, f.split_end))
                    .collect()
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                vec![("a.parquet", 0, 0), ("b.parquet", 0, 0)],
                vec![("c.parquet", 0, 100)],
                vec![("c.parquet", 100, 200)],
                vec![("c.parquet", 200, 250)],
                vec![("d.parquet", 0, 0)],
            ]
        );
    }
}
