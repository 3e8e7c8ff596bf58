//! The CustomResourceDefinitions of `PrimusJob`, `PrimusDataset` and `PrimusMetric`:
//! structural OpenAPI schemas generated from primus-spec's types (every `spec` and
//! `status` field, its type, its enum values; unknown fields refused), the status
//! subresource, printer columns and short names.
//!
//! The schemas check what a schema can (types, required fields, enum values, unknown
//! fields); the master checks the rest (`Validate`) and fails a Job with a condition
//! naming the field. Defaults stay out of the schemas: primus-spec fills them where the
//! spec is read, so a stored object is what its author applied.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use primus_spec::Kind;
use primus_spec::dataset::DatasetSpec;
use primus_spec::job::JobSpec;
use primus_spec::metric::MetricSpec;
use primus_spec::status::Status;
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use crate::{CustomKind, GROUP, VERSION};

/// Why the definitions could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A generated schema is not one Kubernetes' schema type can hold.
    #[error("the {kind} schema: {message}")]
    Schema {
        /// The kind whose schema failed.
        kind: &'static str,
        /// What failed.
        message: String,
    },
    /// YAML could not be written.
    #[error("writing YAML: {0}")]
    Yaml(String),
}

/// The definitions of every Primus custom resource, Job first.
pub fn definitions() -> Result<Vec<CustomResourceDefinition>, CrdError> {
    CustomKind::ALL.into_iter().map(definition).collect()
}

/// [`definitions`] as one YAML file of `---`-separated documents (what `primus crds` prints
/// and `k8s/crds/` holds).
pub fn definitions_yaml() -> Result<String, CrdError> {
    let mut out = String::from(
        "# The CustomResourceDefinitions of Primus-rs, written by `primus crds` from the\n\
         # Job, Dataset, Metric and status types. Do not edit: edit the types.\n",
    );
    for definition in definitions()? {
        out.push_str("---\n");
        out.push_str(
            &serde_yaml_ng::to_string(&definition).map_err(|e| CrdError::Yaml(e.to_string()))?,
        );
    }
    Ok(out)
}

/// The definition of one kind.
pub fn definition(custom: CustomKind) -> Result<CustomResourceDefinition, CrdError> {
    let spec = match custom.kind {
        Kind::Job => structural_schema::<JobSpec>(),
        Kind::Dataset => structural_schema::<DatasetSpec>(),
        Kind::Metric => structural_schema::<MetricSpec>(),
    };
    let root = json!({
        "type": "object",
        "description": description(custom.kind),
        "required": ["spec"],
        "properties": {
            "spec": spec,
            "status": structural_schema::<Status>(),
        },
    });
    let schema: JSONSchemaProps = serde_json::from_value(root).map_err(|e| CrdError::Schema {
        kind: custom.name,
        message: e.to_string(),
    })?;
    Ok(CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(custom.definition_name()),
            ..ObjectMeta::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: GROUP.into(),
            names: CustomResourceDefinitionNames {
                kind: custom.name.into(),
                list_kind: Some(format!("{}List", custom.name)),
                plural: custom.plural.into(),
                singular: Some(custom.name.to_ascii_lowercase()),
                short_names: Some(custom.short_names.iter().map(|s| (*s).into()).collect()),
                categories: Some(vec!["primus".into()]),
            },
            scope: "Namespaced".into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: VERSION.into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(schema),
                }),
                subresources: Some(CustomResourceSubresources {
                    status: Some(CustomResourceSubresourceStatus(json!({}))),
                    scale: None,
                }),
                additional_printer_columns: Some(printer_columns(custom.kind)),
                ..CustomResourceDefinitionVersion::default()
            }],
            ..CustomResourceDefinitionSpec::default()
        },
        status: None,
    })
}

fn description(kind: Kind) -> &'static str {
    match kind {
        Kind::Job => "A training Job: what model trains on which Dataset, how, and where.",
        Kind::Dataset => "A Dataset: the streams a Job reads, their sources and schema.",
        Kind::Metric => {
            "A Job's metrics, written by its master: time series of its executors' reports."
        }
    }
}

/// What `kubectl get` shows beside the name.
fn printer_columns(kind: Kind) -> Vec<CustomResourceColumnDefinition> {
    let mut columns = vec![column(
        "Phase",
        "string",
        ".status.phase",
        "Where it is in its life.",
    )];
    match kind {
        Kind::Job => columns.extend([
            column(
                "Progress",
                "number",
                ".status.progress.fraction",
                "Share of a batch Job's rows trained (0 to 1).",
            ),
            column(
                "Samples",
                "integer",
                ".status.progress.samples",
                "Samples trained.",
            ),
            column(
                "Samples/s",
                "number",
                ".status.progress.samples_per_second",
                "Samples trained per second lately.",
            ),
            column(
                "AUC",
                "number",
                ".status.progress.auc",
                "Progressive-validation AUC.",
            ),
        ]),
        Kind::Dataset => {}
        Kind::Metric => columns = vec![column("Job", "string", ".spec.job", "The Job measured.")],
    }
    columns.push(column(
        "Age",
        "date",
        ".metadata.creationTimestamp",
        "Since it was created.",
    ));
    columns
}

fn column(name: &str, kind: &str, path: &str, description: &str) -> CustomResourceColumnDefinition {
    CustomResourceColumnDefinition {
        name: name.into(),
        type_: kind.into(),
        json_path: path.into(),
        description: Some(description.into()),
        ..CustomResourceColumnDefinition::default()
    }
}

/// `T`'s schema as Kubernetes takes it: inlined (no `$ref`), in the structural form, no
/// defaults (see the module doc).
fn structural_schema<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::openapi3()
        .with(|settings| {
            settings.inline_subschemas = true;
            settings.meta_schema = None;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    crate::structural::rewrite(&mut schema);
    schema
}
