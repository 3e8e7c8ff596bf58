//! The minibatches whose gradients a shard applied, by identity (a hash of the task rows a
//! minibatch holds, which a data executor serves again unchanged when its trainer died).
//! A push of an identity already applied is answered without applying it, so a minibatch
//! a dead trainer pushed and had not yet confirmed, or a push retried after its answer was
//! lost, changes the shard once.
//!
//! A shard remembers an identity together with what the call held (per table, or dense
//! tensor, its name, its number of keys and their smallest and largest): after a move,
//! the part of a push that the old shard refused reaches the new one as a second call of
//! the same minibatch, which holds other keys and must apply too.

use std::sync::{Mutex, PoisonError};

use primus_batch::RecentIdentities;
use primus_batch::hash::{hash_bytes, mix64};

/// Identities remembered, newest kept: about ten minutes of one push per step from four
/// trainers at 25 steps a second, far longer than a minibatch takes to be served again.
const REMEMBERED: usize = 1 << 16;

/// The identities applied (or being applied) on one shard, for one kind of push.
pub(crate) struct AppliedMinibatches {
    remembered: Mutex<RecentIdentities>,
}

impl Default for AppliedMinibatches {
    fn default() -> Self {
        Self {
            remembered: Mutex::new(RecentIdentities::new(REMEMBERED)),
        }
    }
}

/// What a shard remembers of a call of `minibatch` holding `parts` (a name and its keys
/// each): 0 when the call names no minibatch. The parts of one minibatch on different
/// shards, or moved between them, hold disjoint keys, so a part's count and smallest and
/// largest key tell them apart without hashing every key on the push's path.
pub(crate) fn call_identity<'a>(
    minibatch: u64,
    parts: impl IntoIterator<Item = (&'a str, &'a [u64])>,
) -> u64 {
    if minibatch == 0 {
        return 0;
    }
    let mut identity = mix64(minibatch);
    for (name, keys) in parts {
        let smallest = keys.iter().copied().min().unwrap_or(0);
        let largest = keys.iter().copied().max().unwrap_or(0);
        for value in [
            hash_bytes(name.as_bytes()),
            keys.len() as u64,
            smallest,
            largest,
        ] {
            identity = mix64(identity ^ value);
        }
    }
    identity.max(1)
}

impl AppliedMinibatches {
    /// Claims `minibatch` for applying: false when it was applied, or is being applied,
    /// already. Identity 0 (a push that names none) is always applied.
    pub(crate) fn claim(&self, minibatch: u64) -> bool {
        if minibatch == 0 {
            return true;
        }
        self.lock().insert(minibatch)
    }

    /// A claimed push failed before it was applied: its identity may come again.
    pub(crate) fn release(&self, minibatch: u64) {
        self.lock().remove(minibatch);
    }

    /// The shard's state was replaced (a restore, or every row dropped): a minibatch
    /// applied before may have to be applied again.
    pub(crate) fn forget_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecentIdentities> {
        self.remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_applied_once_until_released_or_forgotten() {
        let applied = AppliedMinibatches::default();
        assert!(applied.claim(7));
        assert!(!applied.claim(7), "a repeat");
        assert!(applied.claim(0) && applied.claim(0), "no identity: always");
        applied.release(7);
        assert!(applied.claim(7), "a failed push comes again");
        applied.forget_all();
        assert!(applied.claim(7), "after a restore");
    }

    #[test]
    fn a_calls_identity_is_its_minibatch_and_what_it_holds() {
        let call = |minibatch, table, keys: &[u64]| call_identity(minibatch, [(table, keys)]);
        assert_eq!(call(5, "t", &[1, 2]), call(5, "t", &[1, 2]));
        assert_ne!(
            call(5, "t", &[1, 2]),
            call(5, "t", &[3]),
            "another part of it"
        );
        assert_ne!(call(5, "t", &[1, 2]), call(5, "u", &[1, 2]));
        assert_eq!(call(5, "t", &[1, 2]), call(5, "t", &[2, 1]), "in any order");
        assert_ne!(call(5, "t", &[1, 2]), call(6, "t", &[1, 2]));
        assert_eq!(call(0, "t", &[1, 2]), 0, "no minibatch named");
    }

    #[test]
    fn the_oldest_identities_are_forgotten_beyond_the_limit() {
        let applied = AppliedMinibatches::default();
        for id in 1..=REMEMBERED as u64 + 1 {
            assert!(applied.claim(id));
        }
        assert!(applied.claim(1), "forgotten");
        assert!(!applied.claim(REMEMBERED as u64 + 1), "still remembered");
    }
}
