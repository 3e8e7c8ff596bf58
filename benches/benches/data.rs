//! Data path figures, each next to a baseline measured in the same run:
//! 1. Parquet -> minibatch rows/s on one core for Criteo-like rows, from the local file
//!    system and from S3 (SeaweedFS on loopback); baseline: the same reads without the
//!    feature pipeline (Parquet decode alone).
//! 2. Bytes on the wire per minibatch of session data, IKJT vs jagged (RecD).
//! 3. File size of the same session rows ordered by time vs clustered by session (RecD
//!    reports 3.71x on production data).
//!
//! `cargo bench -p primus-benches --bench data`

#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]

use std::time::Instant;

use futures::TryStreamExt;
use primus_batch::{FeaturePipeline, Minibatch, Sparse, ipc};
use primus_config::StorageSettings;
use primus_datagen::criteo::CriteoOptions;
use primus_datagen::sessions::{RowOrder, SessionOptions, Sessions};
use primus_datagen::write::{Layout, criteo, write_file};
use primus_spec::dataset::WindowUnit;
use primus_storage::Location;
use primus_storage::parquet::{ReadOptions, read};
use primus_testkit::{S3Bucket, SeaweedS3};

const CRITEO_ROWS: usize = 1_000_000;
const SESSIONS: usize = 40_000;
const MINIBATCH: usize = 4096;

/// Rows read from every file under `location`, with or without the pipeline, and seconds.
async fn read_all(location: &Location, pipeline: Option<&FeaturePipeline>) -> (usize, f64) {
    let columns =
        FeaturePipeline::new(&primus_datagen::criteo::feature_schema("categorical")).columns();
    let files = location.list("").await.expect("list");
    let start = Instant::now();
    let mut rows = 0;
    for file in files {
        let options = ReadOptions {
            columns: Some(columns.clone()),
            row_groups: None,
            batch_size: 8192,
        };
        let mut records = std::pin::pin!(
            read(location, &file.location, &options)
                .await
                .expect("open")
        );
        while let Some(record) = records.try_next().await.expect("read") {
            rows += match pipeline {
                Some(pipeline) => pipeline.minibatch(&record).expect("minibatch").rows(),
                None => record.num_rows(),
            };
        }
    }
    (rows, start.elapsed().as_secs_f64())
}

async fn parquet_to_minibatch(name: &str, location: &Location) {
    let layout = Layout {
        unit: WindowUnit::Hourly,
        start_unix_s: 0,
        windows: 1,
        files_per_window: 4,
        row_group_rows: 65_536,
    };
    criteo(location, &layout, CRITEO_ROWS, CriteoOptions::default())
        .await
        .expect("generate");
    let pipeline = FeaturePipeline::new(&primus_datagen::criteo::feature_schema("categorical"));
    // Warm the page cache / server first, then measure each twice and keep the best.
    read_all(location, None).await;
    let mut best = (f64::MAX, f64::MAX);
    let mut rows = 0;
    for _ in 0..2 {
        let (n, decode) = read_all(location, None).await;
        let (m, full) = read_all(location, Some(&pipeline)).await;
        assert_eq!(n, m);
        rows = n;
        best = (best.0.min(decode), best.1.min(full));
    }
    let (decode, full) = (rows as f64 / best.0, rows as f64 / best.1);
    println!(
        "{name:<6} Parquet -> minibatch, 1 core: {:>10.0} rows/s   baseline Parquet decode alone: {:>10.0} rows/s   ({:.2}x of decode; target >= 1M rows/s)",
        full,
        decode,
        full / decode
    );
}

fn wire_bytes() {
    let schema = primus_datagen::sessions::feature_schema("ids");
    let pipeline = FeaturePipeline::new(&schema);
    let mut generator = Sessions::new(SessionOptions {
        order: RowOrder::Clustered,
        ..Default::default()
    })
    .expect("sessions");
    let batch = generator.generate(SESSIONS / 4, 0, 3600).expect("generate");
    let minibatch = pipeline.minibatch(&batch).expect("minibatch");
    let (mut jagged, mut grouped, mut batches, mut factor) = (0usize, 0usize, 0usize, 0.0);
    let mut start = 0;
    while start + MINIBATCH <= minibatch.rows() {
        let part: Minibatch = minibatch.slice(start..start + MINIBATCH).expect("slice");
        jagged += ipc::encode(&part).expect("encode").len();
        let ikjt = part.grouped(pipeline.groups()).expect("group");
        if let Sparse::Grouped(ikjt) = &ikjt.sparse {
            factor += ikjt.groups[0].dedupe_factor();
        }
        grouped += ipc::encode(&ikjt).expect("encode").len();
        batches += 1;
        start += MINIBATCH;
    }
    println!(
        "wire bytes per {MINIBATCH}-row minibatch of clustered sessions: IKJT {} vs jagged {} (baseline): {:.2}x smaller; mean DedupeFactor of group `user` {:.2}",
        grouped / batches,
        jagged / batches,
        jagged as f64 / grouped as f64,
        factor / batches as f64
    );
}

async fn clustering(location: &Location) {
    let mut sizes = Vec::new();
    let mut rows = 0;
    for order in [RowOrder::Time, RowOrder::Clustered] {
        let mut generator = Sessions::new(SessionOptions {
            order,
            ..Default::default()
        })
        .expect("sessions");
        let batch = generator.generate(SESSIONS, 0, 3600).expect("generate");
        rows = batch.num_rows();
        let name = format!("{order:?}.parquet");
        sizes.push(
            write_file(location, &name, batch, 1 << 20)
                .await
                .expect("write"),
        );
    }
    println!(
        "{rows} session rows ({SESSIONS} sessions in one hour), zstd Parquet: time-ordered {:.1} MiB (baseline) vs clustered {:.1} MiB: {:.2}x smaller (RecD: 3.71x)",
        sizes[0] as f64 / 1048576.0,
        sizes[1] as f64 / 1048576.0,
        sizes[0] as f64 / sizes[1] as f64
    );
}

fn s3_location(bucket: &S3Bucket) -> Location {
    let settings = primus_harness::stores::s3_settings(bucket);
    primus_storage::open(&format!("{}/criteo", bucket.url()), &settings).expect("s3 location")
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let local = primus_storage::open(
            dir.path().to_str().expect("utf-8"),
            &StorageSettings::default(),
        )
        .expect("local");
        parquet_to_minibatch("local", &local).await;
        let seaweed = SeaweedS3::shared().expect("seaweedfs");
        let bucket = seaweed.bucket("bench").expect("bucket");
        parquet_to_minibatch("s3", &s3_location(&bucket)).await;
        wire_bytes();
        let sessions = primus_storage::open(
            dir.path().join("sessions").to_str().expect("utf-8"),
            &StorageSettings::default(),
        )
        .expect("local");
        clustering(&sessions).await;
    });
}
