//! Synthetic recommendation data, written as time-partitioned Parquet (zstd) to any
//! object store URL. Behind `primus datagen`, and used by tests and benchmarks.
//!
//! - [`criteo`]: 13 count-like dense and 26 categorical columns, Zipf-distributed ids with
//!   Criteo's cardinalities (scalable), labels drawn from a hidden logistic model whose
//!   probabilities are kept, so the best achievable AUC of the data is known exactly.
//!   With `drift_radians_per_day > 0` the hidden weights rotate over time (drift data);
//!   with `tasks`, a rare conversion among clicks and a continuous watch time, correlated
//!   with the click, come with their own best achievable scores.
//! - [`sessions`]: RecD-style sessions (mean ~16.5 samples, heavy tail): user features
//!   that change between a session's samples with a set probability, item features
//!   redrawn per sample; rows ordered by time or clustered by session.
//! - [`write`](mod@write): lays batches out as `date=YYYY-MM-DD/hour=HH/part-NNNNN.parquet`.
//! - [`import`]: public data sets (Adult) into daily partitions with a held-out last day.
//! - [`cluster`]: a stored data set written again with each session's rows together
//!   (RecD §4.1), and the storage ratio that achieved.

#![warn(missing_docs)]

pub mod cluster;
pub mod criteo;
mod hidden;
pub mod import;
pub mod sessions;
pub mod write;

/// Generator options that cannot produce data.
#[derive(Debug, thiserror::Error)]
pub enum DatagenError {
    /// An option out of range.
    #[error("{field}: {message}")]
    Option {
        /// The option.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A source file cannot be imported.
    #[error("{file}: {message}")]
    Source {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// Reading or writing the object store failed.
    #[error(transparent)]
    Storage(#[from] primus_storage::StorageError),
    /// Arrow refused the rows.
    #[error("building record batch: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
}

pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> DatagenError {
    DatagenError::Option {
        field,
        message: message.into(),
    }
}
