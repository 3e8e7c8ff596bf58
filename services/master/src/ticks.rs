//! How long the master's Jobs' status ticks take: each tick (observe, decide, act, and the
//! status write) is timed into one shared [`TickTimes`], which keeps the latest durations.
//! It tells how many Jobs one master drives before its tick outgrows
//! `master.status_interval_ms` and the Jobs should be sharded over more masters.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Durations kept: the latest ticks of every Job together.
const KEPT: usize = 65_536;

/// The latest status ticks' durations, shared by every Job of the master.
#[derive(Debug, Clone, Default)]
pub struct TickTimes {
    inner: Arc<Mutex<Recorded>>,
}

#[derive(Debug, Default)]
struct Recorded {
    count: u64,
    latest: VecDeque<Duration>,
}

/// The ticks recorded since a [`TickTimes::take`].
#[derive(Debug, Clone, PartialEq)]
pub struct TickSummary {
    /// Ticks recorded (all of them, also those beyond the kept durations).
    pub count: u64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl TickTimes {
    pub(crate) fn record(&self, took: Duration) {
        let mut recorded = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        recorded.count += 1;
        if recorded.latest.len() == KEPT {
            recorded.latest.pop_front();
        }
        recorded.latest.push_back(took);
    }

    /// Summarises the ticks recorded since the last call and starts over; None when there
    /// were none.
    pub fn take(&self) -> Option<TickSummary> {
        let recorded = std::mem::take(&mut *self.inner.lock().unwrap_or_else(|p| p.into_inner()));
        let mut latest = Vec::from(recorded.latest);
        latest.sort_unstable();
        let at = |share: f64| latest[((latest.len() - 1) as f64 * share).round() as usize];
        let max = *latest.last()?;
        Some(TickSummary {
            count: recorded.count,
            p50: at(0.5),
            p99: at(0.99),
            max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_covers_the_ticks_since_the_last_one() {
        let ticks = TickTimes::default();
        assert_eq!(ticks.take(), None);
        for ms in 1..=100 {
            ticks.record(Duration::from_millis(ms));
        }
        let summary = ticks.take().expect("ticks");
        assert_eq!(summary.count, 100);
        assert_eq!(summary.p50, Duration::from_millis(51));
        assert_eq!(summary.p99, Duration::from_millis(99));
        assert_eq!(summary.max, Duration::from_millis(100));
        assert_eq!(ticks.take(), None, "taken");
    }
}
