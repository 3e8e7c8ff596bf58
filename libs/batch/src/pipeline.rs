//! Rows (an Arrow record batch read from Parquet or a stream) to a [`Minibatch`], as the
//! Dataset's feature schema says.

use std::sync::LazyLock;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int64Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_cast::cast;
use arrow_schema::DataType;
use primus_spec::dataset::{DenseFeature, DenseTransform, FeatureSchema};

use crate::BatchError;
use crate::hash::{feature_seed, int_key, str_key};
use crate::kjt::{JaggedFeature, Kjt};
use crate::minibatch::{DenseMatrix, Minibatch, Sparse, Target};

struct SparseColumn {
    name: String,
    seed: u64,
    multi_hot: bool,
}

/// Turns record batches into minibatches. Built once per Dataset schema.
pub struct FeaturePipeline {
    label: String,
    targets: Vec<String>,
    dense: Vec<DenseFeature>,
    sparse: Vec<SparseColumn>,
    groups: Vec<(String, Vec<usize>)>,
}

/// A column's ids, whatever integer or string type they came in.
enum Ids {
    Unsigned(ArrayRef),
    Signed(ArrayRef),
    Text(ArrayRef),
}

impl Ids {
    fn of(column: &str, array: &ArrayRef) -> Result<Self, BatchError> {
        let kind = |array: &ArrayRef| match array.data_type() {
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
                Some(DataType::UInt64)
            }
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                Some(DataType::Int64)
            }
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(DataType::Utf8),
            _ => None,
        };
        let unpacked = match array.data_type() {
            DataType::Dictionary(_, value) => cast(array, value)?,
            _ => array.clone(),
        };
        let Some(target) = kind(&unpacked) else {
            return Err(BatchError::ColumnType {
                column: column.to_owned(),
                found: array.data_type().to_string(),
                expected: "integer or string ids",
            });
        };
        let normalised = if unpacked.data_type() == &target {
            unpacked
        } else {
            cast(&unpacked, &target)?
        };
        Ok(match target {
            DataType::UInt64 => Self::Unsigned(normalised),
            DataType::Int64 => Self::Signed(normalised),
            _ => Self::Text(normalised),
        })
    }

    /// Appends the keys of elements `range` (nulls skipped) to `out`.
    fn push_keys(&self, seed: u64, range: std::ops::Range<usize>, out: &mut Vec<u64>) {
        match self {
            Self::Unsigned(a) => push_ints(a.as_primitive::<UInt64Type>(), seed, range, out, |v| v),
            Self::Signed(a) => push_ints(a.as_primitive::<Int64Type>(), seed, range, out, |v| {
                v as u64
            }),
            Self::Text(a) => push_strings(a.as_string::<i32>(), seed, range, out),
        }
    }
}

fn push_ints<T: arrow_array::ArrowPrimitiveType>(
    array: &arrow_array::PrimitiveArray<T>,
    seed: u64,
    range: std::ops::Range<usize>,
    out: &mut Vec<u64>,
    to_u64: impl Fn(T::Native) -> u64,
) {
    let values = &array.values()[range.clone()];
    match array.nulls() {
        None => out.extend(values.iter().map(|&v| int_key(seed, to_u64(v)))),
        Some(nulls) => out.extend(
            range
                .zip(values)
                .filter(|(i, _)| nulls.is_valid(*i))
                .map(|(_, &v)| int_key(seed, to_u64(v))),
        ),
    }
}

fn push_strings(array: &StringArray, seed: u64, range: std::ops::Range<usize>, out: &mut Vec<u64>) {
    out.extend(
        range
            .filter(|&i| array.is_valid(i))
            .map(|i| str_key(seed, array.value(i))),
    );
}

impl FeaturePipeline {
    /// The pipeline of `schema`.
    pub fn new(schema: &FeatureSchema) -> Self {
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, feature) in schema.sparse.iter().enumerate() {
            if let Some(group) = &feature.dedup_group {
                match groups.iter_mut().find(|(name, _)| name == group) {
                    Some((_, members)) => members.push(i),
                    None => groups.push((group.clone(), vec![i])),
                }
            }
        }
        Self {
            label: schema.label.clone(),
            targets: schema.targets.clone(),
            dense: schema.dense.clone(),
            sparse: schema
                .sparse
                .iter()
                .map(|f| SparseColumn {
                    name: f.name.clone(),
                    seed: feature_seed(f.key_feature()),
                    multi_hot: f.multi_hot,
                })
                .collect(),
            groups,
        }
    }

    /// The columns a reader must project: label, targets, dense, then sparse.
    pub fn columns(&self) -> Vec<String> {
        std::iter::once(self.label.clone())
            .chain(self.targets.iter().cloned())
            .chain(self.dense.iter().map(|d| d.name.clone()))
            .chain(self.sparse.iter().map(|s| s.name.clone()))
            .collect()
    }

    /// RecD dedup groups (feature indices into the minibatch's sparse features).
    pub fn groups(&self) -> &[(String, Vec<usize>)] {
        &self.groups
    }

    /// The batch's rows as a jagged minibatch.
    pub fn minibatch(&self, batch: &RecordBatch) -> Result<Minibatch, BatchError> {
        let labels = self.labels(batch)?;
        let targets = (self.targets.iter())
            .map(|name| target(batch, name))
            .collect::<Result<_, _>>()?;
        let dense = self.dense(batch)?;
        let features = self
            .sparse
            .iter()
            .map(|column| sparse_feature(batch, column))
            .collect::<Result<_, _>>()?;
        Ok(Minibatch {
            labels,
            targets,
            dense,
            sparse: Sparse::Jagged(Kjt {
                rows: batch.num_rows(),
                features,
            }),
        })
    }

    fn labels(&self, batch: &RecordBatch) -> Result<Vec<f32>, BatchError> {
        let column = column(batch, &self.label)?;
        let floats = numeric(&self.label, column, &DataType::Float32)?;
        let floats = floats.as_primitive::<Float32Type>();
        for (row, value) in floats.iter().enumerate() {
            let message = match value {
                None => "the label is null",
                Some(v) if !(0.0..=1.0).contains(&v) => "the label is not in [0, 1]",
                Some(_) => continue,
            };
            return Err(BatchError::BadValue {
                column: self.label.clone(),
                row,
                message: message.into(),
            });
        }
        Ok(floats.values().to_vec())
    }

    fn dense(&self, batch: &RecordBatch) -> Result<DenseMatrix, BatchError> {
        let rows = batch.num_rows();
        let cols = self.dense.len();
        let mut values = vec![0f32; rows * cols];
        for (j, feature) in self.dense.iter().enumerate() {
            let raw = numeric(
                &feature.name,
                column(batch, &feature.name)?,
                &DataType::Float64,
            )?;
            let raw = raw.as_primitive::<Float64Type>();
            for (row, value) in raw.iter().enumerate() {
                let x = transform(&feature.transform, value.unwrap_or(feature.missing));
                if !x.is_finite() {
                    return Err(BatchError::BadValue {
                        column: feature.name.clone(),
                        row,
                        message: format!("{value:?} is not a finite number after the transform"),
                    });
                }
                values[row * cols + j] = x as f32;
            }
        }
        Ok(DenseMatrix {
            names: self.dense.iter().map(|d| d.name.clone()).collect(),
            values,
        })
    }
}

/// Column `name`'s values as a target: numbers, none null or infinite.
fn target(batch: &RecordBatch, name: &str) -> Result<Target, BatchError> {
    let floats = numeric(name, column(batch, name)?, &DataType::Float32)?;
    let floats = floats.as_primitive::<Float32Type>();
    for (row, value) in floats.iter().enumerate() {
        let message = match value {
            None => "the target is null",
            Some(v) if !v.is_finite() => "the target is not a finite number",
            Some(_) => continue,
        };
        return Err(BatchError::BadValue {
            column: name.to_owned(),
            row,
            message: message.into(),
        });
    }
    Ok(Target {
        name: name.to_owned(),
        values: floats.values().to_vec(),
    })
}

fn transform(transform: &DenseTransform, x: f64) -> f64 {
    match *transform {
        DenseTransform::None => x,
        DenseTransform::Log1p => log1p(x.max(0.0)),
        DenseTransform::Standardize { mean, std } => (x - mean) / std,
        DenseTransform::Clip { min, max } => x.clamp(min, max),
    }
}

/// Integers below this have their `ln_1p` in [`LOG1P_OF_SMALL_INTEGERS`].
const LOG1P_TABLE_LEN: usize = 4096;

/// `ln_1p(i)` for every integer `i` below [`LOG1P_TABLE_LEN`]. Dense features are mostly
/// small counts (Criteo's are), and `ln_1p` was the largest part of the pipeline's own work.
static LOG1P_OF_SMALL_INTEGERS: LazyLock<Vec<f64>> =
    LazyLock::new(|| (0..LOG1P_TABLE_LEN).map(|i| (i as f64).ln_1p()).collect());

/// `x.ln_1p()`, bit for bit, looked up where `x` is a small non-negative integer.
fn log1p(x: f64) -> f64 {
    if x.is_sign_positive() && x < LOG1P_TABLE_LEN as f64 && x == x.trunc() {
        // In range and integral, so the cast is exact.
        LOG1P_OF_SMALL_INTEGERS[x as usize]
    } else {
        x.ln_1p()
    }
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef, BatchError> {
    batch
        .column_by_name(name)
        .ok_or_else(|| BatchError::MissingColumn {
            column: name.to_owned(),
            available: batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

fn numeric(name: &str, array: &ArrayRef, to: &DataType) -> Result<ArrayRef, BatchError> {
    let from = array.data_type();
    if !(from.is_numeric() || from == &DataType::Boolean) {
        return Err(BatchError::ColumnType {
            column: name.to_owned(),
            found: from.to_string(),
            expected: "a number",
        });
    }
    if from == to {
        return Ok(array.clone());
    }
    Ok(cast(array, to)?)
}

fn sparse_feature(
    batch: &RecordBatch,
    column_spec: &SparseColumn,
) -> Result<JaggedFeature, BatchError> {
    let name = &column_spec.name;
    let array = column(batch, name)?;
    let rows = batch.num_rows();
    let mut feature = JaggedFeature::with_capacity(name.clone(), rows, rows);
    let (list_offsets, list_nulls, inner): (Vec<usize>, _, ArrayRef) = match array.data_type() {
        DataType::List(_) if column_spec.multi_hot => {
            let list = array.as_list::<i32>();
            let offsets = list.value_offsets().iter().map(|&o| o as usize).collect();
            (offsets, list.nulls().cloned(), list.values().clone())
        }
        DataType::LargeList(_) if column_spec.multi_hot => {
            let list = array.as_list::<i64>();
            let offsets = list.value_offsets().iter().map(|&o| o as usize).collect();
            (offsets, list.nulls().cloned(), list.values().clone())
        }
        DataType::List(_) | DataType::LargeList(_) => {
            return Err(BatchError::ColumnType {
                column: name.clone(),
                found: array.data_type().to_string(),
                expected: "one id per row (set multi_hot: true for lists)",
            });
        }
        _ if column_spec.multi_hot => {
            return Err(BatchError::ColumnType {
                column: name.clone(),
                found: array.data_type().to_string(),
                expected: "a list of ids (multi_hot: true)",
            });
        }
        _ => {
            let ids = Ids::of(name, array)?;
            if array.null_count() == 0 {
                // One key per row: hash the column in one pass, offsets are 0..=rows.
                ids.push_keys(column_spec.seed, 0..rows, &mut feature.values);
                feature.offsets.extend(1..=rows as u32);
            } else {
                for row in 0..rows {
                    ids.push_keys(column_spec.seed, row..row + 1, &mut feature.values);
                    feature.close_row();
                }
            }
            return Ok(feature);
        }
    };
    let ids = Ids::of(name, &inner)?;
    for row in 0..rows {
        if list_nulls.as_ref().is_none_or(|n| n.is_valid(row)) {
            ids.push_keys(
                column_spec.seed,
                list_offsets[row]..list_offsets[row + 1],
                &mut feature.values,
            );
        }
        feature.close_row();
    }
    Ok(feature)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log1p_is_ln_1p_bit_for_bit() {
        let integers = (0..LOG1P_TABLE_LEN as u32 + 10).map(f64::from);
        let others = [
            -0.0,
            0.5,
            1e-300,
            4095.5,
            4096.0,
            1e12,
            f64::MAX,
            f64::INFINITY,
            f64::MIN_POSITIVE,
        ];
        for x in integers.chain(others) {
            assert_eq!(log1p(x).to_bits(), x.ln_1p().to_bits(), "log1p({x:e})");
        }
        assert!(log1p(f64::NAN).is_nan());
    }
}
