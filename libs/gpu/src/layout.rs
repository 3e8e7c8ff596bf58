//! What the kernels read, as plain host data: table shapes, the jagged (or inverse
//! jagged) bags of each feature, and optimizer parameters. Everything is validated here,
//! once, so that the CPU references and the kernels only ever see well-formed input.

use crate::GpuError;

/// One embedding table as the kernels see it: `rows` rows of `stride` floats whose first
/// `dim` floats are the embedding (the rest is optimizer state, as in the CPU arena).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableShape {
    /// Rows in the table.
    pub rows: u32,
    /// Weights per row.
    pub dim: u32,
    /// Floats per row: weights, then optimizer state.
    pub stride: u32,
}

impl TableShape {
    /// A table of bare embeddings (no optimizer state).
    pub fn dense(rows: u32, dim: u32) -> Self {
        Self {
            rows,
            dim,
            stride: dim,
        }
    }

    pub(crate) fn floats(&self) -> usize {
        self.rows as usize * self.stride as usize
    }
}

/// Sum or mean of a bag's rows. An empty bag pools to zeros either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// The rows' sum.
    Sum,
    /// The rows' mean.
    Mean,
}

/// How the backward pass accumulates repeated rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulation {
    /// Atomic adds: fastest; the order of additions, and so the last bits, vary.
    Atomic,
    /// One writer per row summing in a fixed order: the same bits on every run.
    Deterministic,
}

/// One sparse feature of a batch, its keys already resolved to row ids of `table`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureBags {
    /// Index into the batch's tables.
    pub table: usize,
    /// `bags + 1` entries into `rows`, starting at 0, never decreasing.
    pub offsets: Vec<u32>,
    /// Row ids in `table`; repeats are allowed.
    pub rows: Vec<u32>,
    /// Inverse keyed jagged tensor (RecD): sample `b` pools bag `inverse[b]`. Without it,
    /// bag `b` belongs to sample `b` and there is one bag per sample.
    pub inverse: Option<Vec<u32>>,
}

impl FeatureBags {
    /// Bags (samples, or unique rows with an inverse index).
    pub fn bags(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Sample `b`'s bag.
    pub fn bag_of(&self, sample: usize) -> usize {
        self.inverse
            .as_ref()
            .map_or(sample, |inverse| inverse[sample] as usize)
    }

    /// The row ids of bag `bag`.
    pub fn bag(&self, bag: usize) -> &[u32] {
        &self.rows[self.offsets[bag] as usize..self.offsets[bag + 1] as usize]
    }
}

/// The sparse input of one pooling call: `samples` samples, features in output order.
/// Feature `f` fills columns `column(f) .. column(f) + dim` of each sample's output row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolingInput {
    /// Samples in the minibatch.
    pub samples: usize,
    /// Each feature's bags, in output order.
    pub features: Vec<FeatureBags>,
}

impl PoolingInput {
    /// Checks every field against `tables`; the error names the feature and field.
    pub fn validate(&self, tables: &[TableShape]) -> Result<(), GpuError> {
        for (f, feature) in self.features.iter().enumerate() {
            validate_feature(f, feature, self.samples, tables)?;
        }
        let items = self.samples.saturating_mul(self.features.len());
        let values: usize = self.features.iter().map(|f| f.rows.len()).sum();
        let bags: usize = self.features.iter().map(FeatureBags::bags).sum();
        if items > u32::MAX as usize || values > u32::MAX as usize || bags >= u32::MAX as usize {
            return Err(GpuError::invalid(
                "input",
                format!(
                    "{items} samples x features, {bags} bags, {values} rows: over the u32 range"
                ),
            ));
        }
        Ok(())
    }

    /// Output floats per sample: the sum of the features' dims.
    pub fn out_width(&self, tables: &[TableShape]) -> usize {
        self.features
            .iter()
            .map(|f| tables[f.table].dim as usize)
            .sum()
    }

    /// First output column of each feature.
    pub fn columns(&self, tables: &[TableShape]) -> Vec<usize> {
        let mut next = 0;
        self.features
            .iter()
            .map(|f| {
                let column = next;
                next += tables[f.table].dim as usize;
                column
            })
            .collect()
    }

    /// Every pooled row's contributions (work item `feature * samples + sample`, one per
    /// bag entry) grouped by row, rows in ascending order (table, then row id), each
    /// group's items ascending: the order the deterministic backward sums them in, which
    /// is the reference's. A counting sort over the tables' rows, so linear in the
    /// entries; `self` must be valid for `tables`.
    pub fn contributions_by_row(&self, tables: &[TableShape]) -> RowContributions {
        let mut first_row = Vec::with_capacity(tables.len());
        let mut total_rows = 0usize;
        for table in tables {
            first_row.push(total_rows);
            total_rows += table.rows as usize;
        }
        let mut counts = vec![0u32; total_rows];
        self.for_each_entry(&first_row, |row, _| counts[row] += 1);
        let mut plan = RowContributions::default();
        // Where each used row's contributions start, and its place among the used rows.
        let mut next = vec![0u32; total_rows];
        let mut placed = 0u32;
        for (t, table) in tables.iter().enumerate() {
            for row in 0..table.rows as usize {
                let global = first_row[t] + row;
                if counts[global] == 0 {
                    continue;
                }
                plan.row_offsets.push(placed);
                plan.row_table.push(t as u32);
                plan.row_id.push(row as u32);
                next[global] = placed;
                placed += counts[global];
            }
        }
        plan.row_offsets.push(placed);
        plan.contrib_item = vec![0; placed as usize];
        self.for_each_entry(&first_row, |row, item| {
            plan.contrib_item[next[row] as usize] = item;
            next[row] += 1;
        });
        let used = plan.row_id.len();
        plan.row_feature = (plan.row_offsets[..used].iter())
            .map(|&start| plan.contrib_item[start as usize] / self.samples.max(1) as u32)
            .collect();
        plan
    }
}

impl PoolingInput {
    /// Calls `visit(first_row[table] + row, item)` for every bag entry, in item order
    /// (feature, then sample, then position in the bag).
    fn for_each_entry(&self, first_row: &[usize], mut visit: impl FnMut(usize, u32)) {
        for (f, feature) in self.features.iter().enumerate() {
            let base = first_row[feature.table];
            let first_item = f * self.samples;
            match feature.inverse {
                // Bag b is sample b's: the rows in order are the entries in order.
                None => {
                    for (b, bag) in feature.offsets.windows(2).enumerate() {
                        let item = (first_item + b) as u32;
                        for &row in &feature.rows[bag[0] as usize..bag[1] as usize] {
                            visit(base + row as usize, item);
                        }
                    }
                }
                Some(_) => {
                    for b in 0..self.samples {
                        let item = (first_item + b) as u32;
                        for &row in feature.bag(feature.bag_of(b)) {
                            visit(base + row as usize, item);
                        }
                    }
                }
            }
        }
    }
}

/// The contributions of [`PoolingInput::contributions_by_row`]: used row `r` (of table
/// `row_table[r]`, id `row_id[r]`) sums items `contrib_item[row_offsets[r] ..
/// row_offsets[r + 1]]`; `row_feature[r]` is the feature of its first item.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowContributions {
    /// The table of each used row.
    pub row_table: Vec<u32>,
    /// Its id in that table.
    pub row_id: Vec<u32>,
    /// The feature of its first contribution.
    pub row_feature: Vec<u32>,
    /// Used rows + 1 entries into `contrib_item`.
    pub row_offsets: Vec<u32>,
    /// Work items, grouped by row.
    pub contrib_item: Vec<u32>,
}

fn validate_feature(
    f: usize,
    feature: &FeatureBags,
    samples: usize,
    tables: &[TableShape],
) -> Result<(), GpuError> {
    let field = |name: &str| format!("features[{f}].{name}");
    let Some(table) = tables.get(feature.table) else {
        return Err(GpuError::invalid(
            field("table"),
            format!("table {} of {}", feature.table, tables.len()),
        ));
    };
    if table.dim == 0 || table.dim > table.stride {
        return Err(GpuError::invalid(
            format!("tables[{}]", feature.table),
            format!("dim {} must be 1..=stride {}", table.dim, table.stride),
        ));
    }
    let offsets = &feature.offsets;
    if offsets.first() != Some(&0) {
        return Err(GpuError::invalid(field("offsets"), "must start at 0"));
    }
    if let Some(at) = offsets.windows(2).position(|w| w[1] < w[0]) {
        return Err(GpuError::invalid(
            field("offsets"),
            format!("decreases at {}", at + 1),
        ));
    }
    if offsets.last().map(|&o| o as usize) != Some(feature.rows.len()) {
        return Err(GpuError::invalid(
            field("offsets"),
            format!("must end at rows.len() = {}", feature.rows.len()),
        ));
    }
    if let Some(at) = feature.rows.iter().position(|&r| r >= table.rows) {
        return Err(GpuError::invalid(
            field(&format!("rows[{at}]")),
            format!(
                "row {} of a table with {} rows",
                feature.rows[at], table.rows
            ),
        ));
    }
    match &feature.inverse {
        None if feature.bags() != samples => Err(GpuError::invalid(
            field("offsets"),
            format!("{} bags for {samples} samples", feature.bags()),
        )),
        Some(inverse) if inverse.len() != samples => Err(GpuError::invalid(
            field("inverse"),
            format!("{} entries for {samples} samples", inverse.len()),
        )),
        Some(inverse) => match inverse.iter().position(|&b| b as usize >= feature.bags()) {
            Some(at) => Err(GpuError::invalid(
                field(&format!("inverse[{at}]")),
                format!("bag {} of {}", inverse[at], feature.bags()),
            )),
            None => Ok(()),
        },
        None => Ok(()),
    }
}

/// Floats of optimizer state per row that each fused update keeps after the weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowOptimizer {
    /// State: `accumulator[dim]`.
    Adagrad {
        /// Step size.
        lr: f32,
        /// Added to the accumulator's square root.
        epsilon: f32,
    },
    /// State: `m[dim]`, `v[dim]`, `beta1^t`, `beta2^t`.
    Adam {
        /// Step size.
        lr: f32,
        /// Decay of the first moment.
        beta1: f32,
        /// Decay of the second moment.
        beta2: f32,
        /// Added to the second moment's square root.
        epsilon: f32,
    },
}

impl RowOptimizer {
    /// Floats of state per row of `dim` weights.
    pub fn state_len(&self, dim: u32) -> u32 {
        match self {
            Self::Adagrad { .. } => dim,
            Self::Adam { .. } => 2 * dim + 2,
        }
    }
}

/// Checks a sparse update: rows exist and are distinct, one gradient row per id, the
/// stride holds the optimizer's state, the table slice has the shape's size.
pub fn validate_update(
    shape: TableShape,
    optimizer: RowOptimizer,
    table_len: usize,
    ids: &[u32],
    grads: &[f32],
) -> Result<(), GpuError> {
    let needed = shape.dim as usize + optimizer.state_len(shape.dim) as usize;
    if (shape.stride as usize) < needed {
        return Err(GpuError::invalid(
            "table.stride",
            format!(
                "{} floats cannot hold {needed} (weights and state)",
                shape.stride
            ),
        ));
    }
    if table_len != shape.floats() {
        return Err(GpuError::invalid(
            "table",
            format!(
                "{table_len} floats for {} rows x {}",
                shape.rows, shape.stride
            ),
        ));
    }
    validate_grads(shape, ids.len(), grads)?;
    validate_ids(shape.rows, ids)
}

/// One gradient row (`dim` floats) for each of `ids` ids.
pub(crate) fn validate_grads(shape: TableShape, ids: usize, grads: &[f32]) -> Result<(), GpuError> {
    validate_per_id("grads", ids, grads.len(), ("dim", shape.dim))
}

/// `floats` must be `per_id.1` floats for each of `ids` ids.
fn validate_per_id(
    field: &str,
    ids: usize,
    floats: usize,
    (unit, per_id): (&str, u32),
) -> Result<(), GpuError> {
    if floats == ids * per_id as usize {
        return Ok(());
    }
    Err(GpuError::invalid(
        field,
        format!("{floats} floats for {ids} ids x {unit} {per_id}"),
    ))
}

/// Row ids of an update: each below `rows`, none twice. Costs O(n log n) in the ids, never
/// O(rows): a push of a few thousand ids into a table of millions stays cheap.
pub fn validate_ids(rows: u32, ids: &[u32]) -> Result<(), GpuError> {
    if let Some(at) = ids.iter().position(|&id| id >= rows) {
        return Err(GpuError::invalid(
            format!("ids[{at}]"),
            format!("row {} of {rows}", ids[at]),
        ));
    }
    let mut by_id: Vec<(u32, usize)> = ids.iter().copied().zip(0..).collect();
    by_id.sort_unstable();
    // The earliest position at which an id repeats one seen before it.
    let repeat = by_id
        .windows(2)
        .filter(|pair| pair[0].0 == pair[1].0)
        .map(|pair| pair[1].1)
        .min();
    match repeat {
        Some(at) => Err(GpuError::invalid(
            format!("ids[{at}]"),
            format!("row {} appears twice (sum its gradients first)", ids[at]),
        )),
        None => Ok(()),
    }
}

/// A read of the first `floats` floats of rows `ids` (repeats allowed).
pub fn validate_read(shape: TableShape, ids: &[u32], floats: u32) -> Result<(), GpuError> {
    if floats > shape.stride {
        return Err(GpuError::invalid(
            "floats",
            format!("{floats} per row, rows hold {}", shape.stride),
        ));
    }
    match ids.iter().position(|&id| id >= shape.rows) {
        Some(at) => Err(GpuError::invalid(
            format!("ids[{at}]"),
            format!("row {} of {}", ids[at], shape.rows),
        )),
        None => Ok(()),
    }
}

/// A write of whole rows: distinct ids, `stride` floats each.
pub fn validate_write(shape: TableShape, ids: &[u32], values: &[f32]) -> Result<(), GpuError> {
    validate_per_id("values", ids.len(), values.len(), ("stride", shape.stride))?;
    validate_ids(shape.rows, ids)
}

/// Offsets of each table's row 0 when tables are laid end to end, each start rounded up
/// to a multiple of 4 floats so that 16-byte loads stay aligned.
pub(crate) fn table_bases(floats_per_table: impl Iterator<Item = usize>) -> (Vec<u64>, usize) {
    let mut next = 0usize;
    let bases = floats_per_table
        .map(|floats| {
            let base = next;
            next = (next + floats).next_multiple_of(4);
            base as u64
        })
        .collect();
    (bases, next)
}
