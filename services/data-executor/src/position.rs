//! A stream binding's position: which messages of its subject were served. The binding's
//! holder reads messages in stream order and buffers each as one chunk at the task offset
//! its rows start at; from the served offset the cursor says which message is the first
//! not wholly served and how many of its rows were. Checkpoints record that position with
//! the offsets, and a binding read again starts from it, so every row is served once.

use std::collections::VecDeque;

use primus_proto::v1::StreamPosition;

/// One message read: its stream sequence, the task offset of its first row and its rows
/// (0 for a message that was rejected or empty).
#[derive(Debug, Clone, Copy)]
struct Read {
    sequence: u64,
    first_offset: u64,
    rows: u64,
}

/// The messages a binding's holder read and has not wholly served yet.
#[derive(Debug)]
pub(crate) struct StreamCursor {
    /// In stream order.
    unserved: VecDeque<Read>,
    /// The position once every message read so far is served.
    after_last: StreamPosition,
}

impl StreamCursor {
    /// A cursor that starts reading at `start` (default: the stream's first message).
    pub(crate) fn new(start: StreamPosition) -> Self {
        Self {
            unserved: VecDeque::new(),
            after_last: start,
        }
    }

    /// Message `sequence` was read: its rows (`rows` of them, after the `skipped` its start
    /// position said were served before) enter the buffer at task offset `offset`.
    pub(crate) fn read(&mut self, sequence: u64, offset: u64, skipped: u64, rows: u64) {
        self.unserved.push_back(Read {
            sequence,
            first_offset: offset.saturating_sub(skipped),
            rows: skipped + rows,
        });
        self.after_last = StreamPosition {
            sequence: sequence + 1,
            rows: 0,
        };
    }

    /// The position once the rows before task offset `served` are served.
    pub(crate) fn position(&mut self, served: u64) -> StreamPosition {
        while let Some(front) = self.unserved.front() {
            if front.first_offset + front.rows > served {
                return StreamPosition {
                    sequence: front.sequence,
                    rows: served.saturating_sub(front.first_offset),
                };
            }
            self.unserved.pop_front();
        }
        self.after_last
    }

    /// Rows of the message at `position.sequence` to skip when reading starts there.
    pub(crate) fn skip_of(start: &StreamPosition, sequence: u64) -> u64 {
        if start.sequence == sequence {
            start.rows
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(sequence: u64, rows: u64) -> StreamPosition {
        StreamPosition { sequence, rows }
    }

    #[test]
    fn the_position_is_the_first_message_not_wholly_served() {
        let mut cursor = StreamCursor::new(StreamPosition::default());
        assert_eq!(cursor.position(0), at(0, 0), "nothing read yet");
        cursor.read(3, 100, 0, 10);
        cursor.read(5, 110, 0, 0);
        cursor.read(9, 110, 0, 4);
        assert_eq!(cursor.position(100), at(3, 0));
        assert_eq!(cursor.position(107), at(3, 7));
        assert_eq!(cursor.position(110), at(9, 0), "the rejected 5 is passed");
        assert_eq!(cursor.position(113), at(9, 3));
        assert_eq!(cursor.position(114), at(10, 0), "everything read is served");
        cursor.read(12, 114, 0, 2);
        assert_eq!(cursor.position(114), at(12, 0));
    }

    #[test]
    fn a_message_started_inside_counts_the_rows_served_before() {
        let start = at(7, 3);
        let mut cursor = StreamCursor::new(start);
        assert_eq!(cursor.position(50), start, "nothing read: where it started");
        assert_eq!(StreamCursor::skip_of(&start, 7), 3);
        assert_eq!(StreamCursor::skip_of(&start, 8), 0);
        cursor.read(7, 50, 3, 5);
        assert_eq!(cursor.position(50), at(7, 3));
        assert_eq!(cursor.position(52), at(7, 5));
        assert_eq!(cursor.position(55), at(8, 0));
    }
}
