//! Which rows a minibatch must still read, and reading them. Its rows may not be looked up
//! yet (the push before its step reads them), or have been looked up before a push that
//! changed some of them. The trainer remembers the keys of its last pushes; a minibatch
//! reads the rows it lacks and those pushed since its lookup began (in the push before it
//! when it is ready by then, else just before it computes), and so computes with every row
//! as fresh as a lookup at that moment would give.

use std::collections::VecDeque;

use anyhow::Context;
use primus_batch::hash::KeySet;
use primus_model::ModelLayout;
use primus_model::pooling::BatchKeys;
use primus_ps_client::TableKeys;

use crate::prefetch::{PushCount, asked_of, check_rows, wide_positions};

/// Pushes remembered; a minibatch looked up before the oldest re-reads all its rows.
const REMEMBERED: usize = 4;

/// The keys of the trainer's recent pushes, per layout table.
#[derive(Debug, Default)]
pub(crate) struct RecentPushes {
    count: PushCount,
    /// `(index of the push, its keys per table)`, oldest first.
    pushes: VecDeque<(u64, Vec<KeySet>)>,
}

impl RecentPushes {
    pub(crate) fn count(&self) -> PushCount {
        self.count.clone()
    }

    /// A push of `tables` (each table's pushed keys) has completed.
    pub(crate) fn record(&mut self, tables: Vec<KeySet>) {
        let index = self.count.now();
        if self.pushes.len() == REMEMBERED {
            self.pushes.pop_front();
        }
        self.pushes.push_back((index, tables));
        self.count.completed(index + 1);
    }

    /// What changed since a lookup that began after `looked_up_at` pushes had completed
    /// (everything for rows never looked up).
    pub(crate) fn since(&self, looked_up_at: Option<u64>) -> Stale<'_> {
        let Some(looked_up_at) = looked_up_at else {
            return Stale::Everything;
        };
        let now = self.count.now();
        if looked_up_at >= now {
            return Stale::Nothing;
        }
        match self.pushes.front() {
            Some((oldest, _)) if *oldest <= looked_up_at => Stale::Keys(
                self.pushes
                    .iter()
                    .filter(|(index, _)| *index >= looked_up_at)
                    .map(|(_, tables)| tables)
                    .collect(),
            ),
            _ => Stale::Everything,
        }
    }
}

/// The rows a prefetched minibatch must read (again).
pub(crate) enum Stale<'a> {
    Nothing,
    /// The keys of these pushes.
    Keys(Vec<&'a Vec<KeySet>>),
    /// Every row (never looked up, or before the pushes remembered).
    Everything,
}

impl<'a> Stale<'a> {
    pub(crate) fn is_nothing(&self) -> bool {
        matches!(self, Self::Nothing)
    }

    /// These rows, and those of a push of `pushing` (each table's keys) not yet recorded.
    pub(crate) fn and(self, pushing: &'a Vec<KeySet>) -> Self {
        match self {
            Self::Nothing => Self::Keys(vec![pushing]),
            Self::Keys(mut pushes) => {
                pushes.push(pushing);
                Self::Keys(pushes)
            }
            Self::Everything => Self::Everything,
        }
    }

    /// Whether table `t`'s row of `key` changed.
    pub(crate) fn contains(&self, t: usize, key: u64) -> bool {
        match self {
            Self::Nothing => false,
            Self::Keys(pushes) => pushes
                .iter()
                .any(|tables| tables.get(t).is_some_and(|keys| keys.contains(&key))),
            Self::Everything => true,
        }
    }
}

/// One table's rows that a minibatch reads (again).
pub(crate) struct StaleRows {
    /// The layout table.
    table: usize,
    /// Their positions among the table's unique keys in the minibatch.
    positions: Vec<usize>,
    keys: Vec<u64>,
}

/// The rows of `keys` that `stale` changed, except those `current` says are current
/// anyway (a hot replica's).
pub(crate) fn stale_rows(
    stale: &Stale<'_>,
    keys: &BatchKeys,
    current: impl Fn(usize, u64) -> bool,
) -> Vec<StaleRows> {
    if stale.is_nothing() {
        return Vec::new();
    }
    let mut changed = Vec::new();
    for (t, keys) in keys.tables.iter().enumerate() {
        let positions: Vec<usize> = (0..keys.len())
            .filter(|&p| stale.contains(t, keys[p]) && !current(t, keys[p]))
            .collect();
        if !positions.is_empty() {
            let keys = positions.iter().map(|&p| keys[p]).collect();
            changed.push(StaleRows {
                table: t,
                positions,
                keys,
            });
        }
    }
    changed
}

/// What to look up for `changed`: each table's keys, and its first-order weights' after it.
pub(crate) fn asked_for<'a>(
    layout: &'a ModelLayout,
    changed: &'a [StaleRows],
) -> Vec<TableKeys<'a>> {
    let mut asked = Vec::new();
    for stale in changed {
        let slot = &layout.tables[stale.table];
        let keys = &stale.keys;
        asked.push(TableKeys {
            table: &slot.name,
            keys,
        });
        if let Some(wide) = &slot.wide {
            asked.push(TableKeys { table: wide, keys });
        }
    }
    asked
}

/// Writes `fresh`, the store's answer to `asked` (= [`asked_for`] `changed`), over the
/// stale rows: into `rows` (per layout table, by key position) and `wide` (first-order
/// weights per wide table, by key position).
pub(crate) fn overwrite(
    layout: &ModelLayout,
    changed: &[StaleRows],
    asked: &[TableKeys<'_>],
    fresh: Vec<Vec<f32>>,
    rows: &mut [&mut Vec<f32>],
    wide: &mut [Vec<f32>],
) -> anyhow::Result<()> {
    let wide_of = wide_positions(layout);
    let mut fresh = asked_of(asked).into_iter().zip(fresh);
    for stale in changed {
        let (t, dim) = (stale.table, layout.tables[stale.table].dim);
        let (asked, table_rows) = fresh.next().context("an answer per table")?;
        check_rows(&asked, &table_rows, dim)?;
        for (i, &p) in stale.positions.iter().enumerate() {
            rows[t][p * dim..][..dim].copy_from_slice(&table_rows[i * dim..][..dim]);
        }
        if let Some(w) = wide_of[t] {
            let (asked, weights) = fresh.next().context("an answer per wide table")?;
            check_rows(&asked, &weights, 1)?;
            for (i, &p) in stale.positions.iter().enumerate() {
                wide[w][p] = weights[i];
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(values: &[u64]) -> Vec<KeySet> {
        vec![values.iter().copied().collect()]
    }

    #[test]
    fn a_lookup_reads_again_what_was_pushed_after_it_began() {
        let mut recent = RecentPushes::default();
        let first_lookup = recent.count().now();
        assert!(recent.since(Some(first_lookup)).is_nothing());
        recent.record(keys(&[1, 2]));
        let second_lookup = recent.count().now();
        recent.record(keys(&[3]));
        let stale = recent.since(Some(first_lookup));
        assert!(stale.contains(0, 1) && stale.contains(0, 3) && !stale.contains(0, 4));
        let stale = recent.since(Some(second_lookup));
        assert!(!stale.contains(0, 1) && stale.contains(0, 3));
        assert!(!stale.contains(1, 3), "another table");
        assert!(recent.since(Some(recent.count().now())).is_nothing());
        for k in 10..10 + REMEMBERED as u64 {
            recent.record(keys(&[k]));
        }
        assert!(
            recent.since(Some(first_lookup)).contains(0, 999),
            "older than what is remembered: everything"
        );
        assert!(recent.since(None).contains(0, 999), "never looked up");
    }

    #[test]
    fn the_push_in_flight_adds_its_keys() {
        let mut recent = RecentPushes::default();
        let looked_up = recent.count().now();
        let pushing = keys(&[7]);
        let stale = recent.since(Some(looked_up)).and(&pushing);
        assert!(stale.contains(0, 7) && !stale.contains(0, 1));
        recent.record(keys(&[1]));
        let stale = recent.since(Some(looked_up)).and(&pushing);
        assert!(stale.contains(0, 7) && stale.contains(0, 1) && !stale.contains(0, 2));
        assert!(recent.since(None).and(&pushing).contains(0, 2));
    }
}
