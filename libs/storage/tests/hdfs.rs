//! primus-storage against a real HDFS: a namenode and two datanodes (Hadoop's
//! MiniDFSCluster, started by primus-testkit), permissions on.
#![cfg(feature = "hdfs")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
use parquet::file::properties::WriterProperties;
use primus_config::StorageSettings;
use primus_storage::parquet::{ReadOptions, metadata, read, write};
use primus_storage::{Location, StorageError, open};
use primus_testkit::Hdfs;

fn folder(hint: &str) -> Location {
    let hdfs = Hdfs::shared().expect("hdfs");
    let url = hdfs.folder(hint).expect("folder");
    open(&url, &StorageSettings::default()).expect("open")
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64")
                .values()
                .to_vec()
        })
        .collect()
}

#[tokio::test]
async fn objects_are_written_read_in_ranges_listed_renamed_and_deleted() {
    let location = folder("objects");
    let path = location.path("a/b/object.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(3 * 1024 * 1024 + 17).collect();
    location
        .put(&path, bytes.clone().into())
        .await
        .expect("put");
    assert_eq!(location.get(&path).await.expect("get").to_vec(), bytes);
    assert_eq!(
        location.head(&path).await.expect("head").size,
        bytes.len() as u64
    );
    let range = location
        .store()
        .get_range(&path, 1_000_000..1_000_100)
        .await
        .expect("ranged read");
    assert_eq!(&range[..], &bytes[1_000_000..1_000_100]);

    let other = location.path("a/other.bin");
    location
        .put(&other, b"x".to_vec().into())
        .await
        .expect("put");
    let listed: Vec<String> = location
        .list("a")
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.location.to_string())
        .collect();
    assert_eq!(listed, [path.to_string(), other.to_string()]);

    let renamed = location.path("c/renamed.bin");
    location
        .store()
        .rename(&path, &renamed)
        .await
        .expect("rename");
    assert!(matches!(
        location.get(&path).await,
        Err(StorageError::NotFound { .. })
    ));
    assert_eq!(
        location.get(&renamed).await.expect("get").len(),
        bytes.len()
    );

    assert_eq!(location.delete_all("").await.expect("delete"), 2);
    assert!(location.list("").await.expect("list").is_empty());
}

#[tokio::test]
async fn a_multipart_upload_is_one_object() {
    let location = folder("multipart");
    let path = location.path("checkpoint/part.bin");
    let upload = location
        .store()
        .put_multipart(&path)
        .await
        .expect("start a multipart upload");
    let mut writer = WriteMultipart::new_with_chunk_size(upload, 1024 * 1024);
    let mut expected = Vec::new();
    for part in 0..5u8 {
        let chunk = vec![part; 700 * 1024];
        expected.extend_from_slice(&chunk);
        writer.write(&chunk);
    }
    writer.finish().await.expect("finish");
    assert_eq!(location.get(&path).await.expect("get").to_vec(), expected);

    // An upload aborted leaves nothing behind.
    let aborted = location.path("checkpoint/aborted.bin");
    let mut upload = location
        .store()
        .put_multipart(&aborted)
        .await
        .expect("start a multipart upload");
    upload
        .put_part(PutPayload::from(vec![1u8; 1024]))
        .await
        .expect("part");
    upload.abort().await.expect("abort");
    assert!(matches!(
        location.get(&aborted).await,
        Err(StorageError::NotFound { .. })
    ));
}

#[tokio::test]
async fn parquet_partitions_are_read_by_row_group() {
    let location = folder("parquet");
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(100))
        .build();
    for hour in 0..3i64 {
        let path = location.path(&format!("date=2026-11-20/hour={hour:02}/part-0.parquet"));
        let batches = (0..4).map(|group| {
            let start = hour * 400 + group * 100;
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from_iter_values(start..start + 100))],
            )
            .expect("batch")
        });
        let written = write(
            &location,
            &path,
            schema.clone(),
            batches,
            Some(props.clone()),
        )
        .await
        .expect("write");
        assert_eq!((written.rows, written.row_groups), (400, 4));
    }
    let partitions = location.list("date=2026-11-20").await.expect("list");
    assert_eq!(partitions.len(), 3);
    let second = &partitions[1].location;
    assert_eq!(
        metadata(&location, second)
            .await
            .expect("metadata")
            .num_row_groups(),
        4
    );
    let options = ReadOptions {
        row_groups: Some(2..4),
        ..Default::default()
    };
    let rows: Vec<RecordBatch> = read(&location, second, &options)
        .await
        .expect("read")
        .try_collect()
        .await
        .expect("batches");
    assert_eq!(ids(&rows), (600..800).collect::<Vec<i64>>());
}

#[tokio::test]
async fn a_missing_path_is_not_found_naming_it() {
    let location = folder("missing");
    let path = location.path("nope/none.parquet");
    let err = read(&location, &path, &ReadOptions::default())
        .await
        .err()
        .expect("missing file");
    assert!(matches!(err, StorageError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("nope/none.parquet"), "{err}");
    assert!(err.to_string().starts_with("hdfs://127.0.0.1:"), "{err}");
}

#[tokio::test]
async fn a_folder_of_another_user_is_access_denied() {
    let hdfs = Hdfs::shared().expect("hdfs");
    hdfs.make_folder("/private", "hdfs", 0o700).expect("mkdir");
    let location = open(
        &format!("{}/private", hdfs.url()),
        &StorageSettings::default(),
    )
    .expect("open");
    let path = location.path("x.bin");
    let err = location
        .put(&path, b"payload".to_vec().into())
        .await
        .expect_err("not the owner");
    assert!(matches!(err, StorageError::Denied { .. }), "{err}");
    assert!(err.to_string().contains("/private/x.bin"), "{err}");
    assert!(!err.to_string().contains("\tat org.apache"), "{err}");
    let err = location.list("").await.expect_err("not the owner");
    assert!(matches!(err, StorageError::Denied { .. }), "{err}");
}

/// With the failover retries cut (storage.hdfs.*), a namenode that is not there fails a
/// call in seconds; the client's own defaults take minutes.
#[tokio::test]
async fn a_dead_namenode_fails_fast_naming_the_url() {
    let port = primus_testkit::free_port().expect("port");
    let url = format!("hdfs://127.0.0.1:{port}/datasets");
    let started = Instant::now();
    let outcome = match open(&url, &StorageSettings::default()) {
        Ok(location) => location.list("").await.map(|_| ()),
        Err(e) => Err(e),
    };
    let err = outcome.expect_err("no namenode there");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

/// A folder out of space refuses a write with the namenode's quota error, in seconds.
#[tokio::test]
async fn a_write_beyond_the_space_quota_fails_naming_the_quota() {
    let hdfs = Hdfs::shared().expect("hdfs");
    let url = hdfs.folder("full").expect("folder");
    let folder = url.strip_prefix(&hdfs.url()).expect("this HDFS").to_owned();
    hdfs.set_space_quota(&folder, 1).expect("quota");
    let location = open(&url, &StorageSettings::default()).expect("open");
    let path = location.path("checkpoint/shard-0.bin");
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        location.put(&path, vec![7u8; 4096].into()),
    )
    .await
    .expect("the write ends")
    .expect_err("no space");
    eprintln!("{err} after {:?}", started.elapsed());
    assert!(err.to_string().contains("shard-0.bin"), "{err}");
    assert!(err.to_string().contains("Quota"), "{err}");
    hdfs.clear_space_quota(&folder).expect("quota cleared");
    location
        .put(&path, vec![7u8; 4096].into())
        .await
        .expect("written once there is space");
}
