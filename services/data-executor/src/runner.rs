//! Batch task runner: streams a task's Parquet files (only the schema's columns, only the
//! row groups of the task's byte split) through the feature pipeline into the source's
//! serving buffer, from the task's start offset on. A store that cannot be reached is
//! waited for: the read starts again, with backoff, from the rows already served.

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use primus_batch::FeaturePipeline;
use primus_config::StorageSettings;
use primus_proto::v1::{BatchWork, TaskFile};
use primus_storage::parquet::{ReadOptions, metadata, read};
use primus_storage::{Location, ObjectPath, StorageError};
use tokio::time::Instant;

use crate::buffer::{Buffers, Chunk, SourceIndex};
use crate::ledger::{ReadEnd, TaskLedger};

pub(crate) struct BatchRunner<'a> {
    pub buffers: &'a Buffers,
    pub pipeline: &'a FeaturePipeline,
    pub storage: &'a StorageSettings,
    pub read_batch_rows: usize,
    /// Injected before each read (`data.read_delay_ms`, tests and benchmarks only).
    pub read_delay: Duration,
    /// How long an unreachable store is waited for (`data.storage_retry_ms`).
    pub storage_retry: Duration,
}

/// Longest pause between two attempts to reach the store.
const MOST_BACKOFF: Duration = Duration::from_secs(5);

/// Why a task's read stopped.
struct ReadError {
    message: String,
    /// The store could not be reached: reading again later may succeed.
    transient: bool,
}

impl From<StorageError> for ReadError {
    fn from(error: StorageError) -> Self {
        Self {
            transient: error.is_transient(),
            message: error.to_string(),
        }
    }
}

impl ReadError {
    fn permanent(message: String) -> Self {
        Self {
            message,
            transient: false,
        }
    }
}

/// Row groups of `file` whose first byte lies in its split (all when the split is 0..0).
fn row_groups(meta: &parquet::file::metadata::ParquetMetaData, file: &TaskFile) -> Vec<usize> {
    (0..meta.num_row_groups())
        .filter(|&i| {
            let group = meta.row_group(i);
            let start = (0..group.num_columns())
                .map(|c| group.column(c).byte_range().0)
                .min()
                .unwrap_or(0);
            file.split_end == 0 || (file.split_start..file.split_end).contains(&start)
        })
        .collect()
}

impl BatchRunner<'_> {
    /// Reads the whole task; records on the ledger how reading ended.
    pub(crate) async fn run(
        &self,
        source: SourceIndex,
        work: &BatchWork,
        start_offset: u64,
        ledger: &Arc<TaskLedger>,
    ) {
        let _writing = self.buffers.writer(source);
        let mut from = start_offset;
        let mut backoff = Duration::from_millis(100);
        let mut give_up = Instant::now() + self.storage_retry;
        let end = loop {
            let mut offset = 0u64;
            let read = self
                .read_files(source, work, from, ledger, &mut offset)
                .await;
            let rows = offset.max(from);
            match read {
                Ok(()) => break ReadEnd::Complete { rows },
                Err(error) if error.transient && !ledger.is_taken_back() => {
                    if rows > from {
                        // Rows came through since the last failure: a new outage.
                        give_up = Instant::now() + self.storage_retry;
                        backoff = Duration::from_millis(100);
                    }
                    if Instant::now() + backoff > give_up {
                        break ReadEnd::Failed {
                            rows,
                            error: format!(
                                "{} (still failing after {} s of retries: data.storage_retry_ms)",
                                error.message,
                                self.storage_retry.as_secs()
                            ),
                        };
                    }
                    tracing::warn!(task = %ledger.id, error = %error.message, row = rows, "the store is unreachable; reading again from the rows served");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MOST_BACKOFF);
                    from = rows;
                }
                Err(error) => {
                    break ReadEnd::Failed {
                        rows,
                        error: error.message,
                    };
                }
            }
        };
        ledger.finish_reading(end);
    }

    async fn read_files(
        &self,
        source: SourceIndex,
        work: &BatchWork,
        start_offset: u64,
        ledger: &Arc<TaskLedger>,
        offset: &mut u64,
    ) -> Result<(), ReadError> {
        let location = primus_storage::open(&work.dir, self.storage)?;
        for file in &work.files {
            if ledger.is_taken_back() {
                return Ok(());
            }
            let path = location.path(&file.name);
            // Storage errors name the file's URL already; the others get it here.
            self.read_file(&location, &path, file, source, start_offset, ledger, offset)
                .await?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn read_file(
        &self,
        location: &Location,
        path: &ObjectPath,
        file: &TaskFile,
        source: SourceIndex,
        start_offset: u64,
        ledger: &Arc<TaskLedger>,
        offset: &mut u64,
    ) -> Result<(), ReadError> {
        let meta = metadata(location, path).await?;
        let groups = row_groups(&meta, file);
        let (Some(&first), Some(&last)) = (groups.first(), groups.last()) else {
            return Ok(());
        };
        let rows_in_split: u64 = groups
            .iter()
            .map(|&g| meta.row_group(g).num_rows().max(0) as u64)
            .sum();
        if *offset + rows_in_split <= start_offset {
            // An earlier attempt served all of this file's split: skip it unread.
            *offset += rows_in_split;
            return Ok(());
        }
        let options = ReadOptions {
            columns: Some(self.pipeline.columns()),
            row_groups: Some(first..last + 1),
            batch_size: self.read_batch_rows,
        };
        let mut records = std::pin::pin!(read(location, path, &options).await?);
        loop {
            if !self.read_delay.is_zero() {
                tokio::time::sleep(self.read_delay).await;
            }
            if ledger.is_taken_back() {
                // Another executor continues it from the rows served here.
                return Ok(());
            }
            let Some(record) = records.try_next().await? else {
                break;
            };
            let first_offset = *offset;
            let next = first_offset + record.num_rows() as u64;
            if next > start_offset {
                let skip = start_offset.saturating_sub(first_offset) as usize;
                let record = record.slice(skip, record.num_rows() - skip);
                let batch = self
                    .pipeline
                    .minibatch(&record)
                    .map_err(|e| ReadError::permanent(format!("{}: {e}", location.url_of(path))))?;
                let chunk = Chunk {
                    batch,
                    task: ledger.clone(),
                    first_offset: first_offset + skip as u64,
                };
                self.buffers.push(source, chunk).await;
            }
            // Counted once buffered: a failed read ends at the rows that were.
            *offset = next;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Float64Array, RecordBatch, UInt64Array};
    use primus_proto::v1::SourceKind;
    use primus_spec::dataset::{FeatureSchema, SparseFeature};

    use super::*;

    /// Label `label`, one sparse feature `c1` in table `t` (shared by the runners' tests).
    pub(crate) fn schema() -> FeatureSchema {
        FeatureSchema {
            label: "label".into(),
            negative_sample_rate: None,
            targets: Vec::new(),
            dense: vec![],
            sparse: vec![SparseFeature {
                name: "c1".into(),
                table: "t".into(),
                multi_hot: false,
                dedup_group: None,
                sequence: None,
                same_ids_as: None,
            }],
        }
    }

    async fn write(dir: &std::path::Path, name: &str, columns: Vec<(&str, ArrayRef)>) {
        let location = primus_storage::open(dir.to_str().expect("utf-8"), &Default::default())
            .expect("location");
        let batch = RecordBatch::try_from_iter(columns).expect("batch");
        primus_storage::parquet::write(
            &location,
            &location.path(name),
            batch.schema(),
            [batch],
            None,
        )
        .await
        .expect("write");
    }

    fn file(name: &str) -> TaskFile {
        TaskFile {
            name: name.into(),
            ..Default::default()
        }
    }

    fn runner<'a>(buffers: &'a Buffers, pipeline: &'a FeaturePipeline) -> BatchRunner<'a> {
        BatchRunner {
            buffers,
            pipeline,
            storage: &STORAGE,
            read_batch_rows: 7,
            read_delay: Duration::ZERO,
            storage_retry: Duration::from_secs(1),
        }
    }

    static STORAGE: std::sync::LazyLock<StorageSettings> =
        std::sync::LazyLock::new(StorageSettings::default);

    /// Reads one task of `files` from `start_offset`; returns the served rows' c1 keys and
    /// the task's error ("" on success).
    async fn read_task(
        dir: &std::path::Path,
        files: &[&str],
        start_offset: u64,
    ) -> (Vec<u64>, String) {
        let buffers = Buffers::new(vec![("s".into(), SourceKind::Batch, 1.0)], 10_000);
        let pipeline = FeaturePipeline::new(&schema());
        let work = BatchWork {
            dir: dir.to_str().expect("utf-8").to_owned(),
            files: files.iter().map(|f| file(f)).collect(),
        };
        let ledger = Arc::new(TaskLedger::new("t".into(), start_offset));
        runner(&buffers, &pipeline)
            .run(0, &work, start_offset, &ledger)
            .await;
        let mut keys = Vec::new();
        while let Some(served) = buffers.try_pop(10_000) {
            served.consumed();
            keys.extend(
                served.batch.to_kjt().expect("kjt").features[0]
                    .values
                    .clone(),
            );
        }
        let error = ledger
            .finished()
            .expect("reading ended and every row was consumed");
        (keys, error)
    }

    fn ids(range: std::ops::Range<u64>) -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(range))
    }

    fn labels(n: u64) -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values((0..n).map(|i| i % 2)))
    }

    #[tokio::test]
    async fn a_task_resumes_at_its_offset_and_bad_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "a.parquet",
            vec![("label", labels(20)), ("c1", ids(0..20))],
        )
        .await;
        write(
            dir.path(),
            "b.parquet",
            vec![("label", labels(1)), ("c1", ids(20..21))],
        )
        .await;

        // Offset 15: the last 5 rows of a.parquet and b.parquet's row remain.
        let (keys, error) = read_task(dir.path(), &["a.parquet", "b.parquet"], 15).await;
        let seed = primus_batch::hash::feature_seed("c1");
        let expected: Vec<u64> = (15..21)
            .map(|id| primus_batch::hash::int_key(seed, id))
            .collect();
        assert_eq!((keys, error), (expected, String::new()));
        let (keys, _) = read_task(dir.path(), &["a.parquet", "b.parquet"], 20).await;
        assert_eq!(keys.len(), 1, "a.parquet is skipped whole");

        write(
            dir.path(),
            "no-c1.parquet",
            vec![("label", labels(3)), ("c2", ids(0..3))],
        )
        .await;
        std::fs::write(
            dir.path().join("corrupt.parquet"),
            b"PAR1 this is not parquet",
        )
        .expect("write");
        write(
            dir.path(),
            "float-ids.parquet",
            vec![
                ("label", labels(2)),
                ("c1", Arc::new(Float64Array::from(vec![1.5, 2.5]))),
            ],
        )
        .await;
        for (name, column) in [
            ("no-c1.parquet", true),
            ("corrupt.parquet", false),
            ("float-ids.parquet", true),
        ] {
            let (_, error) = read_task(dir.path(), &["a.parquet", name], 0).await;
            assert!(error.contains(name), "{name}: {error}");
            assert!(!column || error.contains("`c1`"), "{name}: {error}");
        }
    }

    /// A store that cannot be reached (no namenode listens there) is retried for
    /// `data.storage_retry_ms`, then the task fails saying so.
    #[tokio::test]
    async fn an_unreachable_store_is_retried_then_fails_naming_the_setting() {
        let port = primus_testkit::free_port().expect("port");
        let buffers = Buffers::new(vec![("s".into(), SourceKind::Batch, 1.0)], 10_000);
        let pipeline = FeaturePipeline::new(&schema());
        let work = BatchWork {
            dir: format!("hdfs://127.0.0.1:{port}/data"),
            files: vec![file("a.parquet")],
        };
        let ledger = Arc::new(TaskLedger::new("t".into(), 0));
        let started = std::time::Instant::now();
        runner(&buffers, &pipeline).run(0, &work, 0, &ledger).await;
        let error = ledger.finished().expect("reading ended");
        assert!(error.contains(&format!("127.0.0.1:{port}")), "{error}");
        assert!(error.contains("data.storage_retry_ms"), "{error}");
        assert!(
            started.elapsed() >= Duration::from_millis(600),
            "gave up after {:?}",
            started.elapsed()
        );
    }
}
