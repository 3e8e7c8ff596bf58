//! Monolith's admission filters: a key gets a row once it has been seen `min_count` times
//! (counted in a count-min sketch, so unadmitted keys cost no per-key memory), and then only
//! with `probability` per occurrence.

use crate::hash::seeded;
use crate::init::unit;

const DEPTH: usize = 4;

pub(crate) struct Admission {
    min_count: u32,
    probability: f32,
    seed: u64,
    /// `DEPTH` rows of saturating counters; empty when no count threshold is set.
    sketch: Vec<u16>,
    width: usize,
}

impl Admission {
    pub(crate) fn new(min_count: u32, probability: f32, width: usize, seed: u64) -> Self {
        let width = if min_count > 1 { width.max(64) } else { 0 };
        Self {
            min_count,
            probability,
            seed,
            sketch: vec![0; width * DEPTH],
            width,
        }
    }

    /// Counts one occurrence of a key without a row; true if it is admitted now.
    pub(crate) fn admit(&mut self, key: u64) -> bool {
        let count = if self.width == 0 { 1 } else { self.count(key) };
        if count < self.min_count {
            return false;
        }
        // A fresh draw per occurrence (keyed by the count), so a frequent key gets in soon.
        self.probability >= 1.0
            || unit(seeded(key ^ u64::from(count).rotate_left(48), self.seed)) < self.probability
    }

    /// Adds one occurrence and returns the estimate (the minimum over the rows).
    fn count(&mut self, key: u64) -> u32 {
        let mut estimate = u16::MAX;
        for row in 0..DEPTH {
            let column =
                (seeded(key, self.seed.wrapping_add(row as u64)) % self.width as u64) as usize;
            let counter = &mut self.sketch[row * self.width + column];
            *counter = counter.saturating_add(1);
            estimate = estimate.min(*counter);
        }
        u32::from(estimate)
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.sketch.len() * std::mem::size_of::<u16>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_admitted_on_its_min_count_th_occurrence() {
        let mut admission = Admission::new(3, 1.0, 1 << 12, 9);
        assert!(!admission.admit(5));
        assert!(!admission.admit(5));
        assert!(admission.admit(5));
        assert!(!admission.admit(6));
    }

    #[test]
    fn probability_admits_about_that_share() {
        let mut admission = Admission::new(0, 0.25, 0, 9);
        let admitted = (0..20_000u64).filter(|k| admission.admit(*k)).count();
        assert!((4_000..6_000).contains(&admitted), "{admitted}");
    }
}
