//! DLRover-RM's resource-performance model of a running Job, fitted online (§4.3's
//! "online model fitting"): every status tick the trainers' summed samples/s under the
//! Job's allocation (trainers, PS shards, the cores of each) becomes an iteration time by
//! Eq. 1, kept per allocation; once the Job has run under two allocations the model is
//! fitted (primus-resource-model) and the `ResourceModel` condition gives its
//! coefficients, its RMSLE and the samples/s it predicts for the allocation running now.

use std::collections::BTreeMap;

use primus_model::ModelLayout;
use primus_resource_model::{Allocation, FittedModel, JobShape, Observation};
use primus_spec::job::JobSpec;

use super::JobRun;
use crate::backend::{ExecutorRole, ResourceBackend};
use crate::plan::Catalog;

/// Iteration times kept per allocation (the newest), and ticks an allocation must hold
/// before they count (the trainers' rates lag a change by a report window).
const KEPT: usize = 30;
const SETTLING_TICKS: usize = 3;
/// Bandwidth between trainers and PS shards assumed by Eq. 4 (10 Gb/s); the sync
/// coefficient absorbs what it really is, as the paper takes B as a constant.
const BANDWIDTH: f64 = 1.25e9;

/// An allocation as a map key: counts, and cores in thousandths.
type AllocationKey = (u32, u32, u64, u64);

/// Iteration times of the allocation running now before the optimizer acts on it.
const SETTLED_TIMES: usize = 3;

/// The iteration times a Job ran at, per allocation.
pub(super) struct PerformanceLog {
    shape: JobShape,
    times: BTreeMap<AllocationKey, Vec<f64>>,
    current: Option<(AllocationKey, usize)>,
    fitted: Option<FittedModel>,
}

impl PerformanceLog {
    pub(super) fn new(spec: &JobSpec, layout: &ModelLayout) -> Self {
        let dense_floats = super::warm_start::dense_parameters(layout);
        Self {
            shape: JobShape {
                batch: f64::from(spec.training.batch_size.max(1)),
                model_bytes: (4 * dense_floats.max(1)) as f64,
                embedding_width: layout.embedding_width.max(1) as f64,
                bandwidth: BANDWIDTH,
            },
            times: BTreeMap::new(),
            current: None,
            fitted: None,
        }
    }

    /// The model as last fitted.
    pub(super) fn fitted(&self) -> Option<&FittedModel> {
        self.fitted.as_ref()
    }

    /// Each allocation the Job ran with and its samples/s (from its median iteration time).
    pub(super) fn measured(&self) -> Vec<(Allocation, f64)> {
        let batch = self.shape.batch;
        (self.observations().into_iter())
            .map(|o| {
                let samples = f64::from(o.allocation.trainers) * batch;
                (o.allocation, samples / o.iteration_seconds)
            })
            .collect()
    }

    /// Allocations with iteration times.
    pub(super) fn allocations(&self) -> usize {
        self.times.values().filter(|t| !t.is_empty()).count()
    }

    /// Whether the allocation running now has enough iteration times to judge it by.
    pub(super) fn settled(&self) -> bool {
        self.current
            .and_then(|(key, _)| self.times.get(&key))
            .is_some_and(|times| times.len() >= SETTLED_TIMES)
    }

    /// One tick: `samples_per_second` of all trainers under `allocation`. Returns the
    /// fitted model once two allocations have settled iteration times.
    pub(super) fn record(
        &mut self,
        allocation: Allocation,
        samples_per_second: f64,
    ) -> Option<(FittedModel, f64, usize)> {
        let key = key(&allocation);
        let ticks = match self.current {
            Some((held, ticks)) if held == key => ticks + 1,
            _ => 1,
        };
        self.current = Some((key, ticks));
        if ticks > SETTLING_TICKS && samples_per_second > 0.0 {
            let seconds = f64::from(allocation.trainers) * self.shape.batch / samples_per_second;
            let kept = self.times.entry(key).or_default();
            kept.push(seconds);
            if kept.len() > KEPT {
                kept.remove(0);
            }
        }
        let observations = self.observations();
        if observations.len() < 2 {
            return None;
        }
        let fitted = FittedModel::fit(self.shape, &observations).ok()?;
        let rmsle = fitted.rmsle(&observations).ok()?;
        self.fitted = Some(fitted);
        Some((fitted, rmsle, observations.len()))
    }

    /// Each allocation's median iteration time.
    fn observations(&self) -> Vec<Observation> {
        self.times
            .iter()
            .filter(|(_, times)| !times.is_empty())
            .map(|(&(trainers, ps, trainer_mcpu, ps_mcpu), times)| {
                let mut sorted = times.clone();
                sorted.sort_by(f64::total_cmp);
                Observation {
                    allocation: Allocation {
                        trainers,
                        ps,
                        trainer_cpu: trainer_mcpu as f64 / 1000.0,
                        ps_cpu: ps_mcpu as f64 / 1000.0,
                    },
                    iteration_seconds: sorted[sorted.len() / 2],
                }
            })
            .collect()
    }
}

fn key(a: &Allocation) -> AllocationKey {
    let milli = |cores: f64| (cores * 1000.0).round().max(1.0) as u64;
    (a.trainers, a.ps, milli(a.trainer_cpu), milli(a.ps_cpu))
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// The trainers and PS shards running now, with their cores; None while either
    /// role has none.
    pub(super) fn allocation(&self) -> Option<Allocation> {
        let trainers = self
            .members(ExecutorRole::Trainer)
            .iter()
            .filter(|(_, id)| !self.trainers_done.contains(id))
            .count() as u32;
        let ps = self.members(ExecutorRole::Ps).len() as u32;
        let topology = &self.job.spec.topology;
        (trainers > 0 && ps > 0).then_some(Allocation {
            trainers,
            ps,
            trainer_cpu: topology.trainers.cpu,
            ps_cpu: topology.ps.cpu,
        })
    }

    /// Adds this tick's throughput to the log and, once the model fits, says what it found.
    pub(super) fn record_performance(&mut self, samples_per_second: f64) {
        let Some(allocation) = self.allocation() else {
            return;
        };
        let (trainers, ps) = (allocation.trainers, allocation.ps);
        let Some((fitted, rmsle, allocations)) =
            self.performance.record(allocation, samples_per_second)
        else {
            return;
        };
        let c = fitted.coefficients;
        let predicted = fitted.throughput(&allocation).unwrap_or(0.0);
        let message = format!(
            "from {allocations} allocations: T_iter = {:.3e}·m/λw + {:.3e}·w/(p·λp) + {:.3e}·(M/p)/(B/w) + {:.3e}·m·D/p + {:.3e} s; RMSLE {rmsle:.3}; predicts {predicted:.0} samples/s for {trainers} trainers x {} cores, {ps} PS shards x {} cores",
            c.grad,
            c.update,
            c.sync,
            c.embedding,
            c.base,
            allocation.trainer_cpu,
            allocation.ps_cpu
        );
        self.writer
            .condition("ResourceModel", true, "Fitted", message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> PerformanceLog {
        PerformanceLog {
            shape: JobShape {
                batch: 256.0,
                model_bytes: 1.0e6,
                embedding_width: 64.0,
                bandwidth: BANDWIDTH,
            },
            times: BTreeMap::new(),
            current: None,
            fitted: None,
        }
    }

    fn allocation(trainers: u32, ps: u32) -> Allocation {
        Allocation {
            trainers,
            ps,
            trainer_cpu: 1.0,
            ps_cpu: 1.0,
        }
    }

    #[test]
    fn a_fit_needs_two_settled_allocations() {
        let mut log = log();
        for _ in 0..10 {
            assert!(log.record(allocation(1, 1), 1000.0).is_none());
        }
        // The first ticks of a new allocation do not count yet.
        for _ in 0..SETTLING_TICKS {
            assert!(log.record(allocation(2, 2), 2400.0).is_none());
        }
        let (fitted, rmsle, allocations) = log
            .record(allocation(2, 2), 2400.0)
            .expect("two allocations");
        assert_eq!(allocations, 2);
        // Two points that non-negative coefficients explain: the fit goes through both.
        assert!(rmsle < 1e-6, "{rmsle}");
        for (a, rate) in [(allocation(1, 1), 1000.0), (allocation(2, 2), 2400.0)] {
            let predicted = fitted.throughput(&a).expect("throughput");
            assert!((predicted - rate).abs() < 1e-3 * rate, "{a:?}: {predicted}");
        }
    }

    #[test]
    fn an_idle_tick_adds_no_observation() {
        let mut log = log();
        for _ in 0..10 {
            log.record(allocation(1, 1), 0.0);
        }
        assert!(log.observations().is_empty());
    }
}
