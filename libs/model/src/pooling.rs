//! Between the minibatch and the dense network: the unique keys a minibatch needs from
//! each table (each looked up and pushed once), sum pooling of a feature's looked-up rows
//! into its slot of the sample's embedding row, and the backward pass of pooling, which
//! adds each pooled gradient onto the unique key it came from.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use primus_batch::Kjt;
use primus_batch::hash::mix64;

use crate::ModelError;
use crate::layout::ModelLayout;

/// Keys are hashes already; one multiply-xorshift round is enough to spread them.
#[derive(Default)]
struct KeyHasher(u64);

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

type KeyMap = HashMap<u64, u32, BuildHasherDefault<KeyHasher>>;

/// One feature of the minibatch, its keys replaced by positions among its table's unique keys.
#[derive(Debug, Clone)]
struct FeatureKeys {
    offsets: Vec<u32>,
    slots: Vec<u32>,
}

/// A minibatch's sparse features, resolved to unique keys per table.
#[derive(Debug, Clone)]
pub struct BatchKeys {
    rows: usize,
    /// Per layout table: its unique keys, in first-seen order.
    pub tables: Vec<Vec<u64>>,
    features: Vec<FeatureKeys>,
}

impl BatchKeys {
    /// Every feature of `layout` must be in `kjt` with one row per sample.
    pub fn collect(layout: &ModelLayout, kjt: &Kjt) -> Result<Self, ModelError> {
        let mut maps: Vec<KeyMap> = vec![KeyMap::default(); layout.tables.len()];
        let mut tables: Vec<Vec<u64>> = vec![Vec::new(); layout.tables.len()];
        let mut features = Vec::with_capacity(layout.features.len());
        for slot in &layout.features {
            let feature = kjt
                .feature(&slot.name)
                .ok_or_else(|| ModelError::Mismatch {
                    feature: slot.name.clone(),
                    message: "missing from the minibatch".into(),
                })?;
            if feature.rows() != kjt.rows {
                return Err(ModelError::Mismatch {
                    feature: slot.name.clone(),
                    message: format!("{} rows in a minibatch of {}", feature.rows(), kjt.rows),
                });
            }
            let (map, keys) = (&mut maps[slot.table], &mut tables[slot.table]);
            let slots = feature
                .values
                .iter()
                .map(|key| {
                    *map.entry(*key).or_insert_with(|| {
                        keys.push(*key);
                        (keys.len() - 1) as u32
                    })
                })
                .collect();
            features.push(FeatureKeys {
                offsets: feature.offsets.clone(),
                slots,
            });
        }
        Ok(Self {
            rows: kjt.rows,
            tables,
            features,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Each sample's embedding row (`rows x layout.embedding_width`): per feature, the sum
    /// of its keys' rows. `rows_per_table[t]` holds `tables[t].len() x dim` floats.
    pub fn pool(&self, layout: &ModelLayout, rows_per_table: &[Vec<f32>]) -> Vec<f32> {
        let width = layout.embedding_width;
        let mut out = vec![0.0f32; self.rows * width];
        for (slot, keys) in layout.features.iter().zip(&self.features) {
            let table = &rows_per_table[slot.table];
            let dim = slot.dim;
            for row in 0..self.rows {
                let target = &mut out[row * width + slot.offset..][..dim];
                for &key in &keys.slots[keys.offsets[row] as usize..keys.offsets[row + 1] as usize]
                {
                    let source = &table[key as usize * dim..][..dim];
                    for (t, s) in target.iter_mut().zip(source) {
                        *t += s;
                    }
                }
            }
        }
        out
    }

    /// Each sample's pooled first-order weight per feature (`rows x features`), from the
    /// one-wide companion rows of each table.
    pub fn pool_wide(&self, layout: &ModelLayout, wide_per_table: &[Vec<f32>]) -> Vec<f32> {
        let features = layout.features.len();
        let mut out = vec![0.0f32; self.rows * features];
        for (f, (slot, keys)) in layout.features.iter().zip(&self.features).enumerate() {
            let table = &wide_per_table[slot.table];
            for row in 0..self.rows {
                out[row * features + f] = keys.slots
                    [keys.offsets[row] as usize..keys.offsets[row + 1] as usize]
                    .iter()
                    .map(|&key| table[key as usize])
                    .sum();
            }
        }
        out
    }

    /// Backward of [`pool`](Self::pool): the gradient of each table's unique keys
    /// (`tables[t].len() x dim`), summing every place a key was pooled.
    pub fn scatter(&self, layout: &ModelLayout, embedded_grad: &[f32]) -> Vec<Vec<f32>> {
        let width = layout.embedding_width;
        let mut grads: Vec<Vec<f32>> = layout
            .tables
            .iter()
            .zip(&self.tables)
            .map(|(table, keys)| vec![0.0; keys.len() * table.dim])
            .collect();
        for (slot, keys) in layout.features.iter().zip(&self.features) {
            let dim = slot.dim;
            let table = &mut grads[slot.table];
            for row in 0..self.rows {
                let source = &embedded_grad[row * width + slot.offset..][..dim];
                for &key in &keys.slots[keys.offsets[row] as usize..keys.offsets[row + 1] as usize]
                {
                    let target = &mut table[key as usize * dim..][..dim];
                    for (t, s) in target.iter_mut().zip(source) {
                        *t += s;
                    }
                }
            }
        }
        grads
    }

    /// Backward of [`pool_wide`](Self::pool_wide).
    pub fn scatter_wide(&self, layout: &ModelLayout, wide_grad: &[f32]) -> Vec<Vec<f32>> {
        let features = layout.features.len();
        let mut grads: Vec<Vec<f32>> = self.tables.iter().map(|k| vec![0.0; k.len()]).collect();
        for (f, (slot, keys)) in layout.features.iter().zip(&self.features).enumerate() {
            let table = &mut grads[slot.table];
            for row in 0..self.rows {
                let g = wide_grad[row * features + f];
                for &key in &keys.slots[keys.offsets[row] as usize..keys.offsets[row + 1] as usize]
                {
                    table[key as usize] += g;
                }
            }
        }
        grads
    }
}
