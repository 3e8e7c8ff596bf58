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

use primus_proto::v1::YieldTaskRequest;
use primus_proto::v1::dataset_service_client::DatasetServiceClient;
use tokio::time::Instant;

use super::JobRun;
use super::executors::answered;
use primus_backend::{ExecutorRole, ResourceBackend};
use primus_data_tasks::plan::Catalog;
use primus_data_tasks::queue::QueueCounts;

/// Seconds an executor must have held tasks before its rate counts.
const MIN_BUSY: Duration = Duration::from_secs(3);

/// Rows each data executor served and how long it held a task.
#[derive(Debug, Default)]
pub(crate) struct Throughputs {
    /// Each running task's offset at the last observation.
    offsets: HashMap<String, u64>,
    served: HashMap<String, (u64, Duration)>,
    observed_at: Option<Instant>,
}

impl Throughputs {
    /// Folds in the queue at `now`: `running` (task -> executor) and `offsets` (task ->
    /// rows served).
    pub(crate) fn observe(
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
    }

    /// Rows per second `executor` served while it held tasks, once it held them a while.
    pub(crate) fn rate(&self, executor: &str) -> Option<f64> {
        let (rows, busy) = self.served.get(executor)?;
        (*busy >= MIN_BUSY).then(|| *rows as f64 / busy.as_secs_f64())
    }
}

/// The data executors among `executors` serving at less than `1 / slowdown` of the median
/// rate of the others (only those with a rate), each with why.
pub(crate) fn stragglers(
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
pub(crate) fn task_to_take_back<'a>(
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

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Measures the data executors' rates, tells the task service which are stragglers
    /// and takes one task back from a straggler when a faster executor is idle.
    pub(super) async fn handle_stragglers(&mut self, counts: &QueueCounts) {
        let policy = self.job.spec.scaling.stragglers.clone();
        let queue = &self.tasks.queue;
        let (running, offsets) = match (queue.running().await, queue.offsets().await) {
            (Ok(running), Ok(offsets)) => (running, offsets),
            (Err(e), _) | (_, Err(e)) => {
                return tracing::warn!(job = self.name, error = %e, "reading the task queue");
            }
        };
        self.throughputs.observe(&running, &offsets, Instant::now());
        if !policy.enabled {
            return;
        }
        let executors: Vec<String> = self
            .members(ExecutorRole::DataExecutor)
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        let found = stragglers(&executors, &self.throughputs, policy.slowdown);
        let ids: BTreeSet<String> = found.iter().map(|(id, _)| id.clone()).collect();
        let known = self.tasks.stragglers.replace(ids.clone());
        for (id, why) in &found {
            if !known.contains(id) {
                self.writer.event("Straggler", why.clone());
            }
        }
        let Some((task, holder)) = task_to_take_back(&executors, &running, &ids, counts.pending)
        else {
            return;
        };
        let message = match self.take_back(task, holder).await {
            Ok(offset) => (
                "StragglerTaskMoved",
                format!(
                    "{task} taken back from {holder} at offset {offset}: a faster data executor is idle"
                ),
            ),
            Err(message) => (
                "StragglerTaskKept",
                format!("{task} stays with {holder}: {message}"),
            ),
        };
        self.writer.event(message.0, message.1);
        self.writer.write().await;
    }

    /// Asks `holder` to give `task` back and puts it back in the queue from the rows it
    /// served; returns that offset.
    async fn take_back(&self, task: &str, holder: &str) -> Result<u64, String> {
        let endpoints = self.endpoints();
        let addr = endpoints
            .iter()
            .find(|e| e.id == holder)
            .map(|e| e.grpc_addr.clone())
            .ok_or_else(|| format!("{holder} is not in the topology"))?;
        let request = YieldTaskRequest {
            job: self.name.clone(),
            task_id: task.to_owned(),
        };
        let yielded = async {
            let mut client = DatasetServiceClient::connect(format!("http://{addr}"))
                .await
                .map_err(|e| e.to_string())?;
            (client.yield_task(request).await)
                .map(|answer| answer.into_inner().served_offset)
                .map_err(|s| s.message().to_owned())
        };
        let offset = answered(holder, yielded).await?;
        let yielded = self
            .tasks
            .queue
            .yield_task(holder, task, offset)
            .await
            .map_err(|e| e.to_string())?;
        match yielded {
            true => Ok(offset),
            false => Err("the queue no longer lists it as its task".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
