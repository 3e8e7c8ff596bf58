//! A shard's change log: the keys of the rows changed lately, in segments, so deltas and
//! incremental snapshots read what changed instead of the whole shard.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

/// A shard's change log drops its oldest segments once it holds more than this many
/// entries and more than a quarter of the shard's rows (see `ChangeLog`).
pub(super) const CHANGE_LOG_MIN: usize = 4096;

/// The rows of a shard changed lately, so that a delta or an incremental snapshot reads
/// those rows instead of the whole shard: what keeps serving sync's cost proportional to the
/// updates, not to the table.
///
/// The log is a list of segments: older ones, sealed, and the newest (`current`). A segment
/// holds the key of each row whose first change after its base happened while it was the
/// newest (a row is logged once per segment). A row's newest change is thus logged in the
/// segment that was newest then, so every row whose version is above a segment's base is
/// in that segment or a later one. A reader asks for a new segment (`seal`); the next write
/// starts it, so a reader that comes back with the watermark it got reads about one
/// segment. The oldest segments are dropped once the log holds more than `CHANGE_LOG_MIN`
/// entries and a quarter of the shard's rows; a `since` below the oldest base scans the
/// shard instead. Dropped segments' allocations are reused.
#[derive(Default)]
pub(super) struct ChangeLog {
    /// Oldest first.
    sealed: VecDeque<Segment>,
    sealed_keys: usize,
    /// The newest segment's keys, and its base.
    current: Vec<u64>,
    current_base: u64,
    /// A write has started the log.
    started: bool,
    /// The highest version any row of the shard was given (a restore may give one above
    /// the table's counter until it ends).
    highest: u64,
    /// A reader read the newest segment: the next write starts a new one.
    seal: AtomicBool,
    /// An emptied allocation for the next segment.
    spare: Vec<u64>,
}

pub(super) struct Segment {
    /// Every change in this segment has a version above this one.
    base: u64,
    /// The highest version given while this was the newest segment: the shard's versions
    /// interleave with other shards', so a reader's `since` often lies between two
    /// segments' bases, and this tells whether the older one matters.
    top: u64,
    /// Keys when logged; a key may have left its row (evicted) since, or moved to another.
    keys: Vec<u64>,
}

impl ChangeLog {
    /// At the start of a write: starts a segment if a reader asked for one (or the log has
    /// none), then drops the oldest past the size limit. `version_before` is below every
    /// version the write will give.
    pub(super) fn start(&mut self, version_before: u64, rows: usize) {
        let sealed = self.seal.swap(false, Ordering::AcqRel);
        if !self.started {
            self.started = true;
            self.restart(version_before);
        } else if sealed && !self.current.is_empty() {
            let keys = std::mem::replace(&mut self.current, std::mem::take(&mut self.spare));
            self.sealed_keys += keys.len();
            self.sealed.push_back(Segment {
                base: self.current_base,
                top: self.highest,
                keys,
            });
            // Every row's version is at most `highest`: all later changes are above it.
            self.current_base = version_before.max(self.highest);
        }
        let limit = CHANGE_LOG_MIN.max(rows / 4);
        while self.sealed_keys + self.current.len() > limit {
            match self.sealed.pop_front() {
                Some(mut dropped) => {
                    self.sealed_keys -= dropped.keys.len();
                    dropped.keys.clear();
                    self.spare = dropped.keys;
                }
                // The newest alone is too big: start over from here.
                None => self.restart(version_before),
            }
        }
    }

    /// Empties the newest segment and makes it start after every version given so far.
    pub(super) fn restart(&mut self, version_before: u64) {
        self.current.clear();
        self.current_base = version_before.max(self.highest);
    }

    /// A write gave a row `version`.
    #[inline]
    pub(super) fn gave(&mut self, version: u64) {
        self.highest = self.highest.max(version);
    }

    /// The row of `key` changed; its version was `old` before.
    #[inline]
    pub(super) fn note(&mut self, key: u64, old: u64) {
        if old <= self.current_base {
            self.current.push(key);
        }
    }

    pub(super) fn entries(&self) -> usize {
        self.sealed_keys + self.current.len()
    }

    /// Keys that include every row changed after `since`, or None when the log does not
    /// reach back that far.
    pub(super) fn since(&self, since: u64) -> Option<impl Iterator<Item = &u64>> {
        // Also when the log does not reach back to `since`: otherwise a log that started over
        // would never be sealed again, and readers would scan for good.
        self.seal.store(true, Ordering::Release);
        let oldest = self.sealed.front().map_or(self.current_base, |s| s.base);
        if !self.started || since < oldest {
            return None;
        }
        // Sealed segments that may hold a version above `since` (tops never decrease).
        let from = self.sealed.partition_point(|s| s.top <= since);
        Some(
            self.sealed
                .range(from..)
                .flat_map(|s| &s.keys)
                .chain(&self.current),
        )
    }
}
