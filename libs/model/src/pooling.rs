//! Between the minibatch and the dense network: the unique keys a minibatch needs from
//! each table (each looked up and pushed once), pooling of a feature's looked-up rows (their
//! sum or mean, as its table says) into its slot of the sample's embedding row (a sequence
//! feature's position: its one id's row, or zeros), and the
//! backward pass of pooling, which adds each pooled gradient (a mean's share of it) onto
//! the unique key it came from. Pooling and its backward are
//! primus-gpu's kernels over the batch's unique rows, run by the caller's
//! [`EmbeddingKernels`]: the CPU references, or the CUDA kernels.

use std::collections::HashMap;

use primus_batch::hash::KeyMap;
use primus_batch::{Ikjt, JaggedFeature, Kjt, Sparse};
use primus_gpu::{Accumulation, FeatureBags, GpuError, Pooling, PoolingInput, TableShape};
pub use primus_gpu::{CpuKernels, EmbeddingKernels};

use primus_spec::job::TablePooling;

use crate::ModelError;
use crate::layout::{ModelLayout, SequencePosition};

/// A minibatch's sparse features, resolved to unique keys per table.
#[derive(Debug, Clone)]
pub struct BatchKeys {
    /// Per layout table: its unique keys, in first-seen order.
    pub tables: Vec<Vec<u64>>,
    samples: usize,
    /// Per layout feature: its table.
    feature_tables: Vec<usize>,
    /// The features pooled once per sample, then each dedup group's features, pooled once
    /// per unique row of the group (RecD) and expanded to its samples by the inverse
    /// index where the embedding row mixes them with the others.
    parts: Vec<Part>,
}

/// Features pooled together: pooled the same way, per sample or per unique row of one
/// dedup group.
#[derive(Debug, Clone)]
struct Part {
    /// Their bags, keys replaced by positions among the table's unique keys; one bag per
    /// sample, or per unique row of the group.
    input: PoolingInput,
    /// Each one's index among the layout's features.
    features: Vec<usize>,
    /// A dedup group's: each sample's unique row.
    inverse: Option<Vec<u32>>,
    /// Their tables' pooling.
    pooling: Pooling,
}

impl Part {
    fn new(samples: usize, inverse: Option<Vec<u32>>, pooling: Pooling) -> Self {
        Self {
            input: PoolingInput {
                samples,
                features: Vec::new(),
            },
            features: Vec::new(),
            inverse,
            pooling,
        }
    }

    /// The bag sample `b` pools.
    fn row_of(&self, sample: usize) -> usize {
        self.inverse.as_ref().map_or(sample, |i| i[sample] as usize)
    }
}

/// A feature of a minibatch as pooling reads it: one row per sample, or (RecD's IKJT) one
/// row per unique row of dedup group `g`, with each sample's row in its inverse index.
type FeatureRows<'a> = (&'a JaggedFeature, Option<(usize, &'a [u32])>);

/// One position of a sequence feature as bags: per row, the key at `position` of its
/// list's kept ids, or an empty bag.
fn position_bags(feature: &JaggedFeature, position: SequencePosition) -> (Vec<u32>, Vec<u64>) {
    let mut offsets = Vec::with_capacity(feature.offsets.len());
    let mut keys = Vec::new();
    offsets.push(0);
    for bounds in feature.offsets.windows(2) {
        let list = &feature.values[bounds[0] as usize..bounds[1] as usize];
        if let Some(at) = position.in_list(list.len()) {
            keys.push(list[at]);
        }
        offsets.push(keys.len() as u32);
    }
    (offsets, keys)
}

impl BatchKeys {
    /// Every feature of `layout` must be in `kjt` with one row per sample.
    pub fn collect(layout: &ModelLayout, kjt: &Kjt) -> Result<Self, ModelError> {
        Self::resolve(layout, kjt.rows, |name| {
            kjt.feature(name).map(|feature| (feature, None))
        })
    }

    /// Every feature of `layout` must be in `ikjt`: a grouped feature's keys are resolved
    /// and pooled once per unique row of its group; the pooled rows are expanded to the
    /// samples, and their gradients summed back onto the unique rows, by the group's
    /// inverse index. The unique keys are those of the same rows as a KJT, the pooled
    /// rows equal bit for bit, the gradients within float rounding.
    pub fn collect_grouped(layout: &ModelLayout, ikjt: &Ikjt) -> Result<Self, ModelError> {
        Self::resolve(layout, ikjt.rows, |name| {
            let jagged = ikjt.jagged.iter().find(|f| f.name == name);
            jagged.map(|feature| (feature, None)).or_else(|| {
                ikjt.groups.iter().enumerate().find_map(|(g, group)| {
                    let feature = group.features.iter().find(|f| f.name == name)?;
                    Some((feature, Some((g, group.inverse.as_slice()))))
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
        let mut maps: Vec<KeyMap<u32>> = vec![KeyMap::default(); layout.tables.len()];
        let mut tables: Vec<Vec<u64>> = vec![Vec::new(); layout.tables.len()];
        let mut parts: Vec<Part> = Vec::new();
        // (dedup group, pooling) -> its part.
        let mut part_of: HashMap<(Option<usize>, Pooling), usize> = HashMap::new();
        for (index, slot) in layout.features.iter().enumerate() {
            let (feature, group) =
                feature_rows(&slot.name).ok_or_else(|| ModelError::Mismatch {
                    feature: slot.name.clone(),
                    message: "missing from the minibatch".into(),
                })?;
            let mismatch = |message: String| ModelError::Mismatch {
                feature: slot.name.clone(),
                message,
            };
            let pooling = match layout.tables[slot.table].pooling {
                TablePooling::Sum => Pooling::Sum,
                TablePooling::Mean => Pooling::Mean,
            };
            let (bags, inverse) = match group {
                None if feature.rows() != samples => {
                    return Err(mismatch(format!(
                        "{} rows in a minibatch of {samples}",
                        feature.rows()
                    )));
                }
                None => (samples, None),
                Some((_, inverse)) if inverse.len() != samples => {
                    return Err(mismatch(format!(
                        "an inverse index of {} rows in a minibatch of {samples}",
                        inverse.len()
                    )));
                }
                Some((_, inverse)) => (feature.rows(), Some(inverse)),
            };
            let key = (group.map(|(g, _)| g), pooling);
            let part = *part_of.entry(key).or_insert_with(|| {
                parts.push(Part::new(bags, inverse.map(<[u32]>::to_vec), pooling));
                parts.len() - 1
            });
            let part = &mut parts[part];
            if feature.rows() != part.input.samples {
                return Err(mismatch(format!(
                    "{} rows where its group has {}",
                    feature.rows(),
                    part.input.samples
                )));
            }
            let (map, keys) = (&mut maps[slot.table], &mut tables[slot.table]);
            let mut row_of = |key: u64| {
                *map.entry(key).or_insert_with(|| {
                    keys.push(key);
                    (keys.len() - 1) as u32
                })
            };
            let (offsets, rows) = match slot.position {
                None => (
                    feature.offsets.clone(),
                    feature.values.iter().map(|key| row_of(*key)).collect(),
                ),
                Some(position) => {
                    let (offsets, keys) = position_bags(feature, position);
                    (offsets, keys.into_iter().map(row_of).collect())
                }
            };
            part.input.features.push(FeatureBags {
                table: slot.table,
                offsets,
                rows,
                inverse: None,
            });
            part.features.push(index);
        }
        if let Some(part) = parts.iter().find(|p| {
            p.inverse
                .as_ref()
                .is_some_and(|i| i.iter().any(|&u| u as usize >= p.input.samples))
        }) {
            let feature = &layout.features[part.features[0]].name;
            return Err(ModelError::Mismatch {
                feature: feature.clone(),
                message: format!(
                    "its group's inverse index names a row past its {} unique rows",
                    part.input.samples
                ),
            });
        }
        Ok(Self {
            tables,
            samples,
            feature_tables: layout.features.iter().map(|f| f.table).collect(),
            parts,
        })
    }

    /// Samples.
    pub fn rows(&self) -> usize {
        self.samples
    }

    /// How often the minibatch pools each unique key: per table, one count per key of
    /// `tables[t]`, in that order.
    pub fn access_counts(&self) -> Vec<Vec<u64>> {
        let mut counts: Vec<Vec<u64>> = self.tables.iter().map(|k| vec![0; k.len()]).collect();
        for part in &self.parts {
            // How many samples pool each bag: one each, or as the inverse index says.
            let mut pooled_by = vec![1_u64; part.input.samples];
            if let Some(inverse) = &part.inverse {
                pooled_by.fill(0);
                for &row in inverse {
                    pooled_by[row as usize] += 1;
                }
            }
            for feature in &part.input.features {
                for (bag, &samples) in pooled_by.iter().enumerate() {
                    let (start, end) = (feature.offsets[bag], feature.offsets[bag + 1]);
                    for &row in &feature.rows[start as usize..end as usize] {
                        counts[feature.table][row as usize] += samples;
                    }
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

    pub(crate) fn embedding_shapes(&self, layout: &ModelLayout) -> Vec<TableShape> {
        self.shapes(layout.tables.iter().map(|t| t.dim))
    }

    pub(crate) fn wide_shapes(&self) -> Vec<TableShape> {
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
        self.pooled(kernels, &self.embedding_shapes(layout), &weights)
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
        self.pooled(kernels, &self.wide_shapes(), &weights)
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
        self.scattered(kernels, &self.embedding_shapes(layout), embedded_grad)
            .map_err(|e| ModelError::Inputs(format!("embedding gradient: {e}")))
    }

    /// Backward of [`pool_wide`](Self::pool_wide).
    pub fn scatter_wide(
        &self,
        kernels: &dyn EmbeddingKernels,
        wide_grad: &[f32],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.scattered(kernels, &self.wide_shapes(), wide_grad)
            .map_err(|e| ModelError::Inputs(format!("wide gradient: {e}")))
    }

    /// The one part, and its pooling, when every feature is pooled per sample and the
    /// same way, in layout order.
    pub(crate) fn per_sample_only(&self) -> Option<(&PoolingInput, Pooling)> {
        match self.parts.as_slice() {
            [part] if part.inverse.is_none() => Some((&part.input, part.pooling)),
            _ => None,
        }
    }

    /// First column of each layout feature in a sample's row, and the row's width.
    fn columns(&self, shapes: &[TableShape]) -> (Vec<usize>, usize) {
        let mut width = 0;
        let columns = (self.feature_tables.iter())
            .map(|&t| {
                width += shapes[t].dim as usize;
                width - shapes[t].dim as usize
            })
            .collect();
        (columns, width)
    }

    /// Each part pooled on its own bags, then copied into the samples' rows.
    fn pooled(
        &self,
        kernels: &dyn EmbeddingKernels,
        shapes: &[TableShape],
        weights: &[&[f32]],
    ) -> Result<Vec<f32>, GpuError> {
        if let Some((input, pooling)) = self.per_sample_only() {
            return kernels.gather_pool(shapes, weights, input, pooling);
        }
        let (columns, width) = self.columns(shapes);
        let mut out = vec![0.0; self.samples * width];
        for part in self.parts.iter().filter(|p| !p.features.is_empty()) {
            let pooled = kernels.gather_pool(shapes, weights, &part.input, part.pooling)?;
            let (part_width, part_columns) =
                (part.input.out_width(shapes), part.input.columns(shapes));
            for sample in 0..self.samples {
                let from = &pooled[part.row_of(sample) * part_width..][..part_width];
                let to = &mut out[sample * width..][..width];
                for (k, &feature) in part.features.iter().enumerate() {
                    let dim = shapes[self.feature_tables[feature]].dim as usize;
                    to[columns[feature]..][..dim].copy_from_slice(&from[part_columns[k]..][..dim]);
                }
            }
        }
        Ok(out)
    }

    /// Each part's gradient rows (a group's summed over the samples of each unique row,
    /// in sample order) scattered onto its keys; the parts' table gradients added.
    fn scattered(
        &self,
        kernels: &dyn EmbeddingKernels,
        shapes: &[TableShape],
        grad_out: &[f32],
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        if let Some((input, pooling)) = self.per_sample_only() {
            return kernels.pool_backward(
                shapes,
                input,
                pooling,
                grad_out,
                Accumulation::Deterministic,
            );
        }
        let (columns, width) = self.columns(shapes);
        if grad_out.len() != self.samples * width {
            return Err(GpuError::Invalid {
                field: "grad_out".into(),
                reason: format!(
                    "{} floats for {} samples of {width}",
                    grad_out.len(),
                    self.samples
                ),
            });
        }
        let mut grads: Vec<Vec<f32>> = (shapes.iter())
            .map(|t| vec![0.0; t.rows as usize * t.dim as usize])
            .collect();
        for part in self.parts.iter().filter(|p| !p.features.is_empty()) {
            let (part_width, part_columns) =
                (part.input.out_width(shapes), part.input.columns(shapes));
            let mut part_grad = vec![0.0; part.input.samples * part_width];
            for sample in 0..self.samples {
                let from = &grad_out[sample * width..][..width];
                let to = &mut part_grad[part.row_of(sample) * part_width..][..part_width];
                for (k, &feature) in part.features.iter().enumerate() {
                    let dim = shapes[self.feature_tables[feature]].dim as usize;
                    let (to, from) = (
                        &mut to[part_columns[k]..][..dim],
                        &from[columns[feature]..][..dim],
                    );
                    to.iter_mut().zip(from).for_each(|(t, f)| *t += f);
                }
            }
            let part_grads = kernels.pool_backward(
                shapes,
                &part.input,
                part.pooling,
                &part_grad,
                Accumulation::Deterministic,
            )?;
            for (total, part) in grads.iter_mut().zip(part_grads) {
                total.iter_mut().zip(part).for_each(|(t, p)| *t += p);
            }
        }
        Ok(grads)
    }
}
