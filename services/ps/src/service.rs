//! The ParameterServer RPCs over this process's tables.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use primus_batch::hash::KeyMap;
use primus_embedding::{DenseError, DenseStore, DenseValues, EmbeddingError, ShardSnapshot, Table};
use primus_proto::v1::parameter_server_server::ParameterServer;
use primus_proto::v1::{
    AwaitSnapshotRequest, DenseTensor, DropMovedRequest, DropMovedResponse, ExportDeltaRequest,
    ExportDeltaResponse, ExportMovedRequest, ExportMovedResponse, FenceRequest, FenceResponse,
    ImportDenseRequest, ImportDenseResponse, ImportRowsRequest, ImportRowsResponse,
    InitDenseRequest, InitDenseResponse, LookupRequest, LookupResponse, LookupTablesRequest,
    LookupTablesResponse, OpenRequest, OpenResponse, PullDenseRequest, PullDenseResponse,
    PushDenseRequest, PushDenseResponse, PushRequest, PushResponse, PushTablesRequest,
    PushTablesResponse, ReadRowsRequest, ReadRowsResponse, RestoreRequest, RestoreResponse,
    SetMemoryLimitRequest, SetMemoryLimitResponse, SnapshotRequest, SnapshotResponse, StatsRequest,
    StatsResponse, TableDelta, TableStats,
};
use primus_ps_client::Layout;
use tonic::{Request, Response, Status};

use primus_config::StorageSettings;

use crate::applied::{AppliedMinibatches, call_identity};
use crate::snapshots;
use crate::tables::Tables;
use primus_proto::packed::{decode_f32, decode_keys, encode_f32, encode_keys};

pub(crate) struct Ps {
    tables: Arc<Tables>,
    dense: Arc<DenseStore>,
    storage: StorageSettings,
    /// Set by Fence while the Job is resharded: calls touching what this layout places on
    /// another shard are refused. Every read and write holds it shared while it runs, so a
    /// fence waits for the calls in flight and nothing changes a moved row after it.
    fence: RwLock<Option<Layout>>,
    /// `ps.memory_limit_bytes` as it is now (0: none); the memory limiter reads it.
    memory_limit: Arc<AtomicU64>,
    /// Training calls are served (false with `ps.await_restore` until Restore or Open).
    open: AtomicBool,
    /// Snapshots copied and still being written.
    writes: snapshots::Writes,
    /// Minibatches whose table gradients, and whose dense gradients, were applied here.
    applied_tables: AppliedMinibatches,
    applied_dense: AppliedMinibatches,
}

impl Ps {
    pub(crate) fn new(
        tables: Arc<Tables>,
        dense: Arc<DenseStore>,
        storage: StorageSettings,
        memory_limit: Arc<AtomicU64>,
        await_restore: bool,
    ) -> Self {
        Self {
            tables,
            dense,
            storage,
            fence: RwLock::new(None),
            memory_limit,
            open: AtomicBool::new(!await_restore),
            writes: snapshots::Writes::default(),
            applied_tables: AppliedMinibatches::default(),
            applied_dense: AppliedMinibatches::default(),
        }
    }

    /// The shard's rows and dense tensors were replaced: what was applied before may come again.
    fn forget_applied(&self) {
        self.applied_tables.forget_all();
        self.applied_dense.forget_all();
    }

    /// UNAVAILABLE until this shard is open for training: a caller holds its call and
    /// tries again, so nothing lands on rows a restore is about to replace.
    fn opened(&self) -> Result<(), Status> {
        match self.open.load(Ordering::Acquire) {
            true => Ok(()),
            false => Err(Status::unavailable(
                "this PS shard waits for its restore from the Job's checkpoint (ps.await_restore)",
            )),
        }
    }

    /// The fence, held shared, once the shard is open.
    fn training_fence(&self) -> Result<RwLockReadGuard<'_, Option<Layout>>, Status> {
        self.opened()?;
        Ok(self.fence.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The fence, held shared, if no key of `keys` moved away.
    fn keys_here(&self, keys: &[u64]) -> Result<RwLockReadGuard<'_, Option<Layout>>, Status> {
        let fence = self.training_fence()?;
        if let Some(layout) = *fence
            && let Some(key) = keys.iter().find(|k| !layout.holds_key(**k))
        {
            return Err(moved(&layout, &format!("key {key}")));
        }
        Ok(fence)
    }

    /// The fence, held shared, if no key of any of `tables` moved away.
    fn all_keys_here<'a>(
        &self,
        mut tables: impl Iterator<Item = &'a [u64]>,
    ) -> Result<RwLockReadGuard<'_, Option<Layout>>, Status> {
        let fence = self.training_fence()?;
        if let Some(layout) = *fence
            && let Some(key) = tables.find_map(|keys| keys.iter().find(|k| !layout.holds_key(**k)))
        {
            return Err(moved(&layout, &format!("key {key}")));
        }
        Ok(fence)
    }

    /// The fence, held shared, if no tensor of `names` moved away.
    fn dense_here<'a>(
        &self,
        mut names: impl Iterator<Item = &'a str>,
    ) -> Result<RwLockReadGuard<'_, Option<Layout>>, Status> {
        let fence = self.training_fence()?;
        if let Some(layout) = *fence
            && let Some(name) = names.find(|n| !layout.holds_dense(n))
        {
            return Err(moved(&layout, &format!("dense tensor {name:?}")));
        }
        Ok(fence)
    }
}

/// `keys`' rows of `table`, in request order.
fn rows_of(table: &Table, keys: &[u64]) -> Result<LookupResponse, Status> {
    // Duplicates are looked up once, then copied to every position that asked.
    let (unique, positions) = dedup(keys);
    let dim = table.dim();
    let mut rows = vec![0.0f32; unique.len() * dim];
    table.lookup(&unique, &mut rows).map_err(table_status)?;
    let mut out = Vec::with_capacity(keys.len() * dim * 4);
    for &p in &positions {
        encode_f32(&rows[p * dim..(p + 1) * dim], &mut out);
    }
    Ok(LookupResponse {
        dim: dim as u32,
        rows: out.into(),
    })
}

/// Applies `grads` to `table` (called `name`).
fn push_to(name: &str, table: &Table, keys: &[u64], grads: &[f32]) -> Result<PushResponse, Status> {
    let span = tracing::info_span!(
        "ps.push",
        primus.table = %name,
        primus.keys = keys.len(),
        primus.applied = tracing::field::Empty,
        primus.dropped = tracing::field::Empty,
    );
    let outcome = span
        .in_scope(|| table.push(keys, grads, primus_spec::time::unix_secs()))
        .map_err(table_status)?;
    span.record("primus.applied", outcome.applied);
    span.record("primus.dropped", outcome.dropped);
    Ok(PushResponse {
        applied: outcome.applied,
        dropped: outcome.dropped,
        refused: outcome.refused,
    })
}

/// ABORTED with the metadata a client follows to the new shard list.
fn moved(layout: &Layout, what: &str) -> Status {
    let mut status = Status::aborted(format!(
        "{what} moved to another PS shard (the Job now has {} shards)",
        layout.shard_count
    ));
    status.metadata_mut().insert(
        primus_ps_client::MOVED_METADATA,
        tonic::metadata::MetadataValue::from(layout.shard_count),
    );
    status
}

fn layout_status(error: primus_ps_client::layout::LayoutError) -> Status {
    Status::invalid_argument(error.to_string())
}

fn snapshot_response(taken: snapshots::Taken) -> SnapshotResponse {
    SnapshotResponse {
        manifest_uri: taken.manifest_uri,
        version: taken.version,
        rows: taken.rows,
    }
}

#[tonic::async_trait]
impl ParameterServer for Ps {
    async fn lookup(
        &self,
        request: Request<LookupRequest>,
    ) -> Result<Response<LookupResponse>, Status> {
        let request = request.into_inner();
        let table = self.tables.get(&request.table)?;
        let keys = decode_keys("keys", &request.keys)?;
        let _span = tracing::info_span!(
            "ps.lookup",
            primus.table = %request.table,
            primus.keys = keys.len(),
        )
        .entered();
        let fence = self.keys_here(&keys)?;
        let rows = rows_of(table, &keys)?;
        drop(fence);
        Ok(Response::new(rows))
    }

    async fn lookup_tables(
        &self,
        request: Request<LookupTablesRequest>,
    ) -> Result<Response<LookupTablesResponse>, Status> {
        let requests = request.into_inner().tables;
        let _span =
            tracing::info_span!("ps.lookup_tables", primus.tables = requests.len()).entered();
        let mut asked = Vec::with_capacity(requests.len());
        for (i, request) in requests.iter().enumerate() {
            let table = self.tables.get(&request.table)?;
            let keys = decode_keys(&format!("tables[{i}].keys"), &request.keys)?;
            asked.push((table, keys));
        }
        let fence = self.all_keys_here(asked.iter().map(|(_, keys)| keys.as_slice()))?;
        let tables = asked
            .iter()
            .map(|(table, keys)| rows_of(table, keys))
            .collect::<Result<_, _>>()?;
        drop(fence);
        Ok(Response::new(LookupTablesResponse { tables }))
    }

    async fn read_rows(
        &self,
        request: Request<ReadRowsRequest>,
    ) -> Result<Response<ReadRowsResponse>, Status> {
        let request = request.into_inner();
        let table = self.tables.get(&request.table)?;
        let keys = decode_keys("keys", &request.keys)?;
        let _span = tracing::info_span!(
            "ps.read_rows",
            primus.table = %request.table,
            primus.keys = keys.len(),
        )
        .entered();
        let fence = self.keys_here(&keys)?;
        let (found, rows) = table.read_rows(&keys).map_err(table_status)?;
        drop(fence);
        let mut values = Vec::with_capacity(rows.len() * 4);
        encode_f32(&rows, &mut values);
        Ok(Response::new(ReadRowsResponse {
            dim: table.dim() as u32,
            stride: table.row_width() as u32,
            keys: encode_keys(&found),
            values,
        }))
    }

    async fn push(&self, request: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        let request = request.into_inner();
        let table = self.tables.get(&request.table)?;
        let keys = decode_keys("keys", &request.keys)?;
        let grads = decode_f32("grads", &request.grads)?;
        let fence = self.keys_here(&keys)?;
        let pushed = push_to(&request.table, table, &keys, &grads)?;
        drop(fence);
        self.tables.record_push();
        Ok(Response::new(pushed))
    }

    async fn push_tables(
        &self,
        request: Request<PushTablesRequest>,
    ) -> Result<Response<PushTablesResponse>, Status> {
        let PushTablesRequest {
            tables: requests,
            then_lookup,
            minibatch,
        } = request.into_inner();
        let span = tracing::info_span!(
            "ps.push_tables",
            primus.tables = requests.len(),
            primus.then_lookup = then_lookup.len(),
            primus.version = tracing::field::Empty,
        )
        .entered();
        let mut pushed = Vec::with_capacity(requests.len());
        for (i, request) in requests.iter().enumerate() {
            let table = self.tables.get(&request.table)?;
            let keys = decode_keys(&format!("tables[{i}].keys"), &request.keys)?;
            let grads = decode_f32(&format!("tables[{i}].grads"), &request.grads)?;
            table
                .check_push(&keys, &grads)
                .map_err(|e| Status::invalid_argument(format!("tables[{i}]: {e}")))?;
            pushed.push((request.table.as_str(), table, keys, grads));
        }
        let mut asked = Vec::with_capacity(then_lookup.len());
        for (i, request) in then_lookup.iter().enumerate() {
            let table = self.tables.get(&request.table)?;
            let keys = decode_keys(&format!("then_lookup[{i}].keys"), &request.keys)?;
            asked.push((table, keys));
        }
        // Checked whole, then applied under one hold of the fence: a shard that refuses
        // moved keys has applied none of the call, and the rows read after see every push.
        let all_keys = (pushed.iter().map(|(_, _, keys, _)| keys.as_slice()))
            .chain(asked.iter().map(|(_, keys)| keys.as_slice()));
        let fence = self.all_keys_here(all_keys)?;
        let call = call_identity(
            minibatch,
            (pushed.iter()).map(|(name, _, keys, _)| (*name, keys.as_slice())),
        );
        let repeated = !self.applied_tables.claim(call);
        let tables = if repeated {
            tracing::info!(
                minibatch,
                "a minibatch's table gradients came again: applied once"
            );
            vec![PushResponse::default(); pushed.len()]
        } else {
            let applied = (pushed.iter())
                .map(|(name, table, keys, grads)| push_to(name, table, keys, grads))
                .collect::<Result<_, _>>();
            applied.inspect_err(|_| self.applied_tables.release(call))?
        };
        let looked_up = asked
            .iter()
            .map(|(table, keys)| rows_of(table, keys))
            .collect::<Result<_, _>>()?;
        drop(fence);
        // Serving holds these rows once it holds this version of the shard.
        span.record("primus.version", self.tables.version());
        self.tables.record_push();
        Ok(Response::new(PushTablesResponse {
            tables,
            looked_up,
            repeated,
        }))
    }

    async fn init_dense(
        &self,
        request: Request<InitDenseRequest>,
    ) -> Result<Response<InitDenseResponse>, Status> {
        let tensors = decode_tensors(request.into_inner().tensors)?;
        let fence = self.dense_here(tensors.iter().map(|t| t.name.as_str()))?;
        let created = self.dense.init(&tensors).map_err(dense_status)?;
        drop(fence);
        let (_, version) = self.dense.pull(&[]).map_err(dense_status)?;
        Ok(Response::new(InitDenseResponse { created, version }))
    }

    async fn pull_dense(
        &self,
        request: Request<PullDenseRequest>,
    ) -> Result<Response<PullDenseResponse>, Status> {
        let PullDenseRequest { names, with_state } = request.into_inner();
        let fence = self.dense_here(names.iter().map(String::as_str))?;
        if with_state {
            let (state, version) = self.dense.export(&names).map_err(dense_status)?;
            drop(fence);
            let optimizer_json = serde_json::to_string(self.dense.optimizer())
                .map_err(|e| Status::internal(format!("the dense optimizer: {e}")))?;
            return Ok(Response::new(PullDenseResponse {
                tensors: Vec::new(),
                version,
                state,
                optimizer_json,
            }));
        }
        let (tensors, version) = self.dense.pull(&names).map_err(dense_status)?;
        drop(fence);
        let tensors = tensors
            .into_iter()
            .map(|t| {
                let mut values = Vec::with_capacity(t.values.len() * 4);
                encode_f32(&t.values, &mut values);
                DenseTensor {
                    name: t.name,
                    shape: t.shape,
                    values: values.into(),
                }
            })
            .collect();
        Ok(Response::new(PullDenseResponse {
            tensors,
            version,
            ..Default::default()
        }))
    }

    async fn push_dense(
        &self,
        request: Request<PushDenseRequest>,
    ) -> Result<Response<PushDenseResponse>, Status> {
        let PushDenseRequest { grads, minibatch } = request.into_inner();
        let grads = decode_tensors(grads)?;
        let fence = self.dense_here(grads.iter().map(|g| g.name.as_str()))?;
        let call = call_identity(minibatch, grads.iter().map(|g| (g.name.as_str(), &[][..])));
        if !self.applied_dense.claim(call) {
            tracing::info!(
                minibatch,
                "a minibatch's dense gradients came again: applied once"
            );
            return Ok(Response::new(PushDenseResponse {
                version: self.dense.version(),
                repeated: true,
            }));
        }
        let pushed = self.dense.push(&grads).map_err(dense_status);
        let version = pushed.inspect_err(|_| self.applied_dense.release(call))?;
        drop(fence);
        Ok(Response::new(PushDenseResponse {
            version,
            repeated: false,
        }))
    }

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotResponse>, Status> {
        self.opened()?;
        let request = request.into_inner();
        let copied = snapshots::copy(
            self.tables.clone(),
            &self.dense,
            &self.storage,
            &request.base_manifest_uri,
        )
        .await?;
        let (version, rows) = (copied.version(), copied.rows());
        if request.in_background {
            tracing::info!(uri = %request.uri, version, rows, "snapshot copied; writing it in the background");
            let storage = self.storage.clone();
            let (uri, base) = (request.uri, request.base_manifest_uri);
            self.writes.start(copied, storage, uri, base);
            return Ok(Response::new(SnapshotResponse {
                manifest_uri: String::new(),
                version,
                rows,
            }));
        }
        let taken = snapshots::write(
            copied,
            &self.storage,
            &request.uri,
            &request.base_manifest_uri,
        )
        .await?;
        tracing::info!(manifest = %taken.manifest_uri, version, rows, "snapshot written");
        Ok(Response::new(snapshot_response(taken)))
    }

    async fn await_snapshot(
        &self,
        request: Request<AwaitSnapshotRequest>,
    ) -> Result<Response<SnapshotResponse>, Status> {
        let taken = self.writes.wait(&request.into_inner().uri).await?;
        Ok(Response::new(snapshot_response(taken)))
    }

    async fn restore(
        &self,
        request: Request<RestoreRequest>,
    ) -> Result<Response<RestoreResponse>, Status> {
        let request = request.into_inner();
        let layout = match &request.layout {
            None => None,
            Some(layout) => Some(Layout::from_proto(Some(layout)).map_err(layout_status)?),
        };
        let manifest_uri = request.manifest_uri.clone();
        let manifests: Vec<String> = std::iter::once(request.manifest_uri)
            .chain(request.more_manifest_uris)
            .collect();
        let (version, rows) = snapshots::restore(
            self.tables.clone(),
            self.dense.clone(),
            &self.storage,
            &manifests,
            layout,
        )
        .await?;
        self.forget_applied();
        tracing::info!(manifest = %manifest_uri, version, rows, "restored");
        self.open.store(true, Ordering::Release);
        Ok(Response::new(RestoreResponse { version, rows }))
    }

    async fn open(&self, request: Request<OpenRequest>) -> Result<Response<OpenResponse>, Status> {
        if request.into_inner().empty {
            let replacing = self.tables.replacing_rows().await;
            let fence = self.fence.write().unwrap_or_else(PoisonError::into_inner);
            for (_, table) in self.tables.iter() {
                table.clear();
            }
            drop(replacing);
            let tensors = self.dense.forget(|_| false);
            self.forget_applied();
            drop(fence);
            tracing::info!(tensors, "every row and dense tensor dropped");
        }
        if !self.open.swap(true, Ordering::AcqRel) {
            tracing::info!("open for training without a restore");
        }
        Ok(Response::new(OpenResponse {}))
    }

    async fn export_delta(
        &self,
        request: Request<ExportDeltaRequest>,
    ) -> Result<Response<ExportDeltaResponse>, Status> {
        // A shard awaiting its restore holds none of its rows yet: a delta of it would tell
        // serving that every change up to now is held.
        self.opened()?;
        let request = request.into_inner();
        let since = request.since_version;
        let mut response = ExportDeltaResponse::default();
        let exporting = self.tables.exporting().await;
        for (name, table) in self.tables.iter() {
            let delta = table.export_delta(since).map_err(table_status)?;
            // Every table shares the version sequence; the smallest watermark is safe for all.
            response.version = if response.tables.is_empty() {
                delta.version
            } else {
                response.version.min(delta.version)
            };
            let mut rows = Vec::with_capacity(delta.weights.len() * 4);
            encode_f32(&delta.weights, &mut rows);
            response.tables.push(TableDelta {
                table: name.to_owned(),
                dim: table.dim() as u32,
                keys: encode_keys(&delta.keys),
                rows,
                evicted_keys: encode_keys(&delta.evicted),
                versions: encode_keys(&delta.versions),
                evicted_versions: encode_keys(&delta.evicted_versions),
                update_counts: if request.update_counts {
                    encode_keys(&delta.update_counts)
                } else {
                    Vec::new()
                },
            });
        }
        drop(exporting);
        Ok(Response::new(response))
    }

    async fn stats(
        &self,
        _request: Request<StatsRequest>,
    ) -> Result<Response<StatsResponse>, Status> {
        let tables: Vec<TableStats> = self
            .tables
            .iter()
            .map(|(name, table)| {
                let stats = table.stats();
                TableStats {
                    table: name.to_owned(),
                    rows: stats.rows,
                    bytes: stats.bytes,
                    admitted: stats.admitted,
                    rejected: stats.rejected,
                    evicted: stats.evicted,
                    dim: table.dim() as u32,
                    missing_reads: stats.missing_reads,
                    change_scans: stats.change_scans,
                    refused: stats.refused,
                }
            })
            .collect();
        Ok(Response::new(StatsResponse {
            memory_bytes: tables.iter().map(|t| t.bytes).sum::<u64>() + self.dense.bytes(),
            memory_limit_bytes: self.memory_limit.load(Ordering::Acquire),
            tables,
        }))
    }

    async fn export_moved(
        &self,
        request: Request<ExportMovedRequest>,
    ) -> Result<Response<ExportMovedResponse>, Status> {
        let request = request.into_inner();
        let layout = Layout::from_proto(request.layout.as_ref()).map_err(layout_status)?;
        let table = self.tables.get(&request.table)?;
        let parts = table.shard_count() as u32;
        if request.part >= parts {
            return Err(Status::invalid_argument(format!(
                "part: {} is not below the table's {parts} parts",
                request.part
            )));
        }
        let mut snapshot = table
            .snapshot_shard(request.part as usize, request.since_version)
            .map_err(table_status)?;
        snapshot.retain(|key| !layout.holds_key(key));
        Ok(Response::new(ExportMovedResponse {
            rows: snapshot.encode(),
            parts,
            version: snapshot.version,
        }))
    }

    async fn import_rows(
        &self,
        request: Request<ImportRowsRequest>,
    ) -> Result<Response<ImportRowsResponse>, Status> {
        let request = request.into_inner();
        let table = self.tables.get(&request.table)?;
        let snapshot = ShardSnapshot::decode(&request.rows)
            .map_err(|e| Status::invalid_argument(format!("rows: {e}")))?;
        let rows = table
            .restore_shard(&snapshot)
            .map_err(|e| Status::invalid_argument(format!("rows: {e}")))?;
        Ok(Response::new(ImportRowsResponse { rows: rows as u64 }))
    }

    async fn fence(
        &self,
        request: Request<FenceRequest>,
    ) -> Result<Response<FenceResponse>, Status> {
        let layout =
            Layout::from_proto(request.into_inner().layout.as_ref()).map_err(layout_status)?;
        let mut fence = self.fence.write().unwrap_or_else(PoisonError::into_inner);
        *fence = Some(layout);
        let version = self.tables.version();
        let moved_any = self
            .dense
            .pull(&[])
            .map_err(dense_status)?
            .0
            .iter()
            .any(|t| !layout.holds_dense(&t.name));
        let dense = if moved_any {
            self.dense.encode_where(|name| !layout.holds_dense(name))
        } else {
            Vec::new()
        };
        drop(fence);
        tracing::info!(shards = layout.shard_count, index = ?layout.index, version, "fenced");
        Ok(Response::new(FenceResponse { version, dense }))
    }

    async fn import_dense(
        &self,
        request: Request<ImportDenseRequest>,
    ) -> Result<Response<ImportDenseResponse>, Status> {
        let request = request.into_inner();
        let layout = Layout::from_proto(request.layout.as_ref()).map_err(layout_status)?;
        let tensors = self
            .dense
            .merge_where(&request.dense, |name| layout.holds_dense(name))
            .map_err(|e| Status::invalid_argument(format!("dense: {e}")))?;
        Ok(Response::new(ImportDenseResponse {
            tensors: tensors as u64,
        }))
    }

    async fn set_memory_limit(
        &self,
        request: Request<SetMemoryLimitRequest>,
    ) -> Result<Response<SetMemoryLimitResponse>, Status> {
        let bytes = request.into_inner().bytes;
        let before = self.memory_limit.swap(bytes, Ordering::AcqRel);
        tracing::info!(before, bytes, "memory limit changed");
        Ok(Response::new(SetMemoryLimitResponse {}))
    }

    async fn drop_moved(
        &self,
        _request: Request<DropMovedRequest>,
    ) -> Result<Response<DropMovedResponse>, Status> {
        let Some(layout) = *self.fence.read().unwrap_or_else(PoisonError::into_inner) else {
            return Err(Status::failed_precondition(
                "no fence set: nothing is known to have moved",
            ));
        };
        let tables = self.tables.clone();
        let rows = tokio::task::spawn_blocking(move || {
            tables
                .iter()
                .map(|(_, table)| table.forget(|key| layout.holds_key(key)))
                .sum::<usize>()
        })
        .await
        .map_err(|e| Status::internal(format!("dropping moved rows: {e}")))?;
        let tensors = self.dense.forget(|name| layout.holds_dense(name));
        tracing::info!(rows, tensors, "dropped what moved to other shards");
        Ok(Response::new(DropMovedResponse {
            rows: rows as u64,
            tensors: tensors as u64,
        }))
    }
}

/// Unique keys in first-seen order, and for each request position its unique index.
fn dedup(keys: &[u64]) -> (Vec<u64>, Vec<usize>) {
    let mut seen: KeyMap<usize> = KeyMap::with_capacity_and_hasher(keys.len(), Default::default());
    let mut unique = Vec::with_capacity(keys.len());
    let positions = keys
        .iter()
        .map(|key| {
            *seen.entry(*key).or_insert_with(|| {
                unique.push(*key);
                unique.len() - 1
            })
        })
        .collect();
    (unique, positions)
}

fn decode_tensors(tensors: Vec<DenseTensor>) -> Result<Vec<DenseValues>, Status> {
    tensors
        .into_iter()
        .map(|t| {
            let values = decode_f32(&format!("dense tensor {:?} values", t.name), &t.values)?;
            Ok(DenseValues {
                name: t.name,
                shape: t.shape,
                values,
            })
        })
        .collect()
}

fn dense_status(error: DenseError) -> Status {
    match error {
        DenseError::Unknown(_) => Status::not_found(error.to_string()),
        DenseError::Shape { .. } => Status::failed_precondition(error.to_string()),
        DenseError::Size { .. } | DenseError::NonFinite { .. } => {
            Status::invalid_argument(error.to_string())
        }
    }
}

/// A device fault is the PS's (INTERNAL); anything else is the caller's input.
fn table_status(error: EmbeddingError) -> Status {
    match error {
        EmbeddingError::Device { .. } => Status::internal(error.to_string()),
        _ => Status::invalid_argument(error.to_string()),
    }
}
