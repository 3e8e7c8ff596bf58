//! Moving a running Job's parameters from one list of PS shards to another while its
//! trainers keep training (DLRover-RM's seamless migration): grow or shrink the shard count,
//! or put a shard on a fresh process.
//!
//! Rows are copied in rounds while the old shards keep serving (each round copies what
//! changed since the last, read from the shards' change logs), until a round is small. Then
//! every old shard is fenced: it refuses calls that touch what moves, so nothing more changes
//! there; the last round and the moved dense tensors are copied; the caller publishes the
//! new shard list, which refused clients pick up and retry; the old shards drop what moved.
//! The fence is the only pause, and it lasts one small round.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::ShardClient;
use crate::layout::{self, Layout};
use futures::future::try_join_all;
use primus_embedding::ShardSnapshot;
use primus_proto::v1::{
    DropMovedRequest, ExportMovedRequest, FenceRequest, ImportDenseRequest, ImportRowsRequest,
    StatsRequest,
};

/// A copy round smaller than this many rows ends the background copying.
const SMALL_ROUND: u64 = 2_000;
/// Background rounds at most (a table changing faster than it copies still converges to a
/// fence after these).
const MAX_ROUNDS: u32 = 6;

/// Why a resharding failed (before the switch every old shard is unfenced again).
#[derive(Debug, thiserror::Error)]
pub enum ReshardError {
    /// A shard list is empty.
    #[error("resharding needs at least one shard on each side")]
    NoShards,
    /// A shard cannot be reached or answered with an error.
    #[error("resharding, PS shard {addr}: {message}")]
    Shard {
        /// Its address.
        addr: String,
        /// What went wrong.
        message: String,
    },
    /// The caller could not publish the new shard list.
    #[error("resharding, publishing the new shard list: {0}")]
    Publish(String),
}

/// What one resharding did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReshardReport {
    /// Rows written to their new shards (a row that changed during the copy counts again).
    pub rows_copied: u64,
    /// Copy rounds, the one under the fence included.
    pub rounds: u32,
    /// Dense tensors that moved.
    pub dense_moved: u64,
    /// Rows the old shards dropped after the switch.
    pub rows_dropped: u64,
    /// From the first copy to the fence.
    pub copying: Duration,
    /// From the fence to the new list published: the longest any call waited.
    pub fenced: Duration,
}

struct Source {
    addr: String,
    client: ShardClient,
    /// Its place in the old list and in the new one.
    old: Layout,
    new: Layout,
    /// Per (table, part): the version the last copy reached.
    copied: HashMap<(String, u32), u64>,
}

/// Moves the parameters held by the shards at `from` (in shard order) to those at `to`, then
/// calls `publish` to switch the Job's clients to `to` and drops what moved from the old
/// shards that stay. An old shard missing from `to` ends up holding nothing and may be
/// stopped after this returns. Fails before `publish` with every old shard unfenced.
pub async fn reshard<F, Fut>(
    from: &[String],
    to: &[String],
    publish: F,
) -> Result<ReshardReport, ReshardError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    if from.is_empty() || to.is_empty() {
        return Err(ReshardError::NoShards);
    }
    let mut targets = HashMap::new();
    for addr in to {
        targets.insert(addr.clone(), connect(addr).await?);
    }
    let mut sources = Vec::with_capacity(from.len());
    for (i, addr) in from.iter().enumerate() {
        sources.push(Source {
            addr: addr.clone(),
            client: connect(addr).await?,
            old: Layout {
                shard_count: from.len() as u32,
                index: Some(i as u32),
            },
            new: Layout {
                shard_count: to.len() as u32,
                index: to.iter().position(|a| a == addr).map(|i| i as u32),
            },
            copied: HashMap::new(),
        });
    }
    let tables = table_names(&sources[0]).await?;
    let started = Instant::now();
    let mut report = ReshardReport::default();
    loop {
        let copied = copy_round(&mut sources, &tables, to, &targets).await?;
        report.rows_copied += copied;
        report.rounds += 1;
        if copied < SMALL_ROUND || report.rounds >= MAX_ROUNDS {
            break;
        }
    }
    report.copying = started.elapsed();
    let fenced_at = Instant::now();
    let switched = async {
        let dense = fence(&mut sources, Source::new_layout).await?;
        report.rows_copied += copy_round(&mut sources, &tables, to, &targets).await?;
        report.rounds += 1;
        report.dense_moved = import_dense(&dense, to, &targets).await?;
        publish().await.map_err(ReshardError::Publish)
    }
    .await;
    if let Err(e) = switched {
        if let Err(unfence) = fence(&mut sources, Source::old_layout).await {
            tracing::error!(error = %unfence, "lifting the fence after a failed resharding");
        }
        return Err(e);
    }
    report.fenced = fenced_at.elapsed();
    for source in sources.iter_mut().filter(|s| s.new.index.is_some()) {
        match source.client.drop_moved(DropMovedRequest {}).await {
            Ok(answer) => report.rows_dropped += answer.into_inner().rows,
            Err(status) => {
                tracing::warn!(shard = %source.addr, %status, "dropping moved rows");
            }
        }
    }
    Ok(report)
}

impl Source {
    fn new_layout(&self) -> Layout {
        self.new
    }

    fn old_layout(&self) -> Layout {
        self.old
    }

    fn failed(&self, status: &tonic::Status) -> ReshardError {
        ReshardError::Shard {
            addr: self.addr.clone(),
            message: status.to_string(),
        }
    }
}

async fn connect(addr: &str) -> Result<ShardClient, ReshardError> {
    crate::connect_shard(addr).await.map_err(|e| {
        let message = match e {
            crate::PsClientError::Connect { message, .. } => message,
            other => other.to_string(),
        };
        ReshardError::Shard {
            addr: addr.to_owned(),
            message,
        }
    })
}

async fn table_names(source: &Source) -> Result<Vec<String>, ReshardError> {
    let stats = source
        .client
        .clone()
        .stats(StatsRequest {})
        .await
        .map_err(|s| source.failed(&s))?;
    Ok(stats
        .into_inner()
        .tables
        .into_iter()
        .map(|t| t.table)
        .collect())
}

/// Sets every source's fence to the layout `which` gives it; returns the dense tensors the
/// sources handed over (encoded, one per source).
async fn fence(
    sources: &mut [Source],
    which: fn(&Source) -> Layout,
) -> Result<Vec<Vec<u8>>, ReshardError> {
    let calls = sources.iter().map(|source| {
        let mut client = source.client.clone();
        let layout = Some(which(source).to_proto());
        async move {
            let answer = client.fence(FenceRequest { layout }).await;
            answer
                .map(|a| a.into_inner().dense)
                .map_err(|s| source.failed(&s))
        }
    });
    try_join_all(calls).await
}

/// Copies, from every source, the rows that moved and changed since its last copy.
async fn copy_round(
    sources: &mut [Source],
    tables: &[String],
    to: &[String],
    targets: &HashMap<String, ShardClient>,
) -> Result<u64, ReshardError> {
    let calls = sources
        .iter_mut()
        .map(|source| copy_source(source, tables, to, targets));
    Ok(try_join_all(calls).await?.into_iter().sum())
}

async fn copy_source(
    source: &mut Source,
    tables: &[String],
    to: &[String],
    targets: &HashMap<String, ShardClient>,
) -> Result<u64, ReshardError> {
    let mut copied = 0;
    for table in tables {
        let (mut part, mut parts) = (0u32, 1u32);
        while part < parts {
            let since = source
                .copied
                .get(&(table.clone(), part))
                .copied()
                .unwrap_or(0);
            let request = ExportMovedRequest {
                layout: Some(source.new.to_proto()),
                table: table.clone(),
                part,
                since_version: since,
            };
            let answer = source
                .client
                .export_moved(request)
                .await
                .map_err(|s| source.failed(&s))?
                .into_inner();
            let snapshot =
                ShardSnapshot::decode(&answer.rows).map_err(|e| ReshardError::Shard {
                    addr: source.addr.clone(),
                    message: format!("exported rows of table {table:?}: {e}"),
                })?;
            copied += import_rows(table, snapshot, to, targets).await?;
            source.copied.insert((table.clone(), part), answer.version);
            parts = answer.parts;
            part += 1;
        }
    }
    Ok(copied)
}

/// Writes each row of `snapshot` (and each eviction) on the shard of `to` that holds it.
async fn import_rows(
    table: &str,
    snapshot: ShardSnapshot,
    to: &[String],
    targets: &HashMap<String, ShardClient>,
) -> Result<u64, ReshardError> {
    let count = snapshot.keys.len() as u64;
    if count == 0 && snapshot.evicted.is_empty() {
        return Ok(0);
    }
    let shard_count = to.len() as u32;
    let calls = to.iter().enumerate().map(|(index, addr)| {
        let mut part = snapshot.clone();
        part.retain(|key| layout::key_shard(key, shard_count) == index as u32);
        let mut client = targets[addr].clone();
        async move {
            if part.keys.is_empty() && part.evicted.is_empty() {
                return Ok(());
            }
            let request = ImportRowsRequest {
                table: table.to_owned(),
                rows: part.encode(),
            };
            client
                .import_rows(request)
                .await
                .map(drop)
                .map_err(|s| ReshardError::Shard {
                    addr: addr.clone(),
                    message: s.to_string(),
                })
        }
    });
    try_join_all(calls).await?;
    Ok(count)
}

/// Hands every target the dense tensors the old shards gave up; each keeps its own.
async fn import_dense(
    handed_over: &[Vec<u8>],
    to: &[String],
    targets: &HashMap<String, ShardClient>,
) -> Result<u64, ReshardError> {
    let mut moved = 0;
    for dense in handed_over.iter().filter(|d| !d.is_empty()) {
        let calls = to.iter().enumerate().map(|(index, addr)| {
            let mut client = targets[addr].clone();
            let request = ImportDenseRequest {
                dense: dense.clone(),
                layout: Some(
                    Layout {
                        shard_count: to.len() as u32,
                        index: Some(index as u32),
                    }
                    .to_proto(),
                ),
            };
            async move {
                client
                    .import_dense(request)
                    .await
                    .map(|a| a.into_inner().tensors)
                    .map_err(|s| ReshardError::Shard {
                        addr: addr.clone(),
                        message: s.to_string(),
                    })
            }
        });
        moved += try_join_all(calls).await?.into_iter().sum::<u64>();
    }
    Ok(moved)
}
