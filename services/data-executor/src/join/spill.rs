//! The joiner's disk tier: feature messages that no longer fit the memory budget, as Arrow
//! IPC bytes appended to segment files. A segment is deleted once every message in it is
//! gone (joined or expired) and a newer segment took over the writes.
//!
//! Reads and writes are plain blocking file calls on the joiner's task: they touch a local
//! disk, a message at a time, and only for rows that outlived the memory budget.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use primus_batch::ipc;

use super::JoinError;

/// Where one spilled message lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SpillRef {
    segment: u64,
    offset: u64,
    len: u64,
}

struct Segment {
    file: File,
    len: u64,
    /// Messages in it not yet released.
    live: usize,
}

pub(super) struct SpillStore {
    dir: PathBuf,
    segment_bytes: u64,
    segments: HashMap<u64, Segment>,
    active: u64,
}

impl SpillStore {
    /// Spills into a fresh `dir` (created; emptied of earlier segments, which belonged to a
    /// joiner that died and whose messages JetStream delivers again).
    pub(super) fn open(dir: PathBuf, segment_bytes: u64) -> Result<Self, JoinError> {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| spill_error(&dir, "clear", e))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| spill_error(&dir, "create", e))?;
        Ok(Self {
            dir,
            segment_bytes: segment_bytes.max(1),
            segments: HashMap::new(),
            active: 0,
        })
    }

    fn path(&self, segment: u64) -> PathBuf {
        self.dir.join(format!("segment-{segment:06}.arrows"))
    }

    pub(super) fn write(&mut self, rows: &RecordBatch) -> Result<SpillRef, JoinError> {
        let bytes = ipc::encode_rows(rows).map_err(|e| JoinError::Spill(e.to_string()))?;
        let full = self
            .segments
            .get(&self.active)
            .is_some_and(|s| s.len >= self.segment_bytes);
        if full {
            self.active += 1;
            self.release_if_unused(self.active - 1)?;
        }
        let path = self.path(self.active);
        let segment = match self.segments.entry(self.active) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let file = OpenOptions::new()
                    .create_new(true)
                    .read(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| spill_error(&path, "create", e))?;
                entry.insert(Segment {
                    file,
                    len: 0,
                    live: 0,
                })
            }
        };
        segment
            .file
            .write_all(&bytes)
            .map_err(|e| spill_error(&path, "write", e))?;
        let at = SpillRef {
            segment: self.active,
            offset: segment.len,
            len: bytes.len() as u64,
        };
        segment.len += at.len;
        segment.live += 1;
        Ok(at)
    }

    pub(super) fn read(&self, at: SpillRef) -> Result<RecordBatch, JoinError> {
        let path = self.path(at.segment);
        let segment = self
            .segments
            .get(&at.segment)
            .ok_or_else(|| JoinError::Spill(format!("{}: segment is gone", path.display())))?;
        let mut bytes = vec![0; at.len as usize];
        segment
            .file
            .read_exact_at(&mut bytes, at.offset)
            .map_err(|e| spill_error(&path, "read", e))?;
        ipc::decode_rows(&bytes).map_err(|e| JoinError::Spill(format!("{}: {e}", path.display())))
    }

    /// The message at `at` is no longer needed.
    pub(super) fn release(&mut self, at: SpillRef) -> Result<(), JoinError> {
        if let Some(segment) = self.segments.get_mut(&at.segment) {
            segment.live = segment.live.saturating_sub(1);
        }
        self.release_if_unused(at.segment)
    }

    fn release_if_unused(&mut self, segment: u64) -> Result<(), JoinError> {
        let unused =
            segment != self.active && self.segments.get(&segment).is_some_and(|s| s.live == 0);
        if unused {
            self.segments.remove(&segment);
            let path = self.path(segment);
            std::fs::remove_file(&path).map_err(|e| spill_error(&path, "delete", e))?;
        }
        Ok(())
    }

    /// Segment files on disk now.
    #[cfg(test)]
    pub(super) fn segments(&self) -> usize {
        self.segments.len()
    }
}

impl Drop for SpillStore {
    fn drop(&mut self) {
        // What was spilled is still unacked in JetStream: nothing is lost with the files.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spill_error(path: &Path, what: &str, e: std::io::Error) -> JoinError {
    JoinError::Spill(format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, UInt64Array};

    use super::*;

    fn rows(ids: std::ops::Range<u64>) -> RecordBatch {
        let ids: ArrayRef = Arc::new(UInt64Array::from_iter_values(ids));
        RecordBatch::try_from_iter([("id", ids)]).expect("rows")
    }

    #[test]
    fn spilled_rows_read_back_and_drained_segments_are_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spill_dir = dir.path().join("spill");
        let mut store = SpillStore::open(spill_dir.clone(), 1).expect("open");
        let first = store.write(&rows(0..10)).expect("write");
        let second = store.write(&rows(10..30)).expect("write");
        assert_eq!(
            store.segments(),
            2,
            "each segment holds one message at 1 byte"
        );
        assert_eq!(store.read(second).expect("read"), rows(10..30));
        assert_eq!(store.read(first).expect("read"), rows(0..10));

        store.release(first).expect("release");
        assert_eq!(
            store.segments(),
            1,
            "the drained, inactive segment is deleted"
        );
        assert_eq!(std::fs::read_dir(&spill_dir).expect("dir").count(), 1);
        store.release(second).expect("release");
        assert_eq!(
            store.segments(),
            1,
            "the active segment stays for the next write"
        );
        drop(store);
        assert!(!spill_dir.exists(), "the store's directory goes with it");
    }
}
