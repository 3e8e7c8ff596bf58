//! Collisionless embedding tables (Monolith §2.1, HypeReca §4): the parameter server's
//! training-role storage.
//!
//! - [`index::CuckooIndex`]: u64 key -> row id, bucketized cuckoo hashing, > 90% load.
//! - [`Table`]: shards by key hash, each locked on its own, holding a chunked arena of rows
//!   (weights then optimizer state, contiguous) plus per-row metadata (last update, count,
//!   version). Rows never move; evicted rows are recycled.
//! - Per table: optimizer (SGD, Adagrad, Adam, FTRL), deterministic per-key initializer,
//!   admission (count-min threshold and/or probability), TTL expiry, touched-row deltas.
//! - [`ShardSnapshot`]: a shard's rows copied under its lock, full or incremental (rows
//!   changed and keys evicted since a version), in a checksummed binary format.
//!
//! - [`Region`]: zeroed, aligned memory for buckets and rows; huge pages from 2 MiB up.
//! - [`DenseStore`]: the PS's dense parameters, updated by the same optimizers.
//! - [`ReplicaTable`]: the serving role's copy of a table: weights only, versioned per key,
//!   so deltas applied twice or out of order end in the same rows.
//!
//! - [`hot_set`]: HypeReca's choice of rows every trainer replicates (Algorithm 1 and the
//!   latency model), and when to choose again.
//! - [`HotRows`]: a trainer's replica of chosen rows, trained in place with the table's
//!   optimizer.
//!
//! Time is passed in (`now_secs`), never read from the clock here, so behaviour is testable.

#![warn(missing_docs)]

mod admission;
mod dense;
mod hash;
mod hot_rows;
pub mod hot_set;
pub mod index;
mod init;
mod optimizer;
mod region;
mod replica;
mod snapshot;
mod table;

pub use dense::{DenseError, DenseStore, DenseValues};
pub use hot_rows::HotRows;
pub use region::Region;
pub use replica::{ApplyOutcome, DeltaRows, ReplicaTable};
pub use snapshot::{ShardSnapshot, SnapshotError};
pub use table::{
    Delta, EmbeddingError, PushOutcome, RowMeta, RowStores, RowValues, Table, TableOptions,
    TableStats,
};
