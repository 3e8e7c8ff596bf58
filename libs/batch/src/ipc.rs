//! The wire format: one Arrow IPC stream holding one record batch.
//!
//! Columns: `label` (Float32); `target.<name>` (Float32) per further label column, in the
//! schema's order; `dense` (`FixedSizeList<Float32>` of the dense features, only
//! when there are some; their names in the schema metadata); `sparse.<feature>`
//! (`List<UInt64>`) per jagged feature; `group.<group>` per dedup group, a dictionary
//! column whose keys are the inverse index and whose values are a struct of the group's
//! unique rows (one `List<UInt64>` field per feature). Arrow's dictionary is exactly RecD's
//! inverse index, so IKJT crosses the wire without expanding.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt32Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, DictionaryArray, FixedSizeListArray, Float32Array, ListArray, RecordBatch,
    StructArray, UInt32Array, UInt64Array,
};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, Fields, Schema};

use crate::BatchError;
use crate::ikjt::{Ikjt, IkjtGroup};
use crate::kjt::{JaggedFeature, Kjt};
use crate::minibatch::{DenseMatrix, Minibatch, Sparse, Target};

const LABEL: &str = "label";
const TARGET_PREFIX: &str = "target.";
const DENSE: &str = "dense";
const SPARSE_PREFIX: &str = "sparse.";
const GROUP_PREFIX: &str = "group.";
const DENSE_NAMES_KEY: &str = "primus.dense_names";
const ORDER_KEY: &str = "primus.sparse_order";
/// Present (any value) when the sparse features are an IKJT, even one without groups.
const GROUPED_KEY: &str = "primus.grouped";

fn list_field() -> Arc<Field> {
    Arc::new(Field::new("item", DataType::UInt64, false))
}

fn list_array(feature: &JaggedFeature) -> ListArray {
    let offsets: Vec<i32> = feature.offsets.iter().map(|&o| o as i32).collect();
    ListArray::new(
        list_field(),
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Arc::new(UInt64Array::from(feature.values.clone())),
        None,
    )
}

fn jagged_from(name: &str, array: &dyn Array) -> Result<JaggedFeature, BatchError> {
    let list = array
        .as_list_opt::<i32>()
        .ok_or_else(|| BatchError::Encoding(format!("`{name}` is not a list column")))?;
    let values = list
        .values()
        .as_primitive_opt::<UInt64Type>()
        .ok_or_else(|| BatchError::Encoding(format!("`{name}` does not hold UInt64 keys")))?;
    let offsets = list.value_offsets();
    let base = offsets.first().copied().unwrap_or(0);
    let start = base as usize;
    let end = offsets.last().copied().unwrap_or(0) as usize;
    Ok(JaggedFeature {
        name: name.to_owned(),
        offsets: offsets.iter().map(|&o| (o - base) as u32).collect(),
        values: values.values()[start..end].to_vec(),
    })
}

/// Encodes `batch` as Arrow IPC stream bytes.
pub fn encode(batch: &Minibatch) -> Result<Vec<u8>, BatchError> {
    let mut fields = vec![Field::new(LABEL, DataType::Float32, false)];
    let mut columns: Vec<ArrayRef> = vec![Arc::new(Float32Array::from(batch.labels.clone()))];
    for target in &batch.targets {
        fields.push(Field::new(
            format!("{TARGET_PREFIX}{}", target.name),
            DataType::Float32,
            false,
        ));
        columns.push(Arc::new(Float32Array::from(target.values.clone())));
    }
    let mut metadata = HashMap::new();
    metadata.insert(
        DENSE_NAMES_KEY.to_owned(),
        serde_json::to_string(&batch.dense.names)
            .map_err(|e| BatchError::Encoding(e.to_string()))?,
    );
    if batch.dense.cols() > 0 {
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let array = FixedSizeListArray::try_new(
            item,
            batch.dense.cols() as i32,
            Arc::new(Float32Array::from(batch.dense.values.clone())),
            None,
        )?;
        fields.push(Field::new(DENSE, array.data_type().clone(), false));
        columns.push(Arc::new(array));
    }
    let (jagged, groups, order): (&[JaggedFeature], &[IkjtGroup], Vec<String>) = match &batch.sparse
    {
        Sparse::Jagged(kjt) => (
            &kjt.features,
            &[],
            kjt.features.iter().map(|f| f.name.clone()).collect(),
        ),
        Sparse::Grouped(ikjt) => {
            metadata.insert(GROUPED_KEY.to_owned(), "true".to_owned());
            (&ikjt.jagged, &ikjt.groups, ikjt.order.clone())
        }
    };
    metadata.insert(
        ORDER_KEY.to_owned(),
        serde_json::to_string(&order).map_err(|e| BatchError::Encoding(e.to_string()))?,
    );
    for feature in jagged {
        let array = list_array(feature);
        fields.push(Field::new(
            format!("{SPARSE_PREFIX}{}", feature.name),
            array.data_type().clone(),
            false,
        ));
        columns.push(Arc::new(array));
    }
    for group in groups {
        let members: Vec<ArrayRef> = group
            .features
            .iter()
            .map(|f| Arc::new(list_array(f)) as ArrayRef)
            .collect();
        let struct_fields: Fields = group
            .features
            .iter()
            .zip(&members)
            .map(|(f, a)| Field::new(f.name.clone(), a.data_type().clone(), false))
            .collect();
        let unique = StructArray::try_new(struct_fields, members, None)?;
        let keys = UInt32Array::from(group.inverse.clone());
        let array = DictionaryArray::<UInt32Type>::try_new(keys, Arc::new(unique))?;
        fields.push(Field::new(
            format!("{GROUP_PREFIX}{}", group.name),
            array.data_type().clone(),
            false,
        ));
        columns.push(Arc::new(array));
    }
    let schema = Arc::new(Schema::new_with_metadata(fields, metadata));
    let record = RecordBatch::try_new(schema.clone(), columns)?;
    let mut bytes = Vec::new();
    let mut writer = StreamWriter::try_new(&mut bytes, &schema)?;
    writer.write(&record)?;
    writer.finish()?;
    drop(writer);
    Ok(bytes)
}

fn json_list(schema: &Schema, key: &str) -> Result<Vec<String>, BatchError> {
    let text = schema
        .metadata()
        .get(key)
        .ok_or_else(|| BatchError::Encoding(format!("schema metadata `{key}` is missing")))?;
    serde_json::from_str(text).map_err(|e| BatchError::Encoding(format!("`{key}`: {e}")))
}

/// Encodes raw rows (any columns) as Arrow IPC stream bytes: the payload of a stream
/// source's `SampleRows` message.
pub fn encode_rows(rows: &RecordBatch) -> Result<Vec<u8>, BatchError> {
    let mut bytes = Vec::new();
    let mut writer = StreamWriter::try_new(&mut bytes, &rows.schema())?;
    writer.write(rows)?;
    writer.finish()?;
    drop(writer);
    Ok(bytes)
}

/// Decodes bytes written by [`encode_rows`] (or any Arrow IPC stream of one schema) into
/// one batch of rows.
pub fn decode_rows(bytes: &[u8]) -> Result<RecordBatch, BatchError> {
    let reader = StreamReader::try_new(bytes, None)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    Ok(arrow_select::concat::concat_batches(&schema, &batches)?)
}

/// Decodes bytes written by [`encode`].
pub fn decode(bytes: &[u8]) -> Result<Minibatch, BatchError> {
    let mut reader = StreamReader::try_new(bytes, None)?;
    let record = reader
        .next()
        .ok_or_else(|| BatchError::Encoding("the stream holds no record batch".into()))??;
    let schema = record.schema();
    let labels = record
        .column_by_name(LABEL)
        .and_then(|c| c.as_primitive_opt::<Float32Type>())
        .ok_or_else(|| BatchError::Encoding("no Float32 `label` column".into()))?
        .values()
        .to_vec();
    let names = json_list(&schema, DENSE_NAMES_KEY)?;
    let values = match record.column_by_name(DENSE) {
        None if names.is_empty() => Vec::new(),
        None => {
            return Err(BatchError::Encoding(
                "dense names without a `dense` column".into(),
            ));
        }
        Some(column) => {
            let list = column
                .as_fixed_size_list_opt()
                .ok_or_else(|| BatchError::Encoding("`dense` is not a fixed-size list".into()))?;
            let floats = list
                .values()
                .as_primitive_opt::<Float32Type>()
                .ok_or_else(|| BatchError::Encoding("`dense` does not hold Float32".into()))?;
            let width = names.len();
            floats.values()[list.offset() * width..(list.offset() + list.len()) * width].to_vec()
        }
    };
    if values.len() != labels.len() * names.len() {
        return Err(BatchError::Encoding(format!(
            "{} dense values for {} rows of {} features",
            values.len(),
            labels.len(),
            names.len()
        )));
    }
    let mut targets = Vec::new();
    let mut jagged = Vec::new();
    let mut groups = Vec::new();
    for (field, column) in schema.fields().iter().zip(record.columns()) {
        if let Some(name) = field.name().strip_prefix(TARGET_PREFIX) {
            targets.push(target_from(name, column)?);
        } else if let Some(name) = field.name().strip_prefix(SPARSE_PREFIX) {
            jagged.push(jagged_from(name, column)?);
        } else if let Some(name) = field.name().strip_prefix(GROUP_PREFIX) {
            groups.push(group_from(name, column)?);
        }
    }
    let rows = labels.len();
    let order = json_list(&schema, ORDER_KEY)?;
    if !groups.is_empty() && !schema.metadata().contains_key(GROUPED_KEY) {
        return Err(BatchError::Encoding(
            "dedup groups in a jagged batch".into(),
        ));
    }
    let sparse = if !schema.metadata().contains_key(GROUPED_KEY) {
        Sparse::Jagged(Kjt {
            rows,
            features: jagged,
        })
    } else {
        Sparse::Grouped(Ikjt {
            rows,
            jagged,
            groups,
            order,
        })
    };
    Ok(Minibatch {
        labels,
        targets,
        dense: DenseMatrix { names, values },
        sparse,
    })
}

fn target_from(name: &str, column: &ArrayRef) -> Result<Target, BatchError> {
    let values = column
        .as_primitive_opt::<Float32Type>()
        .ok_or_else(|| BatchError::Encoding(format!("target `{name}` is not Float32")))?;
    Ok(Target {
        name: name.to_owned(),
        values: values.values().to_vec(),
    })
}

fn group_from(name: &str, column: &ArrayRef) -> Result<IkjtGroup, BatchError> {
    let dictionary = column.as_dictionary_opt::<UInt32Type>().ok_or_else(|| {
        BatchError::Encoding(format!("group `{name}` is not a UInt32 dictionary"))
    })?;
    let unique = dictionary
        .values()
        .as_struct_opt()
        .ok_or_else(|| BatchError::Encoding(format!("group `{name}` values are not a struct")))?;
    let features = unique
        .fields()
        .iter()
        .zip(unique.columns())
        .map(|(f, c)| jagged_from(f.name(), c.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(IkjtGroup {
        name: name.to_owned(),
        features,
        inverse: dictionary.keys().values().to_vec(),
    })
}
