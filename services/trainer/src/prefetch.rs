//! The lookup side of a step: resolves each minibatch to unique keys per table ahead of
//! its step, in the order the minibatches and checkpoint barriers were fed. Its rows are
//! read by the push of the step before, in the same calls per shard; with a hot set, the
//! prefetcher looks up the rows the hot set does not hold (every table in one call).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{Stream, StreamExt};
use primus_batch::Minibatch;
use primus_data_client::Receipt;
use primus_model::pooling::BatchKeys;
use primus_model::{Model, ModelLayout, Tower};
use primus_proto::v1::SourceKind;
use primus_ps_client::TableKeys;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use crate::feed::{Feed, Incoming};
use crate::hot::HotKeys;
use crate::store::ParameterStore;

/// What the prefetcher hands the step loop, in the order it was fed.
pub(crate) enum Ready {
    Step(Box<Prepared>),
    Again(Receipt),
    Barrier(u64),
}

/// Rows of one table looked up on the PS: for the keys at `positions` among the table's
/// unique keys, or for all of them (`None`). Hot keys are left out.
pub(crate) struct Fetched {
    pub(crate) positions: Option<Vec<usize>>,
    pub(crate) rows: Vec<f32>,
}

/// A minibatch with its rows looked up, ready to compute.
pub struct Prepared {
    pub batch: Minibatch,
    pub tower: Tower,
    pub(crate) span: tracing::Span,
    /// Shared with the push, which starts while the compute still holds the minibatch.
    pub(crate) keys: Arc<BatchKeys>,
    pub(crate) fetched: Vec<Fetched>,
    pub(crate) wide: Vec<Vec<f32>>,
    pub(crate) lookup_time: Duration,
    /// Pushes completed when the lookup began; `None` while the rows are not looked up
    /// yet (zeros, read by the push before the step or at its start).
    pub(crate) looked_up_at: Option<u64>,
    /// The Dataset source its rows came from.
    pub(crate) source: String,
    /// Confirmed to the data executor once the step's pushes have landed.
    pub(crate) receipt: Receipt,
}

impl Prepared {
    /// The minibatch's unique keys per table (what it looked up and will push).
    pub fn keys(&self) -> &BatchKeys {
        &self.keys
    }
}

pub(crate) fn tower(kind: SourceKind) -> Tower {
    match kind {
        SourceKind::Stream => Tower::Adapt,
        _ => Tower::Memory,
    }
}

/// Completed pushes, read by the prefetcher as a lookup starts (the rows pushed since are
/// read again, `fresh.rs`).
#[derive(Debug, Clone, Default)]
pub(crate) struct PushCount(Arc<AtomicU64>);

impl PushCount {
    pub(crate) fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// `count` pushes have completed.
    pub(crate) fn completed(&self, count: u64) {
        self.0.store(count, Ordering::Release);
    }
}

/// For each layout table, the index of its first-order weights among a minibatch's wide
/// rows (tables with a first-order part, in layout order).
pub(crate) fn wide_positions(layout: &ModelLayout) -> Vec<Option<usize>> {
    let mut next = 0;
    (layout.tables.iter())
        .map(|slot| {
            slot.wide.as_ref().map(|_| {
                next += 1;
                next - 1
            })
        })
        .collect()
}

/// What a multi-table lookup asked of each table: its name and how many keys.
pub(crate) fn asked_of(asked: &[TableKeys<'_>]) -> Vec<(String, usize)> {
    (asked.iter())
        .map(|a| (a.table.to_owned(), a.keys.len()))
        .collect()
}

/// Fails unless the store answered `width` floats for each key `asked`.
pub(crate) fn check_rows(
    (table, keys): &(String, usize),
    rows: &[f32],
    width: usize,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        rows.len() == keys * width,
        "table {table:?}: the store answered {} floats for {keys} keys of width {width}",
        rows.len(),
    );
    Ok(())
}

/// Looks up one minibatch's unique keys in every table (and wide companion) at once,
/// except the keys `hot` replicates.
pub(crate) async fn prepare<S: ParameterStore>(
    store: &S,
    model: &Model,
    hot: &HotKeys,
    pushes: &PushCount,
    incoming: Incoming,
) -> anyhow::Result<Prepared> {
    let started = Instant::now();
    let looked_up_at = pushes.now();
    let mut prepared = keyed(model, incoming)?;
    let lookup_span = tracing::info_span!(parent: &prepared.span, "trainer.lookup");
    let layout = model.layout();
    let keys = &prepared.keys;
    // Each table's keys not in the hot set (positions among its keys when some are).
    let cold: Vec<(Option<Vec<usize>>, Vec<u64>)> = (keys.tables.iter().enumerate())
        .map(|(t, keys)| {
            let positions = (!hot.is_empty()).then(|| {
                (0..keys.len())
                    .filter(|p| !hot.contains(t, keys[*p]))
                    .collect::<Vec<usize>>()
            });
            let cold = match &positions {
                Some(positions) => positions.iter().map(|p| keys[*p]).collect(),
                None => keys.clone(),
            };
            (positions, cold)
        })
        .collect();
    // One call for every table's rows, then every first-order table's weights.
    let rows_asked = (layout.tables.iter().zip(&cold)).map(|(slot, (_, cold))| TableKeys {
        table: &slot.name,
        keys: cold,
    });
    let wide_asked = (layout.tables.iter().zip(&keys.tables))
        .filter_map(|(slot, keys)| slot.wide.as_ref().map(|table| TableKeys { table, keys }));
    let asked: Vec<TableKeys<'_>> = rows_asked.chain(wide_asked).collect();
    let looked_up = store
        .lookup_tables(&asked)
        .instrument(lookup_span)
        .await
        .context("looking up the minibatch's rows")?;
    let mut looked_up = asked_of(&asked).into_iter().zip(looked_up);
    let mut fetched = Vec::with_capacity(cold.len());
    for ((positions, _), slot) in cold.into_iter().zip(&layout.tables) {
        let (asked, rows) = looked_up.next().context("an answer per table")?;
        check_rows(&asked, &rows, slot.dim)?;
        fetched.push(Fetched { positions, rows });
    }
    let mut wide = Vec::new();
    for (asked, weights) in looked_up {
        check_rows(&asked, &weights, 1)?;
        wide.push(weights);
    }
    (prepared.fetched, prepared.wide) = (fetched, wide);
    prepared.looked_up_at = Some(looked_up_at);
    prepared.lookup_time = started.elapsed();
    Ok(prepared)
}

/// One minibatch's unique keys per table, with its rows not looked up yet (zeros): the push
/// of the step before reads them, after its gradients are applied, in the same calls.
fn prepare_unread(model: &Model, incoming: Incoming) -> anyhow::Result<Prepared> {
    let started = Instant::now();
    let mut prepared = keyed(model, incoming)?;
    let layout = model.layout();
    let keys = &prepared.keys.tables;
    prepared.fetched = (layout.tables.iter().zip(keys))
        .map(|(slot, keys)| Fetched {
            positions: None,
            rows: vec![0.0; keys.len() * slot.dim],
        })
        .collect();
    prepared.wide = (layout.tables.iter().zip(keys))
        .filter(|(slot, _)| slot.wide.is_some())
        .map(|(_, keys)| vec![0.0; keys.len()])
        .collect();
    prepared.lookup_time = started.elapsed();
    Ok(prepared)
}

/// `incoming` resolved to its unique keys per table, with no rows yet.
fn keyed(model: &Model, incoming: Incoming) -> anyhow::Result<Prepared> {
    let Incoming {
        batch,
        kind,
        span,
        source,
        receipt,
    } = incoming;
    let keys = BatchKeys::of(model.layout(), &batch.sparse)?;
    Ok(Prepared {
        batch,
        tower: tower(kind),
        span,
        keys: Arc::new(keys),
        fetched: Vec::new(),
        wide: Vec::new(),
        lookup_time: Duration::ZERO,
        looked_up_at: None,
        source,
        receipt,
    })
}

/// Where a prefetched minibatch's rows come from.
pub(crate) enum Rows {
    /// Looked up by the prefetcher, beside the steps before (without the hot set's keys).
    LookedUp {
        hot: watch::Receiver<Arc<HotKeys>>,
        pushes: PushCount,
    },
    /// Read by the push of the step before, in the same calls (`prepare_unread`).
    ReadByPush,
}

/// Prepares `batches`' minibatches in order, handing them and the barriers to `out`.
pub(crate) async fn prefetch<S: ParameterStore, B>(
    batches: B,
    store: Arc<S>,
    model: Arc<Model>,
    rows: Rows,
    out: mpsc::Sender<anyhow::Result<Ready>>,
) where
    B: Stream<Item = anyhow::Result<Feed>> + Send + 'static,
{
    let mut batches = std::pin::pin!(batches);
    while let Some(next) = batches.next().await {
        let ready = match next {
            Ok(Feed::Batch(incoming)) => {
                let prepared = match &rows {
                    Rows::LookedUp { hot, pushes } => {
                        let hot = hot.borrow().clone();
                        prepare(&*store, &model, &hot, pushes, *incoming).await
                    }
                    Rows::ReadByPush => prepare_unread(&model, *incoming),
                };
                prepared.map(|prepared| Ready::Step(Box::new(prepared)))
            }
            Ok(Feed::Again(receipt)) => Ok(Ready::Again(receipt)),
            Ok(Feed::Barrier(id)) => Ok(Ready::Barrier(id)),
            Err(e) => Err(e),
        };
        let failed = ready.is_err();
        if out.send(ready).await.is_err() || failed {
            return;
        }
    }
}
