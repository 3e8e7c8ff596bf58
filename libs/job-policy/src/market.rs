//! What DLRover-RM's cluster-level selection (Eqs. 11-14) works on: the capacity this
//! master divides among its running `policy: auto` Jobs, what each holds, and each one's
//! latest scale-up plans. Every Job's run reads and writes it; each computes the same
//! greedy selection over what all of them offered and applies its own part.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use primus_config::ClusterSettings;
use primus_resource_model::plans::{JobPlans, select};

/// The capacity, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// Cores; None: no plan that adds cores is applied.
    pub cpu: Option<f64>,
    /// Bytes; None: not a limit.
    pub memory_bytes: Option<u64>,
    /// Eq. 14's `rho`.
    pub rho: f64,
}

impl Capacity {
    /// From `master.cluster`, with `host_cores` standing in for an unset `cpu`. Refuses a
    /// capacity of zero or a `rho` out of range, naming the setting.
    pub fn from_settings(
        settings: &ClusterSettings,
        host_cores: Option<f64>,
    ) -> Result<Self, String> {
        if let Some(cpu) = settings.cpu
            && !(cpu.is_finite() && cpu > 0.0)
        {
            return Err(format!(
                "setting `master.cluster.cpu`: {cpu} is not a number of cores > 0"
            ));
        }
        let memory_bytes = match &settings.memory {
            None => None,
            Some(quantity) => match primus_spec::job::parse_memory(quantity) {
                Ok(0) => return Err("setting `master.cluster.memory`: must be > 0".into()),
                Ok(bytes) => Some(bytes),
                Err(e) => return Err(format!("setting `master.cluster.memory`: {e}")),
            },
        };
        let rho = settings.rho;
        if !(rho.is_finite() && (-10.0..=10.0).contains(&rho)) {
            return Err(format!(
                "setting `master.cluster.rho`: {rho} is outside -10..=10"
            ));
        }
        Ok(Self {
            cpu: settings.cpu.or(host_cores),
            memory_bytes,
            rho,
        })
    }
}

/// One Job's part: what it holds, and its plans once it has some.
#[derive(Debug, Clone)]
struct Part {
    cores: f64,
    memory_bytes: u64,
    plans: Option<JobPlans>,
}

/// The running `policy: auto` Jobs' parts, shared by their runs.
#[derive(Debug, Clone, Default)]
pub struct ClusterPlans(Arc<Mutex<BTreeMap<String, Part>>>);

/// What the selection gave one Job.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The index of the chosen plan among the Job's, None: it stays as it is.
    pub plan: Option<usize>,
    /// Jobs whose plans were weighed.
    pub competing: usize,
    /// Cores free before the selection.
    pub free_cores: f64,
    /// Bytes free before the selection (None: memory is not a limit).
    pub free_memory_bytes: Option<u64>,
}

impl ClusterPlans {
    fn parts(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Part>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `job` holds `cores` and `memory_bytes` now and offers `plans` (None: none now).
    pub fn offer(&self, job: &str, cores: f64, memory_bytes: u64, plans: Option<JobPlans>) {
        let part = Part {
            cores,
            memory_bytes,
            plans,
        };
        self.parts().insert(job.to_owned(), part);
    }

    /// `job` ended: what it held is free.
    pub fn leave(&self, job: &str) {
        self.parts().remove(job);
    }

    /// Eqs. 11-14 over every Job's plans within what no Job holds: `job`'s part of the
    /// outcome.
    pub fn choose(&self, job: &str, capacity: &Capacity) -> Choice {
        let parts = self.parts();
        let held: f64 = parts.values().map(|p| p.cores).sum();
        let held_memory: u64 = parts.values().map(|p| p.memory_bytes).sum();
        let free_cores = capacity.cpu.map_or(0.0, |cpu| (cpu - held).max(0.0));
        let free_memory_bytes = capacity
            .memory_bytes
            .map(|memory| memory.saturating_sub(held_memory));
        let offering: Vec<(&String, &JobPlans)> = (parts.iter())
            .filter_map(|(name, part)| Some((name, part.plans.as_ref()?)))
            .collect();
        let plans: Vec<JobPlans> = offering.iter().map(|(_, p)| (*p).clone()).collect();
        let chosen = select(&plans, free_cores, capacity.rho);
        let plan = (offering.iter().zip(chosen))
            .find(|((name, _), _)| name.as_str() == job)
            .and_then(|(_, choice)| choice);
        Choice {
            plan,
            competing: offering.len(),
            free_cores,
            free_memory_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use primus_resource_model::Allocation;
    use primus_resource_model::plans::Plan;

    use super::*;

    fn plans(cores_now: f64, added: f64, gain: f64) -> JobPlans {
        let cores = cores_now + added;
        JobPlans {
            cores_now,
            remaining_samples: 1e6,
            plans: vec![Plan {
                allocation: Allocation::one_core_each(2, 1),
                cores,
                cost: cores,
                gain,
                throughput: 1_000.0 + gain,
            }],
        }
    }

    #[test]
    fn the_jobs_share_the_free_cores_by_efficiency() {
        let capacity = Capacity {
            cpu: Some(10.0),
            memory_bytes: None,
            rho: 2.5,
        };
        let cluster = ClusterPlans::default();
        cluster.offer("a", 4.0, 0, Some(plans(4.0, 3.0, 100.0)));
        cluster.offer("b", 4.0, 0, Some(plans(4.0, 2.0, 900.0)));
        // 2 cores free: only b's plan fits.
        let (a, b) = (
            cluster.choose("a", &capacity),
            cluster.choose("b", &capacity),
        );
        assert_eq!((a.plan, b.plan), (None, Some(0)));
        assert_eq!((b.competing, b.free_cores), (2, 2.0));
        cluster.leave("b");
        assert_eq!(cluster.choose("a", &capacity).plan, Some(0));
    }

    #[test]
    fn a_capacity_of_zero_or_a_rho_out_of_range_is_refused_naming_the_setting() {
        let refused = |settings: ClusterSettings| {
            Capacity::from_settings(&settings, Some(2.0)).expect_err("refused")
        };
        let zero = refused(ClusterSettings {
            cpu: Some(0.0),
            ..ClusterSettings::default()
        });
        assert!(zero.contains("master.cluster.cpu"), "{zero}");
        let memory = refused(ClusterSettings {
            memory: Some("0Gi".into()),
            ..ClusterSettings::default()
        });
        assert!(memory.contains("master.cluster.memory"), "{memory}");
        let rho = refused(ClusterSettings {
            rho: 12.0,
            ..ClusterSettings::default()
        });
        assert!(rho.contains("master.cluster.rho"), "{rho}");
        let host = Capacity::from_settings(&ClusterSettings::default(), Some(2.0)).expect("ok");
        assert_eq!((host.cpu, host.rho), (Some(2.0), 2.5));
    }
}
