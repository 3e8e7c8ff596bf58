//! Jagged sparse features (TorchRec's KeyedJaggedTensor, one entry per feature): for
//! each feature, the keys of every row concatenated, and row offsets into them.

use std::ops::Range;

/// One sparse feature over a batch: row `i` holds `values[offsets[i]..offsets[i + 1]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JaggedFeature {
    /// The feature's name.
    pub name: String,
    /// `rows + 1` entries, starting at 0, never decreasing.
    pub offsets: Vec<u32>,
    /// Every row's keys, end to end.
    pub values: Vec<u64>,
}

impl JaggedFeature {
    /// An empty feature.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            offsets: vec![0],
            values: Vec::new(),
        }
    }

    /// An empty feature with room for `rows` rows and `values` keys.
    pub fn with_capacity(name: impl Into<String>, rows: usize, values: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Self {
            name: name.into(),
            offsets,
            values: Vec::with_capacity(values),
        }
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Row `i`'s keys.
    pub fn row(&self, i: usize) -> &[u64] {
        &self.values[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Appends a row.
    pub fn push_row(&mut self, keys: &[u64]) {
        self.values.extend_from_slice(keys);
        self.close_row();
    }

    /// Ends the current row after keys were appended to `values` directly.
    #[inline]
    pub fn close_row(&mut self) {
        // Offsets are u32 like TorchRec's: a minibatch never holds 4G keys of one feature.
        self.offsets.push(self.values.len() as u32);
    }

    /// Rows `range` as a feature of their own.
    pub fn slice(&self, range: Range<usize>) -> Self {
        let start = self.offsets[range.start];
        let end = self.offsets[range.end];
        Self {
            name: self.name.clone(),
            offsets: self.offsets[range.start..=range.end]
                .iter()
                .map(|o| o - start)
                .collect(),
            values: self.values[start as usize..end as usize].to_vec(),
        }
    }

    /// Appends every row of `other`.
    pub fn extend(&mut self, other: &Self) {
        let base = self.values.len() as u32;
        self.values.extend_from_slice(&other.values);
        self.offsets
            .extend(other.offsets[1..].iter().map(|o| o + base));
    }
}

/// Sparse features of one batch, every feature with the same number of rows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Kjt {
    /// Rows in the batch.
    pub rows: usize,
    /// The features, in the schema's order.
    pub features: Vec<JaggedFeature>,
}

impl Kjt {
    /// The feature called `name`.
    pub fn feature(&self, name: &str) -> Option<&JaggedFeature> {
        self.features.iter().find(|f| f.name == name)
    }

    /// The rows in `range`, as a batch of their own.
    pub fn slice(&self, range: Range<usize>) -> Self {
        Self {
            rows: range.len(),
            features: self
                .features
                .iter()
                .map(|f| f.slice(range.clone()))
                .collect(),
        }
    }

    /// Appends `other`'s rows; both must have the same features in the same order.
    pub fn extend(&mut self, other: &Self) {
        if self.features.is_empty() && self.rows == 0 {
            self.features = other
                .features
                .iter()
                .map(|f| JaggedFeature::new(f.name.clone()))
                .collect();
        }
        for (mine, theirs) in self.features.iter_mut().zip(&other.features) {
            mine.extend(theirs);
        }
        self.rows += other.rows;
    }

    /// Total keys over all features and rows.
    pub fn values(&self) -> usize {
        self.features.iter().map(|f| f.values.len()).sum()
    }
}
