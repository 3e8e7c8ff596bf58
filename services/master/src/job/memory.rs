//! PS memory (Primus Eq. 2-3, DLRover-RM §5.3 OOM prevention). Every status tick the master
//! asks each PS shard how many bytes its tables and dense parameters hold (all at once, in
//! the background: a shard that does not answer never holds up the Job's loop; the answers
//! are taken at the next tick that finds them all in), keeps the last
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

use std::collections::{HashMap, HashSet, VecDeque};

use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{Endpoint, Role, SetMemoryLimitRequest, StatsRequest};
use tokio::task::JoinHandle;

use super::JobRun;
use super::executors::{ANSWER_DEADLINE, answered, role_spec};
use primus_backend::{ExecutorRole, ExecutorUsage, ResourceBackend};
use primus_data_tasks::plan::Catalog;

/// The executors' memory samples and allotments, how many refused keys were reported
/// already, and which executors were reported short of memory.
#[derive(Debug, Default)]
pub(crate) struct MemoryWatch {
    samples: HashMap<String, MemorySamples>,
    /// Memory given to an executor since it started (else its `topology.<role>.memory`).
    allotted: HashMap<String, u64>,
    refused_reported: u64,
    short: HashSet<String>,
    /// The shards' answers on their way, asked at an earlier tick.
    asking: Option<JoinHandle<Vec<ShardMemory>>>,
}

/// What a PS shard answered about its memory.
#[derive(Debug)]
struct ShardMemory {
    id: String,
    bytes: u64,
    /// Gradients of new keys it refused at its limit, so far.
    refused: u64,
}

impl MemoryWatch {
    /// The memory executors were given since they started, by id.
    pub(super) fn given(&self) -> &HashMap<String, u64> {
        &self.allotted
    }

    /// The answers asked at an earlier tick, once all are in (None while some are still
    /// awaited, and at the first tick); asks `shards` again whenever it takes answers.
    async fn answers(&mut self, shards: &[Endpoint]) -> Option<Vec<ShardMemory>> {
        if self
            .asking
            .as_ref()
            .is_some_and(|asking| !asking.is_finished())
        {
            return None;
        }
        let answered = match self.asking.take() {
            Some(asking) => Some(asking.await.unwrap_or_default()),
            None => None,
        };
        let shards = shards.to_vec();
        self.asking = Some(tokio::spawn(async move {
            let asked = shards.iter().map(|shard| async move {
                let (bytes, refused) = held(&shard.grpc_addr).await?;
                Some(ShardMemory {
                    id: shard.id.clone(),
                    bytes,
                    refused,
                })
            });
            futures::future::join_all(asked)
                .await
                .into_iter()
                .flatten()
                .collect()
        }));
        answered
    }
}

/// The last samples of one executor's memory, oldest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemorySamples {
    samples: VecDeque<u64>,
    capacity: usize,
}

impl MemorySamples {
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(2);
        Self {
            samples: VecDeque::with_capacity(capacity + 1),
            capacity,
        }
    }

    pub(crate) fn push(&mut self, bytes: u64) {
        self.samples.push_back(bytes);
        while self.samples.len() > self.capacity {
            self.samples.pop_front();
        }
    }

    /// The newest sample.
    pub(crate) fn latest(&self) -> u64 {
        self.samples.back().copied().unwrap_or(0)
    }

    /// Whether enough samples came in to forecast.
    pub(crate) fn full(&self) -> bool {
        self.samples.len() >= self.capacity
    }

    /// Primus Eq. 2: the weighted mean change per sample, recent changes weighted most.
    pub(crate) fn forecast_change(&self) -> f64 {
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
    pub(crate) fn more_needed(
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
    pub(crate) fn needed(&self, horizon: u32, margin: u64) -> u64 {
        let used = self.samples.iter().copied().max().unwrap_or(0) as f64;
        let change = self.forecast_change() * f64::from(horizon);
        (used + change.max(0.0) + margin as f64) as u64
    }
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Samples every PS shard's bytes, reports refused keys, and adds a shard when one's
    /// forecast crosses `topology.ps.memory`.
    pub(super) async fn watch_ps_memory(&mut self) {
        let Ok(limit) = primus_spec::job::parse_memory(&self.job.spec.topology.ps.memory) else {
            return;
        };
        let policy = self.job.spec.scaling.memory.clone();
        let endpoints = self.endpoints();
        let shards = primus_proto::role_endpoints(&endpoints, Role::Ps);
        let Some(answers) = self.memory.answers(&shards).await else {
            return;
        };
        let mut refused = 0;
        for answer in answers {
            refused += answer.refused;
            self.memory
                .samples
                .entry(answer.id)
                .or_insert_with(|| MemorySamples::new(policy.samples as usize))
                .push(answer.bytes);
        }
        if refused > self.memory.refused_reported {
            self.memory.refused_reported = refused;
            let message = format!(
                "{refused} gradients of new keys refused: a PS shard reached its memory limit of {limit} bytes (spec.topology.ps.memory {})",
                self.job.spec.topology.ps.memory
            );
            self.writer
                .condition("PsMemory", false, "NewKeysRefused", message);
        }
        if !policy.oom_prevention {
            return;
        }
        let horizon = self.horizon_samples();
        let min_change = primus_spec::job::parse_memory(&policy.min_change).unwrap_or(0);
        let allotted = |id: &str| *self.memory.allotted.get(id).unwrap_or(&limit);
        let outgrowing = shards.iter().find_map(|shard| {
            let samples = self.memory.samples.get(&shard.id)?;
            let memory = allotted(&shard.id);
            let needed = samples.more_needed(memory, horizon, policy.safety_margin, min_change)?;
            Some((shard.clone(), samples.clone(), memory, needed))
        });
        let Some((shard, samples, memory, needed)) = outgrowing else {
            return;
        };
        let figures = figures(&shard.id, &samples, memory, needed, &policy);
        let raised = match policy.vertical {
            true => self.raise_memory(&shard, needed).await,
            false => Err("spec.scaling.memory.vertical is off".to_owned()),
        };
        let message = match raised {
            Ok(()) => {
                self.memory.allotted.insert(shard.id.clone(), needed);
                let message = format!("{figures}: given {needed} bytes");
                tracing::info!(job = self.name, %message, "PS memory raised");
                self.writer.event("MemoryRaised", message);
                self.writer.write().await;
                return;
            }
            Err(why) => format!("{figures}; not given more ({why}): adding a PS shard"),
        };
        tracing::info!(job = self.name, %message, "PS memory forecast");
        self.writer.event("MemoryForecast", message);
        let count = shards.len() as u32;
        self.reshard_ps(count + 1).await;
        // The shards hold less now: forecast from fresh samples.
        for shard in &shards {
            self.memory.samples.remove(&shard.id);
        }
        self.writer.write().await;
    }

    /// Primus's vertical scaling of the other executors: each one's resident memory (as
    /// the backend measured it, `usage`) is sampled, and one whose forecast crosses its
    /// memory is given more where the backend can; where it cannot, the `MemoryShort`
    /// event says so once.
    pub(super) async fn watch_executor_memory(&mut self, usage: &[ExecutorUsage]) {
        let policy = self.job.spec.scaling.memory.clone();
        let endpoints = self.endpoints();
        for used in usage {
            let Some(endpoint) = endpoints.iter().find(|e| e.id == used.id) else {
                continue;
            };
            if endpoint.role == Role::Ps as i32 {
                continue;
            }
            self.memory
                .samples
                .entry(used.id.clone())
                .or_insert_with(|| MemorySamples::new(policy.samples as usize))
                .push(used.memory_bytes);
        }
        if !(policy.oom_prevention && policy.vertical) {
            return;
        }
        let horizon = self.horizon_samples();
        let min_change = primus_spec::job::parse_memory(&policy.min_change).unwrap_or(0);
        for endpoint in endpoints.iter().filter(|e| e.role != Role::Ps as i32) {
            let Some(samples) = self.memory.samples.get(&endpoint.id).cloned() else {
                continue;
            };
            let Some(memory) = self.allotted(endpoint) else {
                continue;
            };
            let Some(needed) =
                samples.more_needed(memory, horizon, policy.safety_margin, min_change)
            else {
                continue;
            };
            let figures = figures(&endpoint.id, &samples, memory, needed, &policy);
            let cpu = role_of(endpoint)
                .and_then(|role| role_spec(&self.job.spec, role))
                .map_or(0.0, |spec| spec.cpu);
            let resized = self
                .context
                .backend
                .resize(&self.name, &endpoint.id, cpu, needed)
                .await;
            match resized {
                Ok(()) => {
                    self.memory.allotted.insert(endpoint.id.clone(), needed);
                    self.writer
                        .event("MemoryRaised", format!("{figures}: given {needed} bytes"));
                }
                Err(e) if self.memory.short.insert(endpoint.id.clone()) => {
                    self.writer.event("MemoryShort", format!("{figures}; {e}"));
                }
                Err(_) => {}
            }
        }
    }

    /// An executor killed for its memory: given half as much again (at least
    /// `min_change` more) where vertical scaling is on and the backend can, so its
    /// restart does not die the same way; else the Job's events say it was killed.
    pub(super) async fn on_out_of_memory(&mut self, id: &str, memory_bytes: u64) {
        let policy = self.job.spec.scaling.memory.clone();
        let endpoints = self.endpoints();
        let Some(endpoint) = endpoints.iter().find(|e| e.id == id) else {
            return;
        };
        let memory = (self.allotted(endpoint)).map_or(memory_bytes, |m| m.max(memory_bytes));
        let killed = format!("{id} was killed for its memory ({memory} bytes)");
        if !policy.vertical {
            let message = format!("{killed}; spec.scaling.memory.vertical is off");
            self.writer.event("OutOfMemory", message);
            return;
        }
        let min_change = primus_spec::job::parse_memory(&policy.min_change).unwrap_or(0);
        let needed = (memory + memory / 2).max(memory + min_change);
        let cpu = role_of(endpoint)
            .and_then(|role| role_spec(&self.job.spec, role))
            .map_or(0.0, |spec| spec.cpu);
        match self
            .context
            .backend
            .resize(&self.name, id, cpu, needed)
            .await
        {
            Ok(()) => {
                self.memory.allotted.insert(id.to_owned(), needed);
                self.writer
                    .event("MemoryRaised", format!("{killed}: given {needed} bytes"));
            }
            Err(e) => self
                .writer
                .event("OutOfMemory", format!("{killed}; not given more: {e}")),
        }
        self.writer.write().await;
    }

    /// The memory `endpoint` is allotted now: its last raise, else its role's
    /// `topology.<role>.memory`.
    fn allotted(&self, endpoint: &Endpoint) -> Option<u64> {
        if let Some(memory) = self.memory.allotted.get(&endpoint.id) {
            return Some(*memory);
        }
        let spec = role_spec(&self.job.spec, role_of(endpoint)?)?;
        primus_spec::job::parse_memory(&spec.memory).ok()
    }

    /// `horizon_seconds` in status intervals.
    fn horizon_samples(&self) -> u32 {
        let policy = &self.job.spec.scaling.memory;
        let interval = self.context.settings.master.status_interval_ms.max(1);
        (policy.horizon_seconds.saturating_mul(1_000) / interval).clamp(1, u64::from(u32::MAX))
            as u32
    }

    /// Gives PS shard `shard` `bytes` of memory: the backend's allotment, then the shard's
    /// own limit.
    async fn raise_memory(&self, shard: &Endpoint, bytes: u64) -> Result<(), String> {
        let cpu = self.job.spec.topology.ps.cpu;
        self.context
            .backend
            .resize(&self.name, &shard.id, cpu, bytes)
            .await
            .map_err(|e| e.to_string())?;
        let set = async {
            let mut client = ParameterServerClient::connect(format!("http://{}", shard.grpc_addr))
                .await
                .map_err(|e| e.to_string())?;
            client
                .set_memory_limit(SetMemoryLimitRequest { bytes })
                .await
                .map(|_| ())
                .map_err(|s| s.message().to_owned())
        };
        answered(&shard.id, set).await
    }
}

/// How a memory decision came about, for its event.
fn figures(
    id: &str,
    samples: &MemorySamples,
    memory: u64,
    needed: u64,
    policy: &primus_spec::job::MemoryPolicy,
) -> String {
    format!(
        "{id} holds {} bytes, changing {:.0} per status interval: it needs {needed} within {}s (Primus Eq. 3, margin {}), over its {memory} bytes",
        samples.latest(),
        samples.forecast_change(),
        policy.horizon_seconds,
        policy.safety_margin
    )
}

/// The role of an executor the topology lists.
fn role_of(endpoint: &Endpoint) -> Option<ExecutorRole> {
    ExecutorRole::ALL
        .into_iter()
        .find(|role| role.proto() as i32 == endpoint.role)
}

/// The bytes a PS shard holds and the gradients it refused at its limit; None when it
/// does not answer within [`ANSWER_DEADLINE`].
async fn held(addr: &str) -> Option<(u64, u64)> {
    let asked = async {
        let mut client = ParameterServerClient::connect(format!("http://{addr}"))
            .await
            .ok()?;
        client.stats(StatsRequest {}).await.ok()
    };
    let stats = tokio::time::timeout(ANSWER_DEADLINE, asked)
        .await
        .ok()??
        .into_inner();
    let refused = stats.tables.iter().map(|t| t.refused).sum();
    Some((stats.memory_bytes, refused))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
