//! One shard of a table: its cuckoo index, its rows (arena chunks that double in size, or
//! a row store with the rows staged for it), row metadata, admission, eviction log and
//! change log, behind the table's per-shard lock.

use primus_gpu::{GpuError, RowStore};
use primus_prefetch::prefetch;

use super::change_log::ChangeLog;
use super::*;

pub(super) struct Shard {
    pub(super) index: CuckooIndex,
    /// Where rows live when not in `chunks`.
    pub(super) store: Option<Box<dyn RowStore>>,
    /// New rows' values not yet written to `store`.
    pub(super) staged: Staged,
    /// Chunk k holds the rows whose id has bit length k (past the first 1024).
    pub(super) chunks: Vec<Region>,
    /// Each arena chunk's row metadata, two words a row (see `RowMeta::to_words`), in a
    /// region of its own so that it, too, is on huge pages once large.
    pub(super) meta_chunks: Vec<Region>,
    /// Rows handed out of the arena so far (recycled ones included).
    pub(super) rows: usize,
    /// Row ids of evicted rows, reused before the arena grows.
    pub(super) free: Vec<u32>,
    pub(super) admission: Admission,
    pub(super) admitted: u64,
    pub(super) rejected: u64,
    pub(super) evicted: u64,
    pub(super) refused: u64,
    pub(super) eviction_log: Vec<(u64, u64)>,
    pub(super) changes: ChangeLog,
}

/// The arena chunk of a row id and the row's place in it.
#[inline]
pub(super) fn chunk_of(row: u32) -> (usize, usize) {
    let chunk = (u32::BITS - (row >> FIRST_CHUNK_ROWS_LOG2).leading_zeros()) as usize;
    (chunk, row as usize - chunk_start(chunk))
}

/// The first row id of a chunk.
#[inline]
pub(super) fn chunk_start(chunk: usize) -> usize {
    match chunk {
        0 => 0,
        k => (1 << FIRST_CHUNK_ROWS_LOG2) << (k - 1),
    }
}

impl Shard {
    /// Weights then optimizer state of a row.
    #[inline]
    pub(super) fn values(&self, row: u32, stride: usize) -> &[f32] {
        let (chunk, place) = chunk_of(row);
        let floats: &[f32] = bytemuck::cast_slice(self.chunks[chunk].words());
        &floats[place * stride..(place + 1) * stride]
    }

    #[inline]
    pub(super) fn weights(&self, row: u32, stride: usize, dim: usize) -> &[f32] {
        &self.values(row, stride)[..dim]
    }

    #[inline]
    pub(super) fn values_mut(&mut self, row: u32, stride: usize) -> &mut [f32] {
        let (chunk, place) = chunk_of(row);
        let floats: &mut [f32] = bytemuck::cast_slice_mut(self.chunks[chunk].words_mut());
        &mut floats[place * stride..(place + 1) * stride]
    }

    #[inline]
    pub(super) fn row_mut(
        &mut self,
        row: u32,
        stride: usize,
        dim: usize,
    ) -> (&mut [f32], &mut [f32]) {
        self.values_mut(row, stride).split_at_mut(dim)
    }

    /// Appends the first `floats` floats of each of `rows` to `out`, from the arena or in
    /// one read of the store.
    pub(super) fn copy_values(
        &self,
        rows: &[u32],
        stride: usize,
        floats: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), GpuError> {
        match &self.store {
            Some(store) => out.extend(store.read(rows, floats as u32)?),
            None => {
                for row in rows {
                    out.extend_from_slice(&self.values(*row, stride)[..floats]);
                }
            }
        }
        Ok(())
    }

    /// Overwrites a row's weights and state (staged, with a store).
    pub(super) fn write_values(&mut self, row: u32, values: &[f32], stride: usize) {
        match self.store {
            Some(_) => self.staged.slot(row, stride).copy_from_slice(values),
            None => self.values_mut(row, stride).copy_from_slice(values),
        }
    }

    /// Writes the staged rows to the store in one batch, growing it first (doubling, as
    /// the arena's chunks do) when the shard has handed out rows beyond its capacity.
    pub(super) fn flush_staged(&mut self) -> Result<(), GpuError> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        if self.staged.rows.is_empty() {
            return Ok(());
        }
        if self.rows > store.shape().rows as usize {
            let (last_chunk, _) = chunk_of(self.rows as u32 - 1);
            store.resize(chunk_start(last_chunk + 1) as u32)?;
        }
        store.write(&self.staged.rows, &self.staged.values)?;
        self.staged = Staged::default();
        Ok(())
    }

    /// Prefetches each cache line of the rows' first `floats` floats, so the misses overlap
    /// before the rows are read.
    #[inline]
    pub(super) fn prefetch_rows(&self, rows: &[Option<u32>], stride: usize, floats: usize) {
        for row in rows.iter().flatten() {
            let (chunk, place) = chunk_of(*row);
            let values: &[f32] = bytemuck::cast_slice(self.chunks[chunk].words());
            let start = place * stride;
            for line in (start..start + floats).step_by(LINE_FLOATS) {
                prefetch(&values[line]);
            }
        }
    }

    /// Prefetches the metadata of the rows, as [`Self::prefetch_rows`] does their values.
    #[inline]
    pub(super) fn prefetch_meta(&self, rows: &[Option<u32>]) {
        for row in rows.iter().flatten() {
            let (chunk, place) = chunk_of(*row);
            prefetch(&self.meta_chunks[chunk].words()[place * META_WORDS]);
        }
    }

    pub(super) fn meta(&self, row: u32) -> RowMeta {
        let (chunk, place) = chunk_of(row);
        let words = &self.meta_chunks[chunk].words()[place * META_WORDS..(place + 1) * META_WORDS];
        RowMeta::from_words(words)
    }

    /// See [`ChangeLog::start`].
    pub(super) fn start_changes(&mut self, version_before: u64) {
        let rows = self.index.len();
        self.changes.start(version_before, rows);
    }

    /// Rows (with their keys) whose version is above `since`, from the change log when it
    /// covers `since`, else from a scan of the index.
    pub(super) fn changed_since(&self, since: u64, scans: &AtomicU64) -> Vec<(u64, u32)> {
        let Some(logged) = self.changes.since(since) else {
            scans.fetch_add(1, Ordering::Relaxed);
            return self
                .index
                .iter()
                .filter(|(_, row)| self.meta(*row).version > since)
                .collect();
        };
        let mut seen = HashSet::new();
        logged
            .filter_map(|&key| Some((key, self.index.get(key)?)))
            .filter(|&(_, row)| self.meta(row).version > since && seen.insert(row))
            .collect()
    }

    /// Stamps a row's metadata with an update: time, one more count, version.
    pub(super) fn record_update(&mut self, key: u64, row: u32, now_secs: u32, version: u64) {
        let (chunk, place) = chunk_of(row);
        let words =
            &mut self.meta_chunks[chunk].words_mut()[place * META_WORDS..(place + 1) * META_WORDS];
        let mut meta = RowMeta::from_words(words);
        self.changes.note(key, meta.version);
        meta.updated_at = now_secs;
        meta.count = meta.count.saturating_add(1);
        meta.version = version;
        words.copy_from_slice(&meta.to_words());
    }

    pub(super) fn set_meta(&mut self, row: u32, meta: RowMeta) {
        let (chunk, place) = chunk_of(row);
        let words =
            &mut self.meta_chunks[chunk].words_mut()[place * META_WORDS..(place + 1) * META_WORDS];
        words.copy_from_slice(&meta.to_words());
    }

    /// The row a gradient for `key` goes to: its own (`known`, or inserted by an earlier
    /// duplicate in this push), or a new one if admission lets the key in; None, counted
    /// as dropped, otherwise.
    #[inline]
    pub(super) fn row_for_push(
        &mut self,
        key: u64,
        known: Option<u32>,
        table: &Table,
        outcome: &mut PushOutcome,
    ) -> Option<u32> {
        if let Some(row) = known.or_else(|| self.index.get(key)) {
            return Some(row);
        }
        if table.refusing_new_rows() {
            self.refused += 1;
            outcome.refused += 1;
            return None;
        }
        if !self.admission.admit(key) {
            self.rejected += 1;
            outcome.dropped += 1;
            return None;
        }
        self.admitted += 1;
        Some(self.new_row(key, table))
    }

    /// A row for a new key: a recycled one, or the next in the arena. Initialised from the
    /// key (weights) and the optimizer (state).
    pub(super) fn new_row(&mut self, key: u64, table: &Table) -> u32 {
        let row = match self.free.pop() {
            Some(row) => row,
            None => {
                let row = self.rows;
                let (chunk, place) = chunk_of(row as u32);
                if place == 0 {
                    let rows = chunk_start(chunk + 1) - chunk_start(chunk);
                    if self.store.is_none() {
                        // Two floats per word, rounded up.
                        self.chunks
                            .push(Region::zeroed((rows * table.stride).div_ceil(2)));
                    }
                    self.meta_chunks.push(Region::zeroed(rows * META_WORDS));
                }
                self.rows += 1;
                row as u32
            }
        };
        let values = match self.store {
            Some(_) => self.staged.slot(row, table.stride),
            None => self.values_mut(row, table.stride),
        };
        let (weights, state) = values.split_at_mut(table.dim);
        table.init.fill(key, table.seed, weights);
        table.optimizer.init_state(weights, state);
        self.set_meta(row, RowMeta::default());
        self.index.insert(key, row);
        row
    }
}

/// Rows (weights and state) waiting to be written to a shard's store in one batch.
#[derive(Default)]
pub(super) struct Staged {
    rows: Vec<u32>,
    /// `stride` floats per entry of `rows`.
    values: Vec<f32>,
    /// Where each staged row is in `rows`.
    at: HashMap<u32, usize>,
}

impl Staged {
    /// The staged values of `row`, zero when it was not staged yet.
    pub(super) fn slot(&mut self, row: u32, stride: usize) -> &mut [f32] {
        let index = *self.at.entry(row).or_insert_with(|| {
            self.rows.push(row);
            self.values.resize(self.values.len() + stride, 0.0);
            self.rows.len() - 1
        });
        &mut self.values[index * stride..(index + 1) * stride]
    }
}
