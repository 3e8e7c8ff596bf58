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
//! - **Rounds.** After each step, every member says on NATS that it takes part in round
//!   `r` of the plan's generation and waits for every other member. With the ring exchange
//!   (the default) the round's gradients of hot rows are then summed over direct gRPC
//!   around the ring of participants, the rows sharded among them by key (`ring`); each
//!   member pushes its own shard of the sum to the PS. Over NATS each member publishes its
//!   gradients, all sum them in member order, and the lowest participant pushes the sum.
//!   Every member applies the same sum with the table's optimizer, so the replicas stay
//!   bitwise equal, and the PS holds the same rows: checkpoints and serving need nothing
//!   else.
//! - **Waiting.** A member with no minibatch ready answers a round the others started
//!   with an empty, idle share. At a checkpoint barrier a member takes part in empty
//!   rounds until every member is at it, so the barrier is passed together and the PS
//!   holds every hot update trained before it; a member idle after passing a barrier
//!   answers as at it, since the data executors pause until every trainer is there.
//! - **Changes.** At a checkpoint the leader chooses again when the hot rows' share of
//!   its accesses drifted or the directory lists other trainers; the new plan takes
//!   effect after a round everyone names (a trainer new to the group installs it at
//!   once, and the members idle at that moment answer the plan's first round, reaching
//!   it through the named one). A member whose data ends says so in its next round. A
//!   member silent for `sync_timeout_ms` ends the group: each trainer pushes its
//!   unsynchronised gradients to the PS and goes back to it for every row, and the choice
//!   starts over. A member's crash rolls the Job back to its checkpoint (the master
//!   restarts every trainer), so the group never continues without it.
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
use primus_embedding::hot_set::KeyFrequencies;
use primus_model::ModelLayout;
use primus_model::pooling::BatchKeys;
use primus_proto::v1::hot_message::Kind;
use primus_proto::v1::{HotMessage, HotPlan, HotRound};
use primus_spec::job::{HotExchange, HotSetSpec, TableSpec};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::device::EmbeddingDevice;
use crate::store::ParameterStore;

mod choice;
mod install;
mod ring;
mod rounds;
mod share;

use choice::{Warmup, new_warmup};
pub use ring::{RingEndpoint, RingInbox, RingService};
use rounds::RoundMode;
pub use share::{Rows, Share};

/// Lists the ids of the job's trainers (the master's topology in the service, a fixed
/// list for a static deployment). The lowest id leads.
pub type TrainerDirectory =
    Arc<dyn Fn() -> BoxFuture<'static, anyhow::Result<Vec<String>>> + Send + Sync>;

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
    /// Bytes of hot-row gradients this member sent and received, and seconds it spent
    /// exchanging them (from its part in a round to the round's sum), since it started.
    pub exchange: Traffic,
}

/// What exchanging hot-row gradients cost one member.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Traffic {
    pub sent_bytes: u64,
    pub received_bytes: u64,
    pub seconds: f64,
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
    /// The checkpoint barrier this member passed, until its next step.
    past_barrier: Option<u64>,
    /// The ring exchange, unless the gradients travel over NATS.
    ring: Option<ring::Ring>,
    /// Over NATS: the share bytes published and received; and the time spent exchanging.
    traffic: Traffic,
}

impl Drop for HotSync {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl HotSync {
    /// Joins the job's hot-set subject as trainer `me`. Subscribes before anything is
    /// published, so no plan naming this trainer can be missed. The ring exchange passes
    /// gradients through `ring`, this trainer's HotExchange service.
    #[expect(
        clippy::too_many_arguments,
        reason = "what a member is: its job, id, model, peers, device and exchange"
    )]
    pub async fn join(
        settings: HotSetSpec,
        bus: &Bus,
        job: &str,
        me: &str,
        layout: &ModelLayout,
        directory: TrainerDirectory,
        device: EmbeddingDevice,
        ring: Option<RingEndpoint>,
    ) -> anyhow::Result<Self> {
        let ring = match (settings.exchange, ring) {
            (HotExchange::Ring, Some(endpoint)) => Some(ring::Ring::new(endpoint)),
            (HotExchange::Ring, None) => anyhow::bail!(
                "training.hot_set.exchange is ring, but this trainer serves no HotExchange"
            ),
            (HotExchange::Nats, _) => None,
        };
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
            past_barrier: None,
            ring,
            traffic: Traffic::default(),
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
                exchange: self.traffic(),
            },
            _ => HotStatus {
                exchange: self.traffic(),
                ..HotStatus::default()
            },
        }
    }

    fn traffic(&self) -> Traffic {
        match &self.ring {
            Some(ring) => {
                let (sent_bytes, received_bytes) = ring.bytes();
                Traffic {
                    sent_bytes,
                    received_bytes,
                    seconds: self.traffic.seconds,
                }
            }
            None => self.traffic,
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
        self.past_barrier = None;
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
            exchange_addr: String::new(),
        };
        self.publish(Kind::Round(message)).await
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
                if round.trainer_id != self.me {
                    self.traffic.received_bytes += round.encoded_len() as u64;
                }
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

    async fn publish(&self, kind: Kind) -> anyhow::Result<()> {
        let message = HotMessage { kind: Some(kind) };
        self.bus.publish(self.subject.clone(), &message).await?;
        Ok(())
    }
}
