//! Per-task bookkeeping: how far a task's rows were read, served and consumed. A task's
//! offset as the executor reports it is what trainers *consumed* (confirmed after pushing
//! their gradients), contiguous from the task's start: rows buffered, or served but still
//! on their way, when the executor dies are served again by the next attempt, never lost;
//! the rows its trainers received since its last report they report themselves. A stream
//! binding read in order also keeps its stream cursor (`position.rs`), which turns a
//! served offset into the binding's stream position.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use primus_proto::v1::StreamPosition;
use primus_telemetry::propagation::{TraceCarrier, current_carrier};

use crate::position::StreamCursor;

/// How a task's reading ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadEnd {
    /// Every row was read; `rows` is the task offset after the last one.
    Complete { rows: u64 },
    /// Reading failed after `rows`; the message names the file and column.
    Failed { rows: u64, error: String },
}

impl ReadEnd {
    fn rows(&self) -> u64 {
        match self {
            Self::Complete { rows } | Self::Failed { rows, .. } => *rows,
        }
    }
}

pub struct TaskLedger {
    pub id: String,
    served: AtomicU64,
    consumed: Mutex<Consumed>,
    reported: AtomicU64,
    end: Mutex<Option<ReadEnd>>,
    /// The master gave the task to another executor: its runner stops reading.
    taken_back: AtomicBool,
    /// A stream binding read in order: its messages read and not wholly served.
    cursor: Option<Mutex<StreamCursor>>,
    /// The trace of the span current when the task started (its `data.task` span): the
    /// minibatches served from its rows continue it in the trainer.
    pub trace: TraceCarrier,
}

/// Rows consumed: every row before `through` (the stream position there, once known), and
/// ranges consumed beyond a gap (minibatches of several trainers confirm out of order),
/// by first row.
#[derive(Debug, Default)]
struct Consumed {
    through: u64,
    position: Option<StreamPosition>,
    beyond: BTreeMap<u64, (u64, Option<StreamPosition>)>,
}

impl Consumed {
    fn add(&mut self, first: u64, end: u64, end_position: Option<StreamPosition>) {
        let known = self.beyond.entry(first).or_insert((end, end_position));
        if end > known.0 {
            *known = (end, end_position);
        }
        while let Some(entry) = self.beyond.first_entry()
            && *entry.key() <= self.through
        {
            let (end, position) = entry.remove();
            if end > self.through {
                (self.through, self.position) = (end, position);
            }
        }
    }
}

impl TaskLedger {
    pub fn new(id: String, start_offset: u64) -> Self {
        Self {
            id,
            served: AtomicU64::new(start_offset),
            consumed: Mutex::new(Consumed {
                through: start_offset,
                ..Consumed::default()
            }),
            reported: AtomicU64::new(start_offset),
            end: Mutex::new(None),
            taken_back: AtomicBool::new(false),
            cursor: None,
            trace: current_carrier(),
        }
    }

    /// The ledger of a stream binding read in order from `position`.
    pub fn for_stream(id: String, start_offset: u64, position: StreamPosition) -> Self {
        let ledger = Self {
            cursor: Some(Mutex::new(StreamCursor::new(position))),
            ..Self::new(id, start_offset)
        };
        ledger.lock_consumed().position = Some(position);
        ledger
    }

    fn lock_consumed(&self) -> std::sync::MutexGuard<'_, Consumed> {
        self.consumed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rows `first..end` were consumed; `end_position` is the stream position after them.
    pub fn consumed(&self, first: u64, end: u64, end_position: Option<StreamPosition>) {
        self.lock_consumed().add(first, end, end_position);
    }

    /// Stream message `sequence` was read; its `rows` (after `skipped` served before)
    /// enter the buffer at task offset `offset`. Called before they do.
    pub fn stream_read(&self, sequence: u64, offset: u64, skipped: u64, rows: u64) {
        if let Some(cursor) = &self.cursor {
            let mut cursor = cursor.lock().unwrap_or_else(|p| p.into_inner());
            cursor.read(sequence, offset, skipped, rows);
        }
    }

    /// A stream binding's position at the rows served now (read under the cursor's lock,
    /// so positions asked for one after another never go back).
    pub fn stream_position(&self) -> Option<StreamPosition> {
        let mut cursor = self
            .cursor
            .as_ref()?
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Some(cursor.position(self.served()))
    }

    pub fn take_back(&self) {
        self.taken_back.store(true, Ordering::Release);
    }

    pub fn is_taken_back(&self) -> bool {
        self.taken_back.load(Ordering::Acquire)
    }

    /// Rows before `offset` have been handed to trainers.
    pub fn served_through(&self, offset: u64) {
        self.served.fetch_max(offset, Ordering::AcqRel);
    }

    /// Rows of the task handed to trainers so far (counted from the task's start).
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Acquire)
    }

    pub fn finish_reading(&self, end: ReadEnd) {
        *self.end.lock().unwrap_or_else(|p| p.into_inner()) = Some(end);
    }

    /// The consumed offset, and the stream position there, when it moved past what the
    /// master acknowledged. It stays to report until [`Self::reported`] says it landed: a
    /// report cut off on its way (the executor stopping, the master unreachable) is sent
    /// again, or the master would put rows back in the queue that trainers already trained.
    pub fn progress_to_report(&self) -> Option<(u64, Option<StreamPosition>)> {
        let (through, position) = {
            let consumed = self.lock_consumed();
            (consumed.through, consumed.position)
        };
        (through > self.reported.load(Ordering::Acquire)).then_some((through, position))
    }

    /// The master acknowledged the consumed offset `offset`.
    pub fn reported(&self, offset: u64) {
        self.reported.fetch_max(offset, Ordering::AcqRel);
    }

    /// Once reading ended and every read row was consumed: the task's error ("" on
    /// success).
    pub fn finished(&self) -> Option<String> {
        let end = self.end.lock().unwrap_or_else(|p| p.into_inner());
        let end = end.as_ref()?;
        (self.lock_consumed().through >= end.rows()).then(|| match end {
            ReadEnd::Complete { .. } => String::new(),
            ReadEnd::Failed { error, .. } => error.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumed_offset_stays_to_report_until_the_master_acknowledges_it() {
        let ledger = TaskLedger::new("t".into(), 10);
        assert_eq!(ledger.progress_to_report(), None, "nothing consumed yet");
        ledger.consumed(10, 40, None);
        assert_eq!(ledger.progress_to_report(), Some((40, None)));
        // The report was cut off: the same offset goes out with the next one.
        assert_eq!(ledger.progress_to_report(), Some((40, None)));
        ledger.reported(40);
        assert_eq!(ledger.progress_to_report(), None);
        ledger.consumed(40, 50, None);
        ledger.reported(30);
        assert_eq!(
            ledger.progress_to_report(),
            Some((50, None)),
            "a late acknowledgement of an older report changes nothing"
        );
    }
}
