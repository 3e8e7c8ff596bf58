//! The snapshot format of one shard: every row (weights, optimizer state, metadata) copied
//! under the shard's lock, so a weight is never saved with optimizer state from another
//! moment. Incremental snapshots hold the rows changed and the keys evicted since a base
//! version. A CRC32 over everything before it ends the file; decoding verifies it.
//!
//! Layout, little-endian: magic `PRSN`, format u32, dim u32, stride u32, shard u32,
//! shards u32, since u64, version u64, rows u64, evicted u64; then per row key u64,
//! updated_at u32, count u32, version u64, stride x f32; then evicted keys u64; then crc32.

use crate::table::RowMeta;

const MAGIC: &[u8; 4] = b"PRSN";
const FORMAT: u32 = 1;
const HEADER: usize = 4 + 4 * 5 + 8 * 4;

/// Why a snapshot could not be read or restored.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SnapshotError {
    /// A dense tensor's optimizer state does not fit this PS's optimizer.
    #[error(
        "dense tensor {name:?} has {got} optimizer-state floats; this PS's optimizer keeps {want}"
    )]
    DenseState {
        /// The tensor.
        name: String,
        /// State floats in the snapshot.
        got: usize,
        /// State floats this optimizer keeps.
        want: usize,
    },
    /// The table could not write restored rows (its GPU row store failed).
    #[error(transparent)]
    Table(#[from] crate::EmbeddingError),
    /// The bytes do not start as a snapshot does.
    #[error("not a snapshot of this kind (bad magic)")]
    Magic,
    /// A format this build cannot read.
    #[error("snapshot format {0} is not supported (this build reads {FORMAT})")]
    Format(u32),
    /// The bytes end early (their count).
    #[error("snapshot is truncated ({0} bytes)")]
    Truncated(usize),
    /// The bytes changed since they were written.
    #[error("checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    Checksum {
        /// The checksum written with the snapshot.
        stored: u32,
        /// The checksum of the bytes read.
        computed: u32,
    },
    /// The snapshot is of a table with other rows.
    #[error(
        "snapshot is of a table with dim {got_dim} and stride {got_stride}; this one has {dim} and {stride}"
    )]
    Shape {
        /// The snapshot's dim.
        got_dim: u32,
        /// The snapshot's floats per row.
        got_stride: u32,
        /// This table's dim.
        dim: u32,
        /// This table's floats per row.
        stride: u32,
    },
}

/// One shard's rows as taken under its lock.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardSnapshot {
    /// Weights per row.
    pub dim: u32,
    /// Floats per row: weights, then optimizer state.
    pub stride: u32,
    /// Which shard of the table.
    pub shard: u32,
    /// The table's shard count.
    pub shards: u32,
    /// Rows changed after this version are included (0: every row, a full snapshot).
    pub since: u64,
    /// The table version when the shard was read: every change up to it is included.
    pub version: u64,
    /// The rows' keys.
    pub keys: Vec<u64>,
    /// Each row's metadata (last update, count, version).
    pub meta: Vec<RowMeta>,
    /// `stride` floats per row: weights, then optimizer state.
    pub values: Vec<f32>,
    /// Keys evicted after `since` (incremental snapshots).
    pub evicted: Vec<u64>,
}

impl ShardSnapshot {
    /// Keeps only the rows and evicted keys whose key `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        let stride = self.stride as usize;
        let mut kept = 0;
        for i in 0..self.keys.len() {
            if !keep(self.keys[i]) {
                continue;
            }
            self.keys[kept] = self.keys[i];
            self.meta[kept] = self.meta[i];
            self.values
                .copy_within(i * stride..(i + 1) * stride, kept * stride);
            kept += 1;
        }
        self.keys.truncate(kept);
        self.meta.truncate(kept);
        self.values.truncate(kept * stride);
        self.evicted.retain(|key| keep(*key));
    }

    /// The snapshot's bytes (header, rows, evicted keys, CRC32).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            HEADER + self.keys.len() * (24 + 4 * self.stride as usize) + self.evicted.len() * 8 + 4,
        );
        out.extend_from_slice(MAGIC);
        for v in [FORMAT, self.dim, self.stride, self.shard, self.shards] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.since,
            self.version,
            self.keys.len() as u64,
            self.evicted.len() as u64,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let stride = self.stride as usize;
        for (i, key) in self.keys.iter().enumerate() {
            let meta = self.meta[i];
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&meta.updated_at.to_le_bytes());
            out.extend_from_slice(&meta.count.to_le_bytes());
            out.extend_from_slice(&meta.version.to_le_bytes());
            for v in &self.values[i * stride..(i + 1) * stride] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        for key in &self.evicted {
            out.extend_from_slice(&key.to_le_bytes());
        }
        seal(out)
    }

    /// Reads a snapshot's bytes, checking magic, format, lengths and checksum.
    pub fn decode(bytes: &[u8]) -> Result<Self, SnapshotError> {
        if bytes.len() < HEADER + 4 {
            return Err(SnapshotError::Truncated(bytes.len()));
        }
        let mut reader = open_checked(bytes, MAGIC)?;
        let (dim, stride, shard, shards) =
            (reader.u32()?, reader.u32()?, reader.u32()?, reader.u32()?);
        let (since, version, rows, evicted) =
            (reader.u64()?, reader.u64()?, reader.u64()?, reader.u64()?);
        let rows = usize::try_from(rows).map_err(|_| SnapshotError::Truncated(bytes.len()))?;
        let row_bytes = 24 + 4 * stride as usize;
        if rows.saturating_mul(row_bytes) > bytes.len() {
            return Err(SnapshotError::Truncated(bytes.len()));
        }
        let mut snapshot = ShardSnapshot {
            dim,
            stride,
            shard,
            shards,
            since,
            version,
            keys: Vec::with_capacity(rows),
            meta: Vec::with_capacity(rows),
            values: Vec::with_capacity(rows * stride as usize),
            evicted: Vec::new(),
        };
        for _ in 0..rows {
            snapshot.keys.push(reader.u64()?);
            snapshot.meta.push(RowMeta {
                updated_at: reader.u32()?,
                count: reader.u32()?,
                version: reader.u64()?,
            });
            for _ in 0..stride {
                snapshot.values.push(f32::from_le_bytes(reader.array()?));
            }
        }
        for _ in 0..evicted {
            snapshot.evicted.push(reader.u64()?);
        }
        if !reader.done() {
            return Err(SnapshotError::Truncated(bytes.len()));
        }
        Ok(snapshot)
    }
}

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pub(crate) at: usize,
}

/// Splits off and checks the trailing CRC32, then reads `magic` and the format number.
pub(crate) fn open_checked<'a>(
    bytes: &'a [u8],
    magic: &[u8; 4],
) -> Result<Reader<'a>, SnapshotError> {
    if bytes.len() < 12 {
        return Err(SnapshotError::Truncated(bytes.len()));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(SnapshotError::Checksum { stored, computed });
    }
    let mut reader = Reader { bytes: body, at: 0 };
    if reader.take(4)? != magic {
        return Err(SnapshotError::Magic);
    }
    let format = reader.u32()?;
    if format != FORMAT {
        return Err(SnapshotError::Format(format));
    }
    Ok(reader)
}

/// Appends the CRC32 of everything written so far.
pub(crate) fn seal(mut out: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

impl Reader<'_> {
    pub(crate) fn done(&self) -> bool {
        self.at == self.bytes.len()
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&[u8], SnapshotError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len());
        let end = end.ok_or(SnapshotError::Truncated(self.bytes.len()))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}
