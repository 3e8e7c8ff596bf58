//! Task rows that trainers received from a data executor whose stream broke (it died),
//! reported by the trainers (`TaskService.ReportReceived`). An executor's own reports lag
//! what it served by up to a report interval; the trainers know exactly what reached them
//! and train all of it, so the task's offset moves on through the ranges that continue
//! it, and the executor's successor serves none of those rows again. Ranges of one task
//! may come from several trainers, in any order: each is kept until a continuous run from
//! the task's offset covers it. A lost executor's tasks (it restarted, or stopped
//! heartbeating) go back to the queue only once every trainer of the Job settled on its
//! broken stream, so the reports come before its successor reads. A trainer settles when
//! it reports; when it was lost itself (crashed, restarted or ended) since the executor
//! registered, as it then holds nothing of it to report; when it kept training without
//! reporting (it never read from the executor's lost process); or when the wait's
//! patience runs out. A trainer that is alive but stalled (a PS shard it waits on is
//! stopped) is waited for: it reports once it reads again, and its rows are not served
//! twice.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use primus_proto::v1::{ServedRange, StreamPosition};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Ranges reported per (executor, task), not yet covered by the task's offset, the
/// trainers that reported on each executor's broken streams, and when each executor last
/// registered and crashed and each trainer was last lost.
#[derive(Debug, Default)]
pub struct ReceivedRanges {
    ranges: Mutex<HashMap<(String, String), Vec<ServedRange>>>,
    reported: Mutex<HashMap<String, BTreeSet<String>>>,
    registered: Mutex<HashMap<String, Instant>>,
    executors_crashed: Mutex<HashMap<String, Instant>>,
    trainers_lost: Mutex<HashMap<String, Instant>>,
    report_came: Notify,
}

/// How often a wait for reports looks again at whether its trainers kept training.
const RECHECK: Duration = Duration::from_millis(250);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl ReceivedRanges {
    /// `trainer` reported what it received on its broken stream from `executor`.
    pub fn reported(&self, executor: &str, trainer: &str) {
        (lock(&self.reported).entry(executor.to_owned()))
            .or_default()
            .insert(trainer.to_owned());
        self.report_came.notify_waiters();
    }

    /// `executor`'s process registered now: its trainers' streams open to this one.
    pub fn registered(&self, executor: &str) {
        lock(&self.registered).insert(executor.to_owned(), Instant::now());
    }

    /// `executor`'s process crashed and the backend starts it again.
    pub fn executor_crashed(&self, executor: &str) {
        lock(&self.executors_crashed).insert(executor.to_owned(), Instant::now());
    }

    /// Whether `executor` crashed since it last registered: its restart registers, and
    /// takes its tasks back once the trainers reported on the crashed process.
    pub fn restarting(&self, executor: &str) -> bool {
        let registered = lock(&self.registered).get(executor).copied();
        (lock(&self.executors_crashed).get(executor))
            .is_some_and(|crashed| registered.is_none_or(|since| *crashed >= since))
    }

    /// `trainer`'s process ended (crashed, restarted or exited): whatever it received from
    /// an executor lost before is gone with it, and it reports none of it.
    pub fn trainer_lost(&self, trainer: &str) {
        lock(&self.trainers_lost).insert(trainer.to_owned(), Instant::now());
        self.report_came.notify_waiters();
    }

    /// Waits until each of `trainers` settled on `executor`'s lost process (it reported,
    /// was lost since the executor registered, or `kept_training` says it went on
    /// training without a report) or `patience` passed, then forgets those reports;
    /// returns the trainers that did not settle.
    pub async fn await_reports(
        &self,
        executor: &str,
        trainers: &[String],
        patience: Duration,
        kept_training: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let registered = lock(&self.registered).get(executor).copied();
        let missing = || -> Vec<String> {
            let reported = lock(&self.reported);
            let reported = reported.get(executor);
            let lost = lock(&self.trainers_lost);
            // Without a registration known (a new master), any loss counts.
            let lost_since = |t: &String| {
                (lost.get(t)).is_some_and(|at| registered.is_none_or(|since| *at >= since))
            };
            (trainers.iter())
                .filter(|t| !reported.is_some_and(|r| r.contains(*t)))
                .filter(|t| !lost_since(t) && !kept_training(t))
                .cloned()
                .collect()
        };
        let deadline = Instant::now() + patience;
        let missing = loop {
            let report_came = self.report_came.notified();
            let missing = missing();
            if missing.is_empty() || Instant::now() >= deadline {
                break missing;
            }
            let _ =
                tokio::time::timeout_at(deadline.min(Instant::now() + RECHECK), report_came).await;
        };
        lock(&self.reported).remove(executor);
        missing
    }

    /// Records `ranges` received from `executor`; returns the tasks they belong to.
    pub fn add(&self, executor: &str, ranges: Vec<ServedRange>) -> BTreeSet<String> {
        let mut known = lock(&self.ranges);
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
        let mut known = lock(&self.ranges);
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

    /// A restarted executor's tasks wait for every trainer's report, and no longer than
    /// the patience for one that never comes; reports are forgotten after each wait.
    #[tokio::test]
    async fn the_wait_ends_with_the_last_trainers_report_or_its_patience() {
        let received = std::sync::Arc::new(ReceivedRanges::default());
        let trainers = ["trainer-0".to_owned(), "trainer-1".to_owned()];
        received.reported("e", "trainer-0");
        let late = {
            let received = received.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                received.reported("e", "trainer-1");
            })
        };
        let started = Instant::now();
        let stalled = |_: &str| false;
        let missing =
            (received.await_reports("e", &trainers, Duration::from_secs(30), stalled)).await;
        assert!(missing.is_empty(), "{missing:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        late.await.expect("reporter");
        let patience = Duration::from_millis(100);
        let missing = (received.await_reports("e", &trainers, patience, stalled)).await;
        assert_eq!(missing, trainers, "the earlier reports were forgotten");
    }

    #[test]
    fn an_executor_is_restarting_from_its_crash_until_it_registers() {
        let received = ReceivedRanges::default();
        assert!(!received.restarting("e"));
        received.registered("e");
        received.executor_crashed("e");
        assert!(received.restarting("e"));
        received.registered("e");
        assert!(!received.restarting("e"));
    }

    /// A trainer lost since the executor registered, or one that keeps training, is not
    /// waited for; one lost before the executor registered is (its successor read from it).
    #[tokio::test]
    async fn lost_or_training_trainers_are_not_waited_for() {
        let received = std::sync::Arc::new(ReceivedRanges::default());
        let trainers = ["trainer-0".to_owned(), "trainer-1".to_owned()];
        received.trainer_lost("trainer-0");
        tokio::time::sleep(Duration::from_millis(5)).await;
        received.registered("e");
        let lost = {
            let received = received.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                received.trainer_lost("trainer-1");
            })
        };
        let training = |t: &str| t == "trainer-0";
        let started = Instant::now();
        let missing =
            (received.await_reports("e", &trainers, Duration::from_secs(30), training)).await;
        assert!(missing.is_empty(), "{missing:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        lost.await.expect("loser");
        received.registered("e");
        let patience = Duration::from_millis(100);
        let missing = (received.await_reports("e", &trainers, patience, |_| false)).await;
        assert_eq!(
            missing, trainers,
            "both were lost before the executor registered"
        );
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
