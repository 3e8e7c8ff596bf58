//! The serving role's copy of a table (Monolith §2.2.3): weights only, no optimizer state,
//! each row tagged with the version of the training update it came from. Deltas may arrive
//! twice or out of order; a row or an eviction is applied only when its version is newer
//! than what the replica holds for that key, so any order of the same deltas ends in the
//! same rows.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use primus_spec::job::TableSpec;

use crate::hash::seeded;
use crate::init::Init;
use crate::table::{EmbeddingError, check_width, first_non_finite};

/// Spreads keys over independently locked shards (not the training table's salt: any
/// spreading does).
const SHARD_SALT: u64 = 0x5eed_0f5e_a71e_b0a7;

/// A key's newest known state: its weights, or `None` once evicted (a tombstone, so an
/// older update arriving late cannot bring the row back).
struct Slot {
    version: u64,
    weights: Option<Box<[f32]>>,
}

#[derive(Default)]
struct ReplicaShard {
    slots: HashMap<u64, Slot>,
    rows: usize,
}

/// One delta for one table, as the training PS exported it.
#[derive(Debug, Clone, Copy)]
pub struct DeltaRows<'a> {
    /// Keys whose rows changed.
    pub keys: &'a [u64],
    /// Version of each key's update.
    pub versions: &'a [u64],
    /// `dim` floats per key.
    pub weights: &'a [f32],
    /// Keys evicted.
    pub evicted: &'a [u64],
    /// Version of each eviction.
    pub evicted_versions: &'a [u64],
}

/// What applying a delta did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// Rows written (new or newer than the held copy).
    pub written: u64,
    /// Rows and evictions older than (or as old as) what is held: ignored.
    pub stale: u64,
    /// Rows removed by evictions.
    pub removed: u64,
}

/// A serving replica of one table: weights only, each row tagged with the version of the update it came from.
pub struct ReplicaTable {
    name: String,
    dim: usize,
    init: Init,
    seed: u64,
    shards: Box<[RwLock<ReplicaShard>]>,
}

impl ReplicaTable {
    /// A replica of `spec`'s table; `seed` must be the training PS's so keys without a row
    /// read as the same initial value there and here. `shards` is rounded up to a power of two.
    pub fn new(spec: &TableSpec, seed: u64, shards: usize) -> Self {
        let shards = shards.max(1).next_power_of_two();
        Self {
            name: spec.name.clone(),
            dim: spec.dim as usize,
            init: Init::from_spec(&spec.initializer),
            seed,
            shards: (0..shards).map(|_| RwLock::default()).collect(),
        }
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Weights per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    fn shard_of(&self, key: u64) -> usize {
        (seeded(key, SHARD_SALT) as usize) & (self.shards.len() - 1)
    }

    /// Applies one delta. Refuses (changing nothing) a delta whose lengths do not fit.
    pub fn apply(&self, delta: DeltaRows<'_>) -> Result<ApplyOutcome, EmbeddingError> {
        let keys = delta.keys.len();
        check_width("delta rows", keys, delta.weights.len(), self.dim)?;
        check_width("delta versions", keys, delta.versions.len(), 1)?;
        let evicted = delta.evicted.len();
        check_width("evicted versions", evicted, delta.evicted_versions.len(), 1)?;
        if let Some(bad) = first_non_finite(delta.weights) {
            let position = bad / self.dim;
            return Err(EmbeddingError::NonFinite {
                key: delta.keys[position],
                position,
            });
        }
        let mut outcome = ApplyOutcome::default();
        for (i, (&key, &version)) in delta.keys.iter().zip(delta.versions).enumerate() {
            let weights = &delta.weights[i * self.dim..(i + 1) * self.dim];
            self.write(key, version, Some(weights), &mut outcome);
        }
        for (&key, &version) in delta.evicted.iter().zip(delta.evicted_versions) {
            self.write(key, version, None, &mut outcome);
        }
        Ok(outcome)
    }

    fn write(&self, key: u64, version: u64, weights: Option<&[f32]>, outcome: &mut ApplyOutcome) {
        let mut shard = self.shards[self.shard_of(key)]
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let had_row = match shard.slots.get(&key) {
            Some(slot) if slot.version >= version => {
                outcome.stale += 1;
                return;
            }
            Some(slot) => slot.weights.is_some(),
            None => false,
        };
        match weights {
            Some(_) => {
                outcome.written += 1;
                shard.rows += usize::from(!had_row);
            }
            None => {
                outcome.removed += u64::from(had_row);
                shard.rows -= usize::from(had_row);
            }
        }
        shard.slots.insert(
            key,
            Slot {
                version,
                weights: weights.map(Box::from),
            },
        );
    }

    /// Writes the weights of `keys` into `out` (`dim` floats per key); keys without a row
    /// read as their initial value, as on the training PS. Returns how many had no row.
    pub fn lookup(&self, keys: &[u64], out: &mut [f32]) -> Result<usize, EmbeddingError> {
        check_width("lookup output", keys.len(), out.len(), self.dim)?;
        let mut missing = 0;
        for (key, target) in keys.iter().zip(out.chunks_exact_mut(self.dim)) {
            let shard = self.shards[self.shard_of(*key)]
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            match shard.slots.get(key).and_then(|s| s.weights.as_deref()) {
                Some(weights) => target.copy_from_slice(weights),
                None => {
                    missing += 1;
                    self.init.fill(*key, self.seed, target);
                }
            }
        }
        Ok(missing)
    }

    /// Every row: keys, versions, weights (`dim` floats each), in no particular order.
    pub fn rows(&self) -> (Vec<u64>, Vec<u64>, Vec<f32>) {
        let (mut keys, mut versions, mut weights) = (Vec::new(), Vec::new(), Vec::new());
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(PoisonError::into_inner);
            for (key, slot) in &shard.slots {
                if let Some(w) = &slot.weights {
                    keys.push(*key);
                    versions.push(slot.version);
                    weights.extend_from_slice(w);
                }
            }
        }
        (keys, versions, weights)
    }

    /// Rows held (tombstones of evicted keys not counted).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(PoisonError::into_inner).rows)
            .sum()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Approximate memory held by rows and tombstones.
    pub fn bytes(&self) -> u64 {
        let per_slot = (std::mem::size_of::<u64>() + std::mem::size_of::<Slot>()) as u64;
        self.shards
            .iter()
            .map(|s| {
                let shard = s.read().unwrap_or_else(PoisonError::into_inner);
                shard.slots.len() as u64 * per_slot + (shard.rows * self.dim * 4) as u64
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use primus_spec::job::{Initializer, OptimizerSpec};

    fn spec(dim: u32) -> TableSpec {
        TableSpec {
            initializer: Initializer::Uniform { scale: 0.05 },
            ..TableSpec::new("t", dim, OptimizerSpec::Sgd { learning_rate: 0.1 })
        }
    }

    struct OwnedDelta {
        keys: Vec<u64>,
        versions: Vec<u64>,
        weights: Vec<f32>,
        evicted: Vec<u64>,
        evicted_versions: Vec<u64>,
    }

    impl OwnedDelta {
        fn rows(&self) -> DeltaRows<'_> {
            DeltaRows {
                keys: &self.keys,
                versions: &self.versions,
                weights: &self.weights,
                evicted: &self.evicted,
                evicted_versions: &self.evicted_versions,
            }
        }
    }

    /// Deltas of a little history on 2-wide rows: updates of keys 0..40 at versions
    /// 1..=n, some keys evicted and re-created along the way.
    fn history() -> Vec<OwnedDelta> {
        let mut deltas = Vec::new();
        let mut version = 0u64;
        for round in 0..12u64 {
            let mut delta = OwnedDelta {
                keys: Vec::new(),
                versions: Vec::new(),
                weights: Vec::new(),
                evicted: Vec::new(),
                evicted_versions: Vec::new(),
            };
            for key in (round % 3..40).step_by(3) {
                version += 1;
                delta.keys.push(key);
                delta.versions.push(version);
                delta
                    .weights
                    .extend([round as f32, key as f32 + version as f32]);
            }
            if round % 4 == 3 {
                for key in [round, round + 10] {
                    version += 1;
                    delta.evicted.push(key);
                    delta.evicted_versions.push(version);
                }
            }
            deltas.push(delta);
        }
        deltas
    }

    fn state(table: &ReplicaTable) -> Vec<(u64, u64, Vec<f32>)> {
        let (keys, versions, weights) = table.rows();
        let mut rows: Vec<_> = keys
            .iter()
            .zip(&versions)
            .zip(weights.chunks(table.dim()))
            .map(|((k, v), w)| (*k, *v, w.to_vec()))
            .collect();
        rows.sort_by_key(|r| r.0);
        rows
    }

    #[test]
    fn deltas_in_any_order_or_twice_end_in_the_same_rows() {
        let deltas = history();
        let in_order = ReplicaTable::new(&spec(2), 1, 4);
        for d in &deltas {
            in_order.apply(d.rows()).expect("apply");
        }
        let expected = state(&in_order);
        assert!(expected.len() > 20, "{}", expected.len());
        let orders: [Vec<usize>; 3] = [
            (0..deltas.len()).rev().collect(),
            vec![5, 0, 11, 3, 7, 1, 9, 2, 10, 4, 8, 6],
            (0..deltas.len()).chain(0..deltas.len()).collect(),
        ];
        for order in orders {
            let table = ReplicaTable::new(&spec(2), 1, 4);
            for i in &order {
                table.apply(deltas[*i].rows()).expect("apply");
            }
            assert_eq!(state(&table), expected, "order {order:?}");
            assert_eq!(table.len(), expected.len());
        }
    }

    #[test]
    fn an_older_update_never_overwrites_a_newer_one_nor_revives_an_evicted_key() {
        let table = ReplicaTable::new(&spec(1), 1, 1);
        let apply =
            |keys: &[u64], versions: &[u64], weights: &[f32], evicted: &[u64], ev: &[u64]| {
                table
                    .apply(DeltaRows {
                        keys,
                        versions,
                        weights,
                        evicted,
                        evicted_versions: ev,
                    })
                    .expect("apply")
            };
        apply(&[7], &[10], &[1.0], &[], &[]);
        let outcome = apply(&[7], &[9], &[2.0], &[], &[]);
        assert_eq!(outcome.stale, 1);
        let removed = apply(&[], &[], &[], &[7], &[11]);
        assert_eq!(removed.removed, 1);
        assert_eq!(apply(&[7], &[10], &[3.0], &[], &[]).stale, 1);
        assert!(table.is_empty());
        let mut out = [0.0f32];
        assert_eq!(table.lookup(&[7], &mut out).expect("lookup"), 1);
        apply(&[7], &[12], &[4.0], &[], &[]);
        table.lookup(&[7], &mut out).expect("lookup");
        assert_eq!(out, [4.0]);
    }

    #[test]
    fn missing_keys_read_as_the_training_tables_initial_value() {
        let spec = spec(8);
        let training = crate::Table::new(
            &spec,
            crate::TableOptions {
                seed: 42,
                ..crate::TableOptions::default()
            },
        )
        .expect("table");
        let replica = ReplicaTable::new(&spec, 42, 2);
        let keys = [1u64, 99, u64::MAX];
        let (mut a, mut b) = (vec![0.0; 24], vec![0.0; 24]);
        training.lookup(&keys, &mut a).expect("lookup");
        replica.lookup(&keys, &mut b).expect("lookup");
        assert_eq!(a, b);
    }

    #[test]
    fn a_delta_that_does_not_fit_changes_nothing() {
        let table = ReplicaTable::new(&spec(2), 1, 1);
        let bad = table.apply(DeltaRows {
            keys: &[1, 2],
            versions: &[1, 2],
            weights: &[0.0; 3],
            evicted: &[],
            evicted_versions: &[],
        });
        assert!(matches!(bad, Err(EmbeddingError::Width { .. })), "{bad:?}");
        let nan = table.apply(DeltaRows {
            keys: &[1],
            versions: &[1],
            weights: &[0.0, f32::NAN],
            evicted: &[],
            evicted_versions: &[],
        });
        assert!(
            matches!(nan, Err(EmbeddingError::NonFinite { .. })),
            "{nan:?}"
        );
        assert!(table.is_empty());
    }
}
