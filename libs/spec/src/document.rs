//! Resource documents: `kind`, `metadata`, `spec`, in YAML (JSON is YAML too), several per
//! file separated by `---`. Status is never read from a file: the API server owns it.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::dataset::DatasetSpec;
use crate::job::JobSpec;
use crate::metric::MetricSpec;
use crate::validate::{FieldError, Validate, check_name, fail};

/// The largest resource file accepted (a spec is configuration, not data).
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// The kinds of resource the API server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    /// A training Job.
    Job,
    /// A Dataset.
    Dataset,
    /// A Job's metrics (written by the master).
    Metric,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::Job, Kind::Dataset, Kind::Metric];

    /// The kind's name as written in files and subjects (`Job`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Job => "Job",
            Kind::Dataset => "Dataset",
            Kind::Metric => "Metric",
        }
    }

    /// Case-insensitive, singular or plural (`jobs`, `Dataset`), as users type it.
    pub fn parse(text: &str) -> Option<Kind> {
        let lower = text.to_ascii_lowercase();
        let singular = lower.strip_suffix('s').unwrap_or(&lower);
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(singular))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A resource's name and labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Unique per kind; a DNS label (lowercase letters, digits, `-`).
    pub name: String,
    /// Labels to select resources by (`primus get jobs -l team=ads`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A resource's identity and desired state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Object<S> {
    /// Name and labels.
    pub metadata: Metadata,
    /// The desired state.
    pub spec: S,
}

#[derive(Debug, Clone, PartialEq)]
/// (Boxed: the specs differ a lot in size.)
pub enum Resource {
    /// A Job.
    Job(Box<Object<JobSpec>>),
    /// A Dataset.
    Dataset(Box<Object<DatasetSpec>>),
    /// A Metric.
    Metric(Box<Object<MetricSpec>>),
}

/// Why a resource file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The file is larger than a resource may be.
    #[error("{source_name}: {bytes} bytes is over the {limit}-byte limit for a resource file")]
    TooLarge {
        /// The file's name.
        source_name: String,
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// A document is not YAML or JSON of a resource.
    #[error("{source_name}, document {document}: {message}")]
    Parse {
        /// The file's name.
        source_name: String,
        /// The document's position in the file (1 = first).
        document: usize,
        /// What is wrong.
        message: String,
    },
    /// A document is a resource with problems.
    #[error("{source_name}, document {document} ({kind} {name:?}):\n{}", list(.errors))]
    Invalid {
        /// The file's name.
        source_name: String,
        /// The document's position in the file (1 = first).
        document: usize,
        /// The resource's kind.
        kind: Kind,
        /// The resource's name.
        name: String,
        /// Every problem, each with its field path.
        errors: Vec<FieldError>,
    },
    /// The file holds no resource.
    #[error("{source_name}: no resources in it")]
    Empty {
        /// The file's name.
        source_name: String,
    },
}

fn list(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocument {
    kind: Kind,
    metadata: Metadata,
    spec: serde_yaml_ng::Value,
}

/// Parses and validates every resource in `text`; `source_name` (a file name) goes into
/// every error. Nothing is returned unless every document is valid.
pub fn parse_documents(source_name: &str, text: &str) -> Result<Vec<Resource>, SpecError> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(SpecError::TooLarge {
            source_name: source_name.into(),
            bytes: text.len(),
            limit: MAX_DOCUMENT_BYTES,
        });
    }
    let mut resources = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let number = i + 1;
        let parse_error = |message: String| SpecError::Parse {
            source_name: source_name.into(),
            document: number,
            message,
        };
        let value =
            serde_yaml_ng::Value::deserialize(document).map_err(|e| parse_error(e.to_string()))?;
        if value.is_null() {
            continue; // an empty document, e.g. after a trailing `---`
        }
        let raw: RawDocument = at_path(value, "").map_err(parse_error)?;
        let resource = Resource::from_raw(raw).map_err(parse_error)?;
        let errors = resource.problems();
        if !errors.is_empty() {
            return Err(SpecError::Invalid {
                source_name: source_name.into(),
                document: number,
                kind: resource.kind(),
                name: resource.name().into(),
                errors,
            });
        }
        resources.push(resource);
    }
    if resources.is_empty() {
        return Err(SpecError::Empty {
            source_name: source_name.into(),
        });
    }
    Ok(resources)
}

/// Deserializes with the failing field's path in the message (`spec.model.tables[0].dim: ...`).
fn at_path<T: DeserializeOwned, D>(input: D, prefix: &str) -> Result<T, String>
where
    for<'de> D: serde::Deserializer<'de>,
    for<'de> <D as serde::Deserializer<'de>>::Error: fmt::Display,
{
    serde_path_to_error::deserialize(input).map_err(|e| {
        let path = e.path().to_string();
        let path = match (prefix, path.as_str()) {
            (_, ".") => prefix.to_owned(),
            ("", p) => p.to_owned(),
            (pre, p) => format!("{pre}.{p}"),
        };
        if path.is_empty() {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        }
    })
}

fn json_at_path<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut input = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut input)
        .map_err(|e| format!("spec.{}: {}", e.path(), e.inner()))
}

impl Resource {
    fn from_raw(raw: RawDocument) -> Result<Self, String> {
        let metadata = raw.metadata;
        Ok(match raw.kind {
            Kind::Job => Resource::Job(Box::new(Object {
                metadata,
                spec: at_path(raw.spec, "spec")?,
            })),
            Kind::Dataset => Resource::Dataset(Box::new(Object {
                metadata,
                spec: at_path(raw.spec, "spec")?,
            })),
            Kind::Metric => Resource::Metric(Box::new(Object {
                metadata,
                spec: at_path(raw.spec, "spec")?,
            })),
        })
    }

    /// Rebuilds a resource from its stored parts (the API's `spec_json`).
    pub fn from_json(kind: Kind, metadata: Metadata, spec_json: &str) -> Result<Self, String> {
        Ok(match kind {
            Kind::Job => Resource::Job(Box::new(Object {
                metadata,
                spec: json_at_path(spec_json)?,
            })),
            Kind::Dataset => Resource::Dataset(Box::new(Object {
                metadata,
                spec: json_at_path(spec_json)?,
            })),
            Kind::Metric => Resource::Metric(Box::new(Object {
                metadata,
                spec: json_at_path(spec_json)?,
            })),
        })
    }

    /// The resource's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Resource::Job(_) => Kind::Job,
            Resource::Dataset(_) => Kind::Dataset,
            Resource::Metric(_) => Kind::Metric,
        }
    }

    /// The resource's name and labels.
    pub fn metadata(&self) -> &Metadata {
        match self {
            Resource::Job(o) => &o.metadata,
            Resource::Dataset(o) => &o.metadata,
            Resource::Metric(o) => &o.metadata,
        }
    }

    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.metadata().name
    }

    /// Makes local paths absolute against `base` (where the file was applied from):
    /// `file://./x`, `file://../x` and scheme-less relative paths in Parquet source URIs
    /// and the checkpoint URI. Executors run in folders of their own, so a relative path
    /// would mean something else to each of them.
    pub fn resolve_local_paths(&mut self, base: &std::path::Path) {
        let resolve = |uri: &mut String| {
            let relative = match uri.strip_prefix("file://") {
                Some(rest) if rest.starts_with("./") || rest.starts_with("../") => rest,
                Some(_) => return,
                None if uri.contains("://") || uri.starts_with('/') || uri.is_empty() => return,
                None => uri.as_str(),
            };
            let absolute = base.join(relative.trim_start_matches("./"));
            *uri = format!("file://{}", absolute.display());
        };
        match self {
            Resource::Dataset(dataset) => {
                for source in dataset.spec.streams.iter_mut().flat_map(|s| &mut s.sources) {
                    if let Some(parquet) = &mut source.parquet {
                        resolve(&mut parquet.uri);
                    }
                }
            }
            Resource::Job(job) => {
                if let Some(checkpoint) = &mut job.spec.checkpoint {
                    resolve(&mut checkpoint.uri);
                }
            }
            Resource::Metric(_) => {}
        }
    }

    /// The spec as JSON (what travels in the API's `Resource.spec_json`).
    pub fn spec_json(&self) -> Result<String, serde_json::Error> {
        match self {
            Resource::Job(o) => serde_json::to_string(&o.spec),
            Resource::Dataset(o) => serde_json::to_string(&o.spec),
            Resource::Metric(o) => serde_json::to_string(&o.spec),
        }
    }

    /// Every problem in metadata and spec, with field paths.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let metadata = self.metadata();
        check_name(&mut errors, "metadata.name".into(), &metadata.name, false);
        for key in metadata.labels.keys() {
            if key.is_empty() || key.len() > 63 || key.contains(char::is_whitespace) {
                fail(
                    &mut errors,
                    format!("metadata.labels.{key}"),
                    "label keys are 1-63 characters without spaces",
                );
            }
        }
        match self {
            Resource::Job(o) => o.spec.validate("spec", &mut errors),
            Resource::Dataset(o) => o.spec.validate("spec", &mut errors),
            Resource::Metric(o) => o.spec.validate("spec", &mut errors),
        }
        errors
    }
}
