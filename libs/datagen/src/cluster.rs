//! RecD §4.1's clustering of stored data: every Parquet file under a location is written
//! again, at the same relative path, with the rows of one session together (sessions in
//! the order of their first row, a session's rows in their file order). With a time
//! column and a span, a session's rows are grouped only while they lie within that span
//! of the group's first row, so no row moves far from its time. The file stays the
//! outer bound (a partition is an hour or a day). Clustered rows compress better, since
//! a session's user features repeat from row to row; the summary says by how much.

use std::collections::HashMap;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int32Type, Int64Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{DataType, TimeUnit};
use arrow_select::concat::concat_batches;
use arrow_select::take::take_record_batch;
use futures::TryStreamExt;
use primus_storage::parquet::{ReadOptions, metadata, read};
use primus_storage::{Location, ObjectPath};

use crate::DatagenError;
use crate::write::write_file;

/// How rows are clustered.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The column naming a row's session (integers or strings; a null is a session of
    /// its own).
    pub session_key: String,
    /// The column of a row's time (a timestamp, or integers read as Unix milliseconds)
    /// and the longest span in seconds a group of one session's rows may cover; `None`:
    /// a session's rows in a file are one group.
    pub time_bound: Option<(String, f64)>,
}

/// What clustering did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Clustered {
    /// Files written.
    pub files: u64,
    /// Rows written (as many as were read).
    pub rows: u64,
    /// Groups of one session's rows written together.
    pub groups: u64,
    /// Bytes of the files read.
    pub bytes_before: u64,
    /// Bytes of the files written.
    pub bytes_after: u64,
}

impl Clustered {
    /// Bytes before over bytes after (RecD's storage ratio).
    pub fn storage_ratio(&self) -> f64 {
        self.bytes_before as f64 / self.bytes_after.max(1) as f64
    }
}

/// Clusters every `.parquet` file under `from` into `out` (same relative paths).
pub async fn cluster(
    from: &Location,
    out: &Location,
    options: &ClusterOptions,
) -> Result<Clustered, DatagenError> {
    if let Some((_, span)) = &options.time_bound
        && !(*span > 0.0 && span.is_finite())
    {
        return Err(crate::invalid("max_span_seconds", "must be above 0"));
    }
    let mut files: Vec<_> = (from.list("").await?.into_iter())
        .filter(|meta| meta.location.as_ref().ends_with(".parquet"))
        .collect();
    if files.is_empty() {
        return Err(DatagenError::Source {
            file: from.url_of(&from.path("")),
            message: "holds no .parquet file".into(),
        });
    }
    files.sort_by(|a, b| a.location.cmp(&b.location));
    let mut clustered = Clustered::default();
    for file in files {
        let url = from.url_of(&file.location);
        let relative = relative_path(from, &file.location);
        let row_group_rows = (metadata(from, &file.location).await?.row_groups().iter())
            .map(|rg| rg.num_rows().max(1) as usize)
            .max()
            .unwrap_or(1);
        let batches: Vec<RecordBatch> = read(from, &file.location, &ReadOptions::default())
            .await?
            .try_collect()
            .await?;
        let Some(first) = batches.first() else {
            continue;
        };
        let batch = concat_batches(&first.schema(), &batches)?;
        let (order, groups) =
            session_order(&batch, options).map_err(|message| DatagenError::Source {
                file: url.clone(),
                message,
            })?;
        let batch = take_record_batch(&batch, &order)?;
        clustered.files += 1;
        clustered.rows += batch.num_rows() as u64;
        clustered.groups += groups;
        clustered.bytes_before += file.size;
        clustered.bytes_after += write_file(out, &relative, batch, row_group_rows).await?;
    }
    Ok(clustered)
}

/// `path` relative to `location`'s prefix.
fn relative_path(location: &Location, path: &ObjectPath) -> String {
    let prefix = location.path("");
    let mut parts = path.parts().skip(prefix.parts().count());
    let mut relative = parts
        .next()
        .map(|p| p.as_ref().to_owned())
        .unwrap_or_default();
    for part in parts {
        relative.push('/');
        relative.push_str(part.as_ref());
    }
    relative
}

/// A session key's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Int(i128),
    Text(String),
}

/// The rows in clustered order, and how many groups they form.
fn session_order(
    batch: &RecordBatch,
    options: &ClusterOptions,
) -> Result<(UInt32Array, u64), String> {
    let keys = keys(column(batch, &options.session_key)?, &options.session_key)?;
    let times = match &options.time_bound {
        Some((name, span)) => Some((
            times_ms(column(batch, name)?, name)?,
            (span * 1000.0) as i64,
        )),
        None => None,
    };
    // Each group: its first row's time and its rows; a session's open group by key.
    let mut groups: Vec<(i64, Vec<u32>)> = Vec::new();
    let mut open: HashMap<Key, usize> = HashMap::new();
    for (row, key) in keys.into_iter().enumerate() {
        let time = times.as_ref().map_or(0, |(t, _)| t[row]);
        let joined = key
            .as_ref()
            .and_then(|k| open.get(k))
            .copied()
            .filter(|&g| {
                times
                    .as_ref()
                    .is_none_or(|(_, span)| time - groups[g].0 <= *span)
            });
        match joined {
            Some(group) => groups[group].1.push(row as u32),
            None => {
                if let Some(key) = key {
                    open.insert(key, groups.len());
                }
                groups.push((time, vec![row as u32]));
            }
        }
    }
    let count = groups.len() as u64;
    let order = groups.into_iter().flat_map(|(_, rows)| rows);
    Ok((UInt32Array::from_iter_values(order), count))
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef, String> {
    batch.column_by_name(name).ok_or_else(|| {
        let names: Vec<&str> = (batch.schema_ref().fields().iter())
            .map(|f| f.name().as_str())
            .collect();
        format!("no column {name:?} (columns: {})", names.join(", "))
    })
}

fn keys(array: &ArrayRef, name: &str) -> Result<Vec<Option<Key>>, String> {
    let int = |i: usize, value: i128| (!array.is_null(i)).then_some(Key::Int(value));
    let rows = 0..array.len();
    Ok(match array.data_type() {
        DataType::Int64 => {
            let a = array.as_primitive::<Int64Type>();
            rows.map(|i| int(i, i128::from(a.value(i)))).collect()
        }
        DataType::UInt64 => {
            let a = array.as_primitive::<UInt64Type>();
            rows.map(|i| int(i, i128::from(a.value(i)))).collect()
        }
        DataType::Int32 => {
            let a = array.as_primitive::<Int32Type>();
            rows.map(|i| int(i, i128::from(a.value(i)))).collect()
        }
        DataType::UInt32 => {
            let a = array.as_primitive::<UInt32Type>();
            rows.map(|i| int(i, i128::from(a.value(i)))).collect()
        }
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            rows.map(|i| (!a.is_null(i)).then(|| Key::Text(a.value(i).to_owned())))
                .collect()
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            rows.map(|i| (!a.is_null(i)).then(|| Key::Text(a.value(i).to_owned())))
                .collect()
        }
        other => {
            return Err(format!(
                "session key {name:?} is {other}; integer or string columns only"
            ));
        }
    })
}

/// A time column as Unix milliseconds; a null is time 0.
fn times_ms(array: &ArrayRef, name: &str) -> Result<Vec<i64>, String> {
    let values = |v: Vec<i64>, per_ms: f64| -> Vec<i64> {
        v.into_iter().map(|t| (t as f64 / per_ms) as i64).collect()
    };
    Ok(match array.data_type() {
        DataType::Int64 => array.as_primitive::<Int64Type>().values().to_vec(),
        DataType::Timestamp(TimeUnit::Second, _) => values(
            array
                .as_primitive::<TimestampSecondType>()
                .values()
                .to_vec(),
            0.001,
        ),
        DataType::Timestamp(TimeUnit::Millisecond, _) => array
            .as_primitive::<TimestampMillisecondType>()
            .values()
            .to_vec(),
        DataType::Timestamp(TimeUnit::Microsecond, _) => values(
            array
                .as_primitive::<TimestampMicrosecondType>()
                .values()
                .to_vec(),
            1e3,
        ),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => values(
            array
                .as_primitive::<TimestampNanosecondType>()
                .values()
                .to_vec(),
            1e6,
        ),
        other => {
            return Err(format!(
                "time column {name:?} is {other}; a timestamp or Int64 (Unix milliseconds) only"
            ));
        }
    })
}
