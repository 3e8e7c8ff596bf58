//! A minibatch: labels (the label and any further targets), a dense matrix and sparse
//! features, jagged or grouped.

use std::ops::Range;

use crate::BatchError;
use crate::ikjt::{DedupGroups, Ikjt};
use crate::kjt::Kjt;

/// Dense features, row-major: row `i` is `values[i * names.len()..(i + 1) * names.len()]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DenseMatrix {
    /// The dense features' names, in column order.
    pub names: Vec<String>,
    /// Row-major: `names.len()` values per row.
    pub values: Vec<f32>,
}

impl DenseMatrix {
    /// Columns (dense features).
    pub fn cols(&self) -> usize {
        self.names.len()
    }

    fn slice(&self, range: Range<usize>) -> Self {
        let cols = self.cols();
        Self {
            names: self.names.clone(),
            values: self.values[range.start * cols..range.end * cols].to_vec(),
        }
    }
}

/// A further label column (a schema's `targets`): one value per sample.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Target {
    /// The column's name.
    pub name: String,
    /// One value per sample.
    pub values: Vec<f32>,
}

/// A minibatch's sparse features.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sparse {
    /// One row of keys per sample (KJT).
    Jagged(Kjt),
    /// With RecD dedup groups: unique rows and an inverse index (IKJT).
    Grouped(Ikjt),
}

/// Samples ready to train on: labels, dense features, sparse features.
#[derive(Debug, Clone, PartialEq)]
pub struct Minibatch {
    /// One label per sample, 0 or 1.
    pub labels: Vec<f32>,
    /// The schema's further label columns, in its order.
    pub targets: Vec<Target>,
    /// The dense features.
    pub dense: DenseMatrix,
    /// The sparse features.
    pub sparse: Sparse,
}

impl Minibatch {
    /// Samples held.
    pub fn rows(&self) -> usize {
        self.labels.len()
    }

    /// Sparse features as a KJT, expanding groups.
    pub fn to_kjt(&self) -> Result<Kjt, BatchError> {
        match &self.sparse {
            Sparse::Jagged(kjt) => Ok(kjt.clone()),
            Sparse::Grouped(ikjt) => ikjt.to_kjt(),
        }
    }

    /// The same rows with `groups` deduplicated (RecD); a grouped batch is regrouped.
    pub fn grouped(&self, groups: &DedupGroups) -> Result<Self, BatchError> {
        let ikjt = match &self.sparse {
            Sparse::Jagged(kjt) => Ikjt::from_kjt(kjt, groups)?,
            Sparse::Grouped(ikjt) => Ikjt::from_kjt(&ikjt.to_kjt()?, groups)?,
        };
        Ok(Self {
            labels: self.labels.clone(),
            targets: self.targets.clone(),
            dense: self.dense.clone(),
            sparse: Sparse::Grouped(ikjt),
        })
    }

    /// Rows `range`, as a jagged batch. Copies only those rows of a jagged batch.
    pub fn slice(&self, range: Range<usize>) -> Result<Self, BatchError> {
        let kjt = match &self.sparse {
            Sparse::Jagged(kjt) => kjt.slice(range.clone()),
            Sparse::Grouped(ikjt) => ikjt.to_kjt()?.slice(range.clone()),
        };
        Ok(Self {
            labels: self.labels[range.clone()].to_vec(),
            targets: (self.targets.iter())
                .map(|t| Target {
                    name: t.name.clone(),
                    values: t.values[range.clone()].to_vec(),
                })
                .collect(),
            dense: self.dense.slice(range),
            sparse: Sparse::Jagged(kjt),
        })
    }

    /// The rows of `parts`, in order, as one jagged batch. Parts must share their features.
    pub fn concat(parts: &[Self]) -> Result<Self, BatchError> {
        let Some(first) = parts.first() else {
            return Err(BatchError::Encoding("no minibatch to concatenate".into()));
        };
        let mut labels = Vec::new();
        let mut dense = DenseMatrix {
            names: first.dense.names.clone(),
            values: Vec::new(),
        };
        let mut targets: Vec<Target> = (first.targets.iter())
            .map(|t| Target {
                name: t.name.clone(),
                values: Vec::new(),
            })
            .collect();
        let mut kjt = Kjt::default();
        for part in parts {
            let part_kjt = part.to_kjt()?;
            let same_features = part.dense.names == dense.names
                && (targets.iter().map(|t| &t.name)).eq(part.targets.iter().map(|t| &t.name))
                && (kjt.features.is_empty()
                    || kjt
                        .features
                        .iter()
                        .map(|f| &f.name)
                        .eq(part_kjt.features.iter().map(|f| &f.name)));
            if !same_features {
                return Err(BatchError::Encoding(
                    "minibatches with different features or targets cannot be concatenated".into(),
                ));
            }
            labels.extend_from_slice(&part.labels);
            for (all, target) in targets.iter_mut().zip(&part.targets) {
                all.values.extend_from_slice(&target.values);
            }
            dense.values.extend_from_slice(&part.dense.values);
            kjt.extend(&part_kjt);
        }
        Ok(Self {
            labels,
            targets,
            dense,
            sparse: Sparse::Jagged(kjt),
        })
    }
}
