//! The `task_reader` example's ledgers read back: which attempt at which task read which
//! row, and how far the master had acknowledged each attempt.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// The task reader's report interval: an attempt reads at most this many rows past the
/// last offset the master acknowledged.
const REPORT_EVERY: u64 = 50;

/// One attempt at a task by one executor process, from its `start` line on.
#[derive(Debug)]
struct Attempt {
    /// (offset in the task, row id) of every row it read.
    rows: Vec<(u64, u64)>,
    /// The last offset the master accepted from it, or the one it was handed the task at.
    acknowledged: u64,
    /// The master accepted the task's end from it.
    finished: bool,
}

impl Attempt {
    /// Whether the master had accepted this attempt's read of `offset`.
    fn accepted(&self, offset: u64) -> bool {
        self.finished || offset <= self.acknowledged
    }
}

/// Every attempt at every task of a Job, from the ledgers in its working folder.
pub(crate) struct TaskReads {
    attempts: HashMap<String, Vec<Attempt>>,
}

/// A row's place in the data: its task and its offset there.
type Position = (String, u64);

/// What became of one position across attempts.
#[derive(Default)]
struct PositionReads {
    ids: Vec<u64>,
    acknowledged: u32,
}

impl TaskReads {
    pub(crate) fn load(work: &Path) -> Self {
        let mut attempts: HashMap<String, Vec<Attempt>> = HashMap::new();
        for file in std::fs::read_dir(work).expect("job folder").flatten() {
            if !file.file_name().to_string_lossy().starts_with("rows-") {
                continue;
            }
            let ledger = std::fs::read_to_string(file.path()).expect("ledger");
            for line in ledger.lines() {
                let fields: Vec<&str> = line.split(' ').collect();
                let number =
                    |i: usize| -> u64 { fields[i].parse().unwrap_or_else(|_| panic!("{line:?}")) };
                let task = fields[1].to_owned();
                if fields[0] == "start" {
                    let attempt = Attempt {
                        rows: Vec::new(),
                        acknowledged: number(2),
                        finished: false,
                    };
                    attempts.entry(task).or_default().push(attempt);
                    continue;
                }
                // An executor works on one task at a time: its lines belong to its
                // latest attempt at that task.
                let attempt = (attempts.get_mut(&task).and_then(|a| a.last_mut()))
                    .unwrap_or_else(|| panic!("{line:?} before its task's start"));
                match fields[0] {
                    "row" => attempt.rows.push((number(2), number(3))),
                    "reported" => attempt.acknowledged = number(2),
                    "finished" => attempt.finished = true,
                    other => panic!("unknown ledger line {other:?}: {line:?}"),
                }
            }
        }
        Self { attempts }
    }

    /// Asserts that rows `0..rows` were each read at exactly one place in the data, that
    /// no read the master had acknowledged was read again, and that no attempt read more
    /// than one report interval past its acknowledgement. Returns the rows read again:
    /// those a killed attempt read after its last acknowledged report.
    pub(crate) fn assert_each_row_once(&self, rows: u64) -> u32 {
        let mut positions: HashMap<Position, PositionReads> = HashMap::new();
        for (task, attempts) in &self.attempts {
            for attempt in attempts {
                for &(offset, id) in &attempt.rows {
                    assert!(
                        offset <= attempt.acknowledged + REPORT_EVERY || attempt.finished,
                        "{task}: offset {offset} read more than {REPORT_EVERY} rows past the acknowledged {}",
                        attempt.acknowledged
                    );
                    let reads = positions.entry((task.clone(), offset)).or_default();
                    reads.ids.push(id);
                    reads.acknowledged += u32::from(attempt.accepted(offset));
                }
            }
        }
        let mut place_of: HashMap<u64, &Position> = HashMap::new();
        let mut read_again = 0;
        for (position, reads) in &positions {
            let id = reads.ids[0];
            assert!(
                reads.ids.iter().all(|i| *i == id),
                "{position:?} held different rows: {:?}",
                reads.ids
            );
            assert!(
                reads.acknowledged <= 1,
                "{position:?} (row {id}) read again after the master acknowledged it"
            );
            if let Some(other) = place_of.insert(id, position) {
                panic!("row {id} read at {other:?} and at {position:?}");
            }
            read_again += reads.ids.len() as u32 - 1;
        }
        let missing: Vec<u64> = (0..rows).filter(|id| !place_of.contains_key(id)).collect();
        assert!(
            missing.is_empty(),
            "rows never read: {} (first {:?})",
            missing.len(),
            missing.first()
        );
        assert_eq!(place_of.len() as u64, rows, "no row outside the data");
        read_again
    }
}

/// Waits until `executor` (a task reader) read some rows.
pub(crate) async fn wait_until_rows(work: &Path, executor: &str) {
    let path = work.join(format!("rows-{executor}.txt"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let read_a_row = || {
        std::fs::read_to_string(&path)
            .is_ok_and(|ledger| ledger.lines().any(|l| l.starts_with("row ")))
    };
    while !read_a_row() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{executor} read nothing: {:?}",
            std::fs::read_to_string(&path)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
