//! Samples and minibatches (Primus §5, RecD §4).
//!
//! - [`Minibatch`]: labels (and further [`Target`] columns), a row-major dense matrix, and sparse features either jagged
//!   ([`Kjt`]: per feature, keys plus row offsets) or grouped ([`Ikjt`], RecD's inverse
//!   KJT: per dedup group, unique rows plus one inverse index).
//! - [`ipc`]: the lossless Arrow IPC wire encoding of both.
//! - [`FeaturePipeline`]: rows of a Parquet file or stream message (an Arrow record
//!   batch) to a minibatch, as the Dataset's feature schema says: sparse values hashed
//!   with their feature name into u64 keys ([`hash`]), multi-hot lists, dense transforms,
//!   missing values.
//! - [`RecentIdentities`]: the latest minibatch identities seen, up to a bound.

#![warn(missing_docs)]

mod error;
pub mod hash;
mod ikjt;
pub mod ipc;
mod kjt;
mod minibatch;
mod pipeline;
mod recent;

pub use error::BatchError;
pub use ikjt::{DedupGroups, Ikjt, IkjtGroup, RowHasher, row_hash};
pub use kjt::{JaggedFeature, Kjt};
pub use minibatch::{DenseMatrix, Minibatch, Sparse, Target};
pub use pipeline::FeaturePipeline;
pub use recent::RecentIdentities;
