//! One trainer's loop (Primus §5.1, Monolith §2.2): for each minibatch, the unique keys of
//! each table are looked up (the next minibatch's lookups run while this one computes; the
//! rows a push changed since are read again, `fresh.rs`), pooled, the dense network
//! runs forward and backward, and the sparse gradients of unique keys and the dense
//! gradients go to the parameter store, whose optimizers apply them.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::Stream;
use futures::future::try_join_all;
use primus_batch::hash::KeySet;
use primus_data_client::Receipt;
pub use primus_data_client::TrainerTotals;
use primus_embedding::HotRows;
use primus_model::pooling::{BatchKeys, EmbeddingKernels};
use primus_model::{LookedUp, Model, ModelError, ParamSet, SparseGrads, StepOutput, TableSlot};
use primus_ps_client::TableGrads;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use crate::device::EmbeddingDevice;
use crate::feed::{Feed, Incoming};
use crate::fresh::{RecentPushes, asked_for, overwrite, stale_rows};
use crate::hot::{HotKeys, HotSync, Share};
use crate::meter::{Meter, Reporter};
pub use crate::prefetch::Prepared;
use crate::prefetch::{Fetched, Ready, Rows, prefetch, prepare};
use crate::store::ParameterStore;

/// Trains one model against one parameter store.
pub struct Trainer<S> {
    model: Arc<Model>,
    store: Arc<S>,
    params: Arc<ParamSet>,
    dense_pull_every: u64,
    hot: Option<HotSync>,
    hot_keys: watch::Receiver<Arc<HotKeys>>,
    device: EmbeddingDevice,
    pushes: RecentPushes,
    /// Receipts of minibatches whose pushes were sent; the dense push may still be in
    /// flight (the next push, or a flush, waits for it).
    unconfirmed: Vec<Receipt>,
    pub meter: Meter,
}

impl<S: ParameterStore> Trainer<S> {
    /// Offers this trainer's initial dense parameters (the PS keeps the first offered)
    /// and starts from what the store holds.
    pub async fn start(
        model: Model,
        store: Arc<S>,
        seed: u64,
        dense_pull_every: u32,
        eval_window: usize,
    ) -> anyhow::Result<Self> {
        let params = ParamSet::init(model.layout(), seed);
        let meter = Meter::new(eval_window, &model.layout().heads);
        store
            .init_dense(params.tensors())
            .await
            .context("offering the initial dense parameters")?;
        let mut trainer = Self {
            model: Arc::new(model),
            store,
            params: Arc::new(params),
            dense_pull_every: u64::from(dense_pull_every.max(1)),
            hot: None,
            hot_keys: watch::channel(Arc::new(HotKeys::default())).1,
            device: EmbeddingDevice::Cpu,
            pushes: RecentPushes::default(),
            unconfirmed: Vec::new(),
            meter,
        };
        trainer.pull_dense().await?;
        Ok(trainer)
    }

    /// Continues the step and sample counts of a restored checkpoint.
    pub fn resume_from(&mut self, totals: TrainerTotals) {
        self.meter.steps = totals.steps;
        self.meter.samples = totals.samples;
        self.meter.sources = totals.sources;
        self.meter.confirm();
    }

    pub fn params(&self) -> &ParamSet {
        &self.params
    }

    /// Pools and runs the pooling backward on `device` (the CPU by default).
    pub fn on_device(mut self, device: EmbeddingDevice) -> Self {
        self.device = device;
        self
    }

    /// Trains the job's hot rows locally with the other trainers of `hot` (HypeReca 2FP).
    pub fn with_hot_set(mut self, hot: HotSync) -> Self {
        self.hot_keys = hot.keys();
        self.hot = Some(hot);
        self
    }

    pub fn hot_set(&self) -> Option<&HotSync> {
        self.hot.as_ref()
    }

    /// Waits for work that outlives a step: the dense push in flight and the hot set's push
    /// of its latest round. `train` does this before it returns and at a checkpoint
    /// barrier; a caller of `step` does it before reading the PS.
    pub async fn settle(&mut self) -> anyhow::Result<()> {
        self.flush().await?;
        match &mut self.hot {
            Some(hot) => hot.settle().await,
            None => Ok(()),
        }
    }

    /// Waits for the pushes in flight; every minibatch pushed is then confirmed consumed.
    async fn flush(&mut self) -> anyhow::Result<()> {
        self.store.flush().await?;
        self.confirm_pushed();
        Ok(())
    }

    /// Confirms the minibatches whose pushes have landed, with the totals counting them
    /// (every step counted so far).
    fn confirm_pushed(&mut self) {
        let totals = self.meter.confirm();
        (self.unconfirmed.drain(..)).for_each(|receipt| receipt.consumed(totals));
    }

    /// Looks `incoming`'s keys up, leaving out the rows the hot set holds now.
    pub async fn prepare(&self, incoming: Incoming) -> anyhow::Result<Prepared> {
        let hot = self.hot_keys.borrow().clone();
        let pushes = self.pushes.count();
        prepare(&*self.store, &self.model, &hot, &pushes, incoming).await
    }

    async fn pull_dense(&mut self) -> anyhow::Result<()> {
        let pulled = self.store.pull_dense(&self.params.names()).await?;
        Arc::make_mut(&mut self.params).assign(pulled)?;
        Ok(())
    }

    /// Trains on every minibatch of `batches`, looking the next one up while the current
    /// one computes, and hands `reporter` the meter's figures every `interval`. A barrier
    /// is reported aligned once every minibatch fed before it is trained and pushed.
    /// Returns when the stream ends.
    pub async fn train<B, R>(
        &mut self,
        batches: B,
        interval: Duration,
        reporter: &R,
    ) -> anyhow::Result<()>
    where
        B: Stream<Item = anyhow::Result<Feed>> + Send + 'static,
        R: Reporter,
    {
        let (prepared_tx, ready) = mpsc::channel::<anyhow::Result<Ready>>(1);
        let mut upcoming = Upcoming { ready, taken: None };
        // Without a hot set a minibatch's rows are read by the push before it; with one,
        // the prefetcher looks up those the hot set does not hold.
        let rows = match self.hot {
            None => Rows::ReadByPush,
            Some(_) => Rows::LookedUp {
                hot: self.hot_keys.clone(),
                pushes: self.pushes.count(),
            },
        };
        let prefetcher = tokio::spawn(prefetch(
            batches,
            self.store.clone(),
            self.model.clone(),
            rows,
            prepared_tx,
        ));
        // A report after each step once `interval` has passed (every step for a zero
        // interval), and also when no minibatch came for `interval`: an online trainer
        // waiting on a quiet stream still says how far it got.
        let mut last_report = Instant::now();
        loop {
            // Nothing to train now: what was pushed is confirmed, so an executor whose data
            // ran out sees every minibatch consumed and can end its streams.
            if !self.unconfirmed.is_empty() && !upcoming.has_ready() {
                self.flush().await?;
            }
            let quiet = async {
                match interval.checked_sub(last_report.elapsed()) {
                    _ if interval.is_zero() => std::future::pending().await,
                    Some(left) => tokio::time::sleep(left).await,
                    None => {}
                }
            };
            let next = tokio::select! {
                next = upcoming.recv() => next,
                _ = quiet => {
                    reporter.report(&self.meter.report()).await;
                    last_report = Instant::now();
                    continue;
                }
                // The other hot-set members wait on this trainer, which has no minibatch
                // ready (a quiet stream): it answers their round with nothing to add.
                _ = wanted(&mut self.hot) => {
                    if let Some(hot) = &mut self.hot {
                        hot.idle_round(&self.store).await?;
                    }
                    continue;
                }
            };
            let Some(next) = next else { break };
            match next? {
                Ready::Step(prepared) => {
                    self.step_before(*prepared, Some(&mut upcoming)).await?;
                    if last_report.elapsed() >= interval {
                        reporter.report(&self.meter.report()).await;
                        last_report = Instant::now();
                    }
                }
                // Confirmed with the next confirmation, which follows the pushes of every
                // minibatch fed before it, the same minibatch's first copy among them.
                Ready::Again(receipt) => self.unconfirmed.push(receipt),
                Ready::Barrier(id) => {
                    if let Some(hot) = &mut self.hot {
                        hot.wait_at_barrier(&self.store, id).await?;
                    }
                    // Aligned means pushed: the snapshot that follows holds every step.
                    self.flush().await?;
                    reporter.aligned(id, &self.meter.totals()).await;
                    if let Some(hot) = &mut self.hot
                        && let Err(e) = hot.at_checkpoint().await
                    {
                        tracing::warn!(error = %e, "checking the hot set at a checkpoint");
                    }
                }
            }
        }
        self.settle().await?;
        if let Some(hot) = &mut self.hot
            && let Err(e) = hot.leave().await
        {
            tracing::warn!(error = %e, "leaving the hot set");
        }
        prefetcher.await.context("the prefetch task")?;
        Ok(())
    }

    /// Computes and pushes one looked-up minibatch.
    pub async fn step(&mut self, prepared: Prepared) -> anyhow::Result<StepOutput> {
        self.step_before(prepared, None).await
    }

    /// [`Trainer::step`], followed by the minibatches in `upcoming`: when the next one is
    /// ready by the push, the push also reads the rows it lacks (not looked up yet, or
    /// changed by this push or one since its lookup).
    async fn step_before(
        &mut self,
        prepared: Prepared,
        upcoming: Option<&mut Upcoming>,
    ) -> anyhow::Result<StepOutput> {
        let mut prepared = prepared;
        self.meter.step_begins();
        let late_lookup = Instant::now();
        // The dense pull and the rows' late lookups, both waiting on the last push, at once.
        let pull = self.meter.steps.is_multiple_of(self.dense_pull_every) && self.meter.steps > 0;
        let pull_span = tracing::info_span!(parent: &prepared.span, "trainer.pull_dense");
        let names = self.params.names();
        let pulled = async {
            match pull {
                true => self
                    .store
                    .pull_dense(&names)
                    .instrument(pull_span)
                    .await
                    .map(Some),
                false => Ok(None),
            }
        };
        let (pulled, rows) = futures::try_join!(pulled, self.rows(&mut prepared))?;
        if let Some(pulled) = pulled {
            // The last step's compute has let go of its share: assigned in place, not copied.
            Arc::make_mut(&mut self.params).assign(pulled)?;
        }
        let lookup_time = prepared.lookup_time + late_lookup.elapsed();
        // Counted once, for the hot share and the hot set's samples.
        let access_counts = self.hot.is_some().then(|| prepared.keys.access_counts());
        if let Some(counts) = &access_counts {
            self.count_hot_accesses(&prepared.keys, counts);
        }
        let started = Instant::now();
        let (model, params) = (self.model.clone(), self.params.clone());
        let device = self.device.clone();
        let compute_span = tracing::info_span!(parent: &prepared.span, "trainer.compute");
        let push_span = tracing::info_span!(parent: &prepared.span, "trainer.push");
        let keys = prepared.keys.clone();
        // A minibatch served again after a trainer died is applied where it was not yet.
        let minibatch = prepared.receipt.minibatch();
        let (sparse_tx, sparse_rx) = oneshot::channel();
        let computing = tokio::task::spawn_blocking(move || {
            compute_span
                .in_scope(|| compute(&model, &params, device.kernels(), prepared, rows, sparse_tx))
        });
        // The sparse push starts as soon as the embeddings' gradients are known, beside
        // the rest of the backward; the dense push follows that.
        let sparse = match sparse_rx.await {
            Ok(sparse) => sparse?,
            Err(_) => {
                computing.await.context("the compute task")??;
                anyhow::bail!("the compute task ended without the embeddings' gradients");
            }
        };
        let pushing = self.pushed_keys(&keys);
        // A hot set's replica may change before the next step: its rows are read then.
        let mut next = (upcoming.filter(|_| self.hot.is_none()))
            .and_then(Upcoming::next_step)
            .filter(|next| next.fetched.iter().all(|f| f.positions.is_none()));
        let gradients = Gradients {
            keys: &keys,
            grads: &sparse.grads,
            wide_grads: &sparse.wide_grads,
        };
        let sparse_push = self
            .push_sparse(gradients, &pushing, next.as_deref_mut(), minibatch)
            .instrument(push_span);
        let dense_push = async {
            // When the compute task ended: the sparse push, polled first, may have kept
            // this task from seeing it at once.
            let (prepared, mut output, computed) =
                computing.await.context("the compute task")??;
            let dense = std::mem::take(&mut output.dense_grads);
            (self.store.push_dense(dense, minibatch).await).context("pushing dense gradients")?;
            anyhow::Ok((prepared, output, computed))
        };
        let (hot_share, (mut prepared, output, computed)) =
            futures::try_join!(sparse_push, dense_push)?;
        self.pushes.record(pushing);
        // This push waited for the dense push before it: those minibatches have landed
        // (and are counted; this one is not yet).
        self.confirm_pushed();
        self.unconfirmed
            .push(std::mem::replace(&mut prepared.receipt, Receipt::none()));
        if let Some(next) = next {
            // Its rows are as fresh as a lookup after this push.
            next.looked_up_at = Some(self.pushes.count().now());
        }
        if let Some(hot) = &mut self.hot {
            let remote = lookup_time + computed.elapsed();
            let counts = access_counts.unwrap_or_default();
            hot.finish_step(&self.store, &prepared.keys, &counts, hot_share, remote)
                .await?;
            self.meter.hot_rows = hot.status().rows;
        }
        // Checked by the step.
        let labels = self.model.head_labels(&prepared.batch)?;
        let meter = &mut self.meter;
        meter.compute += computed - started;
        meter.step_times += &output.times;
        meter.push += computed.elapsed();
        meter.lookup += lookup_time;
        let rows = prepared.batch.rows() as u64;
        meter.count(&prepared.source, rows);
        meter.interval_samples += rows;
        meter.interval_steps += 1;
        meter.score(&output, &labels);
        Ok(output)
    }

    /// Each table's rows with the values this step computes with: hot rows from the
    /// replica (updated by the previous round), the others from the PS as prefetched, and
    /// any key that left the hot set since the prefetch, or that a push changed since,
    /// looked up now.
    async fn rows(&self, prepared: &mut Prepared) -> anyhow::Result<Vec<Vec<f32>>> {
        let layout = self.model.layout();
        let fetched = std::mem::take(&mut prepared.fetched);
        let keys = &prepared.keys;
        let merged = (layout.tables.iter().zip(fetched).enumerate())
            .map(|(t, (slot, fetched))| self.table_rows(t, slot, &keys.tables[t], fetched));
        let mut all = try_join_all(merged).await?;
        self.refresh(prepared, &mut all).await?;
        Ok(all)
    }

    /// Table `t`'s rows for `keys` as looked up (with the hot set's current ones).
    async fn table_rows(
        &self,
        t: usize,
        slot: &TableSlot,
        keys: &[u64],
        fetched: Fetched,
    ) -> anyhow::Result<Vec<f32>> {
        match (fetched.positions, self.hot_replica(t)) {
            (None, None) => Ok(fetched.rows),
            (positions, replica) => {
                let fetched = Fetched {
                    positions,
                    rows: fetched.rows,
                };
                self.merge_rows(slot, keys, fetched, replica).await
            }
        }
    }

    /// Reads, in one call, the rows (and first-order weights) of `prepared` that were not
    /// looked up yet or that a push changed since; hot rows come from the replica, which
    /// is current.
    async fn refresh(&self, prepared: &mut Prepared, rows: &mut [Vec<f32>]) -> anyhow::Result<()> {
        let stale = self.pushes.since(prepared.looked_up_at);
        let changed = stale_rows(&stale, &prepared.keys, |t, key| {
            self.hot_replica(t).is_some_and(|r| r.contains(key))
        });
        if changed.is_empty() {
            return Ok(());
        }
        let layout = self.model.layout();
        let asked = asked_for(layout, &changed);
        let lookup_span = tracing::info_span!(parent: &prepared.span, "trainer.lookup");
        let fresh = self
            .store
            .lookup_tables(&asked)
            .instrument(lookup_span)
            .await
            .context("looking up the minibatch's rows")?;
        let mut rows: Vec<&mut Vec<f32>> = rows.iter_mut().collect();
        overwrite(
            layout,
            &changed,
            &asked,
            fresh,
            &mut rows,
            &mut prepared.wide,
        )
    }

    /// The keys a push of `keys` changed on the store: all but the hot set's.
    fn pushed_keys(&self, keys: &BatchKeys) -> Vec<KeySet> {
        keys.tables
            .iter()
            .enumerate()
            .map(|(t, keys)| {
                let replica = self.hot_replica(t);
                keys.iter()
                    .filter(|k| !replica.is_some_and(|r| r.contains(**k)))
                    .copied()
                    .collect()
            })
            .collect()
    }

    /// Layout table `t`'s hot rows, when the hot set holds any.
    fn hot_replica(&self, t: usize) -> Option<&HotRows> {
        let replica = self.hot.as_ref().and_then(|h| h.replica(t));
        replica.filter(|r| !r.is_empty())
    }

    /// One table's rows for `keys`: the replica's, else the prefetched ones, else looked
    /// up now.
    async fn merge_rows(
        &self,
        slot: &TableSlot,
        keys: &[u64],
        fetched: Fetched,
        replica: Option<&HotRows>,
    ) -> anyhow::Result<Vec<f32>> {
        let dim = slot.dim;
        let mut rows = vec![0.0f32; keys.len() * dim];
        let mut filled = vec![false; keys.len()];
        if let Some(replica) = replica {
            replica.fill_weights(keys, &mut rows, &mut filled)?;
        }
        let positions = fetched
            .positions
            .unwrap_or_else(|| (0..keys.len()).collect());
        for (i, &p) in positions.iter().enumerate() {
            if !filled[p] {
                rows[p * dim..][..dim].copy_from_slice(&fetched.rows[i * dim..][..dim]);
                filled[p] = true;
            }
        }
        let late: Vec<usize> = (0..keys.len()).filter(|p| !filled[*p]).collect();
        if !late.is_empty() {
            let late_keys: Vec<u64> = late.iter().map(|p| keys[*p]).collect();
            let looked_up = self
                .store
                .lookup(&slot.name, &late_keys)
                .await
                .with_context(|| format!("looking up table {:?}", slot.name))?;
            for (i, p) in late.into_iter().enumerate() {
                rows[p * dim..][..dim].copy_from_slice(&looked_up[i * dim..][..dim]);
            }
        }
        Ok(rows)
    }

    /// `counts`: [`BatchKeys::access_counts`] of `keys`.
    fn count_hot_accesses(&mut self, keys: &BatchKeys, counts: &[Vec<u64>]) {
        let Some(hot) = &self.hot else { return };
        let (mut accesses, mut on_hot) = (0u64, 0u64);
        for (t, counts) in counts.iter().enumerate() {
            let replica = hot.replica(t);
            for (key, count) in keys.tables[t].iter().zip(counts) {
                accesses += count;
                if replica.is_some_and(|r| r.contains(*key)) {
                    on_hot += count;
                }
            }
        }
        self.meter.interval_accesses += accesses;
        self.meter.interval_hot_accesses += on_hot;
    }

    /// Pushes the step's sparse gradients to the PS, except those of hot rows, which it
    /// returns. With `next`, the push also reads again `next`'s rows that it (`pushing`,
    /// each table's keys) or a push since `next`'s lookup changes.
    async fn push_sparse(
        &self,
        gradients: Gradients<'_>,
        pushing: &Vec<KeySet>,
        next: Option<&mut Prepared>,
        minibatch: u64,
    ) -> anyhow::Result<Share> {
        let layout = self.model.layout();
        let (pushes, hot_share) = self.split_hot(&gradients);
        let pushed: Vec<TableGrads<'_>> = (pushes.iter())
            .filter(|(_, keys, _)| !keys.is_empty())
            .map(|(table, keys, grads)| TableGrads { table, keys, grads })
            .collect();
        let changed = match &next {
            Some(next) => {
                let stale = self.pushes.since(next.looked_up_at).and(pushing);
                stale_rows(&stale, &next.keys, |_, _| false)
            }
            None => Vec::new(),
        };
        let asked = asked_for(layout, &changed);
        let fresh = (self.store.push_tables(&pushed, &asked, minibatch).await)
            .context("pushing sparse gradients")?;
        if let Some(next) = next {
            let mut rows: Vec<&mut Vec<f32>> =
                next.fetched.iter_mut().map(|f| &mut f.rows).collect();
            overwrite(layout, &changed, &asked, fresh, &mut rows, &mut next.wide)?;
        }
        Ok(hot_share)
    }

    /// Each table's gradients to push (first-order tables' after theirs), and the hot
    /// rows' share, which the hot set applies.
    fn split_hot<'a>(&'a self, gradients: &Gradients<'a>) -> (Vec<TablePush<'a>>, Share) {
        let layout = self.model.layout();
        let Gradients {
            keys,
            grads,
            wide_grads,
            ..
        } = *gradients;
        let mut pushes = Vec::new();
        let mut hot_share = Share {
            tables: vec![(Vec::new(), Vec::new()); layout.tables.len()],
        };
        for (t, table) in layout.tables.iter().enumerate() {
            let (keys_t, grads_t) = (&keys.tables[t], &grads[t]);
            match self.hot.as_ref().filter(|_| self.hot_replica(t).is_some()) {
                Some(hot) => {
                    let ((cold_keys, cold_grads), hot_rows) = hot.split(t, keys_t, grads_t);
                    hot_share.tables[t] = hot_rows;
                    pushes.push((
                        table.name.as_str(),
                        Cow::Owned(cold_keys),
                        Cow::Owned(cold_grads),
                    ));
                }
                None => pushes.push((
                    table.name.as_str(),
                    Cow::Borrowed(keys_t.as_slice()),
                    Cow::Borrowed(grads_t.as_slice()),
                )),
            }
            if let (Some(wide), Some(g)) = (&table.wide, wide_grads.get(t)) {
                pushes.push((
                    wide.as_str(),
                    Cow::Borrowed(keys_t.as_slice()),
                    Cow::Borrowed(g.as_slice()),
                ));
            }
        }
        (pushes, hot_share)
    }
}

/// One table's keys and gradients to push.
type TablePush<'a> = (&'a str, Cow<'a, [u64]>, Cow<'a, [f32]>);

/// A step's sparse gradients: each table's, per unique key of `keys`, and each
/// first-order table's.
#[derive(Clone, Copy)]
struct Gradients<'a> {
    keys: &'a BatchKeys,
    grads: &'a [Vec<f32>],
    wide_grads: &'a [Vec<f32>],
}

/// The minibatches and barriers the prefetcher has ready, with the next one taken early
/// when a push wants to read its stale rows.
struct Upcoming {
    ready: mpsc::Receiver<anyhow::Result<Ready>>,
    taken: Option<anyhow::Result<Ready>>,
}

impl Upcoming {
    /// The next minibatch or barrier; `None` once the prefetcher is done.
    async fn recv(&mut self) -> Option<anyhow::Result<Ready>> {
        match self.taken.take() {
            Some(taken) => Some(taken),
            None => self.ready.recv().await,
        }
    }

    /// Whether the next minibatch or barrier is ready now.
    fn has_ready(&mut self) -> bool {
        if self.taken.is_none() {
            self.taken = self.ready.try_recv().ok();
        }
        self.taken.is_some()
    }

    /// The next minibatch, when it is ready now and no barrier comes first.
    fn next_step(&mut self) -> Option<&mut Prepared> {
        if self.taken.is_none() {
            self.taken = self.ready.try_recv().ok();
        }
        match &mut self.taken {
            Some(Ok(Ready::Step(next))) => Some(next),
            _ => None,
        }
    }
}

/// Resolves when the other members of `hot`'s group wait for this trainer's share.
async fn wanted(hot: &mut Option<HotSync>) {
    match hot {
        Some(hot) => hot.wanted().await,
        None => std::future::pending().await,
    }
}

/// A step's compute-bound part in the model ([`Model::train_minibatch`]), and when it ended; the sparse
/// gradients go to `sparse_tx` as soon as they are known, before the rest of the dense
/// network's backward.
fn compute(
    model: &Model,
    params: &ParamSet,
    kernels: &dyn EmbeddingKernels,
    prepared: Prepared,
    rows: Vec<Vec<f32>>,
    sparse_tx: oneshot::Sender<Result<SparseGrads, ModelError>>,
) -> anyhow::Result<(Prepared, StepOutput, Instant)> {
    let looked_up = LookedUp {
        keys: &prepared.keys,
        rows: &rows,
        wide: &prepared.wide,
    };
    let on_sparse_grads = |grads| {
        // The receiver goes away only with the step, which then has no use for them.
        let _ = sparse_tx.send(grads);
    };
    let (batch, tower) = (&prepared.batch, prepared.tower);
    let output =
        model.train_minibatch(params, kernels, batch, looked_up, tower, on_sparse_grads)?;
    Ok((prepared, output, Instant::now()))
}
