//! Key hashing. Keys are arbitrary u64 (often already hashes, often small integers), so every
//! use goes through a full-avalanche mixer first.

/// The splitmix64 finalizer: every input bit affects every output bit.
#[inline]
pub(crate) fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A second, independent hash of the same key (cuckoo's alternative bucket).
#[inline]
pub(crate) fn mix2(x: u64) -> u64 {
    mix(x ^ 0x9e37_79b9_7f4a_7c15).rotate_left(32)
}

/// Mixes a key with a seed (initializers, admission draws).
#[inline]
pub(crate) fn seeded(key: u64, seed: u64) -> u64 {
    mix(key ^ mix(seed.wrapping_add(0x632b_e59b_d9b4_e019)))
}
