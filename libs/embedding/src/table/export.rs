//! What leaves a table: deltas (the rows changed since a version, for serving), snapshots
//! of a shard (for checkpoints) and their restore.

use super::*;

impl Table {
    /// Rows updated and keys evicted after version `since`.
    ///
    /// Every change with a version up to the returned `Delta::version` is included: versions
    /// are taken under the shard's write lock, so by the time this reads a shard (under its
    /// read lock) every change of that shard with a version below the watermark is done.
    /// A change newer than the watermark may be included too; applying it twice is harmless.
    pub fn export_delta(&self, since: u64) -> Result<Delta, EmbeddingError> {
        let watermark = self.version();
        let mut delta = Delta {
            version: watermark,
            ..Delta::default()
        };
        let mut rows = Vec::new();
        for shard in 0..self.shards.len() {
            let guard = self.read(shard);
            rows.clear();
            for (key, row) in guard.changed_since(since, &self.change_scans) {
                let meta = guard.meta(row);
                delta.keys.push(key);
                delta.versions.push(meta.version);
                delta.update_counts.push(u64::from(meta.count));
                rows.push(row);
            }
            guard
                .copy_values(&rows, self.stride, self.dim, &mut delta.weights)
                .map_err(|e| self.device_error(e))?;
            for (version, key) in guard.eviction_log.iter().filter(|(v, _)| *v > since) {
                delta.evicted.push(*key);
                delta.evicted_versions.push(*version);
            }
        }
        Ok(delta)
    }

    /// Copies one shard's rows changed after `since` (0: all rows) under its read lock:
    /// weights, optimizer state and metadata of each row from the same moment.
    pub fn snapshot_shard(
        &self,
        shard: usize,
        since: u64,
    ) -> Result<ShardSnapshot, EmbeddingError> {
        let guard = self.read(shard);
        // Read under the lock: no change of this shard up to this version is missing.
        let version = self.version();
        let mut snapshot = ShardSnapshot {
            dim: self.dim as u32,
            stride: self.stride as u32,
            shard: shard as u32,
            shards: self.shards.len() as u32,
            since,
            version,
            keys: Vec::new(),
            meta: Vec::new(),
            values: Vec::new(),
            evicted: Vec::new(),
        };
        let mut rows = Vec::new();
        for (key, row) in guard.changed_since(since, &self.change_scans) {
            snapshot.keys.push(key);
            snapshot.meta.push(guard.meta(row));
            rows.push(row);
        }
        guard
            .copy_values(&rows, self.stride, self.stride, &mut snapshot.values)
            .map_err(|e| self.device_error(e))?;
        if since > 0 {
            snapshot.evicted = guard
                .eviction_log
                .iter()
                .filter(|(v, _)| *v > since)
                .map(|(_, key)| *key)
                .collect();
        }
        Ok(snapshot)
    }

    /// Writes a shard snapshot's rows into this table (any shard count: each key goes to its
    /// own shard here) and removes the keys it lists as evicted. Returns the rows written.
    pub fn restore_shard(&self, snapshot: &ShardSnapshot) -> Result<usize, SnapshotError> {
        if snapshot.dim as usize != self.dim || snapshot.stride as usize != self.stride {
            return Err(SnapshotError::Shape {
                got_dim: snapshot.dim,
                got_stride: snapshot.stride,
                dim: self.dim as u32,
                stride: self.stride as u32,
            });
        }
        for key in &snapshot.evicted {
            let mut guard = self.write(self.shard_of(*key));
            if let Some(row) = guard.index.remove(*key) {
                guard.set_meta(row, RowMeta::default());
                guard.free.push(row);
            }
        }
        let (order, starts) = self.group_by_shard(&snapshot.keys);
        for shard in 0..self.shards.len() {
            let positions = &order[starts[shard]..starts[shard + 1]];
            if positions.is_empty() {
                continue;
            }
            let mut guard = self.write(shard);
            guard.start_changes(self.version());
            for &position in positions {
                let position = position as usize;
                let key = snapshot.keys[position];
                let row = match guard.index.get(key) {
                    Some(row) => row,
                    None => guard.new_row(key, self),
                };
                let values = &snapshot.values[position * self.stride..(position + 1) * self.stride];
                guard.write_values(row, values, self.stride);
                let (old, new) = (guard.meta(row).version, snapshot.meta[position].version);
                guard.set_meta(row, snapshot.meta[position]);
                guard.changes.note(key, old);
                guard.changes.gave(new);
            }
            guard.flush_staged().map_err(|e| self.device_error(e))?;
        }
        // Later changes must get versions above everything restored.
        self.version.fetch_max(snapshot.version, Ordering::AcqRel);
        Ok(snapshot.keys.len())
    }

    /// Removes the rows whose key `keep` rejects without logging evictions: they moved to
    /// another PS process, which serves them from now on. Returns how many went.
    pub fn forget(&self, keep: impl Fn(u64) -> bool) -> usize {
        let mut total = 0;
        for shard in 0..self.shards.len() {
            let mut guard = self.write(shard);
            let gone: Vec<(u64, u32)> = guard.index.iter().filter(|(key, _)| !keep(*key)).collect();
            for &(key, row) in &gone {
                guard.index.remove(key);
                guard.set_meta(row, RowMeta::default());
                guard.free.push(row);
            }
            total += gone.len();
        }
        total
    }
}
