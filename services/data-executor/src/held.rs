//! Minibatches served and not yet consumed. A trainer confirms each minibatch once its
//! gradients are pushed (`MinibatchesConsumed`); until then the executor holds it. When a
//! trainer's stream breaks (the trainer died), what it held goes back to the executor and
//! is served again, before any buffered row, to whichever trainer asks next. When the
//! executor ends a stream itself (data drained, leaving, the trainer departing), the
//! trainer trains what it holds, so it counts as consumed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use primus_proto::v1::ConfirmedTotalsResponse;

use crate::buffer::Served;

/// The executor's minibatches held by trainers or waiting to be served again.
#[derive(Default)]
pub(crate) struct Unconsumed {
    /// Served on a stream whose trainer went away before consuming them.
    returned: Mutex<VecDeque<Served>>,
    /// Held by trainers on open streams.
    held: AtomicUsize,
    /// The highest totals each trainer confirmed with its minibatches.
    trainer_totals: Mutex<HashMap<String, ConfirmedTotalsResponse>>,
}

impl Unconsumed {
    /// The oldest returned minibatch, served again before any buffered row.
    pub(crate) fn take_returned(&self) -> Option<Served> {
        lock(&self.returned).pop_front()
    }

    /// Rows waiting to be served again.
    pub(crate) fn returned_rows(&self) -> usize {
        lock(&self.returned).iter().map(|s| s.batch.rows()).sum()
    }

    /// Nothing is held by a trainer or waiting to be served again.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.load(Ordering::Acquire) == 0 && lock(&self.returned).is_empty()
    }

    /// `trainer` confirmed minibatches with these totals (the highest count).
    pub(crate) fn record_totals(&self, trainer: &str, totals: ConfirmedTotalsResponse) {
        let mut known = lock(&self.trainer_totals);
        let known = known.entry(trainer.to_owned()).or_default();
        if (totals.steps, totals.samples) > (known.steps, known.samples) {
            *known = totals;
        }
    }

    /// The highest totals `trainer` confirmed here (zeros when none).
    pub(crate) fn totals_of(&self, trainer: &str) -> ConfirmedTotalsResponse {
        (lock(&self.trainer_totals).get(trainer).cloned()).unwrap_or_default()
    }

    /// Serves `batches` again before any buffered row.
    pub(crate) fn give_back(&self, batches: impl IntoIterator<Item = Served>) {
        lock(&self.returned).extend(batches);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a stream's held minibatches end.
enum StreamState {
    Open(BTreeMap<u64, Served>),
    /// The trainer went away or the executor ended the stream: nothing more is held.
    Closed,
}

/// One stream's minibatches served and not yet consumed, by sequence.
pub(crate) struct HeldBatches {
    unconsumed: Arc<Unconsumed>,
    state: Mutex<StreamState>,
    next_sequence: Mutex<u64>,
}

impl HeldBatches {
    pub(crate) fn new(unconsumed: Arc<Unconsumed>) -> Self {
        Self {
            unconsumed,
            state: Mutex::new(StreamState::Open(BTreeMap::new())),
            next_sequence: Mutex::new(0),
        }
    }

    /// Holds `served` until it is consumed; returns its sequence on the stream. On a
    /// stream whose trainer is gone, it goes back at once.
    pub(crate) fn hold(&self, served: Served) -> u64 {
        let sequence = {
            let mut next = lock(&self.next_sequence);
            *next += 1;
            *next
        };
        let mut state = lock(&self.state);
        match &mut *state {
            StreamState::Open(held) => {
                held.insert(sequence, served);
                self.unconsumed.held.fetch_add(1, Ordering::AcqRel);
            }
            StreamState::Closed => self.unconsumed.give_back([served]),
        }
        sequence
    }

    /// The trainer consumed these; returns how many were held.
    pub(crate) fn consumed(&self, sequences: &[u64]) -> usize {
        let mut state = lock(&self.state);
        let StreamState::Open(held) = &mut *state else {
            return 0;
        };
        let released = sequences
            .iter()
            .filter_map(|s| held.remove(s))
            .inspect(Served::consumed)
            .count();
        self.unconsumed.held.fetch_sub(released, Ordering::AcqRel);
        released
    }

    /// The trainer went away: what it held is served again. Returns the rows.
    pub(crate) fn trainer_gone(&self) -> usize {
        let held = self.close();
        let rows = held.iter().map(|s| s.batch.rows()).sum();
        self.unconsumed.give_back(held);
        rows
    }

    /// The executor ended the stream: the trainer trains what it holds.
    pub(crate) fn ended(&self) {
        self.close().iter().for_each(Served::consumed);
    }

    fn close(&self) -> Vec<Served> {
        let state = std::mem::replace(&mut *lock(&self.state), StreamState::Closed);
        match state {
            StreamState::Open(held) => {
                self.unconsumed.held.fetch_sub(held.len(), Ordering::AcqRel);
                held.into_values().collect()
            }
            StreamState::Closed => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use primus_batch::{DenseMatrix, Kjt, Minibatch, Sparse};
    use primus_proto::v1::SourceKind;

    use super::*;

    fn served(rows: usize) -> Served {
        Served {
            source: "s".into(),
            kind: SourceKind::Batch,
            batch: Minibatch {
                labels: vec![0.0; rows],
                targets: Vec::new(),
                dense: DenseMatrix::default(),
                sparse: Sparse::Jagged(Kjt {
                    rows,
                    features: vec![],
                }),
            },
            trace: Default::default(),
            ranges: Vec::new(),
        }
    }

    #[test]
    fn a_gone_trainers_unconsumed_minibatches_are_served_again_in_order() {
        let unconsumed = Arc::new(Unconsumed::default());
        let stream = HeldBatches::new(unconsumed.clone());
        let sequences: Vec<u64> = [3, 5, 7].map(|rows| stream.hold(served(rows))).into();
        assert_eq!(sequences, [1, 2, 3]);
        assert_eq!(
            stream.consumed(&[2, 9]),
            1,
            "an unknown sequence is ignored"
        );
        assert!(!unconsumed.is_empty());
        assert_eq!(stream.trainer_gone(), 10);
        assert_eq!(unconsumed.returned_rows(), 10);
        let again: Vec<usize> = std::iter::from_fn(|| unconsumed.take_returned())
            .map(|s| s.batch.rows())
            .collect();
        assert_eq!(again, [3, 7]);
        assert!(unconsumed.is_empty());
        // Served after the trainer went away (the send raced its departure): back at once.
        stream.hold(served(4));
        assert_eq!(unconsumed.returned_rows(), 4);
    }

    #[test]
    fn minibatches_held_when_the_executor_ends_a_stream_count_as_consumed() {
        let unconsumed = Arc::new(Unconsumed::default());
        let stream = HeldBatches::new(unconsumed.clone());
        stream.hold(served(3));
        stream.ended();
        assert_eq!(stream.trainer_gone(), 0);
        assert!(unconsumed.is_empty());
    }
}
