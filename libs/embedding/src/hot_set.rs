//! Choosing the hot set of HypeReca's two-fold parallelism (HypeReca §5.2): rows every
//! trainer replicates and synchronises each step, so that accesses to them skip the
//! parameter servers.
//!
//! - [`KeyFrequencies`] counts accesses over sampled minibatches.
//! - [`Coverage`] is Algorithm 1: keys by descending count and `rho(R)`, the share of
//!   accesses the top `R` keys cover.
//! - [`CostModel`] is the latency model `L(R) = R * C_ar + N * (1 - rho(R)) * C_a2a`
//!   (`C_ar`: seconds to synchronise one replicated row per step; `C_a2a`: seconds per
//!   access fetched remotely; `N`: accesses per minibatch). `L` is convex in `R` (`rho` is
//!   concave because counts are sorted descending), so a ternary search narrows the range
//!   and an enumeration of what is left finds the minimum, as the paper does.
//! - [`HotSet`] is the chosen keys with the coverage they were chosen for, and says when a
//!   fresh sample shows that coverage has drifted (re-select at the next checkpoint).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

/// A measurement the cost model cannot use.
#[derive(Debug, thiserror::Error)]
#[error("hot set cost model: {0}")]
pub struct CostModelError(String);

/// Access counts per key over sampled minibatches.
#[derive(Debug, Clone)]
pub struct KeyFrequencies<K> {
    counts: HashMap<K, u64>,
    accesses: u64,
    batches: u64,
}

impl<K: Hash + Eq + Ord + Copy> Default for KeyFrequencies<K> {
    fn default() -> Self {
        Self {
            counts: HashMap::new(),
            accesses: 0,
            batches: 0,
        }
    }
}

impl<K: Hash + Eq + Ord + Copy> KeyFrequencies<K> {
    /// Counts every access of one minibatch (repeats included: each is a row fetched).
    pub fn observe_batch(&mut self, keys: impl IntoIterator<Item = K>) {
        for key in keys {
            *self.counts.entry(key).or_insert(0) += 1;
            self.accesses += 1;
        }
        self.batches += 1;
    }

    /// Counts one minibatch given as (key, accesses) pairs.
    pub fn observe_counted(&mut self, counted: impl IntoIterator<Item = (K, u64)>) {
        for (key, count) in counted {
            *self.counts.entry(key).or_insert(0) += count;
            self.accesses += count;
        }
        self.batches += 1;
    }

    /// Minibatches observed.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Mean accesses per observed minibatch (`N` of the latency model).
    pub fn accesses_per_batch(&self) -> f64 {
        self.accesses as f64 / self.batches.max(1) as f64
    }

    /// Algorithm 1. Ties in count are broken by key so that the order is reproducible.
    pub fn coverage(&self) -> Coverage<K> {
        let mut ranked: Vec<(K, u64)> = self.counts.iter().map(|(&k, &c)| (k, c)).collect();
        ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut covered = Vec::with_capacity(ranked.len() + 1);
        covered.push(0u64);
        let mut running = 0;
        for &(_, count) in &ranked {
            running += count;
            covered.push(running);
        }
        Coverage {
            keys: ranked.into_iter().map(|(k, _)| k).collect(),
            covered,
            accesses: self.accesses,
        }
    }

    /// Share of the observed accesses that fall on `hot`.
    pub fn share_on(&self, hot: &HashSet<K>) -> f64 {
        let on: u64 = hot.iter().filter_map(|k| self.counts.get(k)).sum();
        on as f64 / self.accesses.max(1) as f64
    }
}

/// Keys by descending access count and the cumulative accesses they cover.
#[derive(Debug, Clone)]
pub struct Coverage<K> {
    keys: Vec<K>,
    /// `covered[r]`: accesses of the top `r` keys.
    covered: Vec<u64>,
    accesses: u64,
}

impl<K: Copy> Coverage<K> {
    /// `rho(r)`: share of accesses covered by the `r` most frequent keys (1 once `r`
    /// reaches the number of distinct keys; 0 with no accesses).
    pub fn rho(&self, r: usize) -> f64 {
        if self.accesses == 0 {
            return 0.0;
        }
        self.covered[r.min(self.keys.len())] as f64 / self.accesses as f64
    }

    /// Keys seen at least once.
    pub fn distinct_keys(&self) -> usize {
        self.keys.len()
    }

    /// The `r` most frequent keys.
    pub fn top(&self, r: usize) -> &[K] {
        &self.keys[..r.min(self.keys.len())]
    }
}

/// Per-step latency model of HypeReca §5.2.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Seconds to synchronise one replicated row between trainers, per step.
    pub sync_seconds_per_row: f64,
    /// Seconds per access served remotely (lookup and push through the PS).
    pub remote_seconds_per_access: f64,
    /// Accesses per minibatch.
    pub accesses_per_batch: f64,
}

impl CostModel {
    /// From micro-benchmark measurements on the running system: `sync_seconds` to
    /// synchronise `synced_rows` rows, `remote_seconds` to serve `remote_accesses`.
    pub fn measured(
        sync_seconds: f64,
        synced_rows: u64,
        remote_seconds: f64,
        remote_accesses: u64,
        accesses_per_batch: f64,
    ) -> Result<Self, CostModelError> {
        let per = |seconds: f64, count: u64, what: &str| {
            if seconds.is_finite() && seconds >= 0.0 && count > 0 {
                Ok(seconds / count as f64)
            } else {
                Err(CostModelError(format!(
                    "{what}: {seconds} s over {count} must be a finite, non-negative time over a positive count"
                )))
            }
        };
        if !(accesses_per_batch.is_finite() && accesses_per_batch >= 0.0) {
            return Err(CostModelError(format!(
                "accesses per batch {accesses_per_batch} must be finite and non-negative"
            )));
        }
        Ok(Self {
            sync_seconds_per_row: per(sync_seconds, synced_rows, "row synchronisation")?,
            remote_seconds_per_access: per(remote_seconds, remote_accesses, "remote access")?,
            accesses_per_batch,
        })
    }

    /// `L(r)` in seconds per step.
    pub fn latency<K: Copy>(&self, coverage: &Coverage<K>, r: usize) -> f64 {
        r as f64 * self.sync_seconds_per_row
            + self.accesses_per_batch * (1.0 - coverage.rho(r)) * self.remote_seconds_per_access
    }

    /// The hot-set size in `0..=max_rows` (and at most the distinct keys) minimising
    /// `L`: ternary search down to a small window, then enumeration of the window.
    pub fn best_size<K: Copy>(&self, coverage: &Coverage<K>, max_rows: usize) -> usize {
        const WINDOW: usize = 64;
        let latency = |r: usize| self.latency(coverage, r);
        let (mut lo, mut hi) = (0usize, max_rows.min(coverage.distinct_keys()));
        while hi - lo > WINDOW {
            let m1 = lo + (hi - lo) / 3;
            let m2 = hi - (hi - lo) / 3;
            // Convex: with L(m1) <= L(m2) a minimum lies in [lo, m2], else in [m1, hi].
            if latency(m1) <= latency(m2) {
                hi = m2;
            } else {
                lo = m1;
            }
        }
        (lo..=hi)
            .min_by(|&a, &b| latency(a).total_cmp(&latency(b)).then(a.cmp(&b)))
            .unwrap_or(0)
    }
}

/// The replicated keys and the coverage they were chosen for.
#[derive(Debug, Clone)]
pub struct HotSet<K> {
    /// The chosen keys.
    pub keys: HashSet<K>,
    /// `rho` of these keys on the sample they were chosen from.
    pub expected_coverage: f64,
    /// `L` predicted for this size, seconds per step.
    pub predicted_seconds: f64,
}

impl<K: Hash + Eq + Ord + Copy> HotSet<K> {
    /// Chooses the hot set for `sample` under `model`, at most `max_rows` rows.
    pub fn choose(sample: &KeyFrequencies<K>, model: &CostModel, max_rows: usize) -> Self {
        let coverage = sample.coverage();
        let size = model.best_size(&coverage, max_rows);
        Self {
            keys: coverage.top(size).iter().copied().collect(),
            expected_coverage: coverage.rho(size),
            predicted_seconds: model.latency(&coverage, size),
        }
    }

    /// Whether `fresh` (minibatches seen since) is covered by less than the expected share
    /// minus `tolerance`: the access pattern moved and the set should be chosen again.
    pub fn drifted(&self, fresh: &KeyFrequencies<K>, tolerance: f64) -> bool {
        fresh.share_on(&self.keys) < self.expected_coverage - tolerance
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frequencies(batches: &[&[u64]]) -> KeyFrequencies<u64> {
        let mut f = KeyFrequencies::default();
        for batch in batches {
            f.observe_batch(batch.iter().copied());
        }
        f
    }

    #[test]
    fn counted_accesses_are_the_same_sample_as_listed_ones() {
        let mut counted = KeyFrequencies::default();
        counted.observe_counted([(1u64, 2), (3, 1)]);
        counted.observe_counted([(2, 2), (1, 1)]);
        let listed = frequencies(&[&[1, 1, 3], &[2, 1, 2]]);
        assert_eq!(counted.batches(), listed.batches());
        assert_eq!(counted.accesses_per_batch(), listed.accesses_per_batch());
        assert_eq!(counted.coverage().top(3), listed.coverage().top(3));
        let rho = |f: &KeyFrequencies<u64>| (0..4).map(|r| f.coverage().rho(r)).collect::<Vec<_>>();
        assert_eq!(rho(&counted), rho(&listed));
    }

    #[test]
    fn rho_of_a_known_sample() {
        let coverage = frequencies(&[&[1, 1, 3], &[2, 1, 2]]).coverage();
        assert_eq!(coverage.top(3), &[1, 2, 3]);
        let rho: Vec<f64> = (0..5).map(|r| coverage.rho(r)).collect();
        assert_eq!(rho, vec![0.0, 0.5, 5.0 / 6.0, 1.0, 1.0]);
    }

    /// Zipf-like counts: the search must find the same minimum as trying every size.
    #[test]
    fn the_search_finds_the_minimum_of_every_size() {
        let mut sample = KeyFrequencies::default();
        let mut state = 17u64;
        for _ in 0..50 {
            let batch: Vec<u64> = (0..2000)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = (state >> 11) as f64 / (1u64 << 53) as f64;
                    (1.0 / (u + 1e-4)).floor() as u64
                })
                .collect();
            sample.observe_batch(batch);
        }
        let coverage = sample.coverage();
        for (sync, remote, max_rows) in [
            (1e-7, 1e-6, 100_000),
            (1e-6, 1e-7, 100_000),
            (1e-9, 1e-5, 300),
            (0.0, 1e-6, 5000),
        ] {
            let model = CostModel {
                sync_seconds_per_row: sync,
                remote_seconds_per_access: remote,
                accesses_per_batch: sample.accesses_per_batch(),
            };
            let found = model.best_size(&coverage, max_rows);
            let brute = (0..=max_rows.min(coverage.distinct_keys()))
                .map(|r| model.latency(&coverage, r))
                .fold(f64::INFINITY, f64::min);
            assert_eq!(
                model.latency(&coverage, found),
                brute,
                "sync {sync} remote {remote}"
            );
            assert!(found <= max_rows);
        }
    }

    #[test]
    fn a_hot_set_notices_when_traffic_moves_to_other_keys() {
        // Counts 1:6, 2:3, 3..5:1 of 12 accesses, 6 per batch. Replicating a key costs
        // 0.01 s; it saves 6 * count / 12 * 0.01 s: worth it for keys 1 and 2 only.
        let before = frequencies(&[&[1, 1, 1, 2, 2, 3], &[1, 1, 2, 1, 4, 5]]);
        let model = CostModel {
            sync_seconds_per_row: 1e-2,
            remote_seconds_per_access: 1e-2,
            accesses_per_batch: before.accesses_per_batch(),
        };
        let hot = HotSet::choose(&before, &model, 10);
        assert_eq!(hot.keys, HashSet::from([1, 2]));
        assert_eq!(hot.expected_coverage, 0.75);
        assert!(!hot.drifted(&frequencies(&[&[1, 1, 2, 1, 2, 9]]), 0.1));
        assert!(hot.drifted(&frequencies(&[&[7, 8, 9, 7, 8, 1]]), 0.1));
    }

    #[test]
    fn measured_costs_are_checked() {
        assert!(CostModel::measured(0.01, 100, 0.5, 1000, 2048.0).is_ok());
        assert!(CostModel::measured(f64::NAN, 100, 0.5, 1000, 2048.0).is_err());
        assert!(CostModel::measured(0.01, 0, 0.5, 1000, 2048.0).is_err());
        assert!(CostModel::measured(0.01, 10, 0.5, 1000, -1.0).is_err());
    }
}
