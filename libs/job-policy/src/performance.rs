//! DLRover-RM's resource-performance model of a running Job, fitted online (§4.3's
//! "online model fitting"): every status tick the trainers' summed samples/s under the
//! Job's allocation (trainers, PS shards, the cores of each) becomes an iteration time by
//! Eq. 1, kept per allocation; once the Job has run under two allocations the model is
//! fitted (primus-resource-model).

use std::time::Duration;

use tokio::time::Instant;

use primus_resource_model::autoscale::Measurements;
use primus_resource_model::{Allocation, FittedModel, JobShape, Terms};

/// Iteration times kept per allocation (the newest), and ticks and time an allocation must
/// hold before they count: a trainer's rate covers its last report window (2 s by
/// default), so the first after a change mix the allocation before.
const KEPT: usize = 30;
const SETTLING_TICKS: usize = 3;
const SETTLING: Duration = Duration::from_secs(5);

/// The iteration times a Job ran at, per allocation, and the model fitted to them.
pub struct PerformanceLog {
    pub measurements: Measurements,
    /// The allocation of the last ticks, since when, and how many ticks it has held.
    current: Option<(Allocation, Instant, usize)>,
    fitted: Option<FittedModel>,
}

impl PerformanceLog {
    /// For a Job of `shape`, with nothing measured yet.
    pub fn of(shape: JobShape) -> Self {
        Self {
            measurements: Measurements::new(shape, KEPT),
            current: None,
            fitted: None,
        }
    }

    /// The model as last fitted.
    pub fn fitted(&self) -> Option<&FittedModel> {
        self.fitted.as_ref()
    }

    /// One tick at `now`: `samples_per_second` of all trainers under `allocation`. Returns the
    /// fitted model, its RMSLE and the allocations it was fitted to, once two allocations
    /// have settled iteration times.
    pub fn record(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> PerformanceLog {
        PerformanceLog::of(JobShape {
            batch: 256.0,
            model_bytes: 1.0e6,
            embedding_width: 64.0,
            bandwidth: 1.25e9,
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
