//! PS memory (Primus Eq. 2-3, DLRover-RM §5.3 OOM prevention). Every status tick's snapshot
//! carries how many bytes each PS shard's tables and dense parameters hold (asked in the
//! background by the master); the policy keeps the last
//! `N` samples, forecasts the change over the next ones with Primus's weights
//! `w(i) = 1 / (N - i + 1)` (the newest counts most):
//!
//! ```text
//! D = sum_i w(i) * (R_i - R_(i-1)) / N
//! ```
//!
//! and the allocation it needs, `R_used + D * horizon + R_s` (the most used of the samples,
//! the forecast change over the horizon, a safety margin). When that crosses the shard's
//! memory (at first `topology.ps.memory`) and the shard holds at least half of it, the
//! master gives it the memory it needs where the backend can (the backend's `resize`, then
//! the shard's own limit through `SetMemoryLimit`), skipping increases under
//! `min_change`, and otherwise adds a PS shard (a live resharding) before the limit is
//! reached. A shard at its limit refuses new keys (it never aborts); the `PsMemory`
//! condition names the limit and how many keys were refused.

use std::collections::{BTreeSet, HashMap, VecDeque};

use primus_proto::v1::{Endpoint, Role};
use primus_spec::job::{JobSpec, MemoryPolicy as MemorySettings, parse_memory};

use crate::actions::{Action, Shortfall};
use crate::snapshot::{Snapshot, allotted};

/// The executors' memory samples and what was reported already.
#[derive(Debug, Default)]
pub struct MemoryPolicy {
    samples: HashMap<String, MemorySamples>,
    refused_reported: u64,
    /// The PS shards at the last decision: a resharding moves what they hold, so their
    /// forecast starts again from fresh samples.
    shards: BTreeSet<String>,
}

/// The last samples of one executor's memory, oldest first.
#[derive(Debug, Clone, Default)]
pub struct MemorySamples {
    samples: VecDeque<u64>,
    capacity: usize,
}

impl MemorySamples {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(2);
        Self {
            samples: VecDeque::with_capacity(capacity + 1),
            capacity,
        }
    }

    pub fn push(&mut self, bytes: u64) {
        self.samples.push_back(bytes);
        while self.samples.len() > self.capacity {
            self.samples.pop_front();
        }
    }

    /// The newest sample.
    pub fn latest(&self) -> u64 {
        self.samples.back().copied().unwrap_or(0)
    }

    /// Whether enough samples came in to forecast.
    pub fn full(&self) -> bool {
        self.samples.len() >= self.capacity
    }

    /// Primus Eq. 2: the weighted mean change per sample, recent changes weighted most.
    pub fn forecast_change(&self) -> f64 {
        let n = self.samples.len().saturating_sub(1);
        if n == 0 {
            return 0.0;
        }
        let sum: f64 = self
            .samples
            .iter()
            .zip(self.samples.iter().skip(1))
            .enumerate()
            .map(|(i, (before, now))| {
                let weight = 1.0 / (n - (i + 1) + 1) as f64;
                weight * (*now as f64 - *before as f64)
            })
            .sum();
        sum / n as f64
    }

    /// The memory to give an executor allotted `memory`, if it needs more by over
    /// `min_change` within `horizon` samples (with `safety_margin` of `memory` to spare) and
    /// already uses at least half of it: an executor far from its memory is left alone
    /// however it grows, since a long horizon over early growth would ask for memory a Job
    /// never needs.
    pub fn more_needed(
        &self,
        memory: u64,
        horizon: u32,
        safety_margin: f64,
        min_change: u64,
    ) -> Option<u64> {
        let needed = self.needed(horizon, (memory as f64 * safety_margin) as u64);
        (self.full() && self.latest() >= memory / 2 && needed > memory.saturating_add(min_change))
            .then_some(needed)
    }

    /// Primus Eq. 3: the most used of the samples, the forecast change over `horizon`
    /// samples and `margin`.
    pub fn needed(&self, horizon: u32, margin: u64) -> u64 {
        let used = self.samples.iter().copied().max().unwrap_or(0) as f64;
        let change = self.forecast_change() * f64::from(horizon);
        (used + change.max(0.0) + margin as f64) as u64
    }
}

impl MemoryPolicy {
    /// Samples every executor's resident memory but the PS shards' (as the backend
    /// measured it); one whose forecast crosses its memory is given more where vertical
    /// scaling is on (Primus's vertical scaling).
    pub fn decide_executors(&mut self, snapshot: &Snapshot) -> Vec<Action> {
        let policy = &snapshot.spec.scaling.memory;
        let not_ps = |e: &&Endpoint| e.role != Role::Ps as i32;
        for used in &snapshot.usage {
            if snapshot
                .endpoints
                .iter()
                .filter(not_ps)
                .any(|e| e.id == used.id)
            {
                self.sample(&used.id, used.memory_bytes, policy);
            }
        }
        if !(policy.oom_prevention && policy.vertical) {
            return Vec::new();
        }
        (snapshot.endpoints.iter().filter(not_ps))
            .filter_map(|endpoint| {
                let (figures, bytes) = self.outgrowing(snapshot, endpoint)?;
                Some(Action::Resize {
                    id: endpoint.id.clone(),
                    bytes,
                    figures,
                    otherwise: Shortfall::ShortOnce,
                })
            })
            .collect()
    }

    /// Samples every PS shard's bytes, reports refused keys, and, when one's forecast
    /// crosses its memory, gives it more (with `vertical`) or adds a shard.
    pub fn decide_shards(&mut self, snapshot: &Snapshot) -> Vec<Action> {
        let policy = &snapshot.spec.scaling.memory;
        let shards = primus_proto::role_endpoints(&snapshot.endpoints, Role::Ps);
        let ids: BTreeSet<String> = shards.iter().map(|s| s.id.clone()).collect();
        if ids != self.shards {
            for shard in std::mem::replace(&mut self.shards, ids) {
                self.samples.remove(&shard);
            }
        }
        let Some(answers) = &snapshot.shard_memory else {
            return Vec::new();
        };
        let mut actions = Vec::new();
        let mut refused = 0;
        for answer in answers {
            refused += answer.refused;
            if self.shards.contains(&answer.id) {
                self.sample(&answer.id, answer.bytes, policy);
            }
        }
        let memory = &snapshot.spec.topology.ps.memory;
        if refused > self.refused_reported {
            self.refused_reported = refused;
            let limit = parse_memory(memory).unwrap_or(0);
            let message = format!(
                "{refused} gradients of new keys refused: a PS shard reached its memory limit of {limit} bytes (spec.topology.ps.memory {memory})"
            );
            actions.push(Action::Condition {
                kind: "PsMemory",
                holds: false,
                reason: "NewKeysRefused",
                message,
            });
        }
        if !policy.oom_prevention {
            return actions;
        }
        let outgrowing = shards
            .iter()
            .find_map(|shard| Some((shard, self.outgrowing(snapshot, shard)?)));
        let Some((shard, (figures, bytes))) = outgrowing else {
            return actions;
        };
        match policy.vertical {
            true => actions.push(Action::RaiseShardMemory {
                id: shard.id.clone(),
                bytes,
                figures,
            }),
            false => {
                let message = format!(
                    "{figures}; not given more (spec.scaling.memory.vertical is off): adding a PS shard"
                );
                actions.push(Action::Event {
                    reason: "MemoryForecast",
                    message,
                });
                actions.push(Action::AddPsShard);
            }
        }
        actions
    }

    fn sample(&mut self, id: &str, bytes: u64, policy: &MemorySettings) {
        self.samples
            .entry(id.to_owned())
            .or_insert_with(|| MemorySamples::new(policy.samples as usize))
            .push(bytes);
    }

    /// Why `endpoint` needs more memory and how much, when its forecast says so.
    fn outgrowing(&self, snapshot: &Snapshot, endpoint: &Endpoint) -> Option<(String, u64)> {
        let policy = &snapshot.spec.scaling.memory;
        let samples = self.samples.get(&endpoint.id)?;
        let memory = snapshot.allotted(endpoint)?;
        let min_change = parse_memory(&policy.min_change).unwrap_or(0);
        let horizon = snapshot.horizon_samples;
        let needed = samples.more_needed(memory, horizon, policy.safety_margin, min_change)?;
        Some((
            figures(&endpoint.id, samples, memory, needed, policy),
            needed,
        ))
    }
}

/// An executor killed for its memory: given half as much again (at least `min_change`
/// more) where vertical scaling is on, so its restart does not die the same way; else the
/// Job's events say it was killed. `memory_bytes` is the limit it was killed at.
pub fn after_out_of_memory(
    spec: &JobSpec,
    given: &HashMap<String, u64>,
    endpoint: &Endpoint,
    memory_bytes: u64,
) -> Action {
    let policy = &spec.scaling.memory;
    let memory = allotted(spec, given, endpoint).map_or(memory_bytes, |m| m.max(memory_bytes));
    let killed = format!("{} was killed for its memory ({memory} bytes)", endpoint.id);
    if !policy.vertical {
        return Action::Event {
            reason: "OutOfMemory",
            message: format!("{killed}; spec.scaling.memory.vertical is off"),
        };
    }
    let min_change = parse_memory(&policy.min_change).unwrap_or(0);
    Action::Resize {
        id: endpoint.id.clone(),
        bytes: (memory + memory / 2).max(memory + min_change),
        figures: killed,
        otherwise: Shortfall::Killed,
    }
}

/// How a memory decision came about, for its event.
fn figures(
    id: &str,
    samples: &MemorySamples,
    memory: u64,
    needed: u64,
    policy: &MemorySettings,
) -> String {
    format!(
        "{id} holds {} bytes, changing {:.0} per status interval: it needs {needed} within {}s (Primus Eq. 3, margin {}), over its {memory} bytes",
        samples.latest(),
        samples.forecast_change(),
        policy.horizon_seconds,
        policy.safety_margin
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{ShardMemory, fixture};
    use tokio::time::Instant;

    const GIB: u64 = 1 << 30;

    fn samples(values: &[u64]) -> MemorySamples {
        let mut samples = MemorySamples::new(values.len());
        for v in values {
            samples.push(*v);
        }
        samples
    }

    #[test]
    fn the_forecast_weights_recent_changes_most() {
        // Primus Eq. 2 over 4 samples (3 changes): (1/3 * 10 + 1/2 * 10 + 1 * 40) / 3.
        let growing = samples(&[100, 110, 120, 160]);
        let expected = (10.0 / 3.0 + 10.0 / 2.0 + 40.0) / 3.0;
        assert!((growing.forecast_change() - expected).abs() < 1e-9);
        // The same changes in the other order forecast less: old changes count less.
        let slowing = samples(&[100, 140, 150, 160]);
        assert!(slowing.forecast_change() < growing.forecast_change());
        assert_eq!(samples(&[5, 5, 5]).forecast_change(), 0.0);
    }

    #[test]
    fn the_memory_needed_is_the_most_held_plus_the_forecast_change_and_the_margin() {
        let growing = samples(&[100, 110, 120, 160]);
        let change = growing.forecast_change();
        assert_eq!(growing.needed(3, 50), (160.0 + 3.0 * change + 50.0) as u64);
        // A shrinking shard needs what it held most, not less.
        let shrinking = samples(&[200, 150, 100]);
        assert_eq!(shrinking.needed(10, 0), 200);
        let mut window = MemorySamples::new(3);
        for v in [1, 2, 3, 4] {
            window.push(v);
        }
        assert!(window.full());
        assert_eq!(window.latest(), 4);
        assert_eq!(window.needed(0, 0), 4, "only the last 3 samples are kept");
    }

    #[test]
    fn more_memory_is_asked_only_near_the_limit_and_for_more_than_the_minimum_change() {
        // Growing 100 a sample towards 1,000: needs 900, plus 5 forecast changes, plus 100.
        let near = samples(&[500, 600, 700, 800, 900]);
        let change = near.forecast_change();
        let needed = (900.0 + 5.0 * change + 100.0) as u64;
        assert_eq!(near.more_needed(1_000, 5, 0.1, 0), Some(needed));
        assert_eq!(
            near.more_needed(1_000, 5, 0.1, needed - 1_000),
            None,
            "under min_change"
        );
        let far = samples(&[100, 200, 300, 400, 450]);
        assert_eq!(
            far.more_needed(1_000, 50, 0.1, 0),
            None,
            "under half its memory"
        );
        let partial = samples(&[900, 950]);
        let mut waiting = MemorySamples::new(5);
        waiting.push(partial.latest());
        assert_eq!(
            waiting.more_needed(1_000, 5, 0.1, 0),
            None,
            "too few samples"
        );
        assert_eq!(
            samples(&[900, 900, 900]).more_needed(1_000, 5, 0.05, 0),
            None
        );
    }

    /// The example Job (PS shards of 2Gi) forecasting from 3 samples, 1 sample ahead.
    fn spec(vertical: bool) -> JobSpec {
        let mut spec = fixture::spec();
        spec.scaling.memory.samples = 3;
        spec.scaling.memory.vertical = vertical;
        spec
    }

    /// PS shards `ids` answering `bytes` each and `refused` keys in all (on the first).
    fn shards_tick(spec: &JobSpec, ids: &[&str], bytes: u64, refused: u64) -> Snapshot {
        let mut snapshot = fixture::snapshot(spec.clone(), ids, Instant::now());
        let answers = ids.iter().enumerate().map(|(i, id)| ShardMemory {
            id: (*id).to_owned(),
            bytes,
            refused: if i == 0 { refused } else { 0 },
        });
        snapshot.shard_memory = Some(answers.collect());
        snapshot
    }

    #[test]
    fn a_shard_growing_into_its_memory_is_given_more_or_a_shard_is_added() {
        let two = ["ps-0", "ps-1", "trainer-0"];
        let growth = [GIB + GIB / 2, GIB + 3 * GIB / 4, 2 * GIB - GIB / 8];
        for vertical in [true, false] {
            let spec = spec(vertical);
            let mut policy = MemoryPolicy::default();
            let mut decided = Vec::new();
            for bytes in growth {
                decided = policy.decide_shards(&shards_tick(&spec, &two, bytes, 0));
            }
            let expected = samples(&growth).needed(1, 2 * GIB / 10);
            match vertical {
                true => assert!(
                    matches!(decided.as_slice(), [Action::RaiseShardMemory { id, bytes, figures }]
                        if id == "ps-0" && *bytes == expected && figures.contains("Primus Eq. 3")),
                    "{decided:?}"
                ),
                false => assert!(
                    matches!(decided.as_slice(), [Action::Event { reason: "MemoryForecast", message }, Action::AddPsShard]
                        if message.contains("vertical is off")),
                    "{decided:?}"
                ),
            }
            // A resharding moves what the shards hold: the forecast waits for new samples.
            let three = ["ps-0", "ps-1", "ps-2", "trainer-0"];
            let after = shards_tick(&spec, &three, growth[2], 0);
            assert_eq!(policy.decide_shards(&after), vec![]);
            assert_eq!(policy.decide_shards(&after), vec![]);
        }
        let mut off = spec(true);
        off.scaling.memory.oom_prevention = false;
        let mut policy = MemoryPolicy::default();
        for bytes in growth {
            let tick = shards_tick(&off, &two, bytes, 0);
            assert_eq!(policy.decide_shards(&tick), vec![], "oom_prevention off");
        }
    }

    #[test]
    fn a_given_shard_memory_counts_and_refused_keys_are_reported_when_they_grow() {
        let spec = spec(true);
        let one = ["ps-0", "trainer-0"];
        let mut policy = MemoryPolicy::default();
        let mut given = shards_tick(&spec, &one, 2 * GIB - GIB / 8, 0);
        given.memory_given.insert("ps-0".to_owned(), 8 * GIB);
        for _ in 0..3 {
            assert_eq!(policy.decide_shards(&given), vec![], "far from 8Gi");
        }
        let mut refusing = shards_tick(&spec, &one, GIB, 7);
        refusing.memory_given = given.memory_given.clone();
        let refused = policy.decide_shards(&refusing);
        assert!(
            matches!(refused.as_slice(), [Action::Condition { kind: "PsMemory", holds: false, message, .. }]
                if message.starts_with("7 gradients of new keys refused")),
            "{refused:?}"
        );
        assert_eq!(policy.decide_shards(&refusing), vec![], "reported already");
        let unanswered = fixture::snapshot(spec.clone(), &one, Instant::now());
        assert_eq!(
            policy.decide_shards(&unanswered),
            vec![],
            "answers on their way"
        );
    }

    #[test]
    fn an_executor_growing_into_its_memory_is_resized_and_ps_usage_is_not_sampled() {
        let spec = spec(true);
        let mut policy = MemoryPolicy::default();
        let mut decided = Vec::new();
        // The trainer has 2Gi; the PS shards' usage is left to their own answers.
        for bytes in [GIB + GIB / 2, GIB + 3 * GIB / 4, 2 * GIB - GIB / 8] {
            let mut tick = fixture::snapshot(spec.clone(), &["trainer-0", "ps-0"], Instant::now());
            tick.usage = vec![
                fixture::used("trainer-0", 1.0, bytes),
                fixture::used("ps-0", 0.5, bytes),
            ];
            decided = policy.decide_executors(&tick);
        }
        assert!(
            matches!(decided.as_slice(), [Action::Resize { id, otherwise: Shortfall::ShortOnce, .. }] if id == "trainer-0"),
            "{decided:?}"
        );
        let mut fixed = spec.clone();
        fixed.scaling.memory.vertical = false;
        let mut tick = fixture::snapshot(fixed, &["trainer-0"], Instant::now());
        tick.usage = vec![fixture::used("trainer-0", 1.0, 2 * GIB)];
        assert_eq!(policy.decide_executors(&tick), vec![], "vertical off");
    }

    #[test]
    fn an_executor_killed_for_its_memory_is_given_half_as_much_again() {
        let trainer = fixture::endpoint("trainer-0");
        let none = HashMap::new();
        let action = after_out_of_memory(&spec(true), &none, &trainer, GIB);
        assert_eq!(
            action,
            Action::Resize {
                id: "trainer-0".to_owned(),
                bytes: 3 * GIB,
                figures: format!("trainer-0 was killed for its memory ({} bytes)", 2 * GIB),
                otherwise: Shortfall::Killed,
            },
            "its 2Gi, the more of its allotment and the limit it was killed at"
        );
        let given = HashMap::from([("trainer-0".to_owned(), 4 * GIB)]);
        let Action::Resize { bytes, .. } = after_out_of_memory(&spec(true), &given, &trainer, GIB)
        else {
            panic!("resized");
        };
        assert_eq!(bytes, 6 * GIB);
        assert!(matches!(
            after_out_of_memory(&spec(false), &none, &trainer, GIB),
            Action::Event { reason: "OutOfMemory", message } if message.ends_with("vertical is off")
        ));
    }
}
