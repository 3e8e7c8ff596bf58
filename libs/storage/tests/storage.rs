//! primus-storage against the local file system, the in-memory store and a real S3 server
//! (SeaweedFS, started by primus-testkit).
use std::sync::Arc;

use arrow_array::{Array, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::TryStreamExt;
use parquet::file::properties::WriterProperties;
use primus_config::StorageSettings;
use primus_storage::parquet::{ReadOptions, metadata, read, write};
use primus_storage::{Location, StorageError, open};
use primus_testkit::{S3Bucket, SeaweedS3};

const ROWS_PER_GROUP: usize = 100;
const GROUPS: usize = 3;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("score", DataType::Float32, false),
    ]))
}

fn batch(group: usize) -> RecordBatch {
    let ids: Vec<i64> = (0..ROWS_PER_GROUP)
        .map(|i| (group * ROWS_PER_GROUP + i) as i64)
        .collect();
    let names: Vec<String> = ids.iter().map(|i| format!("row-{i}")).collect();
    let scores: Vec<f32> = ids.iter().map(|i| *i as f32 * 0.5).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(StringArray::from(names)),
            Arc::new(Float32Array::from(scores)),
        ],
    )
    .expect("batch")
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            let col = b
                .column_by_name("id")
                .expect("id column")
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64");
            col.values().to_vec()
        })
        .collect()
}

/// Writes a 3-row-group file, lists it, reads it whole, by row-group range, and projected.
async fn parquet_roundtrip(location: &Location) {
    let path = location.path("date=2026-11-21/hour=07/part-0.parquet");
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(ROWS_PER_GROUP))
        .build();
    let written = write(
        location,
        &path,
        schema(),
        (0..GROUPS).map(batch),
        Some(props),
    )
    .await
    .expect("write");
    assert_eq!(written.rows, (ROWS_PER_GROUP * GROUPS) as u64);
    assert_eq!(written.row_groups, GROUPS);

    let listed = location.list("date=2026-11-21").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].location, path);

    let meta = metadata(location, &path).await.expect("metadata");
    assert_eq!(meta.num_row_groups(), GROUPS);

    let all: Vec<RecordBatch> = read(location, &path, &ReadOptions::default())
        .await
        .expect("read")
        .try_collect()
        .await
        .expect("batches");
    assert_eq!(
        ids(&all),
        (0..(ROWS_PER_GROUP * GROUPS) as i64).collect::<Vec<_>>()
    );

    let options = ReadOptions {
        columns: Some(vec!["id".into()]),
        row_groups: Some(1..2),
        batch_size: 64,
    };
    let middle: Vec<RecordBatch> = read(location, &path, &options)
        .await
        .expect("range read")
        .try_collect()
        .await
        .expect("batches");
    assert!(
        middle.iter().all(|b| b.num_columns() == 1),
        "projection keeps one column"
    );
    assert_eq!(
        ids(&middle),
        (ROWS_PER_GROUP as i64..2 * ROWS_PER_GROUP as i64).collect::<Vec<_>>()
    );
}

async fn missing_things_are_named(location: &Location) {
    let missing = location.path("nope/none.parquet");
    let err = read(location, &missing, &ReadOptions::default())
        .await
        .err()
        .expect("missing object");
    assert!(matches!(err, StorageError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("nope/none.parquet"), "{err}");

    let path = location.path("date=2026-11-21/hour=07/part-0.parquet");
    let err = read(
        location,
        &path,
        &ReadOptions {
            columns: Some(vec!["clicks".into()]),
            ..Default::default()
        },
    )
    .await
    .err()
    .expect("missing column");
    assert!(
        matches!(&err, StorageError::MissingColumn { column, .. } if column == "clicks"),
        "{err}"
    );

    let err = read(
        location,
        &path,
        &ReadOptions {
            row_groups: Some(2..5),
            ..Default::default()
        },
    )
    .await
    .err()
    .expect("row groups out of range");
    assert!(
        matches!(err, StorageError::RowGroupRange { available: 3, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn local_file_system() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}/data", dir.path().display());
    let location = open(&url, &StorageSettings::default()).expect("open");
    parquet_roundtrip(&location).await;
    missing_things_are_named(&location).await;
    assert!(
        dir.path()
            .join("data/date=2026-11-21/hour=07/part-0.parquet")
            .is_file(),
        "written where the URL says"
    );
}

#[tokio::test]
async fn plain_paths_are_local_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let location = open(
        &dir.path().display().to_string(),
        &StorageSettings::default(),
    )
    .expect("open");
    parquet_roundtrip(&location).await;
}

#[tokio::test]
async fn a_file_that_is_not_parquet_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("bad.parquet"),
        b"this is not parquet at all",
    )
    .expect("write");
    let location = open(
        &dir.path().display().to_string(),
        &StorageSettings::default(),
    )
    .expect("open");
    let err = read(
        &location,
        &location.path("bad.parquet"),
        &ReadOptions::default(),
    )
    .await
    .err()
    .expect("corrupt");
    assert!(matches!(err, StorageError::Parquet { .. }), "{err}");
    assert!(err.to_string().contains("bad.parquet"), "{err}");
}

#[tokio::test]
async fn memory_stores_are_shared_by_name() {
    let settings = StorageSettings::default();
    let writer = open("memory://shared-test/a", &settings).expect("open");
    let reader = open("memory://shared-test/a", &settings).expect("open");
    let other = open("memory://other-test/a", &settings).expect("open");
    parquet_roundtrip(&writer).await;
    assert_eq!(reader.list("").await.expect("list").len(), 1);
    assert!(other.list("").await.expect("list").is_empty());
}

#[test]
fn bad_urls_get_clear_errors() {
    let settings = StorageSettings::default();
    for (url, expected) in [
        ("gs://bucket/x", "unsupported scheme `gs`"),
        ("s3:///x", "no bucket"),
        #[cfg(not(feature = "hdfs"))]
        ("hdfs://nn:8020/x", "`hdfs` cargo feature"),
    ] {
        let err = open(url, &settings).expect_err(url);
        assert!(err.to_string().contains(expected), "{url}: {err}");
        assert!(err.to_string().contains(url), "{url}: {err}");
    }
}

fn s3_settings(bucket: &S3Bucket, secret: &str) -> StorageSettings {
    let mut settings = StorageSettings::default();
    settings.s3.endpoint = Some(bucket.endpoint.clone());
    settings.s3.region = Some(S3Bucket::REGION.into());
    settings.s3.access_key_id = Some(S3Bucket::ACCESS_KEY.into());
    settings.s3.secret_access_key = Some(secret.into());
    settings.s3.allow_http = true;
    settings
}

#[tokio::test]
async fn s3_parquet_roundtrip_range_reads_and_missing_objects() {
    let bucket = SeaweedS3::shared()
        .expect("seaweedfs")
        .bucket("roundtrip")
        .expect("bucket");
    let url = format!("{}/datasets/criteo", bucket.url());
    let location = open(&url, &s3_settings(&bucket, S3Bucket::SECRET_KEY)).expect("open");
    parquet_roundtrip(&location).await;
    missing_things_are_named(&location).await;
    let small = location.path("small.bin");
    location
        .put(&small, b"0123456789".to_vec().into())
        .await
        .expect("put");
    assert_eq!(&location.get(&small).await.expect("get")[..], b"0123456789");
    assert_eq!(location.list("").await.expect("list").len(), 2);
}

#[tokio::test]
async fn s3_wrong_credentials_are_access_denied() {
    let bucket = SeaweedS3::shared()
        .expect("seaweedfs")
        .bucket("denied")
        .expect("bucket");
    let location = open(&bucket.url(), &s3_settings(&bucket, "not-the-secret")).expect("open");
    let path = location.path("x.bin");
    let err = location
        .put(&path, b"payload".to_vec().into())
        .await
        .expect_err("wrong secret");
    assert!(matches!(err, StorageError::Denied { .. }), "{err}");
    assert!(err.to_string().contains("access denied"), "{err}");
    assert!(err.to_string().contains("x.bin"), "{err}");

    let err = location
        .list("")
        .await
        .expect_err("wrong secret lists nothing");
    assert!(matches!(err, StorageError::Denied { .. }), "{err}");
}
