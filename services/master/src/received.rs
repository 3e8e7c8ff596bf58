//! Task rows that trainers received from a data executor whose stream broke (it died),
//! reported by the trainers (`TaskService.ReportReceived`). An executor's own reports lag
//! what it served by up to a report interval; the trainers know exactly what reached them
//! and train all of it, so the task's offset moves on through the ranges that continue
//! it, and the executor's successor serves none of those rows again. Ranges of one task
//! may come from several trainers, in any order: each is kept until a continuous run from
//! the task's offset covers it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use primus_proto::v1::{ServedRange, StreamPosition};

/// Ranges reported per (executor, task), not yet covered by the task's offset.
#[derive(Debug, Default)]
pub struct ReceivedRanges(Mutex<HashMap<(String, String), Vec<ServedRange>>>);

impl ReceivedRanges {
    /// Records `ranges` received from `executor`; returns the tasks they belong to.
    pub fn add(&self, executor: &str, ranges: Vec<ServedRange>) -> BTreeSet<String> {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut tasks = BTreeSet::new();
        for range in ranges.into_iter().filter(|r| r.end > r.first) {
            tasks.insert(range.task_id.clone());
            (known.entry((executor.to_owned(), range.task_id.clone())))
                .or_default()
                .push(range);
        }
        tasks
    }

    /// How far the ranges of `task` received from `executor` continue it from `offset`
    /// without a gap, with the stream position there (None when none continues it).
    /// Ranges wholly before that end are dropped.
    pub fn continuation(
        &self,
        executor: &str,
        task: &str,
        offset: u64,
    ) -> Option<(u64, Option<StreamPosition>)> {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let key = (executor.to_owned(), task.to_owned());
        let ranges = known.get_mut(&key)?;
        ranges.sort_by_key(|r| r.first);
        let (mut end, mut position) = (offset, None);
        for range in ranges.iter() {
            if range.first <= end && range.end > end {
                (end, position) = (range.end, range.end_position);
            }
        }
        ranges.retain(|r| r.end > end);
        if ranges.is_empty() {
            known.remove(&key);
        }
        (end > offset).then_some((end, position))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: u64, end: u64) -> ServedRange {
        ServedRange {
            task_id: "t".into(),
            first,
            end,
            end_position: Some(StreamPosition {
                sequence: end,
                rows: 0,
            }),
        }
    }

    #[test]
    fn ranges_from_several_trainers_move_a_task_on_only_without_a_gap() {
        let received = ReceivedRanges::default();
        // Trainer b's minibatch came after one of trainer a's that is not reported yet.
        received.add("e", vec![range(100, 200), range(300, 400)]);
        assert_eq!(
            received.continuation("e", "t", 50),
            None,
            "a gap at 50..100"
        );
        received.add("e", vec![range(40, 100), range(200, 300)]);
        let (end, position) = received.continuation("e", "t", 50).expect("continued");
        assert_eq!((end, position.map(|p| p.sequence)), (400, Some(400)));
        // Everything was covered and dropped; another executor's ranges are its own.
        assert_eq!(received.continuation("e", "t", 0), None);
        received.add("f", vec![range(0, 10)]);
        assert_eq!(received.continuation("e", "t", 0), None);
        assert_eq!(received.continuation("f", "t", 0).map(|c| c.0), Some(10));
    }

    #[test]
    fn rows_behind_the_offset_move_nothing() {
        let received = ReceivedRanges::default();
        assert_eq!(received.add("e", vec![range(0, 100), range(5, 5)]).len(), 1);
        assert_eq!(received.continuation("e", "t", 100), None);
        assert_eq!(
            received.continuation("e", "t", 0),
            None,
            "dropped as covered"
        );
    }
}
