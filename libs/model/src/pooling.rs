//! Between the minibatch and the dense network: the unique keys a minibatch needs from
//! each table (each looked up and pushed once), sum pooling of a feature's looked-up rows
//! into its slot of the sample's embedding row, and the backward pass of pooling, which
//! adds each pooled gradient onto the unique key it came from. Pooling and its backward are
//! primus-gpu's kernels over the batch's unique rows, run by the caller's
//! [`EmbeddingKernels`]: the CPU references, or the CUDA kernels.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use primus_batch::hash::mix64;
use primus_batch::{Ikjt, JaggedFeature, Kjt, Sparse};
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

/// A feature of a minibatch as pooling reads it: one row per sample, or (RecD's IKJT) one
/// row per unique row of its dedup group with each sample's row in `inverse`.
type FeatureRows<'a> = (&'a JaggedFeature, Option<&'a [u32]>);

impl BatchKeys {
    /// Every feature of `layout` must be in `kjt` with one row per sample.
    pub fn collect(layout: &ModelLayout, kjt: &Kjt) -> Result<Self, ModelError> {
        Self::resolve(layout, kjt.rows, |name| {
            kjt.feature(name).map(|feature| (feature, None))
        })
    }

    /// Every feature of `layout` must be in `ikjt`: a grouped feature's keys are resolved
    /// once per unique row of its group, and its samples pool through the group's inverse
    /// index. The keys, pooled rows and gradients are those of the same rows as a KJT.
    pub fn collect_grouped(layout: &ModelLayout, ikjt: &Ikjt) -> Result<Self, ModelError> {
        Self::resolve(layout, ikjt.rows, |name| {
            let jagged = ikjt.jagged.iter().find(|f| f.name == name);
            jagged.map(|feature| (feature, None)).or_else(|| {
                ikjt.groups.iter().find_map(|group| {
                    let feature = group.features.iter().find(|f| f.name == name)?;
                    Some((feature, Some(group.inverse.as_slice())))
                })
            })
        })
    }

    /// [`collect`](Self::collect) or [`collect_grouped`](Self::collect_grouped), as the
    /// minibatch came.
    pub fn of(layout: &ModelLayout, sparse: &Sparse) -> Result<Self, ModelError> {
        match sparse {
            Sparse::Jagged(kjt) => Self::collect(layout, kjt),
            Sparse::Grouped(ikjt) => Self::collect_grouped(layout, ikjt),
        }
    }

    fn resolve<'a>(
        layout: &ModelLayout,
        samples: usize,
        feature_rows: impl Fn(&str) -> Option<FeatureRows<'a>>,
    ) -> Result<Self, ModelError> {
        let mut maps: Vec<KeyMap> = vec![KeyMap::default(); layout.tables.len()];
        let mut tables: Vec<Vec<u64>> = vec![Vec::new(); layout.tables.len()];
        let mut features = Vec::with_capacity(layout.features.len());
        for slot in &layout.features {
            let (feature, inverse) =
                feature_rows(&slot.name).ok_or_else(|| ModelError::Mismatch {
                    feature: slot.name.clone(),
                    message: "missing from the minibatch".into(),
                })?;
            let rows_expected = inverse.map_or(samples, |_| feature.rows());
            if feature.rows() != rows_expected || inverse.is_some_and(|i| i.len() != samples) {
                return Err(ModelError::Mismatch {
                    feature: slot.name.clone(),
                    message: format!("{} rows in a minibatch of {samples}", feature.rows()),
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
                inverse: inverse.map(<[u32]>::to_vec),
            });
        }
        Ok(Self {
            tables,
            input: PoolingInput { samples, features },
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
            // How many samples pool each bag: one each, or as the inverse index says.
            let mut pooled_by = vec![1_u64; feature.bags()];
            if let Some(inverse) = &feature.inverse {
                pooled_by.fill(0);
                for &bag in inverse {
                    pooled_by[bag as usize] += 1;
                }
            }
            for (bag, samples) in pooled_by.into_iter().enumerate() {
                let (start, end) = (feature.offsets[bag], feature.offsets[bag + 1]);
                for &row in &feature.rows[start as usize..end as usize] {
                    counts[feature.table][row as usize] += samples;
                }
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
