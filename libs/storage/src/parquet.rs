//! Parquet files in a [`Location`]: streaming reads with column projection and row-group
//! ranges (one data task reads a range of a file's row groups), and writes.

use std::ops::Range;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use futures::{Stream, TryStreamExt};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::arrow::{AsyncArrowWriter, ProjectionMask};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::WriterProperties;

use crate::reader::ObjectReader;
use crate::{Location, StorageError};

/// What to read from a file.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Top-level columns to read, by name; `None` reads all.
    pub columns: Option<Vec<String>>,
    /// Row groups to read; `None` reads all.
    pub row_groups: Option<Range<usize>>,
    /// Rows per returned batch.
    pub batch_size: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            columns: None,
            row_groups: None,
            batch_size: 8192,
        }
    }
}

/// What a write produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Rows in the file.
    pub rows: u64,
    /// Row groups in the file.
    pub row_groups: usize,
}

fn parquet_error(url: &str) -> impl Fn(parquet::errors::ParquetError) -> StorageError + '_ {
    move |e| match e {
        parquet::errors::ParquetError::External(inner) => {
            match inner.downcast::<object_store::Error>() {
                Ok(store_error) => StorageError::from_store(url.to_owned(), *store_error),
                Err(other) => StorageError::Parquet {
                    url: url.to_owned(),
                    message: other.to_string(),
                },
            }
        }
        other => StorageError::Parquet {
            url: url.to_owned(),
            message: other.to_string(),
        },
    }
}

async fn reader(location: &Location, path: &Path) -> Result<ObjectReader, StorageError> {
    let meta = location.head(path).await?;
    Ok(ObjectReader {
        store: location.store().clone(),
        path: path.clone(),
        size: meta.size,
    })
}

/// The file's footer: schema, row groups and their row counts.
pub async fn metadata(location: &Location, path: &Path) -> Result<ParquetMetaData, StorageError> {
    let url = location.url_of(path);
    let builder = ParquetRecordBatchStreamBuilder::new(reader(location, path).await?)
        .await
        .map_err(parquet_error(&url))?;
    Ok(builder.metadata().as_ref().clone())
}

/// Streams the file's rows as record batches, reading only what `options` asks for.
pub async fn read(
    location: &Location,
    path: &Path,
    options: &ReadOptions,
) -> Result<impl Stream<Item = Result<RecordBatch, StorageError>> + Send + use<>, StorageError> {
    let url = location.url_of(path);
    let mut builder = ParquetRecordBatchStreamBuilder::new(reader(location, path).await?)
        .await
        .map_err(parquet_error(&url))?
        .with_batch_size(options.batch_size.max(1));
    if let Some(columns) = &options.columns {
        let schema = builder.schema();
        let indices = columns
            .iter()
            .map(|name| {
                schema
                    .index_of(name)
                    .map_err(|_| StorageError::MissingColumn {
                        url: url.clone(),
                        column: name.clone(),
                        available: schema
                            .fields()
                            .iter()
                            .map(|f| f.name().as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), indices);
        builder = builder.with_projection(mask);
    }
    if let Some(range) = &options.row_groups {
        let available = builder.metadata().num_row_groups();
        if range.start > range.end || range.end > available {
            return Err(StorageError::RowGroupRange {
                url,
                start: range.start,
                end: range.end,
                available,
            });
        }
        builder = builder.with_row_groups(range.clone().collect());
    }
    let stream = builder.build().map_err(parquet_error(&url))?;
    Ok(stream.map_err(move |e| parquet_error(&url)(e)))
}

/// Writes `batches` as one Parquet file (zstd unless `properties` say otherwise).
pub async fn write(
    location: &Location,
    path: &Path,
    schema: SchemaRef,
    batches: impl IntoIterator<Item = RecordBatch>,
    properties: Option<WriterProperties>,
) -> Result<Written, StorageError> {
    let url = location.url_of(path);
    let properties = properties.unwrap_or_else(|| {
        WriterProperties::builder()
            .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
            .build()
    });
    let sink = BufWriter::new(location.store().clone(), path.clone());
    let mut writer =
        AsyncArrowWriter::try_new(sink, schema, Some(properties)).map_err(parquet_error(&url))?;
    for batch in batches {
        writer.write(&batch).await.map_err(parquet_error(&url))?;
    }
    let metadata = writer.close().await.map_err(parquet_error(&url))?;
    Ok(Written {
        rows: metadata
            .row_groups()
            .iter()
            .map(|rg| rg.num_rows().max(0) as u64)
            .sum(),
        row_groups: metadata.num_row_groups(),
    })
}
