//! Straggler handling (DLRover-RM §5.1): a data executor much slower than its peers gets
//! fewer tasks, and its last ones are taken back for faster executors. Every status tick
//! the task queue's offsets say how many rows each data executor served while it held a
//! task; one serving at less than `1 / spec.scaling.stragglers.slowdown` of its peers'
//! median is a straggler. The task service gives a straggler a task only while more than
//! one is waiting and it holds none; once nothing is waiting and a faster executor is idle,
//! the straggler gives one task back (it serves nothing more of it and answers the rows
//! it served) and the queue holds it from there for the faster one.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use crate::ExecutorRole;
use crate::actions::Action;
use crate::snapshot::Snapshot;

/// Seconds an executor must have held tasks before its rate counts.
const MIN_BUSY: Duration = Duration::from_secs(3);

/// Rows each data executor served and how long it held a task.
#[derive(Debug, Default)]
pub struct Throughputs {
    /// Each running task's offset at the last observation.
    offsets: HashMap<String, u64>,
    served: HashMap<String, (u64, Duration)>,
    /// The executors holding a task at the last observation.
    holding: BTreeSet<String>,
    observed_at: Option<Instant>,
}

impl Throughputs {
    /// Folds in the queue at `now`: `running` (task -> executor) and `offsets` (task ->
    /// rows served).
    pub fn observe(
        &mut self,
        running: &HashMap<String, String>,
        offsets: &HashMap<String, u64>,
        now: Instant,
    ) {
        let elapsed = self.observed_at.map(|at| now - at);
        self.observed_at = Some(now);
        let busy: BTreeSet<&String> = running.values().collect();
        for (task, executor) in running {
            let offset = offsets.get(task).copied().unwrap_or(0);
            // A task first seen now counts from here: its rows before are unattributed.
            let gained = self
                .offsets
                .get(task)
                .map_or(0, |before| offset.saturating_sub(*before));
            self.served.entry(executor.clone()).or_default().0 += gained;
        }
        if let Some(elapsed) = elapsed {
            for executor in busy {
                self.served.entry(executor.clone()).or_default().1 += elapsed;
            }
        }
        self.offsets = running
            .keys()
            .map(|task| (task.clone(), offsets.get(task).copied().unwrap_or(0)))
            .collect();
        self.holding = running.values().cloned().collect();
    }

    /// Rows per second `executor` served while it held tasks, once it held them a while,
    /// or once it served rows and holds none (a fast executor that read its tasks to the
    /// end sooner: whole tasks are its measurement).
    pub fn rate(&self, executor: &str) -> Option<f64> {
        let (rows, busy) = self.served.get(executor)?;
        let finished = *rows > 0 && !busy.is_zero() && !self.holding.contains(executor);
        (*busy >= MIN_BUSY || finished).then(|| *rows as f64 / busy.as_secs_f64())
    }
}

/// The data executors among `executors` serving at less than `1 / slowdown` of the median
/// rate of the others (only those with a rate), each with why.
pub fn stragglers(
    executors: &[String],
    rates: &Throughputs,
    slowdown: f64,
) -> Vec<(String, String)> {
    let measured: Vec<(&String, f64)> = executors
        .iter()
        .filter_map(|e| Some((e, rates.rate(e)?)))
        .collect();
    measured
        .iter()
        .filter_map(|(executor, rate)| {
            let mut peers: Vec<f64> = measured
                .iter()
                .filter(|(other, _)| other != executor)
                .map(|(_, r)| *r)
                .collect();
            peers.sort_by(f64::total_cmp);
            let median = *peers.get(peers.len() / 2)?;
            (*rate * slowdown < median).then(|| {
                let why = format!(
                    "{executor} served {rate:.0} rows/s while holding tasks, under 1/{slowdown} of its peers' median {median:.0} rows/s"
                );
                ((*executor).clone(), why)
            })
        })
        .collect()
}

/// The task to take back now, if any: one a straggler holds while nothing is waiting and a
/// data executor that is not a straggler holds none.
pub fn task_to_take_back<'a>(
    executors: &[String],
    running: &'a HashMap<String, String>,
    stragglers: &BTreeSet<String>,
    pending: u64,
) -> Option<(&'a String, &'a String)> {
    let idle_peer = executors
        .iter()
        .any(|e| !stragglers.contains(e) && !running.values().any(|holder| holder == e));
    if pending > 0 || !idle_peer {
        return None;
    }
    let mut held: Vec<(&String, &String)> = running
        .iter()
        .filter(|(_, holder)| stragglers.contains(*holder))
        .collect();
    held.sort();
    held.into_iter().next()
}

/// The stragglers policy: the data executors' rates and the stragglers marked so far.
#[derive(Debug, Default)]
pub struct StragglerPolicy {
    throughputs: Throughputs,
    marked: BTreeSet<String>,
}

impl StragglerPolicy {
    /// Measures the data executors' rates; with `scaling.stragglers.enabled`, marks the
    /// stragglers (an event for each new one) and takes one task back from a straggler
    /// when a faster executor is idle.
    pub fn decide(&mut self, snapshot: &Snapshot) -> Vec<Action> {
        let Some(held) = &snapshot.held else {
            return Vec::new();
        };
        (self.throughputs).observe(&held.running, &held.offsets, snapshot.now);
        let policy = &snapshot.spec.scaling.stragglers;
        if !policy.enabled {
            return Vec::new();
        }
        let executors: Vec<String> = (snapshot.members(ExecutorRole::DataExecutor).into_iter())
            .map(|(_, id)| id)
            .collect();
        let found = stragglers(&executors, &self.throughputs, policy.slowdown);
        let ids: BTreeSet<String> = found.iter().map(|(id, _)| id.clone()).collect();
        let mut actions = Vec::new();
        if ids != self.marked {
            actions.push(Action::MarkStragglers(ids.clone()));
        }
        for (id, why) in found {
            if !self.marked.contains(&id) {
                actions.push(Action::Event {
                    reason: "Straggler",
                    message: why,
                });
            }
        }
        let pending = snapshot.pending_tasks;
        if let Some((task, holder)) = task_to_take_back(&executors, &held.running, &ids, pending) {
            actions.push(Action::TakeBack {
                task: task.clone(),
                holder: holder.clone(),
            });
        }
        self.marked = ids;
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{HeldTasks, fixture};
    use primus_spec::job::JobSpec;

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn running(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(t, e)| ((*t).to_owned(), (*e).to_owned()))
            .collect()
    }

    fn offsets(pairs: &[(&str, u64)]) -> HashMap<String, u64> {
        pairs.iter().map(|(t, o)| ((*t).to_owned(), *o)).collect()
    }

    #[test]
    fn rates_count_rows_served_over_the_time_tasks_were_held() {
        let mut rates = Throughputs::default();
        let start = Instant::now();
        let held = running(&[("t1", "fast"), ("t2", "slow")]);
        rates.observe(&held, &offsets(&[("t1", 0), ("t2", 0)]), start);
        rates.observe(
            &held,
            &offsets(&[("t1", 3_000), ("t2", 300)]),
            start + Duration::from_secs(2),
        );
        assert_eq!(rates.rate("fast"), None, "held for under MIN_BUSY");
        rates.observe(
            &held,
            &offsets(&[("t1", 6_000), ("t2", 600)]),
            start + Duration::from_secs(4),
        );
        assert_eq!(rates.rate("fast"), Some(1_500.0));
        assert_eq!(rates.rate("slow"), Some(150.0));
        let found = stragglers(&ids(&["fast", "slow"]), &rates, 3.0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "slow");
        assert!(found[0].1.contains("150 rows/s"), "{}", found[0].1);
        assert!(stragglers(&ids(&["fast", "slow"]), &rates, 20.0).is_empty());
    }

    #[test]
    fn an_executor_that_read_its_tasks_to_the_end_sooner_than_min_busy_has_a_rate() {
        let mut rates = Throughputs::default();
        let start = Instant::now();
        let both = running(&[("t1", "fast"), ("t2", "slow")]);
        rates.observe(&both, &offsets(&[("t1", 0), ("t2", 0)]), start);
        rates.observe(
            &both,
            &offsets(&[("t1", 8_000), ("t2", 0)]),
            start + Duration::from_secs(2),
        );
        assert_eq!(
            rates.rate("fast"),
            None,
            "still holding t1, for under MIN_BUSY"
        );
        // t1 is done: the fast executor holds nothing, its 2 s are its measurement.
        let slow_only = running(&[("t2", "slow")]);
        rates.observe(
            &slow_only,
            &offsets(&[("t2", 100)]),
            start + Duration::from_secs(6),
        );
        assert_eq!(rates.rate("fast"), Some(4_000.0));
        assert_eq!(rates.rate("slow"), Some(100.0 / 6.0));
        let found = stragglers(&ids(&["fast", "slow"]), &rates, 3.0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "slow");
    }

    #[test]
    fn a_task_is_taken_back_only_when_nothing_waits_and_a_faster_executor_is_idle() {
        let slow: BTreeSet<String> = ["slow".to_owned()].into();
        let executors = ids(&["fast", "slow"]);
        let held = running(&[("t9", "slow")]);
        assert_eq!(
            task_to_take_back(&executors, &held, &slow, 0),
            Some((&"t9".to_owned(), &"slow".to_owned()))
        );
        assert_eq!(task_to_take_back(&executors, &held, &slow, 1), None);
        let both = running(&[("t9", "slow"), ("t8", "fast")]);
        assert_eq!(task_to_take_back(&executors, &both, &slow, 0), None);
        assert_eq!(
            task_to_take_back(&executors, &held, &BTreeSet::new(), 0),
            None
        );
    }

    /// Two data executors each holding a task, at `seconds` after `start`.
    fn tick(spec: &JobSpec, start: Instant, at: (u64, u64, u64), pending: u64) -> Snapshot {
        let (seconds, fast, slow) = at;
        let ids = ["data_executor-0", "data_executor-1", "trainer-0"];
        let now = start + Duration::from_secs(seconds);
        let mut snapshot = fixture::snapshot(spec.clone(), &ids, now);
        snapshot.pending_tasks = pending;
        snapshot.held = Some(HeldTasks {
            running: running(&[("t1", "data_executor-0"), ("t2", "data_executor-1")]),
            offsets: offsets(&[("t1", fast), ("t2", slow)]),
        });
        snapshot
    }

    #[test]
    fn a_straggler_is_marked_once_and_its_task_taken_back_when_a_peer_is_idle() {
        let start = Instant::now();
        let mut spec = fixture::spec();
        spec.scaling.stragglers.enabled = true;
        spec.scaling.stragglers.slowdown = 3.0;
        let mut policy = StragglerPolicy::default();
        assert_eq!(policy.decide(&tick(&spec, start, (0, 0, 0), 1)), vec![]);
        let early = tick(&spec, start, (2, 3_000, 300), 1);
        assert_eq!(policy.decide(&early), vec![], "too soon");
        let actions = policy.decide(&tick(&spec, start, (4, 6_000, 600), 1));
        let slow: BTreeSet<String> = ["data_executor-1".to_owned()].into();
        assert_eq!(actions[0], Action::MarkStragglers(slow));
        assert!(
            matches!(&actions[1..], [Action::Event { reason: "Straggler", message }] if message.contains("150 rows/s")),
            "{actions:?}"
        );
        let again = tick(&spec, start, (5, 7_500, 750), 1);
        assert_eq!(policy.decide(&again), vec![], "marked already");
        let mut idle = tick(&spec, start, (6, 7_500, 900), 0);
        if let Some(held) = idle.held.as_mut() {
            held.running.remove("t1");
        }
        assert_eq!(
            policy.decide(&idle),
            vec![Action::TakeBack {
                task: "t2".to_owned(),
                holder: "data_executor-1".to_owned()
            }]
        );

        let mut off = StragglerPolicy::default();
        let mut unread = tick(&spec, start, (0, 0, 0), 0);
        unread.held = None;
        assert_eq!(off.decide(&unread), vec![], "the queue could not be read");
        spec.scaling.stragglers.enabled = false;
        for at in [(0, 0, 0), (4, 6_000, 600), (6, 9_000, 900)] {
            let disabled = tick(&spec, start, at, 0);
            assert_eq!(off.decide(&disabled), vec![], "disabled");
        }
    }
}
