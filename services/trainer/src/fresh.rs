//! Which prefetched rows went stale. The next minibatch's rows are looked up while this
//! one computes, so a push that completes after that lookup leaves the prefetched copies of
//! its keys one update behind. The trainer remembers the keys of its last pushes; a
//! minibatch re-reads, just before it computes, the rows pushed since its lookup began, and
//! so computes with every row as fresh as a lookup at that moment would give.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use primus_model::pooling::KeySet;

/// Pushes remembered; a minibatch looked up before the oldest re-reads all its rows.
const REMEMBERED: usize = 4;

/// Completed pushes, read by the prefetcher as a lookup starts.
#[derive(Debug, Clone, Default)]
pub(crate) struct PushCount(Arc<AtomicU64>);

impl PushCount {
    pub(crate) fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// The keys of the trainer's recent pushes, per layout table.
#[derive(Debug, Default)]
pub(crate) struct RecentPushes {
    count: PushCount,
    /// `(index of the push, its keys per table)`, oldest first.
    pushes: VecDeque<(u64, Vec<KeySet>)>,
}

impl RecentPushes {
    pub(crate) fn count(&self) -> PushCount {
        self.count.clone()
    }

    /// A push of `tables` (each table's pushed keys) has completed.
    pub(crate) fn record(&mut self, tables: Vec<KeySet>) {
        let index = self.count.now();
        if self.pushes.len() == REMEMBERED {
            self.pushes.pop_front();
        }
        self.pushes.push_back((index, tables));
        self.count.0.store(index + 1, Ordering::Release);
    }

    /// What changed since a lookup that began after `looked_up_at` pushes had completed.
    pub(crate) fn since(&self, looked_up_at: u64) -> Stale<'_> {
        let now = self.count.now();
        if looked_up_at >= now {
            return Stale::Nothing;
        }
        match self.pushes.front() {
            Some((oldest, _)) if *oldest <= looked_up_at => Stale::Keys(
                self.pushes
                    .iter()
                    .filter(|(index, _)| *index >= looked_up_at)
                    .map(|(_, tables)| tables)
                    .collect(),
            ),
            _ => Stale::Everything,
        }
    }
}

/// The rows a prefetched minibatch must read again.
pub(crate) enum Stale<'a> {
    Nothing,
    /// The keys of these pushes.
    Keys(Vec<&'a Vec<KeySet>>),
    /// Every row (looked up before the pushes remembered).
    Everything,
}

impl Stale<'_> {
    pub(crate) fn is_nothing(&self) -> bool {
        matches!(self, Self::Nothing)
    }

    /// Whether table `t`'s row of `key` changed.
    pub(crate) fn contains(&self, t: usize, key: u64) -> bool {
        match self {
            Self::Nothing => false,
            Self::Keys(pushes) => pushes
                .iter()
                .any(|tables| tables.get(t).is_some_and(|keys| keys.contains(&key))),
            Self::Everything => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(values: &[u64]) -> Vec<KeySet> {
        vec![values.iter().copied().collect()]
    }

    #[test]
    fn a_lookup_reads_again_what_was_pushed_after_it_began() {
        let mut recent = RecentPushes::default();
        let first_lookup = recent.count().now();
        assert!(recent.since(first_lookup).is_nothing());
        recent.record(keys(&[1, 2]));
        let second_lookup = recent.count().now();
        recent.record(keys(&[3]));
        let stale = recent.since(first_lookup);
        assert!(stale.contains(0, 1) && stale.contains(0, 3) && !stale.contains(0, 4));
        let stale = recent.since(second_lookup);
        assert!(!stale.contains(0, 1) && stale.contains(0, 3));
        assert!(!stale.contains(1, 3), "another table");
        assert!(recent.since(recent.count().now()).is_nothing());
        for k in 10..10 + REMEMBERED as u64 {
            recent.record(keys(&[k]));
        }
        assert!(
            recent.since(first_lookup).contains(0, 999),
            "older than what is remembered: everything"
        );
    }
}
