//! Hourly Parquet partitions of numbered rows (columns `id`, `label` = id mod 2, `c1` =
//! id) with a `_SUCCESS` marker per hour: the small batch data of the master's tests.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use primus_config::StorageSettings;
use primus_spec::time;

pub const ROWS_PER_FILE: u64 = 100;
pub const FILES_PER_HOUR: u64 = 2;

/// Writes `days` of hourly partitions under `root`, ids counting up in time order (columns
/// `id`, `label` = id mod 2, `c1` = id), plus a `_SUCCESS` marker per hour. Returns the
/// number of rows.
pub async fn write_partitions(root: &Path, first_day: &str, days: i64) -> u64 {
    let location = primus_storage::open(root.to_str().expect("utf-8"), &StorageSettings::default())
        .expect("location");
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::UInt64, false),
        Field::new("label", DataType::UInt64, false),
        Field::new("c1", DataType::UInt64, false),
    ]));
    let start = time::parse_window_time(first_day).expect("day");
    let mut next_id = 0;
    for hour in 0..days * 24 {
        let partition = time::partition(
            primus_spec::dataset::WindowUnit::Hourly,
            start + hour * time::HOUR,
        );
        for file in 0..FILES_PER_HOUR {
            let ids: Vec<u64> = (next_id..next_id + ROWS_PER_FILE).collect();
            next_id += ROWS_PER_FILE;
            let labels: Vec<u64> = ids.iter().map(|id| id % 2).collect();
            let columns: Vec<ArrayRef> = vec![
                Arc::new(UInt64Array::from(ids.clone())),
                Arc::new(UInt64Array::from(labels)),
                Arc::new(UInt64Array::from(ids)),
            ];
            let batch = RecordBatch::try_new(schema.clone(), columns).expect("batch");
            let path = location.path(&format!("{partition}/part-{file}.parquet"));
            primus_storage::parquet::write(&location, &path, schema.clone(), [batch], None)
                .await
                .expect("write parquet");
        }
        let marker = location.path(&format!("{partition}/_SUCCESS"));
        location
            .put(&marker, Default::default())
            .await
            .expect("marker");
    }
    next_id
}
