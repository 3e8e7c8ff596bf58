//! The table: shards by key hash, each behind its own lock, each with a cuckoo index over a
//! chunked arena of rows. Lookups take read locks shard by shard (never one global lock);
//! a push takes each shard's write lock once per call.
//!
//! A shard's arena is a list of chunks that double in size (1,024 rows, 1,024, 2,048, ...),
//! so a small shard stays small, a big one is a few huge-page-backed regions, and a row's
//! chunk is the bit length of its id. Chunks never move.
//!
//! A table made by [`Table::with_row_stores`] keeps its rows in a [`RowStore`] per shard
//! instead (GPU memory, for the PS's `device: cuda`): index, metadata, admission and
//! eviction stay on the host, and rows are read, written and updated in batches by row id.
//! New rows' initial values are staged and written in one batch before a write-locked call
//! returns, so a reader never finds a staged row.
//!
//! `shard` is one shard, `change_log` its log of changed rows, `export` deltas and
//! snapshots, `error` what a table refuses.

mod change_log;
mod error;
mod export;
mod shard;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use primus_gpu::{GpuError, RowOptimizer, RowStore};
use primus_spec::job::TableSpec;

use crate::admission::Admission;
use crate::hash::seeded;
use crate::index::CuckooIndex;
use crate::init::Init;
use crate::optimizer::Optimizer;
use crate::region::Region;
use crate::snapshot::{ShardSnapshot, SnapshotError};
use change_log::ChangeLog;
pub use error::EmbeddingError;
pub(crate) use error::{check_gradients, check_width, device_error, first_non_finite};
use shard::{Shard, Staged};

/// log2 of the rows in a shard's first arena chunk (chunk k > 0 holds 1024 << (k - 1)).
const FIRST_CHUNK_ROWS_LOG2: u32 = 10;
/// Rows whose lines are prefetched together before they are read or updated.
const ROW_PIPELINE: usize = 64;
/// f32s in a cache line.
const LINE_FLOATS: usize = 16;
/// Words of a row's metadata.
const META_WORDS: usize = 2;
/// Salt of the shard hash, so shard choice and bucket choice are independent.
const SHARD_SALT: u64 = 0x5348_4152_4453_414c;
/// Evictions remembered for deltas (per shard); older ones are dropped.
const EVICTION_LOG: usize = 1 << 20;

/// A row's weights, optimizer state and metadata.
pub type RowValues = (Vec<f32>, Vec<f32>, RowMeta);

/// Makes one shard's row store, given the rows' dim and stride (floats).
pub type RowStores<'a> = &'a dyn Fn(u32, u32) -> Result<Box<dyn RowStore>, GpuError>;

/// How a table is laid out in memory (not part of the job spec: a deployment choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableOptions {
    /// Independently locked shards; a power of two.
    pub shards: usize,
    /// Seeds the initializers and the admission draws.
    pub seed: u64,
    /// Counters per count-min sketch row, per shard (only with an admission `min_count`).
    pub sketch_width: usize,
}

impl Default for TableOptions {
    fn default() -> Self {
        Self {
            shards: 64,
            seed: 0,
            sketch_width: 1 << 14,
        }
    }
}

/// What one row carries besides weights and optimizer state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowMeta {
    /// Seconds (caller's clock) of the last update.
    pub updated_at: u32,
    /// Updates applied to this row.
    pub count: u32,
    /// Table version of the last update (see [`Table::export_delta`]).
    pub version: u64,
}

impl RowMeta {
    fn to_words(self) -> [u64; META_WORDS] {
        [
            u64::from(self.updated_at) | u64::from(self.count) << 32,
            self.version,
        ]
    }

    fn from_words(words: &[u64]) -> Self {
        Self {
            updated_at: words[0] as u32,
            count: (words[0] >> 32) as u32,
            version: words[1],
        }
    }
}

/// What a table holds and did, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Rows held.
    pub rows: u64,
    /// Memory held: arena rows handed out, row metadata, index, admission sketches, change
    /// log entries. Arena space reserved ahead of the rows is not counted: it is committed
    /// only as rows are written (a 2 MiB huge page at a time in large chunks).
    pub bytes: u64,
    /// Keys given a row.
    pub admitted: u64,
    /// Gradients dropped because their key was not admitted (yet).
    pub rejected: u64,
    /// Rows evicted for idling past the table's TTL.
    pub evicted: u64,
    /// Gradients dropped because their key had no row while new rows were refused (the
    /// PS at its memory limit).
    pub refused: u64,
    /// Lookups of keys without a row (answered with the initial value).
    pub missing_reads: u64,
    /// Shards a delta or an incremental snapshot scanned whole because their change logs
    /// did not reach back to its `since`.
    pub change_scans: u64,
}

/// Rows changed after a version, and keys evicted after it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    /// Pass this as `since` next time; every change up to it is included.
    pub version: u64,
    /// Keys whose rows changed.
    pub keys: Vec<u64>,
    /// Weights of `keys`, `dim` floats each.
    pub weights: Vec<f32>,
    /// Version of each key's last update (a replica keeps the newest of two copies).
    pub versions: Vec<u64>,
    /// Updates applied to each key's row ([`RowMeta::count`]).
    pub update_counts: Vec<u64>,
    /// Keys evicted.
    pub evicted: Vec<u64>,
    /// Version of each eviction.
    pub evicted_versions: Vec<u64>,
}

/// One collisionless embedding table: shards, each behind its own lock, each a cuckoo index over its rows.
pub struct Table {
    name: String,
    dim: usize,
    /// Floats per row: weights, then optimizer state.
    stride: usize,
    optimizer: Optimizer,
    init: Init,
    ttl_secs: Option<u64>,
    seed: u64,
    shard_shift: u32,
    shards: Box<[RwLock<Shard>]>,
    /// Change versions; may be shared by the tables of one PS so one `since` covers all.
    version: Arc<AtomicU64>,
    missing_reads: AtomicU64,
    change_scans: AtomicU64,
    /// Set while no new row may be made (the PS holding it is at its memory limit).
    refusing_new_rows: AtomicBool,
    /// Set when rows live in row stores: the kernel form of `optimizer`.
    kernel: Option<RowOptimizer>,
}

/// What one push did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushOutcome {
    /// Gradients applied to a row.
    pub applied: u64,
    /// Gradients dropped because their key is not admitted (yet).
    pub dropped: u64,
    /// Gradients dropped because their key has no row and new rows are refused.
    pub refused: u64,
}

impl Table {
    /// An empty table as `spec` describes it.
    pub fn new(spec: &TableSpec, options: TableOptions) -> Result<Self, EmbeddingError> {
        Self::with_versions(spec, options, Arc::new(AtomicU64::new(0)))
    }

    /// A table whose change versions come from `versions`, shared with other tables.
    pub fn with_versions(
        spec: &TableSpec,
        options: TableOptions,
        versions: Arc<AtomicU64>,
    ) -> Result<Self, EmbeddingError> {
        Self::build(spec, options, versions, None)
    }

    /// A table whose shards keep their rows in stores made by `stores` (on a device)
    /// rather than in host arenas. Its optimizer must have a device kernel.
    pub fn with_row_stores(
        spec: &TableSpec,
        options: TableOptions,
        versions: Arc<AtomicU64>,
        stores: RowStores<'_>,
    ) -> Result<Self, EmbeddingError> {
        Self::build(spec, options, versions, Some(stores))
    }

    fn build(
        spec: &TableSpec,
        options: TableOptions,
        versions: Arc<AtomicU64>,
        stores: Option<RowStores<'_>>,
    ) -> Result<Self, EmbeddingError> {
        let dim = spec.dim as usize;
        if dim == 0 {
            return Err(EmbeddingError::ZeroDim {
                table: spec.name.clone(),
            });
        }
        if !options.shards.is_power_of_two() || options.shards > 4096 {
            return Err(EmbeddingError::Shards {
                table: spec.name.clone(),
                shards: options.shards,
            });
        }
        let optimizer = Optimizer::from_spec(&spec.optimizer);
        let stride = dim + optimizer.state_len(dim);
        let kernel = match stores {
            None => None,
            Some(_) => Some(optimizer.kernel().ok_or_else(|| EmbeddingError::NoKernel {
                table: spec.name.clone(),
                optimizer: optimizer.name(),
            })?),
        };
        let mut shards = Vec::with_capacity(options.shards);
        for i in 0..options.shards {
            let store = match stores {
                Some(make) => {
                    Some(make(dim as u32, stride as u32).map_err(|e| device_error(&spec.name, e))?)
                }
                None => None,
            };
            shards.push(RwLock::new(Shard {
                index: CuckooIndex::default(),
                store,
                staged: Staged::default(),
                chunks: Vec::new(),
                meta_chunks: Vec::new(),
                rows: 0,
                free: Vec::new(),
                admission: Admission::new(
                    spec.admission.min_count,
                    spec.admission.probability as f32,
                    options.sketch_width,
                    seeded(i as u64, options.seed),
                ),
                admitted: 0,
                rejected: 0,
                evicted: 0,
                refused: 0,
                eviction_log: Vec::new(),
                changes: ChangeLog::default(),
            }));
        }
        Ok(Self {
            name: spec.name.clone(),
            dim,
            stride,
            optimizer,
            init: Init::from_spec(&spec.initializer),
            ttl_secs: spec.ttl_seconds,
            seed: options.seed,
            shard_shift: 64 - options.shards.trailing_zeros(),
            shards: shards.into_boxed_slice(),
            version: versions,
            missing_reads: AtomicU64::new(0),
            change_scans: AtomicU64::new(0),
            refusing_new_rows: AtomicBool::new(false),
            kernel,
        })
    }

    fn device_error(&self, error: GpuError) -> EmbeddingError {
        device_error(&self.name, error)
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Floats per stored row: `dim` weights, then the optimizer's state.
    pub fn row_width(&self) -> usize {
        self.stride
    }

    /// Weights per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// While `refuse` holds, a push makes no new row: gradients of keys without one are
    /// refused (counted in [`PushOutcome::refused`]); rows that exist keep training.
    pub fn refuse_new_rows(&self, refuse: bool) {
        self.refusing_new_rows.store(refuse, Ordering::Release);
    }

    pub(crate) fn refusing_new_rows(&self) -> bool {
        self.refusing_new_rows.load(Ordering::Acquire)
    }

    /// The version of the latest update.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    #[inline]
    fn shard_of(&self, key: u64) -> usize {
        if self.shard_shift == 64 {
            0
        } else {
            (seeded(key, SHARD_SALT) >> self.shard_shift) as usize
        }
    }

    fn read(&self, shard: usize) -> RwLockReadGuard<'_, Shard> {
        // A panic under the lock cannot leave a row half-written in a way later readers
        // could not handle (rows are plain floats), so a poisoned lock is still usable.
        self.shards[shard]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self, shard: usize) -> RwLockWriteGuard<'_, Shard> {
        self.shards[shard]
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Positions of `keys` grouped by shard (a counting sort), so each shard is locked once.
    fn group_by_shard(&self, keys: &[u64]) -> (Vec<u32>, Vec<usize>) {
        let shards = self.shards.len();
        let shard_of: Vec<u16> = keys.iter().map(|k| self.shard_of(*k) as u16).collect();
        let mut starts = vec![0usize; shards + 1];
        for s in &shard_of {
            starts[*s as usize + 1] += 1;
        }
        for i in 0..shards {
            starts[i + 1] += starts[i];
        }
        let mut cursor = starts.clone();
        let mut order = vec![0u32; keys.len()];
        for (position, s) in shard_of.iter().enumerate() {
            let slot = &mut cursor[*s as usize];
            order[*slot] = position as u32;
            *slot += 1;
        }
        (order, starts)
    }

    /// Writes the weights of `keys` into `out` (`dim` floats per key, in key order). Keys
    /// without a row read as their initial value.
    pub fn lookup(&self, keys: &[u64], out: &mut [f32]) -> Result<(), EmbeddingError> {
        check_width("lookup output", keys.len(), out.len(), self.dim)?;
        let dim = self.dim;
        let (order, starts) = self.group_by_shard(keys);
        let grouped_keys: Vec<u64> = order.iter().map(|p| keys[*p as usize]).collect();
        let mut missing = 0u64;
        let mut rows = Vec::new();
        for shard in 0..self.shards.len() {
            let span = starts[shard]..starts[shard + 1];
            if span.is_empty() {
                continue;
            }
            let guard = self.read(shard);
            // Resolve every row first, then copy: both passes overlap their cache misses.
            guard.index.get_many(&grouped_keys[span.clone()], &mut rows);
            if let Some(store) = &guard.store {
                missing += self.lookup_stored(store.as_ref(), &order[span], &rows, keys, out)?;
                continue;
            }
            for (positions, rows) in order[span]
                .chunks(ROW_PIPELINE)
                .zip(rows.chunks(ROW_PIPELINE))
            {
                guard.prefetch_rows(rows, self.stride, dim);
                for (&position, row) in positions.iter().zip(rows) {
                    let position = position as usize;
                    let target = &mut out[position * dim..(position + 1) * dim];
                    match row {
                        Some(row) => target.copy_from_slice(guard.weights(*row, self.stride, dim)),
                        None => {
                            missing += 1;
                            self.init.fill(keys[position], self.seed, target);
                        }
                    }
                }
            }
        }
        if missing > 0 {
            self.missing_reads.fetch_add(missing, Ordering::Relaxed);
        }
        Ok(())
    }

    /// [`Self::lookup`] of one shard's keys (at `positions`, resolved to `rows`) from its
    /// store: one batched read. Returns how many keys had no row.
    fn lookup_stored(
        &self,
        store: &dyn RowStore,
        positions: &[u32],
        rows: &[Option<u32>],
        keys: &[u64],
        out: &mut [f32],
    ) -> Result<u64, EmbeddingError> {
        let dim = self.dim;
        let found: Vec<u32> = rows.iter().flatten().copied().collect();
        let weights = store
            .read(&found, dim as u32)
            .map_err(|e| self.device_error(e))?;
        // A store returns `dim` floats for each row asked for, in order.
        let mut stored = weights.chunks_exact(dim);
        let mut missing = 0;
        for (&position, row) in positions.iter().zip(rows) {
            let position = position as usize;
            let target = &mut out[position * dim..(position + 1) * dim];
            match row.and_then(|_| stored.next()) {
                Some(weights) => target.copy_from_slice(weights),
                None => {
                    missing += 1;
                    self.init.fill(keys[position], self.seed, target);
                }
            }
        }
        Ok(missing)
    }

    /// What [`Self::push`] checks before it changes anything: a whole row of finite
    /// gradients per key.
    pub fn check_push(&self, keys: &[u64], grads: &[f32]) -> Result<(), EmbeddingError> {
        check_gradients(keys, grads, self.dim)
    }

    /// Applies `grads` (`dim` floats per key) with the table's optimizer at time `now_secs`.
    /// A key without a row gets one if admission lets it in; otherwise its gradient is
    /// dropped. Any non-finite gradient refuses the whole call before anything changes.
    pub fn push(
        &self,
        keys: &[u64],
        grads: &[f32],
        now_secs: u32,
    ) -> Result<PushOutcome, EmbeddingError> {
        self.check_push(keys, grads)?;
        let dim = self.dim;
        let (order, starts) = self.group_by_shard(keys);
        let grouped_keys: Vec<u64> = order.iter().map(|p| keys[*p as usize]).collect();
        let mut rows = Vec::new();
        let mut outcome = PushOutcome::default();
        for shard in 0..self.shards.len() {
            let span = starts[shard]..starts[shard + 1];
            if span.is_empty() {
                continue;
            }
            let mut guard = self.write(shard);
            // Taken under the shard's lock: an export that reads this version afterwards
            // is guaranteed to see the rows (see `export_delta`).
            let version = self.version.fetch_add(1, Ordering::AcqRel) + 1;
            guard.start_changes(version - 1);
            guard.changes.gave(version);
            guard.index.get_many(&grouped_keys[span.clone()], &mut rows);
            if guard.store.is_some() {
                let stored = self.push_stored(
                    &mut guard,
                    &order[span],
                    &rows,
                    (keys, grads),
                    (now_secs, version),
                )?;
                outcome.applied += stored.applied;
                outcome.dropped += stored.dropped;
                outcome.refused += stored.refused;
                continue;
            }
            for (positions, rows) in order[span]
                .chunks(ROW_PIPELINE)
                .zip(rows.chunks(ROW_PIPELINE))
            {
                guard.prefetch_rows(rows, self.stride, self.stride);
                guard.prefetch_meta(rows);
                for (&position, known) in positions.iter().zip(rows) {
                    let position = position as usize;
                    let key = keys[position];
                    let grad = &grads[position * dim..(position + 1) * dim];
                    let Some(row) = guard.row_for_push(key, *known, self, &mut outcome) else {
                        continue;
                    };
                    let (weights, state) = guard.row_mut(row, self.stride, dim);
                    self.optimizer.apply(weights, state, grad);
                    guard.record_update(key, row, now_secs, version);
                    outcome.applied += 1;
                }
            }
        }
        Ok(outcome)
    }

    /// [`Self::push`] of one shard's keys (at `positions`, resolved to `rows`) into its
    /// store: admission and new rows on the host, new rows' values written in one batch,
    /// then the gradients applied by the fused kernel. A key repeated in one push has its
    /// k-th gradient in the k-th update, so its gradients apply in order, as in the arena.
    fn push_stored(
        &self,
        shard: &mut Shard,
        positions: &[u32],
        rows: &[Option<u32>],
        (keys, grads): (&[u64], &[f32]),
        (now_secs, version): (u32, u64),
    ) -> Result<PushOutcome, EmbeddingError> {
        let dim = self.dim;
        let mut outcome = PushOutcome::default();
        let mut updates = UpdateWaves::default();
        let mut applied = Vec::with_capacity(positions.len());
        for (&position, known) in positions.iter().zip(rows) {
            let position = position as usize;
            let key = keys[position];
            let Some(row) = shard.row_for_push(key, *known, self, &mut outcome) else {
                continue;
            };
            applied.push((key, row));
            updates.add(row, &grads[position * dim..(position + 1) * dim]);
        }
        shard.flush_staged().map_err(|e| self.device_error(e))?;
        if let (Some(store), Some(kernel)) = (shard.store.as_mut(), self.kernel) {
            updates
                .apply(store.as_mut(), kernel)
                .map_err(|e| self.device_error(e))?;
        }
        for (key, row) in applied {
            shard.record_update(key, row, now_secs, version);
            outcome.applied += 1;
        }
        Ok(outcome)
    }

    /// Evicts rows not updated for the table's TTL (none without a TTL); their slots are
    /// reused by later inserts. Returns how many rows went.
    pub fn evict_expired(&self, now_secs: u32) -> usize {
        let Some(ttl) = self.ttl_secs else {
            return 0;
        };
        let mut total = 0;
        for shard in 0..self.shards.len() {
            let mut guard = self.write(shard);
            let expired: Vec<(u64, u32)> = guard
                .index
                .iter()
                .filter(|(_, row)| {
                    u64::from(now_secs).saturating_sub(u64::from(guard.meta(*row).updated_at))
                        >= ttl
                })
                .collect();
            if expired.is_empty() {
                continue;
            }
            let version = self.version.fetch_add(1, Ordering::AcqRel) + 1;
            for (key, row) in &expired {
                guard.index.remove(*key);
                guard.set_meta(*row, RowMeta::default());
                guard.free.push(*row);
                guard.eviction_log.push((version, *key));
            }
            guard.evicted += expired.len() as u64;
            if guard.eviction_log.len() > EVICTION_LOG {
                let excess = guard.eviction_log.len() - EVICTION_LOG;
                guard.eviction_log.drain(..excess);
            }
            total += expired.len();
        }
        total
    }

    /// The row of `key`: weights, optimizer state and metadata read together, under one lock.
    pub fn row(&self, key: u64) -> Result<Option<RowValues>, EmbeddingError> {
        let guard = self.read(self.shard_of(key));
        let Some(row) = guard.index.get(key) else {
            return Ok(None);
        };
        let mut values = Vec::with_capacity(self.stride);
        guard
            .copy_values(&[row], self.stride, self.stride, &mut values)
            .map_err(|e| self.device_error(e))?;
        let state = values.split_off(self.dim);
        Ok(Some((values, state, guard.meta(row))))
    }

    /// The keys of `keys` that have a row, and their rows (weights then optimizer state,
    /// `row_width` floats each), read shard by shard: one lock and one batched read each.
    /// Keys come back grouped by shard, not in the order asked.
    pub fn read_rows(&self, keys: &[u64]) -> Result<(Vec<u64>, Vec<f32>), EmbeddingError> {
        let (order, starts) = self.group_by_shard(keys);
        let (mut found, mut values, mut rows) = (Vec::new(), Vec::new(), Vec::new());
        for shard in 0..self.shards.len() {
            let positions = &order[starts[shard]..starts[shard + 1]];
            if positions.is_empty() {
                continue;
            }
            let guard = self.read(shard);
            rows.clear();
            for &position in positions {
                let key = keys[position as usize];
                if let Some(row) = guard.index.get(key) {
                    found.push(key);
                    rows.push(row);
                }
            }
            guard
                .copy_values(&rows, self.stride, self.stride, &mut values)
                .map_err(|e| self.device_error(e))?;
        }
        Ok((found, values))
    }

    /// Drops every row (a restore starts from an empty table). Row stores keep their
    /// capacity: the rows they hold are written again before they are read.
    pub fn clear(&self) {
        for shard in 0..self.shards.len() {
            let mut guard = self.write(shard);
            guard.index = CuckooIndex::default();
            guard.chunks.clear();
            guard.meta_chunks.clear();
            guard.rows = 0;
            guard.free.clear();
            guard.eviction_log.clear();
            guard.changes = ChangeLog::default();
        }
    }

    /// Independently locked shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        (0..self.shards.len())
            .map(|s| self.read(s).index.len())
            .sum()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the table holds and did.
    pub fn stats(&self) -> TableStats {
        let mut stats = TableStats {
            missing_reads: self.missing_reads.load(Ordering::Relaxed),
            change_scans: self.change_scans.load(Ordering::Relaxed),
            ..TableStats::default()
        };
        for shard in 0..self.shards.len() {
            let guard = self.read(shard);
            stats.rows += guard.index.len() as u64;
            stats.admitted += guard.admitted;
            stats.rejected += guard.rejected;
            stats.evicted += guard.evicted;
            stats.refused += guard.refused;
            let row_bytes = match &guard.store {
                Some(store) => store.bytes() as usize,
                None => guard.rows * self.stride * 4,
            };
            stats.bytes += (row_bytes
                + guard.rows * META_WORDS * 8
                + guard.index.memory_bytes()
                + guard.admission.memory_bytes()
                + guard.changes.entries() * std::mem::size_of::<u64>())
                as u64;
        }
        stats
    }
}

/// Gradient rows for a row store's fused update, which takes each row id once: the k-th
/// gradient of a row goes to the k-th wave, so a row's gradients apply in the order added.
#[derive(Default)]
pub(crate) struct UpdateWaves {
    waves: Vec<(Vec<u32>, Vec<f32>)>,
    added: HashMap<u32, usize>,
}

impl UpdateWaves {
    pub(crate) fn add(&mut self, row: u32, grad: &[f32]) {
        let times = self.added.entry(row).or_default();
        if self.waves.len() == *times {
            self.waves.push(Default::default());
        }
        let (ids, grads) = &mut self.waves[*times];
        ids.push(row);
        grads.extend_from_slice(grad);
        *times += 1;
    }

    pub(crate) fn apply(
        &self,
        store: &mut dyn RowStore,
        kernel: RowOptimizer,
    ) -> Result<(), GpuError> {
        self.waves
            .iter()
            .try_for_each(|(ids, grads)| store.update(kernel, ids, grads))
    }
}
