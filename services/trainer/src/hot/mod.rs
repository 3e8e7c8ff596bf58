//! HypeReca's two-fold parallelism (§5) across a job's trainers: the most accessed rows
//! (the hot set) are replicated on every trainer and trained there, in lockstep; every
//! other row stays on the PS shards.
//!
//! - **Choice.** Every trainer counts its key accesses over `warmup_batches` minibatches
//!   and what the PS cost it meanwhile (lookup and push seconds per access). The leader,
//!   the lowest trainer id the [`TrainerDirectory`] lists, then times how long moving and
//!   applying rows takes here (a probe through NATS and a local apply) and picks the
//!   number of rows that minimises HypeReca's latency model, or `rows` when set. It
//!   publishes a [`HotPlan`] naming the members and the keys.
//! - **Install.** Each member, at its next step boundary, passes a barrier round (so that
//!   no member still pushes those rows) and copies the rows with their optimizer state
//!   from the PS (`ReadRows`). All members read the same values.
//! - **Rounds.** After each step, every member publishes its gradients of hot rows
//!   (round `r` of the plan's generation) and waits for every other member's. All sum them
//!   in member order and apply the sum with the table's optimizer, so the replicas stay
//!   bitwise equal. The lowest participating member also pushes the sum to the PS, which
//!   therefore holds the same rows: checkpoints and serving need nothing else.
//! - **Waiting.** A member with no minibatch ready answers a round the others started
//!   with an empty, idle share. At a checkpoint barrier a member takes part in empty
//!   rounds until every member is at it, so the barrier is passed together and the PS
//!   holds every hot update trained before it.
//! - **Changes.** At a checkpoint the leader chooses again when the hot rows' share of
//!   its accesses drifted or the directory lists other trainers; the new plan takes
//!   effect after a round everyone names. A member whose data ends says so in its next
//!   round. A member silent for `sync_timeout_ms` ends the group: each trainer pushes its
//!   unsynchronised gradients to the PS and goes back to it for every row, and the
//!   choice starts over.
//!
//! A single member needs no NATS: its rounds are local. Wide (first-order) companion
//! tables always go through the PS.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::BoxFuture;
use primus_bus::Bus;
use primus_embedding::HotRows;
use primus_embedding::hot_set::{CostModel, HotSet, KeyFrequencies};
use primus_model::ModelLayout;
use primus_model::pooling::BatchKeys;
use primus_proto::packed::{decode_keys, encode_f32, encode_keys};
use primus_proto::v1::hot_message::Kind;
use primus_proto::v1::{HotMessage, HotPlan, HotProbe, HotRound, HotTableRows};
use primus_spec::job::{HotSetSpec, TableSpec};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::device::EmbeddingDevice;
use crate::store::ParameterStore;

mod share;

pub use share::{Rows, Share};
use share::{chunk, parse_share, share_rows, sum_shares};

/// Lists the ids of the job's trainers (the master's topology in the service, a fixed
/// list for a static deployment). The lowest id leads.
pub type TrainerDirectory =
    Arc<dyn Fn() -> BoxFuture<'static, anyhow::Result<Vec<String>>> + Send + Sync>;

/// How long members that all wait at a barrier pause between their empty rounds.
const IDLE_PAUSE: Duration = Duration::from_millis(5);
/// Rows moved and applied by the cost probe.
const PROBE_ROWS: usize = 1024;

/// A (layout table, key) pair: hot sets span tables.
type TableKey = (u32, u64);

/// The keys replicated now, per layout table (what the prefetcher leaves out).
#[derive(Debug, Default)]
pub struct HotKeys {
    tables: Vec<HashSet<u64>>,
}

impl HotKeys {
    pub fn contains(&self, table: usize, key: u64) -> bool {
        self.tables.get(table).is_some_and(|t| t.contains(&key))
    }

    pub fn is_empty(&self) -> bool {
        self.tables.iter().all(HashSet::is_empty)
    }
}

/// What the hot set is doing, for reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HotStatus {
    pub generation: u64,
    pub members: usize,
    pub rows: usize,
    /// Share of accesses the rows were chosen to cover.
    pub expected_coverage: f64,
    /// Rounds completed in this generation.
    pub rounds: u64,
}

struct Warmup {
    sample: KeyFrequencies<TableKey>,
    remote: Duration,
    accesses: u64,
}

struct Group {
    generation: u64,
    round: u64,
    /// Sorted ids.
    members: Vec<String>,
    /// Per layout table.
    replicas: Vec<HotRows>,
    expected_coverage: f64,
    /// The leader's accesses since the plan, for the drift check.
    recent: KeyFrequencies<TableKey>,
    /// Installed after this generation's round `.0`.
    next: Option<(u64, HotPlan)>,
}

enum Phase {
    Warmup(Warmup),
    /// Not the leader: trains through the PS until a plan names it.
    Following,
    Active(Box<Group>),
}

#[derive(Debug, Clone, Copy)]
struct Costs {
    sync_seconds: f64,
    synced_rows: u64,
    remote_seconds: f64,
    remote_accesses: u64,
}

/// Why a member takes part in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoundMode {
    /// After a step (or the install barrier).
    Step,
    /// Waiting at a checkpoint's barrier, with nothing to add.
    AtBarrier(u64),
    /// No minibatch ready; answering a round the others started.
    Idle,
}

/// How a round ended.
#[derive(Debug, Default)]
struct RoundEnd {
    /// Every participant was at the barrier this member waits at.
    all_at_barrier: bool,
    /// No participant added a gradient.
    empty: bool,
}

/// Which round a member's share belongs to.
struct Outgoing {
    generation: u64,
    round: u64,
    at_barrier: Option<u64>,
    idle: bool,
}

/// One member's part in a completed round.
struct Contribution {
    member: String,
    share: Share,
    at_barrier: Option<u64>,
}

/// Every member's share of one round, as far as it arrived: per member its parts.
type RoundParts = HashMap<String, Vec<Option<HotRound>>>;

/// A trainer's part in the job's hot set.
pub struct HotSync {
    settings: HotSetSpec,
    me: String,
    bus: Bus,
    subject: String,
    inbox: mpsc::UnboundedReceiver<HotMessage>,
    listener: JoinHandle<()>,
    directory: TrainerDirectory,
    specs: Vec<TableSpec>,
    /// Where the replicas live and train.
    device: EmbeddingDevice,
    keys: watch::Sender<Arc<HotKeys>>,
    phase: Phase,
    /// The highest generation seen, so that plans only move forward.
    generation: u64,
    rounds: HashMap<(u64, u64), RoundParts>,
    plans: HashMap<u64, Vec<Option<HotPlan>>>,
    echoes: HashSet<u64>,
    /// Trainers whose data ended: no plan names them again.
    departed: HashSet<String>,
    /// PS seconds and accesses over this trainer's warmup.
    remote: Option<(f64, u64)>,
    /// Seconds to sync [`PROBE_ROWS`] rows, once this trainer led a choice.
    sync_seconds: Option<f64>,
    /// This member's push of the latest round's sum, running beside its next step.
    pushing: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Drop for HotSync {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// Rows of one round on their way to the PS.
fn spawn_push<S: ParameterStore>(
    store: &Arc<S>,
    specs: &[TableSpec],
    sum: Share,
) -> JoinHandle<anyhow::Result<()>> {
    let (store, specs) = (store.clone(), specs.to_vec());
    tokio::spawn(async move { push_share(&*store, &specs, &sum).await })
}

impl HotSync {
    /// Joins the job's hot-set subject as trainer `me`. Subscribes before anything is
    /// published, so no plan naming this trainer can be missed.
    pub async fn join(
        settings: HotSetSpec,
        bus: &Bus,
        job: &str,
        me: &str,
        layout: &ModelLayout,
        directory: TrainerDirectory,
        device: EmbeddingDevice,
    ) -> anyhow::Result<Self> {
        let subject = bus.subjects().hot(job)?;
        let mut subscription = bus.subscribe::<HotMessage>(subject.clone()).await?;
        bus.flush().await?;
        let (tx, inbox) = mpsc::unbounded_channel();
        let listener = tokio::spawn(async move {
            while let Some(received) = subscription.next().await {
                match received {
                    Ok(received) => {
                        if tx.send(received.message).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "a hot-set message"),
                }
            }
        });
        let all = layout.ps_tables();
        let specs = layout
            .tables
            .iter()
            .map(|slot| {
                all.iter()
                    .find(|t| t.name == slot.name)
                    .cloned()
                    .with_context(|| format!("table {:?} has no spec", slot.name))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (keys, _) = watch::channel(Arc::new(HotKeys::default()));
        Ok(Self {
            settings,
            me: me.to_owned(),
            bus: bus.clone(),
            subject,
            inbox,
            listener,
            directory,
            specs,
            device,
            keys,
            phase: Phase::Warmup(new_warmup()),
            generation: 0,
            rounds: HashMap::new(),
            plans: HashMap::new(),
            echoes: HashSet::new(),
            departed: HashSet::new(),
            remote: None,
            sync_seconds: None,
            pushing: None,
        })
    }

    /// The keys replicated now, kept current.
    pub fn keys(&self) -> watch::Receiver<Arc<HotKeys>> {
        self.keys.subscribe()
    }

    pub fn status(&self) -> HotStatus {
        match &self.phase {
            Phase::Active(group) => HotStatus {
                generation: group.generation,
                members: group.members.len(),
                rows: group.replicas.iter().map(HotRows::len).sum(),
                expected_coverage: group.expected_coverage,
                rounds: group.round.saturating_sub(1),
            },
            _ => HotStatus::default(),
        }
    }

    /// Layout table `table`'s replica, while the hot set is active.
    pub fn replica(&self, table: usize) -> Option<&HotRows> {
        match &self.phase {
            Phase::Active(group) => group.replicas.get(table),
            _ => None,
        }
    }

    /// Splits one table's step gradients into those for the PS and those of hot rows:
    /// `(keys, grads)` of each.
    pub fn split(&self, table: usize, keys: &[u64], grads: &[f32]) -> (Rows, Rows) {
        let dim = self.specs[table].dim as usize;
        let (mut cold, mut hot) = (Rows::default(), Rows::default());
        let replica = self.replica(table);
        for (key, grad) in keys.iter().zip(grads.chunks_exact(dim)) {
            let side = if replica.is_some_and(|r| r.contains(*key)) {
                &mut hot
            } else {
                &mut cold
            };
            side.0.push(*key);
            side.1.extend_from_slice(grad);
        }
        (cold, hot)
    }

    /// After a step: counts its accesses, synchronises its hot gradients with the other
    /// members, and installs or chooses a plan when one is due. `access_counts` is
    /// `keys.access_counts()`; `remote` is what the step's PS lookups and pushes took.
    pub async fn finish_step<S: ParameterStore>(
        &mut self,
        store: &Arc<S>,
        keys: &BatchKeys,
        access_counts: &[Vec<u64>],
        hot: Share,
        remote: Duration,
    ) -> anyhow::Result<()> {
        self.observe(keys, access_counts, remote);
        if matches!(self.phase, Phase::Active(_)) {
            self.round(store, hot, RoundMode::Step).await?;
        }
        if !matches!(self.phase, Phase::Active(_)) {
            self.drain();
            if let Some(plan) = self.plan_for_me() {
                self.install(store, plan).await?;
            } else {
                self.choose_when_due(store).await?;
            }
        }
        Ok(())
    }

    /// At a checkpoint the leader chooses again when the hot rows' share of accesses
    /// drifted or the directory lists other trainers; the plan takes effect after the
    /// next round.
    pub async fn at_checkpoint(&mut self) -> anyhow::Result<()> {
        let Phase::Active(group) = &self.phase else {
            return Ok(());
        };
        if group.members.first() != Some(&self.me) || group.next.is_some() {
            return Ok(());
        }
        let members = self.members().await?;
        let Phase::Active(group) = &mut self.phase else {
            return Ok(());
        };
        // Each checkpoint interval is judged on its own accesses.
        let sample = std::mem::take(&mut group.recent);
        let chosen: HashSet<TableKey> = group
            .replicas
            .iter()
            .enumerate()
            .flat_map(|(t, r)| r.keys().map(move |k| (t as u32, k)))
            .collect();
        let share = sample.share_on(&chosen);
        let drifted = share < group.expected_coverage - self.settings.drift_tolerance;
        if !drifted && members == group.members {
            return Ok(());
        }
        tracing::info!(
            share,
            expected = group.expected_coverage,
            ?members,
            "choosing the hot set again"
        );
        let (generation, round) = (group.generation, group.round);
        let rows_now = group.replicas.iter().map(HotRows::len).sum();
        let costs = self.costs(members.len()).await?;
        let mut plan = self.plan(&sample, costs, members, rows_now);
        plan.generation = self.generation.max(generation) + 1;
        (plan.previous_generation, plan.after_round) = (generation, round);
        self.generation = plan.generation;
        self.publish_plan(&plan).await?;
        if let Phase::Active(group) = &mut self.phase {
            group.next = Some((round, plan));
        }
        Ok(())
    }

    /// The trainer's data ended: the other members stop waiting for it.
    pub async fn leave(&mut self) -> anyhow::Result<()> {
        // The last sums reach the PS before the others go on without this member.
        self.settle().await?;
        self.drain();
        let (generation, round) = match &self.phase {
            Phase::Active(group) if group.members.len() > 1 => (group.generation, group.round),
            Phase::Active(_) => return Ok(()),
            _ => match self.plan_for_me() {
                Some(plan) => (plan.generation, 0),
                None => return Ok(()),
            },
        };
        let message = HotRound {
            trainer_id: self.me.clone(),
            generation,
            round,
            leaving: true,
            grads: Vec::new(),
            part: 0,
            parts: 1,
            at_barrier: None,
            idle: false,
        };
        self.publish(Kind::Round(message)).await
    }

    fn observe(&mut self, keys: &BatchKeys, access_counts: &[Vec<u64>], remote: Duration) {
        let counted = || {
            let mut counted: Vec<(TableKey, u64)> = Vec::new();
            for (t, counts) in access_counts.iter().enumerate() {
                let keys = keys.tables[t].iter().map(|k| (t as u32, *k));
                counted.extend(keys.zip(counts.iter().copied()));
            }
            counted
        };
        match &mut self.phase {
            Phase::Warmup(warmup) => {
                let counted = counted();
                warmup.accesses += counted.iter().map(|(_, c)| c).sum::<u64>();
                warmup.remote += remote;
                warmup.sample.observe_counted(counted);
            }
            Phase::Active(group) if group.members.first() == Some(&self.me) => {
                group.recent.observe_counted(counted())
            }
            _ => {}
        }
    }

    /// The directory's trainers that have not left, and this one.
    async fn members(&self) -> anyhow::Result<Vec<String>> {
        let mut members = (self.directory)().await?;
        members.retain(|m| !self.departed.contains(m));
        if !members.contains(&self.me) {
            members.push(self.me.clone());
        }
        members.sort();
        members.dedup();
        Ok(members)
    }

    async fn choose_when_due<S: ParameterStore>(&mut self, store: &Arc<S>) -> anyhow::Result<()> {
        let Phase::Warmup(warmup) = &self.phase else {
            return Ok(());
        };
        if warmup.sample.batches() < u64::from(self.settings.warmup_batches.max(1)) {
            return Ok(());
        }
        self.remote = Some((warmup.remote.as_secs_f64(), warmup.accesses.max(1)));
        let members = self.members().await?;
        if members.first() != Some(&self.me) {
            tracing::info!(leader = ?members.first(), "waiting for the hot-set leader's plan");
            self.phase = Phase::Following;
            return self.await_plan(store).await;
        }
        let Phase::Warmup(warmup) = std::mem::replace(&mut self.phase, Phase::Following) else {
            return Ok(());
        };
        let costs = self.costs(members.len()).await?;
        let mut plan = self.plan(&warmup.sample, costs, members, 0);
        plan.generation = self.generation + 1;
        self.generation = plan.generation;
        if plan.tables.iter().all(|t| t.keys.is_empty()) {
            tracing::info!("no row is worth replicating; counting again");
            if plan.members.len() > 1 {
                // A plan naming no one: the followers stop waiting for one.
                plan.members.clear();
                self.publish_plan(&plan).await?;
            }
            self.phase = Phase::Warmup(new_warmup());
            return Ok(());
        }
        if plan.members.len() > 1 {
            self.publish_plan(&plan).await?;
        }
        self.install(store, plan).await
    }

    /// The measured costs of the latency model: this trainer's PS seconds per access over
    /// its warmup (none if it joined a plan before its warmup ended) and the seconds to
    /// sync a row among `members` (probed the first time).
    async fn costs(&mut self, members: usize) -> anyhow::Result<Option<Costs>> {
        let Some((remote_seconds, remote_accesses)) = self.remote else {
            return Ok(None);
        };
        let sync_seconds = match self.sync_seconds {
            Some(seconds) => seconds,
            None => {
                let seconds = self.probe(members).await?;
                self.sync_seconds = Some(seconds);
                seconds
            }
        };
        Ok(Some(Costs {
            sync_seconds,
            synced_rows: PROBE_ROWS as u64,
            remote_seconds,
            remote_accesses,
        }))
    }

    /// A follower at the end of its warmup waits (up to `sync_timeout_ms`) for the
    /// leader's plan, which every trainer chooses after the same number of minibatches:
    /// all members then start the same round after the same step.
    async fn await_plan<S: ParameterStore>(&mut self, store: &Arc<S>) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.timeout();
        loop {
            self.drain();
            let newest = self.plans.keys().copied().max();
            if let Some(plan) = newest.and_then(|g| self.complete_plan(g)) {
                if plan.members.contains(&self.me) {
                    self.plans.clear();
                    return self.install(store, plan).await;
                }
                self.plans.clear();
                return Ok(());
            }
            if self.receive(deadline).await.is_err() {
                tracing::info!("no hot-set plan came; training through the PS");
                return Ok(());
            }
        }
    }

    /// The rows to replicate for `sample` under the measured costs.
    /// The `rows` most accessed keys of `sample` when set, else the cost model's choice,
    /// else (no measured costs) the `fallback` most accessed.
    fn plan(
        &self,
        sample: &KeyFrequencies<TableKey>,
        costs: Option<Costs>,
        members: Vec<String>,
        fallback: usize,
    ) -> HotPlan {
        let max_rows = self.settings.max_rows.min(usize::MAX as u64) as usize;
        let top = |rows: usize| {
            let coverage = sample.coverage();
            let rows = rows.min(max_rows);
            (coverage.top(rows).to_vec(), coverage.rho(rows))
        };
        let (keys, expected_coverage) = match (self.settings.rows, costs) {
            (Some(rows), _) => top(rows as usize),
            (None, None) => top(fallback),
            (None, Some(costs)) => {
                let model = CostModel::measured(
                    costs.sync_seconds,
                    costs.synced_rows,
                    costs.remote_seconds,
                    costs.remote_accesses,
                    sample.accesses_per_batch(),
                );
                match model {
                    Ok(model) => {
                        let chosen = HotSet::choose(sample, &model, max_rows);
                        tracing::info!(
                            sync_seconds_per_row = model.sync_seconds_per_row,
                            remote_seconds_per_access = model.remote_seconds_per_access,
                            accesses_per_batch = model.accesses_per_batch,
                            rows = chosen.keys.len(),
                            coverage = chosen.expected_coverage,
                            "hot set chosen by the cost model"
                        );
                        (chosen.keys.into_iter().collect(), chosen.expected_coverage)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "no hot set");
                        (Vec::new(), 0.0)
                    }
                }
            }
        };
        let mut per_table: Vec<Vec<u64>> = vec![Vec::new(); self.specs.len()];
        for (table, key) in keys {
            if let Some(keys) = per_table.get_mut(table as usize) {
                keys.push(key);
            }
        }
        HotPlan {
            generation: 0,
            members,
            tables: per_table
                .into_iter()
                .enumerate()
                .map(|(t, mut keys)| {
                    keys.sort_unstable();
                    HotTableRows {
                        table: t as u32,
                        keys: encode_keys(&keys),
                        grads: Vec::new(),
                    }
                })
                .collect(),
            expected_coverage,
            previous_generation: 0,
            after_round: 0,
            part: 0,
            parts: 1,
        }
    }

    /// Seconds to move and apply [`PROBE_ROWS`] rows: a local apply, plus, with other
    /// members, this trainer's own message echoed by NATS once per other member.
    async fn probe(&mut self, members: usize) -> anyhow::Result<f64> {
        let spec = &self.specs[0];
        let dim = spec.dim as usize;
        let mut scratch = self.device.replica(spec)?;
        let width = dim + scratch.state_len();
        let keys: Vec<u64> = (0..PROBE_ROWS as u64).collect();
        scratch.insert_rows(&keys, &vec![0.5; width * keys.len()])?;
        let grads = vec![0.01f32; PROBE_ROWS * dim];
        let started = Instant::now();
        scratch.apply(&keys, &grads)?;
        let apply = started.elapsed().as_secs_f64();
        if members <= 1 {
            return Ok(apply);
        }
        let nonce = rand_nonce();
        let mut payload = encode_keys(&keys);
        encode_f32(&grads, &mut payload);
        let started = Instant::now();
        self.publish(Kind::Probe(HotProbe {
            trainer_id: self.me.clone(),
            nonce,
            payload,
        }))
        .await?;
        let deadline = Instant::now() + self.timeout();
        while !self.echoes.remove(&nonce) {
            self.receive(deadline)
                .await
                .context("the hot-set probe never came back from NATS")?;
        }
        Ok(apply + started.elapsed().as_secs_f64() * (members - 1) as f64)
    }

    async fn install<S: ParameterStore>(
        &mut self,
        store: &Arc<S>,
        plan: HotPlan,
    ) -> anyhow::Result<()> {
        // The barrier round below must find every earlier sum on the PS.
        self.settle().await?;
        let mut members = plan.members.clone();
        members.sort();
        self.generation = self.generation.max(plan.generation);
        let replicas = self
            .specs
            .iter()
            .map(|spec| self.device.replica(spec))
            .collect::<Result<Vec<_>, _>>()?;
        self.phase = Phase::Active(Box::new(Group {
            generation: plan.generation,
            round: 0,
            members,
            replicas,
            expected_coverage: plan.expected_coverage,
            recent: KeyFrequencies::default(),
            next: None,
        }));
        self.publish_keys();
        // The barrier: once every member passed it, no member pushes these rows to the PS
        // any more, so all read the same values.
        self.round(store, Share::empty(self.specs.len()), RoundMode::Step)
            .await?;
        let Phase::Active(group) = &mut self.phase else {
            return Ok(());
        };
        for table in &plan.tables {
            let t = table.table as usize;
            let (Some(spec), Some(replica)) = (self.specs.get(t), group.replicas.get_mut(t)) else {
                anyhow::bail!(
                    "hot-set plan names table {t}; the model has {}",
                    self.specs.len()
                );
            };
            let keys = decode_keys("hot-set plan keys", &table.keys)?;
            if keys.is_empty() {
                continue;
            }
            let stored = store
                .read_rows(&spec.name, &keys)
                .await
                .with_context(|| format!("reading the hot rows of table {:?}", spec.name))?;
            replica.insert_rows(&stored.keys, &stored.values)?;
        }
        tracing::info!(
            generation = group.generation,
            members = ?group.members,
            rows = group.replicas.iter().map(HotRows::len).sum::<usize>(),
            coverage = group.expected_coverage,
            "hot set installed"
        );
        self.publish_keys();
        Ok(())
    }

    /// One round of the active group: exchange, apply, and the lowest participant's push
    /// of the sum to the PS. Ends the group when a member stays silent. `at_barrier`: this
    /// member waits at that checkpoint's barrier; returns whether every participant did.
    async fn round<S: ParameterStore>(
        &mut self,
        store: &Arc<S>,
        share: Share,
        mode: RoundMode,
    ) -> anyhow::Result<RoundEnd> {
        let at_barrier = match mode {
            RoundMode::AtBarrier(checkpoint) => Some(checkpoint),
            RoundMode::Step | RoundMode::Idle => None,
        };
        let Phase::Active(group) = &self.phase else {
            return Ok(RoundEnd::default());
        };
        let (generation, round, members) = (group.generation, group.round, group.members.clone());
        let exchanged = if members.len() == 1 {
            let mine = Contribution {
                member: self.me.clone(),
                share: share.clone(),
                at_barrier,
            };
            Ok((vec![mine], Vec::new()))
        } else {
            let outgoing = Outgoing {
                generation,
                round,
                at_barrier,
                idle: mode == RoundMode::Idle,
            };
            self.exchange(outgoing, &members, &share).await
        };
        let (contributions, leavers) = match exchanged {
            Ok(exchanged) => exchanged,
            Err(silent) => {
                tracing::warn!(
                    generation,
                    round,
                    ?silent,
                    "a hot-set member stayed silent; every row goes through the PS again"
                );
                self.phase = Phase::Warmup(new_warmup());
                self.publish_keys();
                self.settle().await?;
                push_share(&**store, &self.specs, &share).await?;
                return Ok(RoundEnd::default());
            }
        };
        let end = RoundEnd {
            all_at_barrier: at_barrier.is_some()
                && contributions.iter().all(|c| c.at_barrier == at_barrier),
            empty: contributions
                .iter()
                .all(|c| c.share.tables.iter().all(|(keys, _)| keys.is_empty())),
        };
        let summed = sum_shares(self.specs.len(), contributions.iter().map(|c| &c.share));
        let Phase::Active(group) = &mut self.phase else {
            return Ok(RoundEnd::default());
        };
        for (replica, (keys, grads)) in group.replicas.iter_mut().zip(&summed.tables) {
            if !keys.is_empty() {
                replica.apply(keys, grads)?;
            }
        }
        if contributions.first().map(|c| &c.member) == Some(&self.me)
            && summed.tables.iter().any(|(keys, _)| !keys.is_empty())
        {
            // Rounds reach the PS in order; each push runs beside the next step.
            self.settle().await?;
            self.pushing = Some(spawn_push(store, &self.specs, summed));
        }
        let Phase::Active(group) = &mut self.phase else {
            return Ok(RoundEnd::default());
        };
        group.members.retain(|m| !leavers.contains(m));
        group.round += 1;
        self.departed.extend(leavers);
        let due = group
            .next
            .as_ref()
            .is_some_and(|(after, _)| *after == round);
        if due && let Some((_, plan)) = group.next.take() {
            Box::pin(self.install(store, plan)).await?;
        } else if let Some(plan) = self.plan_after(generation, round) {
            Box::pin(self.install(store, plan)).await?;
        }
        Ok(end)
    }

    /// At checkpoint `checkpoint`'s barrier: takes part in rounds with nothing to add
    /// until every member is at the barrier too. Members reach it after different numbers
    /// of minibatches; without this the first would wait for the others' rounds, and they
    /// for it. When it returns, the lowest member has pushed every gradient trained before
    /// the barrier to the PS, so the checkpoint's snapshot holds them.
    pub async fn wait_at_barrier<S: ParameterStore>(
        &mut self,
        store: &Arc<S>,
        checkpoint: u64,
    ) -> anyhow::Result<()> {
        while let Phase::Active(group) = &self.phase
            && group.members.len() > 1
        {
            let idle = Share::empty(self.specs.len());
            let end = self
                .round(store, idle, RoundMode::AtBarrier(checkpoint))
                .await?;
            if end.all_at_barrier {
                break;
            }
            if end.empty {
                // The others have no minibatch ready either: no need to spin.
                tokio::time::sleep(IDLE_PAUSE).await;
            }
        }
        self.settle().await
    }

    /// Waits until this member's push of the latest round's sum reached the PS.
    pub async fn settle(&mut self) -> anyhow::Result<()> {
        settle(self.pushing.take()).await
    }

    /// Resolves once another member started this member's next round with a share to
    /// add (or at a barrier): it waits on this member. Cancel-safe.
    pub async fn wanted(&mut self) {
        loop {
            if self.others_wait() {
                return;
            }
            match self.inbox.recv().await {
                Some(message) => self.file(message),
                None => std::future::pending().await,
            }
        }
    }

    /// Answers the round the others wait on with nothing to add.
    pub async fn idle_round<S: ParameterStore>(&mut self, store: &Arc<S>) -> anyhow::Result<()> {
        let idle = Share::empty(self.specs.len());
        self.round(store, idle, RoundMode::Idle).await.map(|_| ())
    }

    fn others_wait(&self) -> bool {
        let Phase::Active(group) = &self.phase else {
            return false;
        };
        let Some(arrived) = self.rounds.get(&(group.generation, group.round)) else {
            return false;
        };
        arrived.iter().any(|(member, parts)| {
            *member != self.me && parts.iter().flatten().any(|p| !p.idle && !p.leaving)
        })
    }

    /// A follower's view of a re-chosen plan: the leader published it before its share of
    /// round `round`, naming that round.
    fn plan_after(&mut self, generation: u64, round: u64) -> Option<HotPlan> {
        self.drain();
        let generations: Vec<u64> = self.plans.keys().copied().collect();
        for g in generations {
            if let Some(plan) = self.complete_plan(g)
                && plan.previous_generation == generation
                && plan.after_round == round
            {
                self.plans.remove(&g);
                return Some(plan);
            }
        }
        None
    }

    /// Publishes this member's share of a round and collects everyone's, in member
    /// order. Returns the contributions and the members that left; `Err` names the
    /// members that stayed silent past the timeout.
    async fn exchange(
        &mut self,
        outgoing: Outgoing,
        members: &[String],
        share: &Share,
    ) -> Result<(Vec<Contribution>, Vec<String>), Vec<String>> {
        let Outgoing {
            generation,
            round,
            at_barrier,
            idle,
        } = outgoing;
        let parts = chunk(share_rows(share), &self.specs);
        let count = parts.len() as u32;
        for (part, grads) in parts.into_iter().enumerate() {
            let message = HotRound {
                trainer_id: self.me.clone(),
                generation,
                round,
                leaving: false,
                grads,
                part: part as u32,
                parts: count,
                at_barrier,
                idle,
            };
            if let Err(e) = self.publish(Kind::Round(message)).await {
                tracing::warn!(error = %e, "publishing a hot-set round");
                return Err(vec![self.me.clone()]);
            }
        }
        let deadline = Instant::now() + self.timeout();
        loop {
            let missing = self.missing(generation, round, members);
            if missing.is_empty() {
                break;
            }
            if self.receive(deadline).await.is_err() {
                return Err(missing);
            }
        }
        let mut arrived = self.rounds.remove(&(generation, round)).unwrap_or_default();
        self.rounds
            .retain(|(g, r), _| *g > generation || (*g == generation && *r > round));
        let mut contributions = Vec::new();
        let mut leavers = Vec::new();
        for member in members {
            let parts: Vec<HotRound> = arrived
                .remove(member)
                .unwrap_or_default()
                .into_iter()
                .flatten()
                .collect();
            if parts.iter().any(|p| p.leaving) {
                leavers.push(member.clone());
                continue;
            }
            match parse_share(&parts, &self.specs) {
                Ok(share) => contributions.push(Contribution {
                    member: member.clone(),
                    share,
                    at_barrier: parts.first().and_then(|p| p.at_barrier),
                }),
                Err(e) => {
                    tracing::warn!(member = %member, error = %e, "a malformed hot-set share");
                    return Err(vec![member.clone()]);
                }
            }
        }
        Ok((contributions, leavers))
    }

    /// The members whose share of a round has not fully arrived.
    fn missing(&self, generation: u64, round: u64, members: &[String]) -> Vec<String> {
        let arrived = self.rounds.get(&(generation, round));
        members
            .iter()
            .filter(|m| {
                !arrived.is_some_and(|a| {
                    a.get(*m)
                        .is_some_and(|parts| parts.iter().all(Option::is_some))
                })
            })
            .cloned()
            .collect()
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.settings.sync_timeout_ms.max(1))
    }

    /// Files every message waiting in the inbox.
    fn drain(&mut self) {
        while let Ok(message) = self.inbox.try_recv() {
            self.file(message);
        }
    }

    /// Waits for one message until `deadline` and files it.
    async fn receive(&mut self, deadline: Instant) -> anyhow::Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.inbox.recv()).await {
            Ok(Some(message)) => {
                self.file(message);
                Ok(())
            }
            Ok(None) => anyhow::bail!("the hot-set subscription closed"),
            Err(_) => anyhow::bail!("no hot-set message within {left:?}"),
        }
    }

    fn file(&mut self, message: HotMessage) {
        match message.kind {
            Some(Kind::Round(round)) => {
                let Some(key) = self.current_round_key(&round) else {
                    return;
                };
                let parts = self
                    .rounds
                    .entry(key)
                    .or_default()
                    .entry(round.trainer_id.clone())
                    .or_default();
                let (part, count) = (round.part as usize, round.parts.max(1) as usize);
                if parts.len() != count {
                    *parts = vec![None; count];
                }
                if let Some(slot) = parts.get_mut(part) {
                    *slot = Some(round);
                }
            }
            Some(Kind::Plan(plan)) if plan.generation > self.active_generation() => {
                let (part, count) = (plan.part as usize, plan.parts.max(1) as usize);
                let parts = self.plans.entry(plan.generation).or_default();
                if parts.len() != count {
                    *parts = vec![None; count];
                }
                if let Some(slot) = parts.get_mut(part) {
                    *slot = Some(plan);
                }
            }
            Some(Kind::Probe(probe)) if probe.trainer_id == self.me => {
                self.echoes.insert(probe.nonce);
            }
            _ => {}
        }
    }

    /// Rounds of past generations or already completed rounds are dropped.
    fn current_round_key(&self, round: &HotRound) -> Option<(u64, u64)> {
        match &self.phase {
            Phase::Active(group)
                if round.generation < group.generation
                    || (round.generation == group.generation && round.round < group.round) =>
            {
                None
            }
            _ => Some((round.generation, round.round)),
        }
    }

    fn active_generation(&self) -> u64 {
        match &self.phase {
            Phase::Active(group) => group.generation,
            _ => 0,
        }
    }

    /// The newest complete plan that names this trainer.
    fn plan_for_me(&mut self) -> Option<HotPlan> {
        let mut generations: Vec<u64> = self.plans.keys().copied().collect();
        generations.sort_unstable_by(|a, b| b.cmp(a));
        for g in generations {
            if let Some(plan) = self.complete_plan(g)
                && plan.members.contains(&self.me)
            {
                self.plans.retain(|other, _| *other > g);
                return Some(plan);
            }
        }
        None
    }

    /// Generation `g`'s plan once all its parts arrived, keys of every part joined.
    fn complete_plan(&self, g: u64) -> Option<HotPlan> {
        let parts = self.plans.get(&g)?;
        let parts: Vec<&HotPlan> = parts.iter().map(Option::as_ref).collect::<Option<_>>()?;
        let mut plan = (*parts.first()?).clone();
        plan.tables = parts.iter().flat_map(|p| p.tables.clone()).collect();
        Some(plan)
    }

    async fn publish_plan(&self, plan: &HotPlan) -> anyhow::Result<()> {
        let parts = chunk(plan.tables.clone(), &self.specs);
        let count = parts.len() as u32;
        for (part, tables) in parts.into_iter().enumerate() {
            let mut message = plan.clone();
            message.tables = tables;
            message.part = part as u32;
            message.parts = count;
            self.publish(Kind::Plan(message)).await?;
        }
        Ok(())
    }

    async fn publish(&self, kind: Kind) -> anyhow::Result<()> {
        let message = HotMessage { kind: Some(kind) };
        self.bus.publish(self.subject.clone(), &message).await?;
        Ok(())
    }

    fn publish_keys(&self) {
        let tables = match &self.phase {
            Phase::Active(group) => group.replicas.iter().map(|r| r.keys().collect()).collect(),
            _ => Vec::new(),
        };
        self.keys.send_replace(Arc::new(HotKeys { tables }));
    }
}

async fn settle(push: Option<JoinHandle<anyhow::Result<()>>>) -> anyhow::Result<()> {
    match push {
        Some(push) => push.await.context("the hot-set push task")?,
        None => Ok(()),
    }
}

fn new_warmup() -> Warmup {
    Warmup {
        sample: KeyFrequencies::default(),
        remote: Duration::ZERO,
        accesses: 0,
    }
}

fn rand_nonce() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    now ^ u64::from(std::process::id()).rotate_left(32)
}

/// Pushes a share's rows to the PS, one call per table.
async fn push_share<S: ParameterStore>(
    store: &S,
    specs: &[TableSpec],
    share: &Share,
) -> anyhow::Result<()> {
    for (spec, (keys, grads)) in specs.iter().zip(&share.tables) {
        if !keys.is_empty() {
            store
                .push(&spec.name, keys, grads)
                .await
                .with_context(|| format!("pushing the hot rows of table {:?}", spec.name))?;
        }
    }
    Ok(())
}
