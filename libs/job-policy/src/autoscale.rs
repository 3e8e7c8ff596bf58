//! Horizontal scaling of a running Job's data executors by their load (Primus Eq. 1).
//!
//! Every status tick the backend measures each executor's CPU and resident memory (they go
//! into the Metric resource as `cpu_cores` and `memory_bytes`), and the data executors'
//! utilisation `u` is averaged over the ones that reported: buffer starvation (1 - the
//! `buffer_fill` they report), CPU used over `topology.data_executors.cpu` and memory over
//! `topology.data_executors.memory`, each capped at 1. Their load is `L = w.u / sum(w)`.
//! Primus adds data executors when its load is *below* the threshold because its `u_b` is
//! the buffers' fill; here `u_b` is their starvation, so that every utilisation rises with
//! the need for more executors and a high load means scale out. With `spec.scaling.enabled`,
//! the mean load of the last few ticks above `load_threshold`, while tasks wait in the
//! queue, adds one data executor; below `scale_in_threshold` it removes one; within the
//! min/max bounds, one action per `cooldown_seconds` (the Job's start counts as one). Each
//! action is an event naming the figures it used.

use std::collections::VecDeque;
use std::time::Duration;

use primus_spec::job::{JobSpec, ScalingPolicy};
use tokio::time::Instant;

use crate::ExecutorRole;
use crate::actions::Action;
use crate::snapshot::Snapshot;

/// Loads averaged for a decision, and the fewest taken since the last action.
const LOAD_WINDOW: usize = 5;
const MIN_SAMPLES: usize = 3;

/// One data executor's utilisation, each 0..=1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Utilisation {
    pub starvation: f64,
    pub cpu: f64,
    pub memory: f64,
}

impl Utilisation {
    /// From a data executor's buffer fill and measured use, against its allotment.
    pub fn measured(buffer_fill: f64, cpu_cores: f64, memory_bytes: u64, spec: &JobSpec) -> Self {
        let role = &spec.topology.data_executors;
        let memory_limit = primus_spec::job::parse_memory(&role.memory).unwrap_or(0);
        let share = |used: f64, limit: f64| match limit > 0.0 {
            true => (used / limit).clamp(0.0, 1.0),
            false => 0.0,
        };
        Self {
            starvation: 1.0 - buffer_fill.clamp(0.0, 1.0),
            cpu: share(cpu_cores, role.cpu),
            memory: share(memory_bytes as f64, memory_limit as f64),
        }
    }
}

/// The data executors' mean utilisation and their load under a policy's weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub mean: Utilisation,
    pub value: f64,
    pub executors: usize,
}

impl Load {
    /// None when no data executor reported.
    pub fn of(executors: &[Utilisation], policy: &ScalingPolicy) -> Option<Self> {
        if executors.is_empty() {
            return None;
        }
        let n = executors.len() as f64;
        let mean = Utilisation {
            starvation: executors.iter().map(|u| u.starvation).sum::<f64>() / n,
            cpu: executors.iter().map(|u| u.cpu).sum::<f64>() / n,
            memory: executors.iter().map(|u| u.memory).sum::<f64>() / n,
        };
        let w = &policy.weights;
        let total = w.starvation + w.cpu + w.memory;
        let weighted = w.starvation * mean.starvation + w.cpu * mean.cpu + w.memory * mean.memory;
        Some(Self {
            mean,
            value: if total > 0.0 { weighted / total } else { 0.0 },
            executors: executors.len(),
        })
    }
}

/// What the autoscaler decided, and why.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Hold,
    Out(String),
    In(String),
}

/// The loads seen since the last action and when that was.
pub struct Autoscaler {
    loads: VecDeque<Load>,
    last_action: Instant,
}

impl Autoscaler {
    /// For a Job that started at `started`: its start counts as an action, so the first
    /// decision waits a cooldown (buffers are empty while the first reads are on their way).
    pub fn new(started: Instant) -> Self {
        Self {
            loads: VecDeque::new(),
            last_action: started,
        }
    }

    /// With `spec.scaling.enabled`, one data executor more or fewer by their load.
    pub fn decide(&mut self, snapshot: &Snapshot) -> Vec<Action> {
        let policy = &snapshot.spec.scaling;
        if !policy.enabled {
            return Vec::new();
        }
        let data_executors = snapshot.members(ExecutorRole::DataExecutor);
        let utilisations: Vec<Utilisation> = (data_executors.iter())
            .filter_map(|(_, id)| {
                let fill = *snapshot.buffer_fill.get(id)?;
                let used = snapshot.usage.iter().find(|u| &u.id == id)?;
                let (cores, memory) = (used.cpu_cores, used.memory_bytes);
                Some(Utilisation::measured(fill, cores, memory, &snapshot.spec))
            })
            .collect();
        let Some(load) = Load::of(&utilisations, policy) else {
            return Vec::new();
        };
        let running = data_executors.len() as u32;
        let pending = snapshot.pending_tasks;
        let role = ExecutorRole::DataExecutor;
        match self.decide_on_load(load, policy, running, pending, snapshot.now) {
            Decision::Hold => Vec::new(),
            Decision::Out(why) => vec![Action::AddExecutor { role, why }],
            Decision::In(why) => vec![Action::RemoveExecutor { role, why }],
        }
    }

    /// Takes this tick's load; decides for `running` data executors with `pending` tasks
    /// waiting in the queue.
    fn decide_on_load(
        &mut self,
        load: Load,
        policy: &ScalingPolicy,
        running: u32,
        pending: u64,
        now: Instant,
    ) -> Decision {
        self.loads.push_back(load);
        if self.loads.len() > LOAD_WINDOW {
            self.loads.pop_front();
        }
        let cooling = now < self.last_action + Duration::from_secs(policy.cooldown_seconds);
        if !policy.enabled || cooling || self.loads.len() < MIN_SAMPLES {
            return Decision::Hold;
        }
        let n = self.loads.len() as f64;
        let mean = self.loads.iter().map(|l| l.value).sum::<f64>() / n;
        let figures = |comparison: String| {
            let u = self.loads.iter().fold((0.0, 0.0, 0.0), |(s, c, m), l| {
                (s + l.mean.starvation, c + l.mean.cpu, m + l.mean.memory)
            });
            format!(
                "load {comparison} over the last {} ticks: starvation {:.2}, cpu {:.2}, memory {:.2} of {} data executors; {pending} tasks pending",
                self.loads.len(),
                u.0 / n,
                u.1 / n,
                u.2 / n,
                load.executors,
            )
        };
        let decision =
            if mean > policy.load_threshold && running < policy.max_data_executors && pending > 0 {
                Decision::Out(figures(format!("{mean:.2} > {:.2}", policy.load_threshold)))
            } else if mean < policy.scale_in_threshold && running > policy.min_data_executors {
                Decision::In(figures(format!(
                    "{mean:.2} < {:.2}",
                    policy.scale_in_threshold
                )))
            } else {
                Decision::Hold
            };
        if decision != Decision::Hold {
            self.last_action = now;
            self.loads.clear();
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::fixture;

    fn policy() -> ScalingPolicy {
        ScalingPolicy {
            enabled: true,
            min_data_executors: 1,
            max_data_executors: 3,
            ..ScalingPolicy::default()
        }
    }

    /// An autoscaler whose Job started a cooldown before `now`.
    fn started_before(now: Instant) -> Autoscaler {
        Autoscaler::new(now - Duration::from_secs(30))
    }

    fn load(starvation: f64, cpu: f64, memory: f64) -> Load {
        let u = Utilisation {
            starvation,
            cpu,
            memory,
        };
        Load::of(&[u], &policy()).expect("one executor")
    }

    #[test]
    fn the_load_is_the_weighted_mean_utilisation() {
        // Default weights 0.7, 0.2, 0.1.
        let l = load(1.0, 0.5, 0.0);
        assert!((l.value - 0.8).abs() < 1e-12, "{l:?}");
        let two = [
            Utilisation {
                starvation: 1.0,
                cpu: 0.0,
                memory: 0.0,
            },
            Utilisation {
                starvation: 0.0,
                cpu: 0.0,
                memory: 0.0,
            },
        ];
        let l = Load::of(&two, &policy()).expect("two executors");
        assert!((l.value - 0.35).abs() < 1e-12, "{l:?}");
        assert_eq!(Load::of(&[], &policy()), None);
    }

    #[test]
    fn starving_trainers_scale_out_once_per_cooldown_and_only_with_tasks_waiting() {
        let now = Instant::now() + Duration::from_secs(60);
        let mut starting = Autoscaler::new(now);
        let starving = load(1.0, 0.1, 0.1);
        for _ in 0..5 {
            assert_eq!(
                starting.decide_on_load(starving, &policy(), 1, 5, now),
                Decision::Hold,
                "the first decision waits a cooldown after the start"
            );
        }
        let mut scaler = started_before(now);
        assert_eq!(
            scaler.decide_on_load(starving, &policy(), 1, 5, now),
            Decision::Hold
        );
        assert_eq!(
            scaler.decide_on_load(starving, &policy(), 1, 5, now),
            Decision::Hold
        );
        let Decision::Out(why) = scaler.decide_on_load(starving, &policy(), 1, 5, now) else {
            panic!("three starving ticks scale out");
        };
        assert!(
            why.starts_with("load 0.73 > 0.60 over the last 3 ticks: starvation 1.00"),
            "{why}"
        );
        assert!(
            why.ends_with("of 1 data executors; 5 tasks pending"),
            "{why}"
        );
        for _ in 0..5 {
            assert_eq!(
                scaler.decide_on_load(starving, &policy(), 2, 5, now),
                Decision::Hold,
                "cooling down"
            );
        }
        let later = now + Duration::from_secs(31);
        assert!(matches!(
            scaler.decide_on_load(starving, &policy(), 2, 5, later),
            Decision::Out(_)
        ));
        let much_later = later + Duration::from_secs(31);
        let mut idle = started_before(much_later);
        for _ in 0..5 {
            assert_eq!(
                idle.decide_on_load(starving, &policy(), 1, 0, much_later),
                Decision::Hold,
                "no task waits for a new executor"
            );
        }
        let mut full = started_before(now);
        for _ in 0..5 {
            assert_eq!(
                full.decide_on_load(starving, &policy(), 3, 5, now),
                Decision::Hold,
                "at max"
            );
        }
    }

    #[test]
    fn full_buffers_scale_in_down_to_the_minimum() {
        let now = Instant::now() + Duration::from_secs(60);
        let mut scaler = started_before(now);
        let idle = load(0.0, 0.2, 0.1);
        scaler.decide_on_load(idle, &policy(), 2, 0, now);
        scaler.decide_on_load(idle, &policy(), 2, 0, now);
        assert!(matches!(
            scaler.decide_on_load(idle, &policy(), 2, 0, now),
            Decision::In(_)
        ));
        let mut at_min = started_before(now);
        for _ in 0..5 {
            assert_eq!(
                at_min.decide_on_load(idle, &policy(), 1, 0, now),
                Decision::Hold
            );
        }
        let mut off = started_before(now);
        let disabled = ScalingPolicy {
            enabled: false,
            ..policy()
        };
        for _ in 0..5 {
            assert_eq!(
                off.decide_on_load(idle, &disabled, 2, 0, now),
                Decision::Hold
            );
        }
    }

    /// A snapshot of `ids` data executors with buffers `fill` full and `pending` tasks.
    fn tick(ids: &[&str], fill: f64, pending: u64, enabled: bool, now: Instant) -> Snapshot {
        let mut spec = fixture::spec();
        spec.scaling = ScalingPolicy {
            enabled,
            ..policy()
        };
        let mut snapshot = fixture::snapshot(spec, ids, now);
        snapshot.pending_tasks = pending;
        for id in ids.iter().filter(|id| id.starts_with("data_executor")) {
            snapshot.buffer_fill.insert((*id).to_owned(), fill);
            snapshot.usage.push(fixture::used(id, 0.1, 1 << 20));
        }
        snapshot
    }

    #[test]
    fn a_snapshot_of_starving_data_executors_adds_one_and_of_full_ones_removes_one() {
        let now = Instant::now() + Duration::from_secs(60);
        let one = ["data_executor-0", "trainer-0", "ps-0"];
        let starving = tick(&one, 0.0, 5, true, now);
        let mut scaler = started_before(now);
        assert_eq!(scaler.decide(&starving), vec![]);
        assert_eq!(scaler.decide(&starving), vec![]);
        let added = scaler.decide(&starving);
        let [Action::AddExecutor { role, why }] = added.as_slice() else {
            panic!("three starving ticks add a data executor");
        };
        assert_eq!(*role, ExecutorRole::DataExecutor);
        assert!(
            why.ends_with("of 1 data executors; 5 tasks pending"),
            "{why}"
        );

        let two = ["data_executor-0", "data_executor-1", "trainer-0"];
        let full = tick(&two, 1.0, 0, true, now);
        let mut scaler = started_before(now);
        scaler.decide(&full);
        scaler.decide(&full);
        assert!(matches!(
            scaler.decide(&full).as_slice(),
            [Action::RemoveExecutor {
                role: ExecutorRole::DataExecutor,
                ..
            }]
        ));

        let mut off = started_before(now);
        let disabled = tick(&one, 0.0, 5, false, now);
        let mut silent = tick(&one, 0.0, 5, true, now);
        silent.buffer_fill.clear();
        for _ in 0..5 {
            assert_eq!(off.decide(&disabled), vec![], "scaling is off");
            assert_eq!(off.decide(&silent), vec![], "no buffer reported");
        }
    }
}
