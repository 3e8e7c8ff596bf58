//! RecD's inverse keyed jagged tensor (RecD §4.2): features that change together (a
//! user's sequence features within a session) form a dedup group; the group keeps only
//! its unique rows plus one inverse index mapping every batch row to its unique row.
//! Rows merge only when every feature of the group matches exactly: hashes find
//! candidates, values decide.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::BatchError;
use crate::hash::mix64;
use crate::kjt::{JaggedFeature, Kjt};

/// A dedup group: unique rows of its features and, per batch row, the unique row it equals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IkjtGroup {
    /// The group's name (the schema's `dedup_group`).
    pub name: String,
    /// Unique rows only; every feature has the same number of them.
    pub features: Vec<JaggedFeature>,
    /// One entry per batch row: its row in `features`.
    pub inverse: Vec<u32>,
}

impl IkjtGroup {
    /// Unique rows held.
    pub fn unique_rows(&self) -> usize {
        self.features.first().map_or(0, JaggedFeature::rows)
    }

    /// Batch rows per unique row (RecD's DedupeFactor for this group).
    pub fn dedupe_factor(&self) -> f64 {
        self.inverse.len() as f64 / self.unique_rows().max(1) as f64
    }
}

/// Sparse features with some of them deduplicated in groups.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ikjt {
    /// Rows in the batch.
    pub rows: usize,
    /// Features outside every group, one row per batch row.
    pub jagged: Vec<JaggedFeature>,
    /// The dedup groups.
    pub groups: Vec<IkjtGroup>,
    /// Feature names in the order of the KJT this came from.
    pub order: Vec<String>,
}

/// Named groups of feature indices into a [`Kjt`]'s features.
pub type DedupGroups = [(String, Vec<usize>)];

/// The hash that finds candidate duplicates; equality is always confirmed on values.
pub type RowHasher = fn(&[&[u64]]) -> u64;

/// Length-aware hash of one row of a group's features.
pub fn row_hash(row: &[&[u64]]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for values in row {
        h = mix64(h ^ values.len() as u64);
        for &v in *values {
            h = mix64(h ^ v);
        }
    }
    h
}

/// The row hash is already uniform; hashing it again is wasted work.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

const NO_NEXT: u32 = u32::MAX;

impl Ikjt {
    /// Groups `kjt`'s features as `groups` says (each feature in at most one group) and
    /// deduplicates each group's rows.
    pub fn from_kjt(kjt: &Kjt, groups: &DedupGroups) -> Result<Self, BatchError> {
        Self::from_kjt_with_hasher(kjt, groups, row_hash)
    }

    /// As [`Ikjt::from_kjt`] with the candidate hash given (tests force collisions).
    pub fn from_kjt_with_hasher(
        kjt: &Kjt,
        groups: &DedupGroups,
        hasher: RowHasher,
    ) -> Result<Self, BatchError> {
        let mut owner = vec![None; kjt.features.len()];
        for (g, (name, members)) in groups.iter().enumerate() {
            if members.is_empty() {
                return Err(BatchError::Groups(format!(
                    "group `{name}` has no features"
                )));
            }
            for &f in members {
                match owner.get_mut(f) {
                    None => {
                        return Err(BatchError::Groups(format!(
                            "group `{name}` names feature {f}; the batch has {}",
                            kjt.features.len()
                        )));
                    }
                    Some(Some(_)) => {
                        return Err(BatchError::Groups(format!(
                            "feature `{}` is in two groups",
                            kjt.features[f].name
                        )));
                    }
                    Some(slot) => *slot = Some(g),
                }
            }
        }
        let jagged = kjt
            .features
            .iter()
            .zip(&owner)
            .filter(|(_, o)| o.is_none())
            .map(|(f, _)| f.clone())
            .collect();
        let groups = groups
            .iter()
            .map(|(name, members)| {
                let features: Vec<&JaggedFeature> =
                    members.iter().map(|&f| &kjt.features[f]).collect();
                dedup_group(name, &features, kjt.rows, hasher)
            })
            .collect();
        Ok(Self {
            rows: kjt.rows,
            jagged,
            groups,
            order: kjt.features.iter().map(|f| f.name.clone()).collect(),
        })
    }

    /// The batch this was built from, row for row.
    pub fn to_kjt(&self) -> Result<Kjt, BatchError> {
        let features = self
            .order
            .iter()
            .map(|name| self.expand(name))
            .collect::<Result<_, _>>()?;
        Ok(Kjt {
            rows: self.rows,
            features,
        })
    }

    fn expand(&self, name: &str) -> Result<JaggedFeature, BatchError> {
        if let Some(f) = self.jagged.iter().find(|f| f.name == name) {
            return Ok(f.clone());
        }
        for group in &self.groups {
            if let Some(unique) = group.features.iter().find(|f| f.name == name) {
                let mut out = JaggedFeature::with_capacity(name, self.rows, self.rows);
                for &u in &group.inverse {
                    let u = u as usize;
                    if u >= unique.rows() {
                        return Err(BatchError::Encoding(format!(
                            "group `{}` inverse index {u} is past its {} unique rows",
                            group.name,
                            unique.rows()
                        )));
                    }
                    out.push_row(unique.row(u));
                }
                return Ok(out);
            }
        }
        Err(BatchError::Encoding(format!(
            "feature `{name}` is in the order but in no group"
        )))
    }

    /// Keys held (unique rows only for grouped features).
    pub fn values(&self) -> usize {
        let jagged: usize = self.jagged.iter().map(|f| f.values.len()).sum();
        let grouped: usize = self
            .groups
            .iter()
            .flat_map(|g| g.features.iter().map(|f| f.values.len()))
            .sum();
        jagged + grouped
    }
}

fn dedup_group(
    name: &str,
    features: &[&JaggedFeature],
    rows: usize,
    hasher: RowHasher,
) -> IkjtGroup {
    let mut unique: Vec<JaggedFeature> = features
        .iter()
        .map(|f| JaggedFeature::with_capacity(f.name.clone(), rows, f.values.len()))
        .collect();
    // First unique row per hash, then a chain through rows sharing that hash.
    let mut first: HashMap<u64, u32, BuildHasherDefault<PassThrough>> =
        HashMap::with_capacity_and_hasher(rows, Default::default());
    let mut next_same_hash: Vec<u32> = Vec::new();
    let mut inverse = Vec::with_capacity(rows);
    let mut row: Vec<&[u64]> = Vec::with_capacity(features.len());
    for r in 0..rows {
        row.clear();
        row.extend(features.iter().map(|f| f.row(r)));
        // Clustered data repeats the row before (a session's next sample): no hash needed.
        if let Some(&last) = inverse.last()
            && (unique.iter().zip(&row)).all(|(f, values)| f.row(last as usize) == *values)
        {
            inverse.push(last);
            continue;
        }
        let h = hasher(&row);
        let found = match first.get(&h) {
            None => None,
            Some(&head) => {
                let mut candidate = head;
                loop {
                    let c = candidate as usize;
                    if unique
                        .iter()
                        .zip(&row)
                        .all(|(f, values)| f.row(c) == *values)
                    {
                        break Some(candidate);
                    }
                    let next = next_same_hash[c];
                    if next == NO_NEXT {
                        // Prepend the new row to this hash's chain.
                        break None;
                    }
                    candidate = next;
                }
            }
        };
        let index = match found {
            Some(index) => index,
            None => {
                let index = next_same_hash.len() as u32;
                next_same_hash.push(first.insert(h, index).unwrap_or(NO_NEXT));
                for (f, values) in unique.iter_mut().zip(&row) {
                    f.push_row(values);
                }
                index
            }
        };
        inverse.push(index);
    }
    IkjtGroup {
        name: name.to_owned(),
        features: unique,
        inverse,
    }
}
