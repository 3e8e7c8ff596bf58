//! A primus-spec resource as the custom resource that carries it, and back.

use primus_spec::{Kind, Metadata, Resource};
use serde_json::{Value, json};

use crate::{API_VERSION, CustomKind};

/// Why a custom resource could not be read as a Primus resource.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// `kind` is not one of Primus's custom resources.
    #[error("kind {0:?} is not PrimusJob, PrimusDataset or PrimusMetric")]
    Kind(String),
    /// A field is missing or wrong.
    #[error("{name}: {message}")]
    Field {
        /// The object's name (empty when it has none).
        name: String,
        /// What is wrong, with the field path.
        message: String,
    },
}

/// `resource` as a custom resource object (`apiVersion`, `kind`, `metadata`, `spec`), in
/// `namespace` when given.
pub fn custom_resource(
    resource: &Resource,
    namespace: Option<&str>,
) -> Result<Value, ConvertError> {
    let custom = CustomKind::of(resource.kind());
    let spec = resource
        .spec_json()
        .and_then(|text| serde_json::from_str::<Value>(&text))
        .map_err(|e| ConvertError::Field {
            name: resource.name().into(),
            message: format!("spec: {e}"),
        })?;
    let metadata = resource.metadata();
    let mut object = json!({
        "apiVersion": API_VERSION,
        "kind": custom.name,
        "metadata": {"name": metadata.name, "labels": metadata.labels},
        "spec": spec,
    });
    if let Some(namespace) = namespace {
        object["metadata"]["namespace"] = Value::String(namespace.into());
    }
    Ok(object)
}

/// A custom resource object as the Primus resource it carries, checked as the API server
/// checks an applied file (every problem named with its field path).
pub fn resource(object: &Value) -> Result<Resource, ConvertError> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let field = |message: String| ConvertError::Field {
        name: name.clone(),
        message,
    };
    let kind_name = object["kind"].as_str().unwrap_or_default();
    let custom =
        CustomKind::named(kind_name).ok_or_else(|| ConvertError::Kind(kind_name.into()))?;
    let labels = match object["metadata"].get("labels") {
        Some(labels) if !labels.is_null() => serde_json::from_value(labels.clone())
            .map_err(|e| field(format!("metadata.labels: {e}")))?,
        _ => Default::default(),
    };
    let metadata = Metadata {
        name: name.clone(),
        labels,
    };
    let spec = object
        .get("spec")
        .ok_or_else(|| field("spec: missing".into()))?;
    let resource = Resource::from_json(custom.kind, metadata, &spec.to_string()).map_err(field)?;
    let problems = resource.problems();
    if !problems.is_empty() {
        let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Err(field(listed.join("; ")));
    }
    Ok(resource)
}

/// The kind `object` carries, by its `kind` field.
pub fn kind_of(object: &Value) -> Option<Kind> {
    object["kind"]
        .as_str()
        .and_then(CustomKind::named)
        .map(|c| c.kind)
}
