//! A trainer's replica of one table's hot rows (HypeReca's `R` chunk): weights and
//! optimizer state copied from the parameter servers, then trained in place with the
//! table's own optimizer. Every trainer of a job applies the same summed gradients in the
//! same order, so the replicas stay bitwise equal to each other and to the PS rows, which
//! receive those same gradients once per step.

use std::collections::HashMap;

use primus_spec::job::TableSpec;

use crate::EmbeddingError;
use crate::optimizer::Optimizer;
use crate::table::{check_gradients, check_width};

/// Hot rows of one table, `dim` weights then the optimizer's state per row.
#[derive(Debug, Clone)]
pub struct HotRows {
    name: String,
    dim: usize,
    stride: usize,
    optimizer: Optimizer,
    slots: HashMap<u64, usize>,
    values: Vec<f32>,
}

impl HotRows {
    /// An empty replica laid out as `spec`'s table is on the PS.
    pub fn new(spec: &TableSpec) -> Result<Self, EmbeddingError> {
        let dim = spec.dim as usize;
        if dim == 0 {
            return Err(EmbeddingError::ZeroDim {
                table: spec.name.clone(),
            });
        }
        let optimizer = Optimizer::from_spec(&spec.optimizer);
        Ok(Self {
            name: spec.name.clone(),
            dim,
            stride: dim + optimizer.state_len(dim),
            optimizer,
            slots: HashMap::new(),
            values: Vec::new(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Floats of optimizer state per row.
    pub fn state_len(&self) -> usize {
        self.stride - self.dim
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn contains(&self, key: u64) -> bool {
        self.slots.contains_key(&key)
    }

    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots.keys().copied()
    }

    /// Adds (or replaces) `key`'s row: `values` holds its weights then its optimizer state,
    /// as the PS's `ReadRows` returns them.
    pub fn insert(&mut self, key: u64, values: &[f32]) -> Result<(), EmbeddingError> {
        check_width("row values", 1, values.len(), self.stride)?;
        match self.slots.get(&key) {
            Some(&slot) => self.values[slot * self.stride..][..self.stride].copy_from_slice(values),
            None => {
                self.slots.insert(key, self.values.len() / self.stride);
                self.values.extend_from_slice(values);
            }
        }
        Ok(())
    }

    /// `key`'s weights, if it is hot.
    pub fn weights(&self, key: u64) -> Option<&[f32]> {
        let slot = *self.slots.get(&key)?;
        Some(&self.values[slot * self.stride..][..self.dim])
    }

    /// `key`'s weights then optimizer state, if it is hot.
    pub fn values(&self, key: u64) -> Option<&[f32]> {
        let slot = *self.slots.get(&key)?;
        Some(&self.values[slot * self.stride..][..self.stride])
    }

    /// Applies `grads` (`dim` floats per key, keys in the order given) with the table's
    /// optimizer. Every key must be hot and every gradient finite; otherwise nothing
    /// changes.
    pub fn apply(&mut self, keys: &[u64], grads: &[f32]) -> Result<(), EmbeddingError> {
        check_gradients(keys, grads, self.dim)?;
        let slots = keys
            .iter()
            .map(|key| {
                self.slots
                    .get(key)
                    .copied()
                    .ok_or_else(|| EmbeddingError::NotHot {
                        table: self.name.clone(),
                        key: *key,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (slot, grad) in slots.into_iter().zip(grads.chunks_exact(self.dim)) {
            let row = &mut self.values[slot * self.stride..][..self.stride];
            let (weights, state) = row.split_at_mut(self.dim);
            self.optimizer.apply(weights, state, grad);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Table, TableOptions};
    use primus_spec::job::OptimizerSpec;

    fn spec(optimizer: OptimizerSpec) -> TableSpec {
        TableSpec::new("t", 4, optimizer)
    }

    /// The replica of rows copied from a table, trained with the same gradients, ends
    /// bitwise equal to the table for every optimizer.
    #[test]
    fn a_replica_trained_like_the_table_stays_bitwise_equal_to_it() {
        let optimizers = [
            OptimizerSpec::Sgd {
                learning_rate: 0.05,
            },
            OptimizerSpec::Adagrad {
                learning_rate: 0.05,
                initial_accumulator: 0.1,
                epsilon: 1e-8,
            },
            OptimizerSpec::Adam {
                learning_rate: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8,
            },
            OptimizerSpec::Ftrl {
                alpha: 0.1,
                beta: 1.0,
                l1: 0.01,
                l2: 0.01,
            },
        ];
        for optimizer in optimizers {
            let spec = spec(optimizer.clone());
            let table = Table::new(&spec, TableOptions::default()).expect("table");
            let keys = [3u64, 17, 1 << 40];
            let grads: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) * 0.01).collect();
            table.push(&keys, &grads, 1).expect("push");
            let mut hot = HotRows::new(&spec).expect("replica");
            for &key in &keys {
                let (weights, state, _) = table.row(key).expect("read").expect("row");
                hot.insert(key, &[weights, state].concat()).expect("insert");
            }
            for step in 0..20 {
                let grads: Vec<f32> = (0..12)
                    .map(|i| ((i * 7 + step * 3) % 11) as f32 * 0.02 - 0.1)
                    .collect();
                table.push(&keys, &grads, 2).expect("push");
                hot.apply(&keys, &grads).expect("apply");
            }
            for &key in &keys {
                let (weights, state, _) = table.row(key).expect("read").expect("row");
                assert_eq!(
                    hot.values(key).expect("hot"),
                    [weights, state].concat().as_slice(),
                    "{optimizer:?}"
                );
            }
        }
    }

    #[test]
    fn bad_rows_and_gradients_are_refused_without_a_change() {
        let spec = spec(OptimizerSpec::Adagrad {
            learning_rate: 0.05,
            initial_accumulator: 0.1,
            epsilon: 1e-8,
        });
        let mut hot = HotRows::new(&spec).expect("replica");
        assert!(matches!(
            hot.insert(1, &[0.0; 4]),
            Err(EmbeddingError::Width { want: 8, .. })
        ));
        hot.insert(1, &[0.5; 8]).expect("insert");
        assert_eq!(
            hot.apply(&[1, 2], &[0.1; 8]),
            Err(EmbeddingError::NotHot {
                table: "t".into(),
                key: 2
            })
        );
        let mut grads = [0.1; 4];
        grads[2] = f32::NAN;
        assert!(matches!(
            hot.apply(&[1], &grads),
            Err(EmbeddingError::NonFinite { key: 1, .. })
        ));
        assert_eq!(hot.values(1), Some([0.5; 8].as_slice()));
    }
}
