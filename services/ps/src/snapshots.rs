//! Snapshots of every table of this PS in an object store:
//! `<uri>/<full-V | incr-S-V>/<table>/shard-<i>.bin` plus `manifest.json` beside them,
//! naming the version, the base (for incrementals) and each file's size and CRC32. A
//! snapshot is copied in memory at one moment ([`copy`]) and written after ([`write`]),
//! for a flash checkpoint in a task of its own ([`Writes`]) while training goes on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use primus_config::StorageSettings;
use primus_embedding::{DenseStore, ShardSnapshot};
use primus_storage::{Location, StorageError};
use rayon::iter::{IntoParallelIterator, ParallelIterator};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tonic::Status;

use crate::tables::Tables;
use primus_ps_client::Layout;

const MANIFEST: &str = "manifest.json";
const DENSE: &str = "dense.bin";
const FORMAT: u32 = 1;
/// Incrementals followed back to their full snapshot at most this deep.
const MAX_CHAIN: usize = 256;
/// Shard files of one snapshot written at once.
const CONCURRENT_WRITES: usize = 16;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: u32,
    /// Every change up to this version is in this snapshot (with its bases).
    version: u64,
    /// Rows changed after this version are in it (0: full).
    since: u64,
    /// The manifest this one is incremental to.
    base: Option<String>,
    tables: Vec<TableEntry>,
    /// Every dense tensor with its optimizer state (always whole: it is small).
    dense: ShardFile,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableEntry {
    name: String,
    dim: u32,
    shards: Vec<ShardFile>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShardFile {
    /// Relative to the manifest's folder.
    path: String,
    rows: u64,
    bytes: u64,
    crc32: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Taken {
    pub manifest_uri: String,
    pub version: u64,
    pub rows: u64,
}

/// Every table's rows (those changed since `since`) and the dense tensors, copied at one
/// moment; written by [`write`].
pub(crate) struct Copied {
    since: u64,
    version: u64,
    rows: u64,
    dense: Vec<u8>,
    tables: Vec<(String, u32, Vec<ShardSnapshot>)>,
}

impl Copied {
    /// Every change up to this version is in the copy.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// Rows copied.
    pub(crate) fn rows(&self) -> u64 {
        self.rows
    }
}

/// Copies what a snapshot incremental to `base_manifest` (empty: full) holds.
pub(crate) async fn copy(
    tables: Arc<Tables>,
    dense: &DenseStore,
    storage: &StorageSettings,
    base_manifest: &str,
) -> Result<Copied, Status> {
    let since = if base_manifest.is_empty() {
        0
    } else {
        read_manifest(storage, base_manifest).await?.1.version
    };
    let dense = dense.encode();
    // Copying rows holds shard read locks: off the async workers, the shards of a table
    // on every core (training waits for the copy).
    let tables = tokio::task::spawn_blocking(move || {
        tables
            .iter()
            .map(|(name, table)| {
                let shards = (0..table.shard_count())
                    .into_par_iter()
                    .map(|shard| table.snapshot_shard(shard, since))
                    .collect::<Result<Vec<ShardSnapshot>, _>>()
                    .map_err(|e| Status::internal(e.to_string()))?;
                Ok((name.to_owned(), table.dim() as u32, shards))
            })
            .collect::<Result<Vec<_>, Status>>()
    })
    .await
    .map_err(|e| Status::internal(format!("snapshot task: {e}")))??;
    let shards = || tables.iter().flat_map(|(_, _, shards)| shards.iter());
    Ok(Copied {
        since,
        version: shards().map(|s| s.version).min().unwrap_or(0),
        rows: shards().map(|s| s.keys.len() as u64).sum(),
        dense,
        tables,
    })
}

/// Writes `copied` under `uri` (its base manifest: `base_manifest`), the manifest last.
pub(crate) async fn write(
    copied: Copied,
    storage: &StorageSettings,
    uri: &str,
    base_manifest: &str,
) -> Result<Taken, Status> {
    let Copied {
        since,
        version,
        rows,
        dense,
        tables,
    } = copied;
    let folder_name = if since == 0 {
        format!("full-{version}")
    } else {
        format!("incr-{since}-{version}")
    };
    let folder = open(
        storage,
        &format!("{}/{folder_name}", uri.trim_end_matches('/')),
    )?;
    let dense_file = ShardFile {
        path: DENSE.into(),
        rows: 0,
        bytes: dense.len() as u64,
        crc32: crc32fast::hash(&dense),
    };
    folder
        .put(&folder.path(DENSE), Bytes::from(dense))
        .await
        .map_err(storage_status)?;
    let mut manifest = Manifest {
        format: FORMAT,
        version,
        since,
        base: (!base_manifest.is_empty()).then(|| base_manifest.to_owned()),
        tables: Vec::new(),
        dense: dense_file,
    };
    // Shard files are written several at a time: on HDFS and S3 each file costs round
    // trips (a block pipeline, a PUT) that one after another dominate the write.
    let headers: Vec<(String, u32)> = (tables.iter())
        .map(|(name, dim, _)| (name.clone(), *dim))
        .collect();
    let files = (tables.into_iter().enumerate())
        .flat_map(|(table, (name, _, shards))| {
            shards
                .into_iter()
                .map(move |shard| (table, name.clone(), shard))
        })
        .map(|(table, name, shard)| write_shard(folder.clone(), table, name, shard));
    let written: Vec<(usize, ShardFile)> = futures::stream::iter(files)
        .buffered(CONCURRENT_WRITES)
        .try_collect()
        .await?;
    for (table, (name, dim)) in headers.into_iter().enumerate() {
        manifest.tables.push(TableEntry {
            name,
            dim,
            shards: (written.iter())
                .filter(|(of, _)| *of == table)
                .map(|(_, file)| file.clone())
                .collect(),
        });
    }
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Status::internal(format!("encoding the manifest: {e}")))?;
    let manifest_path = folder.path(MANIFEST);
    // The manifest goes last: a snapshot without one was never completed.
    folder
        .put(&manifest_path, Bytes::from(json))
        .await
        .map_err(storage_status)?;
    Ok(Taken {
        manifest_uri: folder.url_of(&manifest_path),
        version,
        rows,
    })
}

/// Writes one shard's file of table number `table` under `folder`; what the manifest says
/// of it.
async fn write_shard(
    folder: Location,
    table: usize,
    name: String,
    shard: ShardSnapshot,
) -> Result<(usize, ShardFile), Status> {
    let bytes = shard.encode();
    let path = format!("{name}/shard-{}.bin", shard.shard);
    let file = ShardFile {
        path: path.clone(),
        rows: shard.keys.len() as u64,
        bytes: bytes.len() as u64,
        crc32: crc32fast::hash(&bytes),
    };
    folder
        .put(&folder.path(&path), Bytes::from(bytes))
        .await
        .map_err(storage_status)?;
    Ok((table, file))
}

/// A background write: `None` until it ended.
type Written = watch::Receiver<Option<Result<Taken, Status>>>;

/// Snapshots copied and being written in the background (flash checkpoints), by the
/// folder URI they were asked for under.
#[derive(Default)]
pub(crate) struct Writes {
    running: Mutex<HashMap<String, Written>>,
}

impl Writes {
    /// Writes `copied` under `uri` in a task of its own.
    pub(crate) fn start(
        &self,
        copied: Copied,
        storage: StorageSettings,
        uri: String,
        base_manifest: String,
    ) {
        let (done, written) = watch::channel(None);
        self.lock().insert(uri.clone(), written);
        tokio::spawn(async move {
            let result = write(copied, &storage, &uri, &base_manifest).await;
            match &result {
                Ok(taken) => {
                    tracing::info!(manifest = %taken.manifest_uri, version = taken.version, rows = taken.rows, "snapshot written")
                }
                Err(status) => tracing::warn!(%uri, %status, "writing a snapshot"),
            }
            done.send_replace(Some(result));
        });
    }

    /// The snapshot started under `uri`, once written (or why it was not).
    pub(crate) async fn wait(&self, uri: &str) -> Result<Taken, Status> {
        let mut written = self.lock().get(uri).cloned().ok_or_else(|| {
            Status::not_found(format!(
                "uri: no snapshot of {uri} is being written by this shard"
            ))
        })?;
        let result = written
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Status::aborted(format!("uri: the write of {uri} was dropped")))?
            .clone()
            .unwrap_or_else(|| Err(Status::internal("a finished write without a result")));
        self.lock().remove(uri);
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Replaces every table's rows with the snapshots at `manifest_uris` (and their bases):
/// one, or with `layout` every shard's snapshot of a checkpoint taken with another shard
/// count, of which only what `layout` places here is kept. Returns (version, rows written).
pub(crate) async fn restore(
    tables: Arc<Tables>,
    dense: Arc<DenseStore>,
    storage: &StorageSettings,
    manifest_uris: &[String],
    layout: Option<Layout>,
) -> Result<(u64, u64), Status> {
    if manifest_uris.len() > 1 && layout.is_none() {
        return Err(Status::invalid_argument(
            "layout: required to restore from more than one manifest",
        ));
    }
    // Read and verify every file before touching a table.
    let mut loaded = Vec::new();
    let mut denses = Vec::new();
    let mut version = 0;
    for manifest_uri in manifest_uris {
        let dim_of = |name: &str| tables.get(name).ok().map(|table| table.dim());
        let chain = load_chain(dim_of, storage, manifest_uri).await?;
        version = version.max(chain.version);
        loaded.extend(chain.shards);
        denses.push(chain.dense);
    }
    let rows = tokio::task::spawn_blocking(move || {
        let keeps_key = |key: u64| layout.is_none_or(|l| l.holds_key(key));
        let keeps_dense = |name: &str| layout.is_none_or(|l| l.holds_dense(name));
        // First the part that can still refuse (an optimizer that keeps other state).
        for (i, bytes) in denses.iter().enumerate() {
            let restored = if i == 0 {
                dense.restore_where(bytes, keeps_dense)
            } else {
                dense.merge_where(bytes, keeps_dense)
            };
            restored.map_err(|e| Status::failed_precondition(format!("{DENSE}: {e}")))?;
        }
        let _replacing = tables.replacing_rows_blocking();
        for (_, table) in tables.iter() {
            table.clear();
        }
        let mut rows = 0u64;
        for (name, mut shard) in loaded {
            if layout.is_some() {
                shard.retain(keeps_key);
            }
            rows += tables
                .get(&name)?
                .restore_shard(&shard)
                .map_err(|e| Status::failed_precondition(format!("table {name:?}: {e}")))?
                as u64;
        }
        Ok::<_, Status>(rows)
    })
    .await
    .map_err(|e| Status::internal(format!("restore task: {e}")))??;
    Ok((version, rows))
}

/// A snapshot with its chain of bases, read and verified: shards oldest first, the newest
/// dense parameters, the newest version.
pub(crate) struct Chain {
    pub shards: Vec<(String, ShardSnapshot)>,
    pub dense: Bytes,
    pub version: u64,
}

/// The snapshot at `manifest_uri` with its bases, for a holder whose table `name` has
/// `dim_of(name)` weights per row (None: it holds no such table).
pub(crate) async fn load_chain(
    dim_of: impl Fn(&str) -> Option<usize>,
    storage: &StorageSettings,
    manifest_uri: &str,
) -> Result<Chain, Status> {
    // The chain, newest first, back to the full snapshot.
    let mut chain = vec![read_manifest(storage, manifest_uri).await?];
    while let Some(base) = chain.last().and_then(|(_, m)| m.base.clone()) {
        if chain.len() >= MAX_CHAIN {
            return Err(Status::failed_precondition(format!(
                "{manifest_uri}: more than {MAX_CHAIN} incremental snapshots back to a full one"
            )));
        }
        chain.push(read_manifest(storage, &base).await?);
    }
    let mut shards = Vec::new();
    for (folder, manifest) in chain.iter().rev() {
        for entry in &manifest.tables {
            let dim = dim_of(&entry.name).ok_or_else(|| {
                Status::failed_precondition(format!(
                    "snapshot {}: table {:?} is not held here",
                    folder.url(),
                    entry.name
                ))
            })?;
            if dim as u32 != entry.dim {
                return Err(Status::failed_precondition(format!(
                    "snapshot {}: table {:?} has dim {}, the one held here {dim}",
                    folder.url(),
                    entry.name,
                    entry.dim,
                )));
            }
            for file in &entry.shards {
                shards.push((entry.name.clone(), read_shard(folder, file).await?));
            }
        }
    }
    // Dense parameters as of the newest snapshot in the chain.
    let Some((folder, newest)) = chain.first() else {
        return Err(Status::internal("empty snapshot chain"));
    };
    Ok(Chain {
        shards,
        dense: read_verified(folder, &newest.dense).await?,
        version: newest.version,
    })
}

async fn read_shard(folder: &Location, file: &ShardFile) -> Result<ShardSnapshot, Status> {
    let bytes = read_verified(folder, file).await?;
    ShardSnapshot::decode(&bytes)
        .map_err(|e| Status::data_loss(format!("{}: {e}", folder.url_of(&folder.path(&file.path)))))
}

/// A snapshot file whose size and CRC32 match the manifest.
async fn read_verified(folder: &Location, file: &ShardFile) -> Result<Bytes, Status> {
    let path = folder.path(&file.path);
    let url = folder.url_of(&path);
    let bytes = folder.get(&path).await.map_err(storage_status)?;
    let crc = crc32fast::hash(&bytes);
    if bytes.len() as u64 != file.bytes || crc != file.crc32 {
        return Err(Status::data_loss(format!(
            "{url}: {} bytes with CRC32 {crc:08x}; the manifest says {} bytes, {:08x}",
            bytes.len(),
            file.bytes,
            file.crc32
        )));
    }
    Ok(bytes)
}

async fn read_manifest(
    storage: &StorageSettings,
    manifest_uri: &str,
) -> Result<(Location, Manifest), Status> {
    let folder_uri = manifest_uri
        .strip_suffix(MANIFEST)
        .map(|f| f.trim_end_matches('/'))
        .filter(|f| !f.is_empty())
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "manifest_uri: {manifest_uri:?} does not name a {MANIFEST}"
            ))
        })?;
    let folder = open(storage, folder_uri)?;
    let bytes = folder
        .get(&folder.path(MANIFEST))
        .await
        .map_err(storage_status)?;
    let mut input = serde_json::Deserializer::from_slice(&bytes);
    let manifest: Manifest = serde_path_to_error::deserialize(&mut input)
        .map_err(|e| Status::data_loss(format!("{manifest_uri}: {}: {}", e.path(), e.inner())))?;
    if manifest.format != FORMAT {
        return Err(Status::failed_precondition(format!(
            "{manifest_uri}: manifest format {} (this build reads {FORMAT})",
            manifest.format
        )));
    }
    Ok((folder, manifest))
}

fn open(storage: &StorageSettings, url: &str) -> Result<Location, Status> {
    primus_storage::open(url, storage).map_err(|e| Status::invalid_argument(format!("uri: {e}")))
}

fn storage_status(error: StorageError) -> Status {
    match error {
        StorageError::NotFound { .. } => Status::not_found(error.to_string()),
        StorageError::Denied { .. } => Status::permission_denied(error.to_string()),
        _ => Status::unavailable(error.to_string()),
    }
}
