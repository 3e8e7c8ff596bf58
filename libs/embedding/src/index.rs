//! Bucketized cuckoo hash index: key -> row id. Two hash functions, five slots per bucket,
//! one 64-byte cache line per bucket (five keys, then five row ids); grows past 92% load
//! (or when a kick chain fails) by a quarter, re-inserting index entries only: the rows
//! they point at never move. Bucket counts need not be powers of two (a hash maps to a
//! bucket by multiply-shift), so the load right after growing stays above 73%: under 18
//! bytes of index per key.
//!
//! Collisionless: a slot stores the full key, so two keys never share a row.
//!
//! Lookups of many keys are pipelined: every key's first bucket is prefetched in one pass
//! (so the cache misses overlap), then matched; only keys not found there prefetch their
//! second bucket, again in one pass. Inserts put a key in its first bucket when it has room, so
//! most lookups read one bucket.

use primus_prefetch::prefetch;

use crate::hash::{mix, mix2};
use crate::region::Region;

const SLOTS: usize = 5;
const BUCKET_WORDS: usize = 8;
/// Row ids are stored plus one, so zeroed memory is a table of empty slots.
const EMPTY: u64 = 0;
/// Grow before an insert would take the load past this (cuckoo walks get long beyond it).
const MAX_LOAD: f64 = 0.92;
/// Displacements tried before an insert gives up and the index grows.
const MAX_KICKS: usize = 500;
/// Each growth multiplies the bucket count by this.
const GROWTH: f64 = 1.25;
/// Keys whose buckets are loaded together in one pass of [`CuckooIndex::get_many`].
const PIPELINE: usize = 64;

/// Words 0..5: keys; words 5..8: the slots' encoded row ids, two per word.
type Bucket = [u64; BUCKET_WORDS];

#[inline(always)]
fn encoded_row(bucket: &Bucket, slot: usize) -> u64 {
    (bucket[SLOTS + slot / 2] >> (32 * (slot % 2))) & 0xffff_ffff
}

#[inline(always)]
fn set_slot(bucket: &mut Bucket, slot: usize, key: u64, encoded: u64) {
    bucket[slot] = key;
    let word = &mut bucket[SLOTS + slot / 2];
    let shift = 32 * (slot % 2);
    *word = (*word & !(0xffff_ffff << shift)) | (encoded << shift);
}

/// The encoded row of `key` in `bucket`, or `fallback`; compiles to conditional moves, so
/// consecutive keys' lookups do not wait on each other's mispredictions.
#[inline(always)]
fn select(bucket: &Bucket, key: u64, fallback: u64) -> u64 {
    let mut row = fallback;
    for slot in 0..SLOTS {
        let encoded = encoded_row(bucket, slot);
        let hit = bucket[slot] == key && encoded != EMPTY;
        row = if hit { encoded } else { row };
    }
    row
}

fn find_slot(bucket: &Bucket, key: u64) -> Option<usize> {
    (0..SLOTS).find(|&s| bucket[s] == key && encoded_row(bucket, s) != EMPTY)
}

/// Prefetches each named bucket: issued back to back, the misses are all in flight at once,
/// and the reads that follow find the lines in cache.
#[inline(always)]
fn prefetch_buckets(buckets: &[Bucket], which: impl Iterator<Item = usize>) {
    for bucket in which {
        prefetch(&buckets[bucket]);
    }
}

/// A collisionless hash index from u64 keys to u32 row ids: cuckoo hashing with two buckets of five slots per key, each bucket one cache line.
pub struct CuckooIndex {
    region: Region,
    bucket_count: usize,
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
    /// An index sized for `keys` keys without growing.
    pub fn with_capacity(keys: usize) -> Self {
        let buckets = ((keys as f64 / (SLOTS as f64 * 0.9)).ceil() as usize).max(2);
        Self::with_buckets(buckets)
    }

    fn with_buckets(bucket_count: usize) -> Self {
        Self {
            region: Region::zeroed(bucket_count * BUCKET_WORDS),
            bucket_count,
            len: 0,
            kick_seed: 0,
        }
    }

    fn buckets(&self) -> &[Bucket] {
        bytemuck::cast_slice(self.region.words())
    }

    fn buckets_mut(&mut self) -> &mut [Bucket] {
        bytemuck::cast_slice_mut(self.region.words_mut())
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keys the index holds before it grows.
    pub fn capacity(&self) -> usize {
        self.bucket_count * SLOTS
    }

    /// Bytes held by the index itself.
    pub fn memory_bytes(&self) -> usize {
        self.bucket_count * std::mem::size_of::<Bucket>()
    }

    #[inline]
    fn bucket_pair(&self, key: u64) -> (usize, usize) {
        let n = self.bucket_count;
        let first = reduce(mix(key), n);
        let mut second = reduce(mix2(key), n);
        if second == first {
            second = (first + 1) % n; // there are always at least two buckets
        }
        (first, second)
    }

    /// The rows of many keys (a missing key yields `None`), pipelined as the module doc
    /// describes.
    pub fn get_many(&self, keys: &[u64], rows: &mut Vec<Option<u32>>) {
        rows.clear();
        rows.reserve(keys.len());
        let buckets = self.buckets();
        let mut homes = [(0usize, 0usize); PIPELINE];
        let mut found = [EMPTY; PIPELINE];
        let mut misses = [0usize; PIPELINE];
        for group in keys.chunks(PIPELINE) {
            for (home, key) in homes.iter_mut().zip(group) {
                *home = self.bucket_pair(*key);
            }
            let homes = &homes[..group.len()];
            prefetch_buckets(buckets, homes.iter().map(|h| h.0));
            let mut missed = 0;
            for (i, (key, home)) in group.iter().zip(homes).enumerate() {
                found[i] = select(&buckets[home.0], *key, EMPTY);
                // Branch-free append of the keys still to look for.
                misses[missed] = i;
                missed += usize::from(found[i] == EMPTY);
            }
            let misses = &misses[..missed];
            prefetch_buckets(buckets, misses.iter().map(|i| homes[*i].1));
            for &i in misses {
                found[i] = select(&buckets[homes[i].1], group[i], EMPTY);
            }
            rows.extend(
                found[..group.len()]
                    .iter()
                    .map(|e| e.checked_sub(1).map(|r| r as u32)),
            );
        }
    }

    /// The row id of `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        let (first, second) = self.bucket_pair(key);
        let buckets = self.buckets();
        let encoded = select(&buckets[second], key, select(&buckets[first], key, EMPTY));
        encoded.checked_sub(1).map(|r| r as u32)
    }

    /// Points `key` at `row`, replacing an earlier row of the same key (returned).
    pub fn insert(&mut self, key: u64, row: u32) -> Option<u32> {
        debug_assert_ne!(row, u32::MAX, "row ids are stored plus one");
        let encoded = u64::from(row) + 1;
        let (first, second) = self.bucket_pair(key);
        for bucket in [first, second] {
            if let Some(slot) = find_slot(&self.buckets()[bucket], key) {
                let old = encoded_row(&self.buckets()[bucket], slot);
                set_slot(&mut self.buckets_mut()[bucket], slot, key, encoded);
                return Some((old - 1) as u32);
            }
        }
        if (self.len + 1) as f64 > self.capacity() as f64 * MAX_LOAD {
            self.grow();
        }
        let mut carried = (key, encoded);
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

    /// Places an entry (key, encoded row), displacing others along a random walk; returns
    /// the entry left without a slot if the walk is too long.
    fn place(&mut self, mut entry: (u64, u64)) -> Option<(u64, u64)> {
        let (first, second) = self.bucket_pair(entry.0);
        if self.put_free(first, entry) || self.put_free(second, entry) {
            return None;
        }
        let mut bucket = first;
        for _ in 0..MAX_KICKS {
            let slot = self.victim_slot(bucket);
            let b = &mut self.buckets_mut()[bucket];
            let victim = (b[slot], encoded_row(b, slot));
            set_slot(b, slot, entry.0, entry.1);
            entry = victim;
            let (a, c) = self.bucket_pair(entry.0);
            bucket = if a == bucket { c } else { a };
            if self.put_free(bucket, entry) {
                return None;
            }
        }
        Some(entry)
    }

    /// The slot to displace from a full bucket: one whose key sits in its second bucket if
    /// there is one (displacing it sends it home, so more lookups end in one bucket),
    /// otherwise a random one.
    fn victim_slot(&mut self, bucket: usize) -> usize {
        self.kick_seed = mix(self.kick_seed.wrapping_add(1));
        let offset = self.kick_seed as usize;
        let b = &self.buckets()[bucket];
        (0..SLOTS)
            .map(|i| (i + offset) % SLOTS)
            .find(|s| self.bucket_pair(b[*s]).0 != bucket)
            .unwrap_or(offset % SLOTS)
    }

    fn put_free(&mut self, bucket: usize, (key, encoded): (u64, u64)) -> bool {
        let b = &mut self.buckets_mut()[bucket];
        match (0..SLOTS).find(|s| encoded_row(b, *s) == EMPTY) {
            Some(slot) => {
                set_slot(b, slot, key, encoded);
                true
            }
            None => false,
        }
    }

    /// Removes `key`, returning its row id.
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        let (first, second) = self.bucket_pair(key);
        for bucket in [first, second] {
            if let Some(slot) = find_slot(&self.buckets()[bucket], key) {
                let b = &mut self.buckets_mut()[bucket];
                let row = (encoded_row(b, slot) - 1) as u32;
                set_slot(b, slot, 0, EMPTY);
                self.len -= 1;
                return Some(row);
            }
        }
        None
    }

    /// Every (key, row) in bucket order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.buckets().iter().flat_map(|b| {
            (0..SLOTS)
                .filter(|&s| encoded_row(b, s) != EMPTY)
                .map(|s| (b[s], (encoded_row(b, s) - 1) as u32))
        })
    }

    /// Grows the bucket count by [`GROWTH`] and re-inserts every entry (index only; rows
    /// stay put).
    fn grow(&mut self) {
        let entries: Vec<(u64, u64)> = self.iter().map(|(k, r)| (k, u64::from(r) + 1)).collect();
        let mut size = grown(self.bucket_count);
        'retry: loop {
            let kick_seed = self.kick_seed;
            *self = Self::with_buckets(size);
            self.kick_seed = kick_seed;
            self.len = entries.len();
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
    fn get_many_agrees_with_get_for_present_and_missing_keys() {
        let mut index = CuckooIndex::default();
        for key in (0..50_000u64).map(|k| k * 3) {
            index.insert(key, (key % 1_000_003) as u32);
        }
        // Every third key is present; groups straddle the pipeline width.
        let keys: Vec<u64> = (0..60_000u64).rev().collect();
        let mut rows = Vec::new();
        index.get_many(&keys, &mut rows);
        assert_eq!(rows.len(), keys.len());
        for (key, row) in keys.iter().zip(&rows) {
            assert_eq!(*row, index.get(*key), "key {key}");
            assert_eq!(row.is_some(), key % 3 == 0 && *key < 150_000, "key {key}");
        }
    }

    #[test]
    fn row_zero_and_key_zero_are_ordinary() {
        let mut index = CuckooIndex::default();
        assert_eq!(index.get(0), None);
        assert_eq!(index.insert(0, 0), None);
        assert_eq!(index.get(0), Some(0));
        let mut rows = Vec::new();
        index.get_many(&[0, 1], &mut rows);
        assert_eq!(rows, vec![Some(0), None]);
    }

    #[test]
    fn most_keys_sit_in_their_first_bucket() {
        let mut index = CuckooIndex::default();
        for key in 0..1_000_000u64 {
            index.insert(key.wrapping_mul(0x9e37_79b9_7f4a_7c15), key as u32);
        }
        let buckets = index.buckets();
        let home = index
            .iter()
            .filter(|(key, _)| find_slot(&buckets[index.bucket_pair(*key).0], *key).is_some())
            .count();
        let load = index.len() as f64 / index.capacity() as f64;
        let share = home as f64 / index.len() as f64;
        // Measured 0.849 at load 0.85; random victims gave 0.810.
        assert!(
            share > 0.83,
            "{share:.3} in the first bucket at load {load:.3}"
        );
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
        assert!(per_key <= 18.0, "{per_key:.1} bytes per key");
    }
}
