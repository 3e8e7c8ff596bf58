//! What a trainer is fed: minibatches with the span of their step and the data executor's
//! claim on them, and checkpoint barriers between them. The first stage of a step: the
//! others (prefetch, freshness, the step, its push) import it, never the other way.

use primus_batch::Minibatch;
use primus_data_client::Receipt;
use primus_proto::v1::SourceKind;
use primus_telemetry::propagation::{TraceCarrier, set_parent_from_carrier};

/// A minibatch to train on and the `trainer.step` span its lookups, compute and pushes
/// run in.
pub struct Incoming {
    pub batch: Minibatch,
    pub kind: SourceKind,
    pub span: tracing::Span,
    /// The Dataset source its rows came from.
    pub source: String,
    /// The data executor's claim on the minibatch, confirmed once it is trained and pushed.
    pub receipt: Receipt,
}

impl Incoming {
    /// A minibatch whose step continues the trace in `trace` (the data task that read it;
    /// an empty carrier starts a new trace).
    pub fn new(batch: Minibatch, kind: SourceKind, source: &str, trace: &TraceCarrier) -> Self {
        let span = tracing::info_span!(
            parent: None,
            "trainer.step",
            primus.source = %source,
            primus.rows = batch.rows(),
        );
        set_parent_from_carrier(&span, trace);
        Self {
            batch,
            kind,
            span,
            source: source.to_owned(),
            receipt: Receipt::none(),
        }
    }

    /// The minibatch as served by a data executor, confirmed consumed through `receipt`.
    pub fn with_receipt(mut self, receipt: Receipt) -> Self {
        self.receipt = receipt;
        self
    }
}

/// What a trainer is fed: minibatches, and checkpoint barriers between them.
pub enum Feed {
    Batch(Box<Incoming>),
    /// A minibatch fed before and served again (its stream broke before the executor read
    /// the confirmation): only its receipt, confirmed once everything fed before it is
    /// pushed; it is not trained or counted again.
    Again(Receipt),
    /// Every minibatch served before checkpoint `id`'s barrier came before this.
    Barrier(u64),
}

impl Feed {
    pub fn batch(incoming: Incoming) -> Self {
        Self::Batch(Box::new(incoming))
    }
}
