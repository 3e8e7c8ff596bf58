//! The resources a user declares: Job, Dataset and Metric (Primus's JobCRD, DataCRD and
//! MetricCRD), with a status shared by all three.
//!
//! [`parse_documents`] reads a YAML (or JSON) file of one or more `---`-separated resources;
//! every problem is reported with its field path (`spec.model.tables[2].dim: must be > 0`).
//! Checks that need other resources (does the Job's dataset exist?) belong to the API server.

#![warn(missing_docs)]

pub mod dataset;
mod defaults;
mod document;
pub mod job;
pub mod metric;
pub mod status;
pub mod time;
mod validate;

pub use document::{
    Kind, MAX_DOCUMENT_BYTES, Metadata, Object, Resource, SpecError, parse_documents,
};
pub use validate::{FieldError, Validate, check_resource_name};
