//! Choosing the hot set: every trainer counts its accesses and PS seconds over its warmup;
//! the leader measures what syncing a row costs, picks the rows that minimise HypeReca's
//! latency model (or the top `rows`) and publishes the plan; followers wait for it. At a
//! checkpoint the leader chooses again when coverage drifted or the members changed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use primus_embedding::HotRows;
use primus_embedding::hot_set::{CostModel, HotSet, KeyFrequencies};
use primus_model::pooling::BatchKeys;
use primus_proto::packed::{encode_f32, encode_keys};
use primus_proto::v1::hot_message::Kind;
use primus_proto::v1::{HotPlan, HotProbe, HotTableRows};

use super::share::chunk;
use super::{HotSync, Phase, TableKey};
use crate::store::ParameterStore;

/// Rows moved and applied by the cost probe.
const PROBE_ROWS: usize = 1024;

pub(super) struct Warmup {
    sample: KeyFrequencies<TableKey>,
    remote: Duration,
    accesses: u64,
}

#[derive(Debug, Clone, Copy)]
struct Costs {
    sync_seconds: f64,
    synced_rows: u64,
    remote_seconds: f64,
    remote_accesses: u64,
}

impl HotSync {
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

    pub(super) fn observe(
        &mut self,
        keys: &BatchKeys,
        access_counts: &[Vec<u64>],
        remote: Duration,
    ) {
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

    pub(super) async fn choose_when_due<S: ParameterStore>(
        &mut self,
        store: &Arc<S>,
    ) -> anyhow::Result<()> {
        let Phase::Warmup(warmup) = &self.phase else {
            return Ok(());
        };
        if warmup.sample.batches() < u64::from(self.settings.warmup_batches.max(1)) {
            return Ok(());
        }
        self.remote = Some((warmup.remote.as_secs_f64(), warmup.accesses.max(1)));
        let members = self.members().await?;
        if let Some(leader) = members.first().filter(|leader| **leader != self.me) {
            tracing::info!(%leader, "waiting for the hot-set leader's plan");
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

    /// A follower's view of a re-chosen plan: the leader published it before its share of
    /// round `round`, naming that round.
    pub(super) fn plan_after(&mut self, generation: u64, round: u64) -> Option<HotPlan> {
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

    /// The newest complete plan that names this trainer.
    pub(super) fn plan_for_me(&mut self) -> Option<HotPlan> {
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

    /// Whether generation `g`'s plan arrived whole and takes effect after a round of
    /// `generation`.
    pub(super) fn plan_follows(&self, g: u64, generation: u64) -> bool {
        self.plans.get(&g).is_some_and(|parts| {
            parts.iter().all(Option::is_some)
                && (parts.iter().flatten()).all(|part| part.previous_generation == generation)
        })
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
}

pub(super) fn new_warmup() -> Warmup {
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
