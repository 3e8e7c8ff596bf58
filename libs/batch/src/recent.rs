//! The latest minibatch identities seen, up to a bound: what a PS shard applied, what a
//! trainer's reader yielded. A minibatch's identity is a hash of the task rows it holds,
//! the same when a data executor serves it again.

use std::collections::VecDeque;

use crate::hash::KeySet;

/// Identities in the order first inserted; the oldest is forgotten beyond the bound.
#[derive(Debug, Clone)]
pub struct RecentIdentities {
    ids: KeySet,
    /// Oldest first.
    order: VecDeque<u64>,
    bound: usize,
}

impl RecentIdentities {
    /// Remembers the latest `bound` identities (at least one).
    pub fn new(bound: usize) -> Self {
        Self {
            ids: KeySet::default(),
            order: VecDeque::new(),
            bound: bound.max(1),
        }
    }

    /// Remembers `id`: false when it is remembered already.
    pub fn insert(&mut self, id: u64) -> bool {
        if !self.ids.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > self.bound
            && let Some(oldest) = self.order.pop_front()
        {
            self.ids.remove(&oldest);
        }
        true
    }

    /// Forgets `id`.
    pub fn remove(&mut self, id: u64) {
        if self.ids.remove(&id)
            && let Some(at) = self.order.iter().rposition(|known| *known == id)
        {
            self.order.remove(at);
        }
    }

    /// Forgets every identity.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_identities_are_remembered_up_to_the_bound() {
        let mut recent = RecentIdentities::new(2);
        assert!(recent.insert(1) && recent.insert(2));
        assert!(!recent.insert(1), "remembered");
        assert!(recent.insert(3), "new");
        assert!(
            recent.insert(1),
            "the oldest was forgotten beyond the bound"
        );
        assert!(!recent.insert(3));
        recent.remove(3);
        assert!(recent.insert(3), "forgotten on request");
        recent.clear();
        assert!(recent.insert(1) && recent.insert(3));
    }
}
