//! The rounds of an active group: after each step every member publishes its part in the
//! round and waits for everyone's. With the ring exchange the parts only say who takes
//! part, and the gradients are summed around the ring of participants (`super::ring`);
//! each pushes its own shard of the sum to the PS. Over NATS the parts carry the shares,
//! all sum them in member order, and the lowest participant pushes the sum. Either way
//! every member applies bitwise the same sum, and the pushes run beside the next step.
//! Idle members answer rounds others started (as at the barrier they last passed, until
//! their next step), also the first round of a plan that follows their group, which a
//! trainer new to the group installs at once; at a checkpoint barrier members take part in
//! empty rounds until all are at it; a silent member ends the group.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use primus_proto::v1::HotRound;
use primus_proto::v1::hot_message::Kind;
use primus_spec::job::TableSpec;
use prost::Message;
use tokio::task::JoinHandle;

use super::ring::Participant;
use super::share::{chunk, parse_share, share_rows, sum_shares};
use super::{HotSync, Phase, Share, new_warmup};
use crate::store::ParameterStore;

/// How long members that all wait at a barrier pause between their empty rounds.
const IDLE_PAUSE: Duration = Duration::from_millis(5);

/// Why a member takes part in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RoundMode {
    /// After a step (or the install barrier).
    Step,
    /// Waiting at a checkpoint's barrier, with nothing to add.
    AtBarrier(u64),
    /// No minibatch ready; answering a round the others started.
    Idle,
    /// No minibatch since passing that checkpoint's barrier (the data executors pause
    /// until every trainer is at it); answering a round the others started.
    IdlePastBarrier(u64),
}

/// How a round ended.
#[derive(Debug, Default)]
pub(super) struct RoundEnd {
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
    at_barrier: Option<u64>,
}

/// A completed exchange, as this member saw it.
struct Exchanged {
    /// The participants, in member order.
    contributions: Vec<Contribution>,
    leavers: Vec<String>,
    /// Every participant's gradients summed.
    summed: Share,
    /// What of the sum this member pushes to the PS.
    push: Share,
}

impl HotSync {
    /// One round of the active group: exchange, apply, and this member's push of its part
    /// of the sum to the PS. Ends the group when a member stays silent. `at_barrier`: this
    /// member waits at that checkpoint's barrier; returns whether every participant did.
    pub(super) async fn round<S: ParameterStore>(
        &mut self,
        store: &Arc<S>,
        share: Share,
        mode: RoundMode,
    ) -> anyhow::Result<RoundEnd> {
        let at_barrier = match mode {
            RoundMode::AtBarrier(checkpoint) | RoundMode::IdlePastBarrier(checkpoint) => {
                Some(checkpoint)
            }
            RoundMode::Step | RoundMode::Idle => None,
        };
        let Phase::Active(group) = &self.phase else {
            return Ok(RoundEnd::default());
        };
        let (generation, round, members) = (group.generation, group.round, group.members.clone());
        let started = Instant::now();
        let exchanged = if members.len() == 1 {
            let mine = Contribution {
                member: self.me.clone(),
                at_barrier,
            };
            Ok(Exchanged {
                contributions: vec![mine],
                leavers: Vec::new(),
                summed: share.clone(),
                push: share.clone(),
            })
        } else {
            let outgoing = Outgoing {
                generation,
                round,
                at_barrier,
                idle: matches!(mode, RoundMode::Idle | RoundMode::IdlePastBarrier(_)),
            };
            self.exchange(outgoing, &members, &share).await
        };
        self.traffic.seconds += started.elapsed().as_secs_f64();
        let Exchanged {
            contributions,
            leavers,
            summed,
            push,
        } = match exchanged {
            Ok(exchanged) => exchanged,
            Err(silent) => {
                tracing::warn!(
                    generation,
                    round,
                    ?silent,
                    "a hot-set member stayed silent or crashed; every row goes through the PS again"
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
            empty: summed.is_empty(),
        };
        let Phase::Active(group) = &mut self.phase else {
            return Ok(RoundEnd::default());
        };
        for (replica, (keys, grads)) in group.replicas.iter_mut().zip(&summed.tables) {
            if !keys.is_empty() {
                replica.apply(keys, grads)?;
            }
        }
        if !push.is_empty() {
            // Rounds reach the PS in order; each push runs beside the next step.
            self.settle().await?;
            self.pushing = Some(spawn_push(store, &self.specs, push));
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
        self.past_barrier = Some(checkpoint);
        self.settle().await
    }

    /// Waits until this member's push of the latest round's sum reached the PS.
    pub async fn settle(&mut self) -> anyhow::Result<()> {
        settle(self.pushing.take()).await
    }

    /// Resolves once another member started this member's next round with a share to
    /// add (or at a barrier), or the first round of a plan that follows this member's
    /// group: it waits on this member. Cancel-safe.
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

    /// Answers the round the others wait on with nothing to add. A member whose group is
    /// followed by a plan reaches that plan's first round through such rounds: after the
    /// round the plan names, it installs the plan.
    pub async fn idle_round<S: ParameterStore>(&mut self, store: &Arc<S>) -> anyhow::Result<()> {
        let idle = Share::empty(self.specs.len());
        let mode = match self.past_barrier {
            Some(checkpoint) => RoundMode::IdlePastBarrier(checkpoint),
            None => RoundMode::Idle,
        };
        self.round(store, idle, mode).await.map(|_| ())
    }

    /// Whether another member waits on this one: in this group's current round, or in
    /// the first round of the plan that follows this group (a trainer that was not in the
    /// group installs it at once, while this member may have no minibatch coming: the
    /// data executors pause at a checkpoint until that trainer reaches the barrier too).
    fn others_wait(&self) -> bool {
        let Phase::Active(group) = &self.phase else {
            return false;
        };
        let started = |generation: u64, round: u64| {
            self.rounds
                .get(&(generation, round))
                .is_some_and(|arrived| {
                    arrived.iter().any(|(member, parts)| {
                        *member != self.me && parts.iter().flatten().any(|p| !p.idle && !p.leaving)
                    })
                })
        };
        let mut following = (group.next.iter().map(|(_, plan)| plan.generation)).chain(
            (self.plans.keys().copied()).filter(|g| self.plan_follows(*g, group.generation)),
        );
        started(group.generation, group.round) || following.any(|g| started(g, 0))
    }

    /// Publishes this member's part in a round (its share, over NATS), collects
    /// everyone's, in member order, and sums the round's gradients (around the ring, or
    /// here). `Err` names the members that stayed silent past the timeout.
    async fn exchange(
        &mut self,
        outgoing: Outgoing,
        members: &[String],
        share: &Share,
    ) -> Result<Exchanged, Vec<String>> {
        let Outgoing {
            generation,
            round,
            at_barrier,
            idle,
        } = outgoing;
        let (parts, exchange_addr) = match &self.ring {
            Some(ring) => (vec![Vec::new()], ring.addr().to_owned()),
            None => (chunk(share_rows(share), &self.specs), String::new()),
        };
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
                exchange_addr: exchange_addr.clone(),
            };
            if self.ring.is_none() {
                self.traffic.sent_bytes += message.encoded_len() as u64;
            }
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
        let mut shares = Vec::new();
        let mut participants = Vec::new();
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
            let addr = parts.first().map(|p| p.exchange_addr.clone());
            contributions.push(Contribution {
                member: member.clone(),
                at_barrier: parts.first().and_then(|p| p.at_barrier),
            });
            if self.ring.is_some() {
                match addr.filter(|a| !a.is_empty()) {
                    Some(addr) => participants.push(Participant {
                        id: member.clone(),
                        addr,
                    }),
                    None => {
                        tracing::warn!(member = %member, "a hot-set member without a ring address");
                        return Err(vec![member.clone()]);
                    }
                }
                continue;
            }
            match parse_share(&parts, &self.specs) {
                Ok(share) => shares.push(share),
                Err(e) => {
                    tracing::warn!(member = %member, error = %e, "a malformed hot-set share");
                    return Err(vec![member.clone()]);
                }
            }
        }
        let (summed, push) = match &mut self.ring {
            Some(_) if participants.len() == 1 => (share.clone(), share.clone()),
            Some(ring) => {
                let sum = ring
                    .all_reduce(
                        &self.me,
                        &participants,
                        (generation, round),
                        share,
                        &self.specs,
                        deadline,
                    )
                    .await?;
                (sum.summed, sum.owned)
            }
            None => {
                let summed = sum_shares(self.specs.len(), shares.iter());
                let first = contributions.first().is_some_and(|c| c.member == self.me);
                let push = if first {
                    summed.clone()
                } else {
                    Share::empty(self.specs.len())
                };
                (summed, push)
            }
        };
        Ok(Exchanged {
            contributions,
            leavers,
            summed,
            push,
        })
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

async fn settle(push: Option<JoinHandle<anyhow::Result<()>>>) -> anyhow::Result<()> {
    match push {
        Some(push) => push.await.context("the hot-set push task")?,
        None => Ok(()),
    }
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
