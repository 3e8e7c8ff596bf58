//! Predict's raw samples to the Arrow columns the training pipeline reads, so serving runs
//! exactly the training feature transforms (`primus_batch::FeaturePipeline`). A feature left
//! out of a sample, or sent without a value, is a null, as a null cell of a training file:
//! the pipeline gives a dense feature its `missing:` value and a sparse one no id.

use std::sync::Arc;

use arrow_array::builder::Int64Builder;
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, Float32Array, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use primus_proto::v1::feature_value::Value;
use primus_proto::v1::{FeatureValue, Sample};
use primus_spec::dataset::{FeatureSchema, SparseFeature};

/// A sample that does not fit the schema; names the sample and the feature.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SampleError {
    #[error("samples[{sample}]: feature {feature:?} is not in the Dataset schema")]
    Unknown { sample: usize, feature: String },
    #[error("samples[{sample}]: feature {feature:?}: {message}")]
    Type {
        sample: usize,
        feature: String,
        message: String,
    },
    #[error("{0}")]
    Columns(String),
}

/// The samples as a record batch of the schema's columns (the label and target columns
/// zero).
pub fn record_batch(
    schema: &FeatureSchema,
    samples: &[Sample],
) -> Result<RecordBatch, SampleError> {
    for (i, sample) in samples.iter().enumerate() {
        if let Some(unknown) = sample.features.keys().find(|name| !in_schema(schema, name)) {
            return Err(SampleError::Unknown {
                sample: i,
                feature: unknown.clone(),
            });
        }
    }
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for label in std::iter::once(&schema.label).chain(&schema.targets) {
        fields.push(Field::new(label, DataType::Float32, false));
        columns.push(Arc::new(Float32Array::from(vec![0.0; samples.len()])));
    }
    for feature in &schema.dense {
        let values = samples
            .iter()
            .enumerate()
            .map(|(i, s)| match value(s, &feature.name) {
                None => Ok(None),
                Some(Value::Number(x)) => Ok(Some(*x)),
                Some(_) => Err(type_error(
                    i,
                    &feature.name,
                    "a dense feature takes a number",
                )),
            })
            .collect::<Result<Vec<Option<f64>>, _>>()?;
        fields.push(Field::new(&feature.name, DataType::Float64, true));
        columns.push(Arc::new(Float64Array::from(values)));
    }
    for feature in &schema.sparse {
        let column = sparse_column(feature, samples)?;
        fields.push(Field::new(
            &feature.name,
            column.data_type().clone(),
            column.is_nullable(),
        ));
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| SampleError::Columns(e.to_string()))
}

fn in_schema(schema: &FeatureSchema, name: &str) -> bool {
    schema.dense.iter().any(|d| d.name == name) || schema.sparse.iter().any(|s| s.name == name)
}

/// An empty id list: no id, of either kind.
fn is_empty_list(value: &Value) -> bool {
    match value {
        Value::Integers(list) => list.values.is_empty(),
        Value::Texts(list) => list.values.is_empty(),
        _ => false,
    }
}

/// The sample's value of `feature`; None is a null.
fn value<'a>(sample: &'a Sample, feature: &str) -> Option<&'a Value> {
    sample
        .features
        .get(feature)
        .and_then(|v: &FeatureValue| v.value.as_ref())
}

fn type_error(sample: usize, feature: &str, message: &str) -> SampleError {
    SampleError::Type {
        sample,
        feature: feature.to_owned(),
        message: message.to_owned(),
    }
}

/// An id column: integers (numbers must be whole) or strings, one kind per request (the
/// kind of the first sample that has a value), as they hash differently; lists for
/// multi-hot features.
fn sparse_column(feature: &SparseFeature, samples: &[Sample]) -> Result<ArrayRef, SampleError> {
    let name = &feature.name;
    let first = samples
        .iter()
        .find_map(|s| value(s, name).filter(|v| !is_empty_list(v)));
    let texts = matches!(first, Some(Value::Text(_) | Value::Texts(_)));
    let same_kind = |i: usize, v: &Value| {
        let is_text = matches!(v, Value::Text(_) | Value::Texts(_));
        if is_text == texts || is_empty_list(v) {
            Ok(())
        } else {
            Err(type_error(
                i,
                name,
                "ids of one feature must all be integers or all be strings",
            ))
        }
    };
    if feature.multi_hot {
        let mut ints = ListBuilder::new(Int64Builder::new());
        let mut strings = ListBuilder::new(StringBuilder::new());
        for (i, sample) in samples.iter().enumerate() {
            let Some(v) = value(sample, name) else {
                ints.append(false);
                strings.append(false);
                continue;
            };
            same_kind(i, v)?;
            // Each row goes to both builders (the other kind's list empty), so an empty list
            // of either kind fits the column the request's ids choose.
            match v {
                Value::Integers(list) => {
                    ints.values().append_slice(&list.values);
                    ints.append(true);
                    strings.append(true);
                }
                Value::Texts(list) => {
                    for s in &list.values {
                        strings.values().append_value(s);
                    }
                    strings.append(true);
                    ints.append(true);
                }
                _ => {
                    return Err(type_error(
                        i,
                        name,
                        "a multi-hot feature takes a list (integers or texts)",
                    ));
                }
            }
        }
        return Ok(if texts {
            Arc::new(strings.finish())
        } else {
            Arc::new(ints.finish())
        });
    }
    if texts {
        let values = samples
            .iter()
            .enumerate()
            .map(|(i, s)| match value(s, name) {
                None => Ok(None),
                Some(Value::Text(t)) => Ok(Some(t.as_str())),
                Some(v) => {
                    same_kind(i, v)?;
                    Err(type_error(i, name, "takes one id, not a list"))
                }
            })
            .collect::<Result<Vec<Option<&str>>, _>>()?;
        return Ok(Arc::new(StringArray::from(values)));
    }
    let values = samples
        .iter()
        .enumerate()
        .map(|(i, s)| match value(s, name) {
            None => Ok(None),
            Some(Value::Number(x)) if x.fract() == 0.0 && x.abs() < 9.007e15 => Ok(Some(*x as i64)),
            Some(Value::Number(x)) => Err(type_error(
                i,
                name,
                &format!("{x} is not a whole number (ids are integers or strings)"),
            )),
            // Exact for any 64-bit id (a double is exact only up to 2^53).
            Some(Value::Integers(list)) if list.values.len() == 1 => Ok(Some(list.values[0])),
            Some(v) => {
                same_kind(i, v)?;
                Err(type_error(i, name, "takes one id, not a list"))
            }
        })
        .collect::<Result<Vec<Option<i64>>, _>>()?;
    Ok(Arc::new(Int64Array::from(values)))
}
