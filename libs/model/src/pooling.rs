//! Between the minibatch and the dense network: the unique keys a minibatch needs from
//! each table (each looked up and pushed once), sum pooling of a feature's looked-up rows
//! into its slot of the sample's embedding row, and the backward pass of pooling, which
//! adds each pooled gradient onto the unique key it came from. Pooling and its backward are
//! primus-gpu's kernels over the batch's unique rows, run by the caller's
//! [`EmbeddingKernels`]: the CPU references, or the CUDA kernels.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use primus_batch::Kjt;
use primus_batch::hash::mix64;
use primus_gpu::{Accumulation, FeatureBags, Pooling, PoolingInput, TableShape};
pub use primus_gpu::{CpuKernels, EmbeddingKernels};

use crate::ModelError;
use crate::layout::ModelLayout;

/// Keys are hashes already; one multiply-xorshift round is enough to spread them.
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

type KeyMap = HashMap<u64, u32, BuildHasherDefault<KeyHasher>>;

/// A set of keys, hashed as cheaply as a minibatch's key maps hash them.
pub type KeySet = HashSet<u64, BuildHasherDefault<KeyHasher>>;

/// A minibatch's sparse features, resolved to unique keys per table.
#[derive(Debug, Clone)]
pub struct BatchKeys {
    /// Per layout table: its unique keys, in first-seen order.
    pub tables: Vec<Vec<u64>>,
    /// Per layout feature: its bags, keys replaced by positions among the table's unique keys.
    input: PoolingInput,
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
            let rows = feature
                .values
                .iter()
                .map(|key| {
                    *map.entry(*key).or_insert_with(|| {
                        keys.push(*key);
                        (keys.len() - 1) as u32
                    })
                })
                .collect();
            features.push(FeatureBags {
                table: slot.table,
                offsets: feature.offsets.clone(),
                rows,
                inverse: None,
            });
        }
        Ok(Self {
            tables,
            input: PoolingInput {
                samples: kjt.rows,
                features,
            },
        })
    }

    /// Samples.
    pub fn rows(&self) -> usize {
        self.input.samples
    }

    /// How often the minibatch pools each unique key: per table, one count per key of
    /// `tables[t]`, in that order.
    pub fn access_counts(&self) -> Vec<Vec<u64>> {
        let mut counts: Vec<Vec<u64>> = self.tables.iter().map(|k| vec![0; k.len()]).collect();
        for feature in &self.input.features {
            for &row in &feature.rows {
                counts[feature.table][row as usize] += 1;
            }
        }
        counts
    }

    /// The batch's unique rows of each table as the kernels see them: `dim` wide.
    fn shapes(&self, dims: impl Iterator<Item = usize>) -> Vec<TableShape> {
        self.tables
            .iter()
            .zip(dims)
            .map(|(keys, dim)| TableShape::dense(keys.len() as u32, dim as u32))
            .collect()
    }

    fn embedding_shapes(&self, layout: &ModelLayout) -> Vec<TableShape> {
        self.shapes(layout.tables.iter().map(|t| t.dim))
    }

    fn wide_shapes(&self) -> Vec<TableShape> {
        self.shapes(std::iter::repeat(1))
    }

    /// Each sample's embedding row (`rows x layout.embedding_width`): per feature, the sum
    /// of its keys' rows. `rows_per_table[t]` holds `tables[t].len() x dim` floats.
    pub fn pool(
        &self,
        kernels: &dyn EmbeddingKernels,
        layout: &ModelLayout,
        rows_per_table: &[Vec<f32>],
    ) -> Result<Vec<f32>, ModelError> {
        let weights: Vec<&[f32]> = rows_per_table.iter().map(Vec::as_slice).collect();
        kernels
            .gather_pool(
                &self.embedding_shapes(layout),
                &weights,
                &self.input,
                Pooling::Sum,
            )
            .map_err(|e| ModelError::Inputs(format!("embedding rows: {e}")))
    }

    /// Each sample's pooled first-order weight per feature (`rows x features`), from the
    /// one-wide companion rows of each table.
    pub fn pool_wide(
        &self,
        kernels: &dyn EmbeddingKernels,
        wide_per_table: &[Vec<f32>],
    ) -> Result<Vec<f32>, ModelError> {
        let weights: Vec<&[f32]> = wide_per_table.iter().map(Vec::as_slice).collect();
        kernels
            .gather_pool(&self.wide_shapes(), &weights, &self.input, Pooling::Sum)
            .map_err(|e| ModelError::Inputs(format!("wide rows: {e}")))
    }

    /// Backward of [`pool`](Self::pool): the gradient of each table's unique keys
    /// (`tables[t].len() x dim`), summing every place a key was pooled.
    pub fn scatter(
        &self,
        kernels: &dyn EmbeddingKernels,
        layout: &ModelLayout,
        embedded_grad: &[f32],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        kernels
            .pool_backward(
                &self.embedding_shapes(layout),
                &self.input,
                Pooling::Sum,
                embedded_grad,
                Accumulation::Deterministic,
            )
            .map_err(|e| ModelError::Inputs(format!("embedding gradient: {e}")))
    }

    /// Backward of [`pool_wide`](Self::pool_wide).
    pub fn scatter_wide(
        &self,
        kernels: &dyn EmbeddingKernels,
        wide_grad: &[f32],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        kernels
            .pool_backward(
                &self.wide_shapes(),
                &self.input,
                Pooling::Sum,
                wide_grad,
                Accumulation::Deterministic,
            )
            .map_err(|e| ModelError::Inputs(format!("wide gradient: {e}")))
    }
}
