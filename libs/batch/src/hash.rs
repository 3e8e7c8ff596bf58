//! Feature keys: a raw sparse value hashed together with its feature's name into the u64
//! key the embedding tables are indexed by. Stable across processes and releases (the
//! serving side hashes the same way), so it is spelled out here rather than taken from
//! `std::hash`, whose output may change between Rust versions. Also the hasher of maps
//! and sets keyed by those keys.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// SplitMix64's finaliser: a bijection on u64 with full avalanche.
pub fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// FNV-1a over bytes, then mixed: strings are short, so this beats a block hash here.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// The seed a feature's name contributes to every key of that feature.
pub fn feature_seed(feature: &str) -> u64 {
    hash_bytes(feature.as_bytes())
}

/// Key of an integer value of the feature with `seed`.
#[inline]
pub fn int_key(seed: u64, value: u64) -> u64 {
    mix64(seed ^ mix64(value))
}

/// Key of a string value of the feature with `seed`. Differs from [`int_key`] of the same
/// digits: a feature's column type is part of its identity.
#[inline]
pub fn str_key(seed: u64, value: &str) -> u64 {
    mix64(seed.rotate_left(17) ^ hash_bytes(value.as_bytes()))
}

/// Hashes feature keys for maps and sets: keys are hashes already, so one mixing round
/// spreads them (SipHash, the standard maps' default, cost far more on a step's path).
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = mix64(self.0 ^ u64::from(*b));
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = mix64(key);
    }
}

/// A map keyed by feature keys, hashed with [`KeyHasher`].
pub type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// A set of feature keys, hashed with [`KeyHasher`].
pub type KeySet = HashSet<u64, BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_feature_and_value() {
        let (a, b) = (feature_seed("c1"), feature_seed("c2"));
        assert_ne!(int_key(a, 7), int_key(b, 7));
        assert_ne!(int_key(a, 7), int_key(a, 8));
        assert_eq!(int_key(a, 7), int_key(feature_seed("c1"), 7));
        assert_ne!(str_key(a, "7"), int_key(a, 7));
    }

    #[test]
    fn keys_are_stable_across_builds() {
        // Serving and training hash separately; a change here breaks every saved model.
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
        assert_eq!(hash_bytes(b""), mix64(0xcbf2_9ce4_8422_2325));
    }
}
