//! `cluster`: stored session data rewritten with each session's rows together: the same
//! rows, whole sessions (or groups within a time span), fewer bytes.

use std::collections::BTreeMap;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, UInt64Type};
use futures::TryStreamExt;
use primus_datagen::cluster::{ClusterOptions, cluster};
use primus_datagen::sessions::{RowOrder, SessionOptions};
use primus_datagen::write::{Layout, sessions};
use primus_spec::dataset::WindowUnit;
use primus_storage::Location;
use primus_storage::parquet::{ReadOptions, read};

fn location(dir: &std::path::Path, name: &str) -> Location {
    let path = dir.join(name);
    primus_storage::open(path.to_str().expect("UTF-8 temp path"), &Default::default())
        .expect("location")
}

/// (session, time, item) of every row of every file, by file, in file order.
async fn rows(location: &Location) -> BTreeMap<String, Vec<(u64, i64, u64)>> {
    let mut files = BTreeMap::new();
    for meta in location.list("").await.expect("list") {
        let batches: Vec<RecordBatch> = read(location, &meta.location, &ReadOptions::default())
            .await
            .expect("read")
            .try_collect()
            .await
            .expect("read");
        let mut rows = Vec::new();
        for batch in batches {
            let column = |name: &str| batch.column_by_name(name).expect("column").clone();
            let (session, ts, item) = (column("session_id"), column("ts_ms"), column("item_id"));
            let (session, ts, item) = (
                session.as_primitive::<UInt64Type>(),
                ts.as_primitive::<Int64Type>(),
                item.as_primitive::<UInt64Type>(),
            );
            rows.extend(
                (0..batch.num_rows()).map(|i| (session.value(i), ts.value(i), item.value(i))),
            );
        }
        let prefix = location.path("").to_string();
        let relative = meta.location.as_ref().trim_start_matches(prefix.as_str());
        files.insert(relative.trim_start_matches('/').to_owned(), rows);
    }
    files
}

/// The runs of one session's consecutive rows: (session, first time, last time).
fn runs(rows: &[(u64, i64, u64)]) -> Vec<(u64, i64, i64)> {
    let mut runs: Vec<(u64, i64, i64)> = Vec::new();
    for &(session, ts, _) in rows {
        match runs.last_mut() {
            Some(run) if run.0 == session => run.2 = run.2.max(ts),
            _ => runs.push((session, ts, ts)),
        }
    }
    runs
}

async fn time_ordered(dir: &std::path::Path) -> (Location, primus_datagen::write::Summary) {
    let from = location(dir, "time");
    let layout = Layout {
        unit: WindowUnit::Hourly,
        start_unix_s: 1_700_000_000 / 3600 * 3600,
        windows: 2,
        files_per_window: 2,
        row_group_rows: 4096,
    };
    let options = SessionOptions {
        order: RowOrder::Time,
        ..SessionOptions::default()
    };
    let summary = sessions(&from, &layout, 1200, options)
        .await
        .expect("sessions");
    (from, summary)
}

#[tokio::test]
async fn time_ordered_sessions_are_written_again_whole_with_the_same_rows_in_fewer_bytes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (from, summary) = time_ordered(dir.path()).await;
    let out = location(dir.path(), "clustered");
    let options = ClusterOptions {
        session_key: "session_id".into(),
        time_bound: None,
    };
    let clustered = cluster(&from, &out, &options).await.expect("cluster");
    assert_eq!(
        (
            clustered.files,
            clustered.rows,
            clustered.groups,
            clustered.bytes_before
        ),
        (summary.files, summary.rows, summary.sessions, summary.bytes),
        "a session's rows are in one file: one group each"
    );
    assert!(
        clustered.storage_ratio() > 1.1,
        "storage ratio {:.3}",
        clustered.storage_ratio()
    );
    let (before, after) = (rows(&from).await, rows(&out).await);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "the same relative paths"
    );
    for (file, rows) in &after {
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        let mut original = before[file].clone();
        original.sort_unstable();
        assert!(sorted == original, "{file}: not the same rows");
        let runs = runs(rows);
        let sessions: std::collections::BTreeSet<u64> = runs.iter().map(|r| r.0).collect();
        assert_eq!(runs.len(), sessions.len(), "{file}: a session split");
        // Sessions in the order of their first row.
        assert!(runs.windows(2).all(|w| w[0].1 <= w[1].1), "{file}");
    }
}

#[tokio::test]
async fn a_time_span_bounds_each_group_of_a_session() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (from, summary) = time_ordered(dir.path()).await;
    let out = location(dir.path(), "clustered");
    let options = ClusterOptions {
        session_key: "session_id".into(),
        time_bound: Some(("ts_ms".into(), 60.0)),
    };
    let clustered = cluster(&from, &out, &options).await.expect("cluster");
    assert_eq!(clustered.rows, summary.rows);
    assert!(clustered.groups > summary.sessions, "{clustered:?}");
    // Groups start in time order and span at most 60 s, so no row is written after one
    // more than 60 s newer (without the bound, a long session's last rows come before the
    // first rows of sessions that start after it).
    let late = |rows: &[(u64, i64, u64)]| {
        let mut latest = i64::MIN;
        rows.iter().any(|&(_, ts, _)| {
            latest = latest.max(ts);
            ts < latest - 60_000
        })
    };
    for (file, rows) in rows(&out).await {
        assert!(
            !late(&rows),
            "{file}: a row more than 60 s before one written earlier"
        );
    }
    let unbounded = location(dir.path(), "unbounded");
    let options = ClusterOptions {
        time_bound: None,
        ..options
    };
    cluster(&from, &unbounded, &options).await.expect("cluster");
    assert!(rows(&unbounded).await.values().any(|rows| late(rows)));
}

#[tokio::test]
async fn a_missing_column_or_an_empty_location_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (from, _) = time_ordered(dir.path()).await;
    let out = location(dir.path(), "clustered");
    let missing = ClusterOptions {
        session_key: "session".into(),
        time_bound: None,
    };
    let error = cluster(&from, &out, &missing)
        .await
        .expect_err("no such column")
        .to_string();
    assert!(
        error.contains(".parquet")
            && error.contains("no column \"session\"")
            && error.contains("session_id"),
        "{error}"
    );
    let span = ClusterOptions {
        session_key: "session_id".into(),
        time_bound: Some(("ts_ms".into(), 0.0)),
    };
    let error = cluster(&from, &out, &span)
        .await
        .expect_err("no span")
        .to_string();
    assert!(error.contains("max_span_seconds"), "{error}");
    let empty = location(dir.path(), "empty");
    let error = cluster(&empty, &out, &missing)
        .await
        .expect_err("no file")
        .to_string();
    assert!(error.contains("holds no .parquet file"), "{error}");
}
