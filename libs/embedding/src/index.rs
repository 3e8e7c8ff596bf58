//! Bucketized cuckoo hash index: key -> row id. Two hash functions, four slots per bucket,
//! one 64-byte cache line per bucket; grows past 92% load (or when a kick chain fails) by a
//! quarter, re-inserting index entries only: the rows they point at never move. Bucket
//! counts need not be powers of two (a hash maps to a bucket by multiply-shift), so the
//! load right after growing stays above 75%: under 22 bytes of index per key.
//!
//! Collisionless: a slot stores the full key, so two keys never share a row.

use crate::hash::{mix, mix2};

const SLOTS: usize = 4;
const EMPTY: u32 = u32::MAX;
/// Grow before an insert would take the load past this (cuckoo walks get long beyond it).
const MAX_LOAD: f64 = 0.92;
/// Displacements tried before an insert gives up and the index grows.
const MAX_KICKS: usize = 500;
/// Each growth multiplies the bucket count by this.
const GROWTH: f64 = 1.25;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    keys: [u64; SLOTS],
    rows: [u32; SLOTS],
}

const EMPTY_BUCKET: Bucket = Bucket {
    keys: [0; SLOTS],
    rows: [EMPTY; SLOTS],
};

pub struct CuckooIndex {
    buckets: Vec<Bucket>,
    len: usize,
    /// Drives the choice of victim slots (deterministic, so runs are reproducible).
    kick_seed: u64,
}

impl Default for CuckooIndex {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl CuckooIndex {
    pub fn with_capacity(keys: usize) -> Self {
        let buckets = ((keys as f64 / (SLOTS as f64 * 0.9)).ceil() as usize).max(2);
        Self {
            buckets: vec![EMPTY_BUCKET; buckets],
            len: 0,
            kick_seed: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.buckets.len() * SLOTS
    }

    /// Bytes held by the index itself.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>()
    }

    #[inline]
    fn bucket_pair(&self, key: u64) -> (usize, usize) {
        let n = self.buckets.len();
        let first = reduce(mix(key), n);
        let mut second = reduce(mix2(key), n);
        if second == first {
            second = (first + 1) % n; // there are always at least two buckets
        }
        (first, second)
    }

    #[inline]
    fn find_in(&self, bucket: usize, key: u64) -> Option<usize> {
        let b = &self.buckets[bucket];
        (0..SLOTS).find(|&s| b.keys[s] == key && b.rows[s] != EMPTY)
    }

    /// The rows of many keys (`EMPTY`-free: a missing key yields `None`). Both candidate
    /// buckets are read and the match selected without branching on the data, so the
    /// cache misses of consecutive keys overlap instead of queueing behind mispredictions.
    pub fn get_many(&self, keys: impl Iterator<Item = u64>, rows: &mut Vec<Option<u32>>) {
        rows.clear();
        for key in keys {
            let (first, second) = self.bucket_pair(key);
            let row = select(
                &self.buckets[second],
                key,
                select(&self.buckets[first], key, EMPTY),
            );
            rows.push((row != EMPTY).then_some(row));
        }
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        let (first, second) = self.bucket_pair(key);
        if let Some(slot) = self.find_in(first, key) {
            return Some(self.buckets[first].rows[slot]);
        }
        self.find_in(second, key)
            .map(|slot| self.buckets[second].rows[slot])
    }

    /// Points `key` at `row`, replacing an earlier row of the same key (returned).
    pub fn insert(&mut self, key: u64, row: u32) -> Option<u32> {
        debug_assert_ne!(row, EMPTY);
        let (first, second) = self.bucket_pair(key);
        for bucket in [first, second] {
            if let Some(slot) = self.find_in(bucket, key) {
                let old = self.buckets[bucket].rows[slot];
                self.buckets[bucket].rows[slot] = row;
                return Some(old);
            }
        }
        if (self.len + 1) as f64 > self.capacity() as f64 * MAX_LOAD {
            self.grow();
        }
        let mut carried = (key, row);
        loop {
            match self.place(carried) {
                None => {
                    self.len += 1;
                    return None;
                }
                // The kick chain failed: `carried` is whichever entry is now homeless.
                Some(homeless) => {
                    carried = homeless;
                    self.grow();
                }
            }
        }
    }

    /// Places an entry, displacing others along a random walk; returns the entry left
    /// without a slot if the walk is too long.
    fn place(&mut self, mut entry: (u64, u32)) -> Option<(u64, u32)> {
        let (first, second) = self.bucket_pair(entry.0);
        if self.put_free(first, entry) || self.put_free(second, entry) {
            return None;
        }
        let mut bucket = first;
        for _ in 0..MAX_KICKS {
            self.kick_seed = mix(self.kick_seed.wrapping_add(1));
            let slot = (self.kick_seed as usize) % SLOTS;
            let b = &mut self.buckets[bucket];
            let victim = (b.keys[slot], b.rows[slot]);
            b.keys[slot] = entry.0;
            b.rows[slot] = entry.1;
            entry = victim;
            let (a, c) = self.bucket_pair(entry.0);
            bucket = if a == bucket { c } else { a };
            if self.put_free(bucket, entry) {
                return None;
            }
        }
        Some(entry)
    }

    fn put_free(&mut self, bucket: usize, (key, row): (u64, u32)) -> bool {
        let b = &mut self.buckets[bucket];
        match b.rows.iter().position(|r| *r == EMPTY) {
            Some(slot) => {
                b.keys[slot] = key;
                b.rows[slot] = row;
                true
            }
            None => false,
        }
    }

    pub fn remove(&mut self, key: u64) -> Option<u32> {
        let (first, second) = self.bucket_pair(key);
        for bucket in [first, second] {
            if let Some(slot) = self.find_in(bucket, key) {
                let row = self.buckets[bucket].rows[slot];
                self.buckets[bucket].rows[slot] = EMPTY;
                self.len -= 1;
                return Some(row);
            }
        }
        None
    }

    /// Every (key, row) in bucket order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.buckets.iter().flat_map(|b| {
            (0..SLOTS)
                .filter(|&s| b.rows[s] != EMPTY)
                .map(|s| (b.keys[s], b.rows[s]))
        })
    }

    /// Grows the bucket count by [`GROWTH`] and re-inserts every entry (index only; rows
    /// stay put).
    fn grow(&mut self) {
        let entries: Vec<(u64, u32)> = self.iter().collect();
        let mut size = grown(self.buckets.len());
        'retry: loop {
            self.buckets = vec![EMPTY_BUCKET; size];
            for &entry in &entries {
                if self.place(entry).is_some() {
                    size = grown(size); // pathological; a bigger table always settles
                    continue 'retry;
                }
            }
            return;
        }
    }
}

/// The row of `key` in `bucket`, or `fallback`; compiles to conditional moves.
#[inline(always)]
fn select(bucket: &Bucket, key: u64, fallback: u32) -> u32 {
    let mut row = fallback;
    for slot in 0..SLOTS {
        let hit = bucket.keys[slot] == key && bucket.rows[slot] != EMPTY;
        row = if hit { bucket.rows[slot] } else { row };
    }
    row
}

fn grown(buckets: usize) -> usize {
    ((buckets as f64 * GROWTH) as usize).max(buckets + 1)
}

/// Maps a 64-bit hash onto `0..n` without division (Lemire's multiply-shift).
#[inline]
fn reduce(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_past_ninety_percent_before_growing() {
        let mut index = CuckooIndex::with_capacity(0);
        let mut best_load: f64 = 0.0;
        for key in 0..200_000u64 {
            let before = index.capacity();
            index.insert(key.wrapping_mul(0x9e37_79b9), key as u32);
            if index.capacity() != before {
                best_load = best_load.max((index.len() - 1) as f64 / before as f64);
            }
        }
        assert!(best_load > 0.9, "grew at {best_load:.3} load");
        for key in 0..200_000u64 {
            assert_eq!(index.get(key.wrapping_mul(0x9e37_79b9)), Some(key as u32));
        }
        assert_eq!(index.len(), 200_000);
    }

    #[test]
    fn insert_replaces_and_remove_frees() {
        let mut index = CuckooIndex::default();
        assert_eq!(index.insert(7, 1), None);
        assert_eq!(index.insert(7, 2), Some(1));
        assert_eq!(index.get(7), Some(2));
        assert_eq!(index.remove(7), Some(2));
        assert_eq!(index.get(7), None);
        assert_eq!(index.remove(7), None);
        assert!(index.is_empty());
    }

    #[test]
    fn memory_per_key_stays_under_24_bytes_at_scale() {
        let mut index = CuckooIndex::default();
        for key in 0..1_000_000u64 {
            index.insert(key, key as u32);
        }
        let per_key = index.memory_bytes() as f64 / index.len() as f64;
        assert!(per_key <= 24.0, "{per_key:.1} bytes per key");
    }
}
