//! Batch task runner: streams a task's Parquet files (only the schema's columns, only the
//! row groups of the task's byte split) through the feature pipeline into the source's
//! serving buffer, from the task's start offset on.

use std::sync::Arc;

use futures::TryStreamExt;
use primus_batch::FeaturePipeline;
use primus_config::StorageSettings;
use primus_proto::v1::{BatchWork, TaskFile};
use primus_storage::parquet::{ReadOptions, metadata, read};
use primus_storage::{Location, ObjectPath};

use crate::buffer::{Buffers, Chunk, SourceIndex};
use crate::ledger::{ReadEnd, TaskLedger};

pub(crate) struct BatchRunner<'a> {
    pub buffers: &'a Buffers,
    pub pipeline: &'a FeaturePipeline,
    pub storage: &'a StorageSettings,
    pub read_batch_rows: usize,
    /// Injected before each read (`data.read_delay_ms`, tests and benchmarks only).
    pub read_delay: std::time::Duration,
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
        let mut offset = 0u64;
        let end = match self
            .read_files(source, work, start_offset, ledger, &mut offset)
            .await
        {
            Ok(()) => ReadEnd::Complete {
                rows: offset.max(start_offset),
            },
            Err(error) => ReadEnd::Failed {
                rows: offset.max(start_offset),
                error,
            },
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
    ) -> Result<(), String> {
        let location = primus_storage::open(&work.dir, self.storage).map_err(|e| e.to_string())?;
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
    ) -> Result<(), String> {
        let meta = metadata(location, path).await.map_err(|e| e.to_string())?;
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
        let mut records = std::pin::pin!(
            read(location, path, &options)
                .await
                .map_err(|e| e.to_string())?
        );
        loop {
            if !self.read_delay.is_zero() {
                tokio::time::sleep(self.read_delay).await;
            }
            if ledger.is_taken_back() {
                // Another executor continues it from the rows served here.
                return Ok(());
            }
            let Some(record) = records.try_next().await.map_err(|e| e.to_string())? else {
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
                    .map_err(|e| format!("{}: {e}", location.url_of(path)))?;
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
            dense: vec![],
            sparse: vec![SparseFeature {
                name: "c1".into(),
                table: "t".into(),
                multi_hot: false,
                dedup_group: None,
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
            read_delay: std::time::Duration::ZERO,
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
}
