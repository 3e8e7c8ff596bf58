//! DLRover-RM's resource-performance model of a running Job, fitted online (§4.3's
//! "online model fitting"): every status tick the trainers' summed samples/s under the
//! Job's allocation (trainers, PS shards, the cores of each) becomes an iteration time by
//! Eq. 1, kept per allocation; once the Job has run under two allocations the model is
//! fitted (primus-resource-model) and the `ResourceModel` condition gives its
//! coefficients, its RMSLE and the samples/s it predicts for the allocation running now.

use std::time::{Duration, Instant};

use primus_model::ModelLayout;
use primus_resource_model::autoscale::Measurements;
use primus_resource_model::{Allocation, FittedModel, JobShape, Terms};
use primus_spec::job::JobSpec;

use super::JobRun;
use super::snapshot::Snapshot;
use primus_backend::ResourceBackend;
use primus_data_tasks::plan::Catalog;

/// Iteration times kept per allocation (the newest), and ticks and time an allocation must
/// hold before they count: a trainer's rate covers its last report window (2 s by
/// default), so the first after a change mix the allocation before.
const KEPT: usize = 30;
const SETTLING_TICKS: usize = 3;
const SETTLING: Duration = Duration::from_secs(5);
/// Bandwidth between trainers and PS shards assumed by Eq. 4 (10 Gb/s); the sync
/// coefficient absorbs what it really is, as the paper takes B as a constant.
const BANDWIDTH: f64 = 1.25e9;

/// The iteration times a Job ran at, per allocation, and the model fitted to them.
pub(super) struct PerformanceLog {
    pub(super) measurements: Measurements,
    /// The allocation of the last ticks, since when, and how many ticks it has held.
    current: Option<(Allocation, Instant, usize)>,
    fitted: Option<FittedModel>,
}

impl PerformanceLog {
    pub(super) fn new(spec: &JobSpec, layout: &ModelLayout) -> Self {
        let dense_floats = super::warm_start::dense_parameters(layout);
        let shape = JobShape {
            batch: f64::from(spec.training.batch_size.max(1)),
            model_bytes: (4 * dense_floats.max(1)) as f64,
            embedding_width: layout.embedding_width.max(1) as f64,
            bandwidth: BANDWIDTH,
        };
        Self::of(shape)
    }

    pub(super) fn of(shape: JobShape) -> Self {
        Self {
            measurements: Measurements::new(shape, KEPT),
            current: None,
            fitted: None,
        }
    }

    /// The model as last fitted.
    pub(super) fn fitted(&self) -> Option<&FittedModel> {
        self.fitted.as_ref()
    }

    /// One tick at `now`: `samples_per_second` of all trainers under `allocation`. Returns the
    /// fitted model, its RMSLE and the allocations it was fitted to, once two allocations
    /// have settled iteration times.
    pub(super) fn record(
        &mut self,
        allocation: Allocation,
        samples_per_second: f64,
        now: Instant,
    ) -> Option<(FittedModel, f64, usize)> {
        let (since, ticks) = match self.current {
            Some((held, since, ticks)) if held == allocation => (since, ticks + 1),
            _ => (now, 1),
        };
        self.current = Some((allocation, since, ticks));
        let settled = ticks > SETTLING_TICKS && now.duration_since(since) >= SETTLING;
        if settled && samples_per_second > 0.0 {
            let batch = self.measurements.shape().batch;
            let seconds = f64::from(allocation.trainers) * batch / samples_per_second;
            self.measurements.add(allocation, seconds);
        }
        let fitted = self.measurements.fit(Terms::All)?;
        let observations = self.measurements.observations();
        let rmsle = fitted.rmsle(&observations).ok()?;
        self.fitted = Some(fitted);
        Some((fitted, rmsle, observations.len()))
    }
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Adds this tick's throughput to the log and, once the model fits, says what it found.
    pub(super) fn record_performance(&mut self, snapshot: &Snapshot) {
        let samples_per_second = snapshot.samples_per_second();
        let Some(allocation) = snapshot.allocation() else {
            return;
        };
        let (trainers, ps) = (allocation.trainers, allocation.ps);
        let Some((fitted, rmsle, allocations)) =
            self.performance
                .record(allocation, samples_per_second, Instant::now())
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
        PerformanceLog::of(JobShape {
            batch: 256.0,
            model_bytes: 1.0e6,
            embedding_width: 64.0,
            bandwidth: BANDWIDTH,
        })
    }

    fn allocation(trainers: u32, ps: u32) -> Allocation {
        Allocation::one_core_each(trainers, ps)
    }

    #[test]
    fn a_fit_needs_two_settled_allocations() {
        let mut log = log();
        let start = Instant::now();
        let tick = |n: u32| start + Duration::from_secs(u64::from(n));
        for n in 0..10 {
            assert!(log.record(allocation(1, 1), 1000.0, tick(n)).is_none());
        }
        // The first ticks and seconds of a new allocation do not count yet.
        for n in 10..10 + SETTLING.as_secs() as u32 {
            assert!(log.record(allocation(2, 2), 2400.0, tick(n)).is_none());
        }
        let (fitted, rmsle, allocations) = log
            .record(allocation(2, 2), 2400.0, tick(20))
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
        let start = Instant::now();
        for n in 0..10 {
            log.record(allocation(1, 1), 0.0, start + Duration::from_secs(n));
        }
        assert_eq!(log.measurements.allocations(), 0);
    }
}
