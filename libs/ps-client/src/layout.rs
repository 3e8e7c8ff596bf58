//! Where a Job's parameters live among its PS shards: a key on the shard its jump consistent
//! hash picks, a dense tensor on the shard the hash of its name picks.

use primus_proto::v1;

/// Lamping & Veach's jump consistent hash: the shard of `key` among `shards`; growing the
/// shard count moves only the keys the new shards take.
pub fn jump_consistent_hash(key: u64, shards: u32) -> u32 {
    let mut key = key;
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(shards) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// The shard of embedding key `key` among `shard_count`.
pub fn key_shard(key: u64, shard_count: u32) -> u32 {
    jump_consistent_hash(key, shard_count)
}

/// The shard of dense tensor `name` among `shard_count`.
pub fn dense_shard(name: &str, shard_count: u32) -> u32 {
    jump_consistent_hash(primus_batch::hash::hash_bytes(name.as_bytes()), shard_count)
}

/// A shard count and one shard's place in it (none: the shard holds nothing, it leaves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Shards the Job's parameters are spread over.
    pub shard_count: u32,
    /// This shard's index among them.
    pub index: Option<u32>,
}

/// A layout from the wire that cannot be.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// No layout given where one is needed.
    #[error("layout: missing")]
    Missing,
    /// Zero shards.
    #[error("layout.shard_count: must be at least 1")]
    NoShards,
    /// An index past the end.
    #[error("layout.index: {index} is not below shard_count {shard_count}")]
    Index {
        /// The index given.
        index: u32,
        /// The shard count given.
        shard_count: u32,
    },
}

impl Layout {
    /// Whether this shard holds `key`.
    pub fn holds_key(&self, key: u64) -> bool {
        self.index == Some(key_shard(key, self.shard_count))
    }

    /// Whether this shard holds dense tensor `name`.
    pub fn holds_dense(&self, name: &str) -> bool {
        self.index == Some(dense_shard(name, self.shard_count))
    }

    /// The wire form.
    pub fn to_proto(self) -> v1::Layout {
        v1::Layout {
            shard_count: self.shard_count,
            index: self.index,
        }
    }

    /// Checks a wire layout.
    pub fn from_proto(layout: Option<&v1::Layout>) -> Result<Self, LayoutError> {
        let layout = layout.ok_or(LayoutError::Missing)?;
        if layout.shard_count == 0 {
            return Err(LayoutError::NoShards);
        }
        if let Some(index) = layout.index
            && index >= layout.shard_count
        {
            return Err(LayoutError::Index {
                index,
                shard_count: layout.shard_count,
            });
        }
        Ok(Self {
            shard_count: layout.shard_count,
            index: layout.index,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_hash_spreads_keys_and_moves_few_on_growth() {
        let keys: Vec<u64> = (0..10_000u64)
            .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let mut counts = [0usize; 4];
        for k in &keys {
            counts[jump_consistent_hash(*k, 4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|c| (2_200..2_800).contains(c)),
            "{counts:?}"
        );
        let moved = keys
            .iter()
            .filter(|k| jump_consistent_hash(**k, 4) != jump_consistent_hash(**k, 5))
            .count();
        // Growing 4 -> 5 shards moves about a fifth of the keys, all to the new shard.
        assert!((1_700..2_300).contains(&moved), "{moved}");
        assert!(keys.iter().all(|k| {
            let (before, after) = (jump_consistent_hash(*k, 4), jump_consistent_hash(*k, 5));
            before == after || after == 4
        }));
    }

    #[test]
    fn a_layout_holds_what_hashes_to_its_index_and_a_leaving_shard_holds_nothing() {
        let layout = Layout {
            shard_count: 3,
            index: Some(1),
        };
        for key in 0..1_000u64 {
            assert_eq!(layout.holds_key(key), key_shard(key, 3) == 1);
        }
        let leaving = Layout {
            shard_count: 3,
            index: None,
        };
        assert!((0..1_000u64).all(|k| !leaving.holds_key(k)));
        assert!(!leaving.holds_dense("bottom.0.weight"));
    }

    #[test]
    fn a_wire_layout_with_no_shards_or_an_index_past_the_end_is_refused() {
        let wire = |shard_count, index| v1::Layout { shard_count, index };
        assert!(matches!(
            Layout::from_proto(Some(&wire(0, None))),
            Err(LayoutError::NoShards)
        ));
        let error = Layout::from_proto(Some(&wire(2, Some(2)))).expect_err("index past the end");
        assert_eq!(
            error.to_string(),
            "layout.index: 2 is not below shard_count 2"
        );
        assert!(matches!(
            Layout::from_proto(None),
            Err(LayoutError::Missing)
        ));
        assert_eq!(
            Layout::from_proto(Some(&wire(4, Some(3)))).ok(),
            Some(Layout {
                shard_count: 4,
                index: Some(3)
            })
        );
    }
}
