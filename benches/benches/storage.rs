//! Object-store throughput on loopback, each store next to the others in one run: the
//! example's Parquet partitions (24 hourly Criteo-like files, as `./scripts/quickstart.sh`
//! generates them) read through primus-storage's Parquet reader from HDFS (the testkit's
//! namenode and two datanodes, replication 2), from MinIO's S3 and from local files (the
//! baseline: the same bytes with no network or server between); and checkpoint files
//! (the size of a PS shard's snapshot file) written whole, as a PS shard writes them, to
//! HDFS and to S3.
//!
//! `cargo bench -p primus-benches --bench storage` (PRIMUS_BENCH_ROWS_PER_HOUR, default
//! 20000; PRIMUS_BENCH_CHECKPOINT_MB, default 256, in files of 32 MB). Last line:
//! `storage: hdfs read X MB/s, s3 Y MB/s, local Z MB/s; checkpoint write hdfs A MB/s, s3 B MB/s`.

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::future::Future;
use std::time::Instant;

use futures::TryStreamExt;
use primus_benches::env_or;
use primus_config::StorageSettings;
use primus_datagen::criteo::CriteoOptions;
use primus_datagen::write::{Layout, criteo};
use primus_harness::stores::{copy_files, s3_settings};
use primus_spec::dataset::WindowUnit;
use primus_storage::Location;
use primus_storage::parquet::{ReadOptions, read};
use primus_testkit::{Hdfs, MinioS3};

const CHECKPOINT_FILE_MB: usize = 32;
const ROUNDS: usize = 3;

/// Reads every Parquet file under `location` whole (every column); returns seconds.
async fn read_all(location: &Location) -> f64 {
    let files = location.list("").await.expect("list");
    let start = Instant::now();
    for file in files {
        let mut records = std::pin::pin!(
            read(location, &file.location, &ReadOptions::default())
                .await
                .expect("open")
        );
        while records.try_next().await.expect("read").is_some() {}
    }
    start.elapsed().as_secs_f64()
}

/// Fetches every file under `location` whole, decoding nothing; returns seconds.
async fn fetch_all(location: &Location) -> f64 {
    let files = location.list("").await.expect("list");
    let start = Instant::now();
    for file in files {
        location.get(&file.location).await.expect("get");
    }
    start.elapsed().as_secs_f64()
}

/// MB/s of the best of [`ROUNDS`] runs of `pass`, after one that warms the server and the
/// page cache.
async fn best_mb_per_s<F: Future<Output = f64>>(bytes: u64, pass: impl Fn() -> F) -> f64 {
    pass().await;
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        best = best.min(pass().await);
    }
    bytes as f64 / 1e6 / best
}

/// Writes `files` checkpoint files of [`CHECKPOINT_FILE_MB`] under `location` with
/// `Location::put`, as a PS shard writes its snapshot; the best of [`ROUNDS`], in MB/s.
async fn write_mb_per_s(location: &Location, files: usize) -> f64 {
    let file: Vec<u8> = (0..CHECKPOINT_FILE_MB * 1_000_000)
        .map(|i| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes()[7])
        .collect();
    let file = bytes::Bytes::from(file);
    let mut best = f64::MAX;
    for round in 0..ROUNDS {
        let start = Instant::now();
        for i in 0..files {
            let path = location.path(&format!("checkpoint-{round}/table/shard-{i}.bin"));
            location.put(&path, file.clone()).await.expect("write");
        }
        best = best.min(start.elapsed().as_secs_f64());
        location
            .delete_all(&format!("checkpoint-{round}"))
            .await
            .expect("delete");
    }
    (files * CHECKPOINT_FILE_MB) as f64 / best
}

#[tokio::main]
async fn main() {
    let rows_per_hour: usize = env_or("PRIMUS_BENCH_ROWS_PER_HOUR", 20_000);
    let checkpoint_mb: usize = env_or("PRIMUS_BENCH_CHECKPOINT_MB", 256);
    let checkpoint_files = checkpoint_mb.div_ceil(CHECKPOINT_FILE_MB).max(1);

    let dir = tempfile::tempdir().expect("tempdir");
    let local = primus_storage::open(
        &format!("file://{}/criteo-like", dir.path().display()),
        &StorageSettings::default(),
    )
    .expect("local");
    let layout = Layout {
        unit: WindowUnit::Hourly,
        start_unix_s: 1_795_651_200,
        windows: 24,
        files_per_window: 1,
        row_group_rows: 65_536,
    };
    let options = CriteoOptions {
        cardinality_scale: 0.001,
        ..Default::default()
    };
    criteo(&local, &layout, rows_per_hour, options)
        .await
        .expect("generate");
    let files = local.list("").await.expect("list");
    let bytes: u64 = files.iter().map(|f| f.size).sum();

    let hdfs = Hdfs::start().expect("hdfs");
    let hdfs_root = hdfs.folder("bench").expect("hdfs folder");
    let on_hdfs = primus_storage::open(
        &format!("{hdfs_root}/criteo-like"),
        &StorageSettings::default(),
    )
    .expect("hdfs");
    let minio = MinioS3::start().expect("minio");
    let bucket = minio.bucket("bench").expect("bucket");
    let on_s3 = primus_storage::open(
        &format!("{}/criteo-like", bucket.url()),
        &s3_settings(&bucket),
    )
    .expect("s3");
    copy_files(&local, &on_hdfs).await;
    copy_files(&local, &on_s3).await;

    println!(
        "{} Parquet files, {:.1} MB, {} rows; best of {ROUNDS} reads after a warm-up",
        files.len(),
        bytes as f64 / 1e6,
        rows_per_hour * 24
    );
    let local_read = best_mb_per_s(bytes, || read_all(&local)).await;
    let hdfs_read = best_mb_per_s(bytes, || read_all(&on_hdfs)).await;
    let s3_read = best_mb_per_s(bytes, || read_all(&on_s3)).await;
    println!(
        "Parquet read (every column decoded): local {local_read:>8.1} MB/s   hdfs {hdfs_read:>8.1} MB/s   s3 (MinIO) {s3_read:>8.1} MB/s"
    );
    let local_fetch = best_mb_per_s(bytes, || fetch_all(&local)).await;
    let hdfs_fetch = best_mb_per_s(bytes, || fetch_all(&on_hdfs)).await;
    let s3_fetch = best_mb_per_s(bytes, || fetch_all(&on_s3)).await;
    println!(
        "whole files, not decoded:            local {local_fetch:>8.1} MB/s   hdfs {hdfs_fetch:>8.1} MB/s   s3 (MinIO) {s3_fetch:>8.1} MB/s"
    );

    let checkpoints = |root: String| root.replace("criteo-like", "checkpoints");
    let hdfs_checkpoints =
        primus_storage::open(&checkpoints(on_hdfs.url()), &StorageSettings::default())
            .expect("hdfs");
    let s3_checkpoints =
        primus_storage::open(&checkpoints(on_s3.url()), &s3_settings(&bucket)).expect("s3");
    let local_checkpoints =
        primus_storage::open(&checkpoints(local.url()), &StorageSettings::default())
            .expect("local");
    let local_write = write_mb_per_s(&local_checkpoints, checkpoint_files).await;
    let hdfs_write = write_mb_per_s(&hdfs_checkpoints, checkpoint_files).await;
    let s3_write = write_mb_per_s(&s3_checkpoints, checkpoint_files).await;
    println!(
        "checkpoint write, {checkpoint_files} files of {CHECKPOINT_FILE_MB} MB:  local {local_write:>8.1} MB/s   hdfs {hdfs_write:>8.1} MB/s   s3 (MinIO) {s3_write:>8.1} MB/s"
    );
    println!(
        "storage: hdfs read {hdfs_read:.0} MB/s, s3 {s3_read:.0} MB/s, local {local_read:.0} MB/s; checkpoint write hdfs {hdfs_write:.0} MB/s, s3 {s3_write:.0} MB/s"
    );
}
