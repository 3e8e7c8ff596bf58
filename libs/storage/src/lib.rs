//! Object stores from URLs, and Parquet files in them.
//!
//! [`open`] turns a URL into a [`Location`] (a store plus a prefix inside it):
//! `file:///abs/dir` or a plain path (the embedded default), `memory://name/dir` (one
//! in-process store per name), `s3://bucket/dir` (endpoint, region, credentials and
//! `allow_http` from [`primus_config::S3Settings`], else the `AWS_*` environment), and
//! `hdfs://namenode:port/dir` with the `hdfs` cargo feature. [`parquet`] reads (streaming,
//! column projection, row-group ranges) and writes Parquet through any of them.

#![warn(missing_docs)]

mod error;
mod location;
pub mod parquet;
mod reader;

pub use error::StorageError;
pub use location::{Location, open};
pub use object_store::path::Path as ObjectPath;
pub use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
