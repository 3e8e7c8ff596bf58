//! `primus cluster` as a user runs it: time-ordered session data written again clustered,
//! with the storage ratio; a missing column named.

use std::path::Path;
use std::process::{Command, Output};

fn primus(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_primus"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run primus")
}

#[test]
fn cluster_writes_each_session_together_and_prints_the_storage_ratio() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generated = primus(
        &[
            "datagen",
            "sessions",
            "--out",
            "time",
            "--start",
            "2026-11-01T00",
            "--windows",
            "1",
            "--files-per-window",
            "1",
            "--sessions-per-window",
            "2000",
            "--order",
            "time",
        ],
        dir.path(),
    );
    assert!(generated.status.success(), "{generated:?}");

    let run = primus(
        &[
            "cluster",
            "--from",
            "time",
            "--out",
            "clustered",
            "--session-key",
            "session_id",
        ],
        dir.path(),
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{run:?}");
    assert!(
        stdout.contains("of 1 files by session_id into 2000 groups"),
        "{stdout}"
    );
    let ratio: f64 = (stdout.split("storage ratio ").nth(1))
        .and_then(|s| s.trim().trim_end_matches('x').parse().ok())
        .expect("a storage ratio");
    assert!(ratio > 1.1, "{stdout}");
    assert!(
        (dir.path())
            .join("clustered/date=2026-11-01/hour=00/part-00000.parquet")
            .is_file()
    );

    let missing = primus(
        &[
            "cluster",
            "--from",
            "time",
            "--out",
            "again",
            "--session-key",
            "user",
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert!(
        stderr.contains("part-00000.parquet") && stderr.contains("no column \"user\""),
        "{stderr}"
    );
    let unbounded = primus(
        &[
            "cluster",
            "--from",
            "time",
            "--out",
            "again",
            "--session-key",
            "session_id",
            "--time-column",
            "ts_ms",
        ],
        dir.path(),
    );
    assert_eq!(unbounded.status.code(), Some(2), "{unbounded:?}");
    assert!(String::from_utf8_lossy(&unbounded.stderr).contains("--max-span-seconds"));
}
