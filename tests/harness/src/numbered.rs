//! Rows that carry their own id, and what a Job trained, id by id: each Criteo-like row's
//! `c26` is replaced by a unique id, so its embedding row is that row's alone and is
//! updated once per training of the row. The chaos suite and the cluster tests count rows
//! lost and trained twice this way.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use futures::TryStreamExt;
use primus_batch::hash::{feature_seed, int_key};
use primus_storage::Location;

use crate::criteo::DLRM_ROW_GROUP_ROWS;
use crate::rows::update_counts;

/// The column replaced by each row's id.
pub const ID_COLUMN: &str = "c26";

/// Rewrites every Parquet file under `location` with each row's [`ID_COLUMN`] replaced by
/// its id, from `first` on in file order, in row groups of the DLRM data's size. Returns the
/// ids given.
pub async fn number_parquet_rows(location: &Location, first: u64) -> Range<u64> {
    let mut next = first;
    for file in location.list("").await.expect("the Parquet files") {
        let options = primus_storage::parquet::ReadOptions::default();
        let read = primus_storage::parquet::read(location, &file.location, &options)
            .await
            .expect("a Parquet file");
        let batches: Vec<RecordBatch> = read.try_collect().await.expect("its rows");
        let schema = batches.first().expect("rows").schema();
        let rows = arrow_select::concat::concat_batches(&schema, &batches).expect("one batch");
        let ids = next..next + rows.num_rows() as u64;
        next = ids.end;
        let rows = with_ids(rows, ids);
        let relative = crate::stores::relative(location, &file.location);
        primus_datagen::write::write_file(location, &relative, rows, DLRM_ROW_GROUP_ROWS)
            .await
            .expect("the file rewritten");
    }
    first..next
}

/// `rows` with [`ID_COLUMN`] replaced by `ids`.
pub fn with_ids(rows: RecordBatch, ids: Range<u64>) -> RecordBatch {
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(ids.map(|id| id as i64)));
    let column = rows.schema().index_of(ID_COLUMN).expect("the id column");
    let mut columns = rows.columns().to_vec();
    columns[column] = ids;
    RecordBatch::try_new(rows.schema(), columns).expect("rows with ids")
}

/// How often a model trained each row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Trained {
    /// Ids whose row was never trained.
    pub lost: u64,
    /// Trainings beyond the first, over every id.
    pub repeated: u64,
    /// Trainings in all.
    pub trainings: u64,
}

/// Reads, from every training PS shard at `shards` (host:port), how many updates each id
/// of `ids` had in table `table`: one per training of its row.
pub async fn trained_rows(
    shards: &[String],
    table: &str,
    ids: impl IntoIterator<Item = u64>,
) -> Trained {
    let seed = feature_seed(ID_COLUMN);
    let ids: HashMap<u64, u64> = ids.into_iter().map(|id| (int_key(seed, id), id)).collect();
    let mut updates: HashMap<u64, u64> = HashMap::new();
    for shard in shards {
        for ((name, key), count) in update_counts(shard).await {
            if name == table
                && let Some(id) = ids.get(&key)
            {
                *updates.entry(*id).or_default() += count;
            }
        }
    }
    Trained {
        lost: ids.len() as u64 - updates.values().filter(|n| **n > 0).count() as u64,
        repeated: updates.values().map(|n| n.saturating_sub(1)).sum(),
        trainings: updates.values().sum(),
    }
}
