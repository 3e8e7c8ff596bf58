//! The joiner's state, without any I/O but the spill files: waiting feature rows and
//! waiting actions by request id, and the messages they came in, each done once every row
//! of it is handed out (joined, or timed out).
//!
//! - A feature row joins the first action of its request id that is waiting or arrives
//!   before the row's deadline (stored time + wait), taking the action's label; at the
//!   deadline it is handed out as a negative (label 0).
//! - An action waits as long for its features; one that finds none is dropped (counted).
//!   An action joins every feature row of its request waiting when it arrives.
//! - With a negative sample rate, a negative row (label 0) is handed out only when its
//!   request id hashes into the rate's share of ids: the same rows on every replay.
//! - Feature messages stay whole in memory (the budget counts their rows) until done, or
//!   until the budget is exceeded: then the oldest spill to disk, and are read back when a
//!   row of them joins or they time out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type, UInt64Type};
use arrow_array::{Array, ArrayRef, Float32Array, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field};

use super::JoinError;
use super::spill::{SpillRef, SpillStore};

/// A message's stream sequence: unique across both subjects of the one stream.
pub(super) type MessageId = u64;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum RequestId {
    Int(u64),
    Text(Box<str>),
}

#[derive(Debug, Clone, Copy)]
struct FeatureRow {
    message: MessageId,
    row: u32,
}

#[derive(Debug, Clone, Copy)]
struct WaitingAction {
    message: MessageId,
    label: f32,
}

enum Rows {
    Memory(RecordBatch),
    Disk(SpillRef),
}

struct FeatureMessage {
    rows: Rows,
    /// Each row's request id, kept in memory while the rows may be on disk.
    ids: Vec<RequestId>,
    /// Rows neither joined nor timed out.
    waiting: Vec<bool>,
    /// Rows not handed out yet.
    remaining: usize,
    /// Joined or timed out since the last hand-out: (row, label).
    ready: Vec<(u32, f32)>,
    deadline_ms: i64,
}

struct ActionMessage {
    /// Request ids of its actions still waiting.
    waiting: Vec<RequestId>,
}

/// What [`JoinTable::take_output`] hands out.
#[derive(Default)]
pub(super) struct Output {
    /// Feature rows with the label column appended, one batch per feature message.
    pub batches: Vec<RecordBatch>,
    /// Messages fully handled once `batches` are buffered: ack them then.
    pub done: Vec<MessageId>,
}

/// Running totals, for metrics and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct JoinTotals {
    pub joined_rows: u64,
    pub negative_rows: u64,
    pub dropped_actions: u64,
    /// Negative rows (joined with label 0, or timed out) left out by the sample rate.
    pub sampled_out_rows: u64,
}

/// Which negative rows are trained (Monolith §2.2.2's negative sampling): those whose
/// request id hashes below the rate's share of all hashes. A choice by id rather than by
/// chance keeps a message joined again after a crash to the same rows.
#[derive(Debug, Clone, Copy)]
pub(super) struct NegativeSampling {
    /// Hashes below this are kept; None keeps every row.
    below: Option<u64>,
}

impl NegativeSampling {
    /// Keeps `rate` of the negatives; unset or at least 1 keeps all of them.
    pub(super) fn new(rate: Option<f64>) -> Self {
        let below = rate
            .filter(|r| *r < 1.0)
            // Saturating: a rate at or below 0 keeps none.
            .map(|r| (r * u64::MAX as f64) as u64);
        Self { below }
    }

    fn keeps(&self, id: &RequestId) -> bool {
        let Some(below) = self.below else {
            return true;
        };
        let seed = primus_batch::hash::feature_seed("negative_sampling");
        let hash = match id {
            RequestId::Int(value) => primus_batch::hash::int_key(seed, *value),
            RequestId::Text(value) => primus_batch::hash::str_key(seed, value),
        };
        hash < below
    }
}

pub(super) struct JoinTable {
    request_id: String,
    label: String,
    wait_ms: i64,
    memory_rows: usize,
    sampling: NegativeSampling,
    features: HashMap<RequestId, Vec<FeatureRow>>,
    actions: HashMap<RequestId, WaitingAction>,
    feature_messages: BTreeMap<MessageId, FeatureMessage>,
    action_messages: HashMap<MessageId, ActionMessage>,
    /// (deadline, message) of every message not yet done, earliest first.
    deadlines: BTreeSet<(i64, MessageId)>,
    /// Feature messages with rows joined since the last hand-out.
    touched: BTreeSet<MessageId>,
    /// Action messages done since the last hand-out.
    done_actions: Vec<MessageId>,
    memory_rows_now: usize,
    spill: SpillStore,
    totals: JoinTotals,
}

impl JoinTable {
    pub(super) fn new(
        request_id: String,
        label: String,
        wait_ms: u64,
        memory_rows: usize,
        sampling: NegativeSampling,
        spill: SpillStore,
    ) -> Self {
        Self {
            request_id,
            label,
            wait_ms: wait_ms.min(i64::MAX as u64) as i64,
            memory_rows: memory_rows.max(1),
            sampling,
            features: HashMap::new(),
            actions: HashMap::new(),
            feature_messages: BTreeMap::new(),
            action_messages: HashMap::new(),
            deadlines: BTreeSet::new(),
            touched: BTreeSet::new(),
            done_actions: Vec::new(),
            memory_rows_now: 0,
            spill,
            totals: JoinTotals::default(),
        }
    }

    pub(super) fn totals(&self) -> JoinTotals {
        self.totals
    }

    /// Whether `message` is still held (a redelivery of it carries nothing new).
    pub(super) fn holds(&self, message: MessageId) -> bool {
        self.feature_messages.contains_key(&message) || self.action_messages.contains_key(&message)
    }

    /// Feature rows waiting, in memory and on disk.
    pub(super) fn waiting_rows(&self) -> (usize, usize) {
        self.feature_messages
            .values()
            .fold((0, 0), |(memory, disk), m| match m.rows {
                Rows::Memory(_) => (memory + m.remaining, disk),
                Rows::Disk(_) => (memory, disk + m.remaining),
            })
    }

    /// Takes in a feature message stored at `stored_ms`. A message without a usable
    /// request id column is refused whole, before anything of it is kept.
    pub(super) fn add_features(
        &mut self,
        message: MessageId,
        stored_ms: i64,
        rows: RecordBatch,
    ) -> Result<(), JoinError> {
        let ids = request_ids(&rows, &self.request_id)?;
        let row_count = rows.num_rows();
        let mut waiting = vec![true; row_count];
        let mut ready = Vec::new();
        for (row, id) in ids.iter().enumerate() {
            match self.actions.remove(id) {
                Some(action) => {
                    waiting[row] = false;
                    ready.push((row as u32, action.label));
                    self.action_row_done(action.message, id);
                }
                None => self
                    .features
                    .entry(id.clone())
                    .or_default()
                    .push(FeatureRow {
                        message,
                        row: row as u32,
                    }),
            }
        }
        let deadline_ms = stored_ms.saturating_add(self.wait_ms);
        self.totals.joined_rows += ready.len() as u64;
        if !ready.is_empty() {
            self.touched.insert(message);
        }
        self.feature_messages.insert(
            message,
            FeatureMessage {
                rows: Rows::Memory(rows),
                ids,
                waiting,
                remaining: row_count,
                ready,
                deadline_ms,
            },
        );
        self.deadlines.insert((deadline_ms, message));
        self.memory_rows_now += row_count;
        self.spill_over_budget()
    }

    /// Takes in an action message stored at `stored_ms`: request ids and labels.
    pub(super) fn add_actions(
        &mut self,
        message: MessageId,
        stored_ms: i64,
        rows: &RecordBatch,
    ) -> Result<(), JoinError> {
        let ids = request_ids(rows, &self.request_id)?;
        let labels = labels(rows, &self.label)?;
        let mut waiting = Vec::new();
        for (id, label) in ids.into_iter().zip(labels) {
            match self.features.remove(&id) {
                Some(rows) => {
                    for feature in rows {
                        self.join_feature(feature, label);
                    }
                }
                None => {
                    let action = WaitingAction { message, label };
                    if let Some(earlier) = self.actions.insert(id.clone(), action) {
                        // A second action before any features: the first one is dropped.
                        self.totals.dropped_actions += 1;
                        self.action_row_done(earlier.message, &id);
                    }
                    waiting.push(id);
                }
            }
        }
        if waiting.is_empty() {
            self.done_actions.push(message);
        } else {
            self.action_messages
                .insert(message, ActionMessage { waiting });
            self.deadlines
                .insert((stored_ms.saturating_add(self.wait_ms), message));
        }
        Ok(())
    }

    fn join_feature(&mut self, feature: FeatureRow, label: f32) {
        if let Some(message) = self.feature_messages.get_mut(&feature.message) {
            message.waiting[feature.row as usize] = false;
            message.ready.push((feature.row, label));
            self.touched.insert(feature.message);
            self.totals.joined_rows += 1;
        }
    }

    /// The action of `id` in `message` no longer waits.
    fn action_row_done(&mut self, message: MessageId, id: &RequestId) {
        let Some(state) = self.action_messages.get_mut(&message) else {
            return;
        };
        if let Some(at) = state.waiting.iter().position(|w| w == id) {
            state.waiting.swap_remove(at);
        }
        if state.waiting.is_empty() {
            self.action_messages.remove(&message);
            self.done_actions.push(message);
        }
    }

    /// Times out every message whose deadline is at or before `now_ms`: waiting feature
    /// rows become negatives, waiting actions are dropped.
    pub(super) fn expire(&mut self, now_ms: i64) {
        while let Some(&(deadline, message)) = self.deadlines.first() {
            if deadline > now_ms {
                break;
            }
            self.deadlines.pop_first();
            if self.feature_messages.contains_key(&message) {
                self.expire_features(message);
            } else if let Some(state) = self.action_messages.remove(&message) {
                self.expire_actions(message, state);
            }
        }
    }

    fn expire_features(&mut self, message: MessageId) {
        let Some(state) = self.feature_messages.get_mut(&message) else {
            return;
        };
        for (row, id) in state.ids.iter().enumerate() {
            if !std::mem::take(&mut state.waiting[row]) {
                continue;
            }
            state.ready.push((row as u32, 0.0));
            self.totals.negative_rows += 1;
            if let Some(rows) = self.features.get_mut(id) {
                rows.retain(|r| r.message != message);
                if rows.is_empty() {
                    self.features.remove(id);
                }
            }
        }
        self.touched.insert(message);
    }

    fn expire_actions(&mut self, message: MessageId, state: ActionMessage) {
        for id in state.waiting {
            if self.actions.get(&id).is_some_and(|a| a.message == message) {
                self.actions.remove(&id);
                self.totals.dropped_actions += 1;
            }
        }
        self.done_actions.push(message);
    }

    /// The rows joined or timed out since the last call, and the messages now done.
    pub(super) fn take_output(&mut self) -> Result<Output, JoinError> {
        let mut output = Output {
            done: std::mem::take(&mut self.done_actions),
            ..Output::default()
        };
        for message in std::mem::take(&mut self.touched) {
            let Some(state) = self.feature_messages.get_mut(&message) else {
                continue;
            };
            let mut rows = std::mem::take(&mut state.ready);
            state.remaining -= rows.len();
            let handled = rows.len();
            rows.retain(|&(row, label)| {
                label != 0.0 || self.sampling.keeps(&state.ids[row as usize])
            });
            self.totals.sampled_out_rows += (handled - rows.len()) as u64;
            if !rows.is_empty() {
                let all = match &state.rows {
                    Rows::Memory(batch) => batch.clone(),
                    Rows::Disk(at) => self.spill.read(*at)?,
                };
                output.batches.push(labelled(&all, &rows, &self.label)?);
            }
            if state.remaining == 0 {
                self.finish_features(message)?;
                output.done.push(message);
            }
        }
        Ok(output)
    }

    fn finish_features(&mut self, message: MessageId) -> Result<(), JoinError> {
        let Some(state) = self.feature_messages.remove(&message) else {
            return Ok(());
        };
        self.deadlines.remove(&(state.deadline_ms, message));
        match state.rows {
            Rows::Memory(_) => self.memory_rows_now -= state.ids.len(),
            Rows::Disk(at) => self.spill.release(at)?,
        }
        Ok(())
    }

    /// Spills the oldest in-memory feature messages until the memory budget holds.
    fn spill_over_budget(&mut self) -> Result<(), JoinError> {
        for state in self.feature_messages.values_mut() {
            if self.memory_rows_now <= self.memory_rows {
                break;
            }
            if let Rows::Memory(batch) = &state.rows {
                let at = self.spill.write(batch)?;
                state.rows = Rows::Disk(at);
                self.memory_rows_now -= state.ids.len();
            }
        }
        Ok(())
    }
}

/// The feature rows `rows` picks, with their labels as the label column (replacing one the
/// features may carry).
fn labelled(all: &RecordBatch, rows: &[(u32, f32)], label: &str) -> Result<RecordBatch, JoinError> {
    let indices = UInt32Array::from_iter_values(rows.iter().map(|(row, _)| *row));
    let labels: ArrayRef = Arc::new(Float32Array::from_iter_values(rows.iter().map(|r| r.1)));
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, column) in all.schema().fields().iter().zip(all.columns()) {
        if field.name() == label {
            continue;
        }
        let taken = arrow_select::take::take(column.as_ref(), &indices, None)
            .map_err(|e| JoinError::Rows(format!("taking joined rows: {e}")))?;
        fields.push(field.as_ref().clone());
        columns.push(taken);
    }
    fields.push(Field::new(label, DataType::Float32, false));
    columns.push(labels);
    let schema = Arc::new(arrow_schema::Schema::new(fields));
    RecordBatch::try_new(schema, columns)
        .map_err(|e| JoinError::Rows(format!("building joined rows: {e}")))
}

fn column<'a>(rows: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef, JoinError> {
    rows.column_by_name(name)
        .ok_or_else(|| JoinError::Rows(format!("column `{name}` is missing")))
}

/// The request id of every row: integer columns as u64 (signed ones by their bits),
/// string columns as text. A null id cannot be joined, so it refuses the message.
fn request_ids(rows: &RecordBatch, name: &str) -> Result<Vec<RequestId>, JoinError> {
    let ids = column(rows, name)?;
    if ids.null_count() > 0 {
        return Err(JoinError::Rows(format!(
            "column `{name}`: {} null request ids",
            ids.null_count()
        )));
    }
    let ids = match ids.data_type() {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            let ints = cast(ids, name, &DataType::Int64)?;
            let ints = ints.as_primitive::<Int64Type>();
            ints.values()
                .iter()
                .map(|&v| RequestId::Int(v as u64))
                .collect()
        }
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
            let ints = cast(ids, name, &DataType::UInt64)?;
            let ints = ints.as_primitive::<UInt64Type>();
            ints.values().iter().map(|&v| RequestId::Int(v)).collect()
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let text = cast(ids, name, &DataType::Utf8)?;
            text.as_string::<i32>()
                .iter()
                .map(|v| RequestId::Text(v.unwrap_or_default().into()))
                .collect()
        }
        other => {
            return Err(JoinError::Rows(format!(
                "column `{name}` is {other}; a request id is an integer or a string"
            )));
        }
    };
    Ok(ids)
}

/// The action rows' labels, each within [0, 1].
fn labels(rows: &RecordBatch, name: &str) -> Result<Vec<f32>, JoinError> {
    let labels = cast(column(rows, name)?, name, &DataType::Float32)?;
    let labels = labels.as_primitive::<Float32Type>();
    labels
        .iter()
        .map(|label| match label {
            Some(v) if (0.0..=1.0).contains(&v) => Ok(v),
            Some(v) => Err(JoinError::Rows(format!(
                "column `{name}`: label {v} is not in [0, 1]"
            ))),
            None => Err(JoinError::Rows(format!("column `{name}`: a null label"))),
        })
        .collect()
}

fn cast(array: &ArrayRef, name: &str, to: &DataType) -> Result<ArrayRef, JoinError> {
    arrow_cast::cast(array.as_ref(), to)
        .map_err(|e| JoinError::Rows(format!("column `{name}` as {to}: {e}")))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow_array::{StringArray, UInt64Array};

    use super::*;

    const WAIT_MS: u64 = 1000;

    fn table(memory_rows: usize, dir: &tempfile::TempDir) -> JoinTable {
        sampled_table(memory_rows, None, dir)
    }

    fn sampled_table(memory_rows: usize, rate: Option<f64>, dir: &tempfile::TempDir) -> JoinTable {
        let spill = SpillStore::open(dir.path().join("spill"), 1 << 20).expect("spill");
        let sampling = NegativeSampling::new(rate);
        JoinTable::new(
            "rid".into(),
            "label".into(),
            WAIT_MS,
            memory_rows,
            sampling,
            spill,
        )
    }

    /// Feature rows: request id `rid` and a feature `c1` = 100 + rid.
    fn features(rids: &[u64]) -> RecordBatch {
        let ids: ArrayRef = Arc::new(UInt64Array::from(rids.to_vec()));
        let c1: ArrayRef = Arc::new(UInt64Array::from_iter_values(rids.iter().map(|r| 100 + r)));
        RecordBatch::try_from_iter([("rid", ids), ("c1", c1)]).expect("features")
    }

    fn actions(pairs: &[(u64, u64)]) -> RecordBatch {
        let ids: ArrayRef = Arc::new(UInt64Array::from_iter_values(pairs.iter().map(|p| p.0)));
        let labels: ArrayRef = Arc::new(UInt64Array::from_iter_values(pairs.iter().map(|p| p.1)));
        RecordBatch::try_from_iter([("rid", ids), ("label", labels)]).expect("actions")
    }

    /// c1 -> label of every handed-out row, failing on a row handed out twice.
    fn collect(output: &Output, into: &mut BTreeMap<u64, f32>) {
        for batch in &output.batches {
            let c1 = batch
                .column_by_name("c1")
                .expect("c1")
                .as_primitive::<UInt64Type>();
            let labels = batch
                .column_by_name("label")
                .expect("label")
                .as_primitive::<Float32Type>();
            assert_eq!(batch.schema().fields().len(), 3, "rid, c1, label");
            for (c1, label) in c1.values().iter().zip(labels.values()) {
                assert!(into.insert(*c1 - 100, *label).is_none(), "row {c1} twice");
            }
        }
    }

    #[test]
    fn out_of_order_features_and_actions_join_and_the_rest_times_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut table = table(1000, &dir);
        let mut rows = BTreeMap::new();
        // Action for 2 arrives before its features; 1 and 3 after; 4 and 5 never; 9 has
        // no features.
        table
            .add_actions(1, 0, &actions(&[(2, 1), (9, 1)]))
            .expect("actions");
        table
            .add_features(2, 10, features(&[1, 2, 3, 4]))
            .expect("features");
        table.add_features(3, 20, features(&[5])).expect("features");
        table
            .add_actions(4, 30, &actions(&[(3, 0), (1, 1)]))
            .expect("actions");
        let output = table.take_output().expect("output");
        collect(&output, &mut rows);
        assert_eq!(rows, BTreeMap::from([(1, 1.0), (2, 1.0), (3, 0.0)]));
        assert_eq!(
            output.done,
            vec![4],
            "the second action message joined whole"
        );

        table.expire(999);
        assert!(
            table.take_output().expect("output").batches.is_empty(),
            "nothing is due yet"
        );
        table.expire(1000);
        let output = table.take_output().expect("output");
        assert_eq!(
            output.done,
            vec![1],
            "the first action message: 9 was dropped"
        );
        table.expire(1010);
        let output = table.take_output().expect("output");
        collect(&output, &mut rows);
        assert_eq!(
            output.done,
            vec![2],
            "feature message 2: 4 became a negative"
        );
        table.expire(1020);
        let output = table.take_output().expect("output");
        collect(&output, &mut rows);
        assert_eq!(output.done, vec![3]);
        assert_eq!(
            rows,
            BTreeMap::from([(1, 1.0), (2, 1.0), (3, 0.0), (4, 0.0), (5, 0.0)])
        );
        assert_eq!(
            table.totals(),
            JoinTotals {
                joined_rows: 3,
                negative_rows: 2,
                dropped_actions: 1,
                sampled_out_rows: 0,
            }
        );
        assert!(
            !table.holds(2) && !table.holds(1),
            "done messages are let go"
        );
    }

    #[test]
    fn rows_beyond_the_memory_budget_spill_and_join_from_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut table = table(4, &dir);
        table
            .add_features(1, 0, features(&[1, 2, 3]))
            .expect("features");
        table
            .add_features(2, 0, features(&[4, 5, 6]))
            .expect("features");
        assert_eq!(
            table.waiting_rows(),
            (3, 3),
            "the oldest message went to disk"
        );
        table
            .add_actions(3, 0, &actions(&[(2, 1), (5, 1)]))
            .expect("actions");
        let mut rows = BTreeMap::new();
        collect(&table.take_output().expect("output"), &mut rows);
        assert_eq!(rows, BTreeMap::from([(2, 1.0), (5, 1.0)]));
        table.expire(WAIT_MS as i64);
        let output = table.take_output().expect("output");
        collect(&output, &mut rows);
        assert_eq!(rows.len(), 6);
        assert_eq!(rows.values().filter(|l| **l == 0.0).count(), 4);
        assert_eq!(table.waiting_rows(), (0, 0));
        let mut done = output.done;
        done.sort_unstable();
        assert_eq!(done, vec![1, 2]);
    }

    #[test]
    fn string_ids_join_and_bad_messages_are_refused_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut table = table(100, &dir);
        let text = |ids: &[&str]| -> ArrayRef { Arc::new(StringArray::from(ids.to_vec())) };
        let c1: ArrayRef = Arc::new(UInt64Array::from(vec![7, 8]));
        let feature_rows =
            RecordBatch::try_from_iter([("rid", text(&["a", "b"])), ("c1", c1)]).expect("rows");
        table.add_features(1, 0, feature_rows).expect("string ids");
        let labels: ArrayRef = Arc::new(Float32Array::from(vec![1.0]));
        let action_rows =
            RecordBatch::try_from_iter([("rid", text(&["b"])), ("label", labels)]).expect("rows");
        table.add_actions(2, 0, &action_rows).expect("string ids");
        let output = table.take_output().expect("output");
        assert_eq!(output.batches[0].num_rows(), 1);

        let err = table
            .add_actions(3, 0, &actions(&[(1, 2)]))
            .expect_err("label 2");
        assert!(
            err.to_string().contains("label 2 is not in [0, 1]"),
            "{err}"
        );
        let no_ids = RecordBatch::try_from_iter([("label", labels_of(&[1.0]))]).expect("rows");
        let err = table.add_actions(4, 0, &no_ids).expect_err("no rid");
        assert!(err.to_string().contains("column `rid` is missing"), "{err}");
        assert!(
            !table.holds(3) && !table.holds(4),
            "refused messages leave nothing"
        );
    }

    /// Every positive is trained and a quarter of the negatives (joined with label 0, or
    /// timed out), the same ones when the messages are joined again.
    #[test]
    fn a_sample_rate_keeps_every_positive_and_its_share_of_negatives_by_request_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let handed_out = || {
            let mut table = sampled_table(1 << 20, Some(0.25), &dir);
            let rids: Vec<u64> = (0..8000).map(|i| i * 7919).collect();
            table.add_features(1, 0, features(&rids)).expect("features");
            // A third clicked, a third explicitly not clicked, the rest time out.
            let clicks: Vec<(u64, u64)> =
                rids.iter().map(|r| (*r, u64::from(r % 3 == 0))).collect();
            table
                .add_actions(2, 0, &actions(&clicks[..5334]))
                .expect("actions");
            table.expire(WAIT_MS as i64);
            let mut rows = BTreeMap::new();
            collect(&table.take_output().expect("output"), &mut rows);
            (rows, table.totals())
        };
        let (rows, totals) = handed_out();
        let positives = rows.values().filter(|l| **l == 1.0).count();
        assert_eq!(
            positives,
            (0..5334u64).filter(|i| (i * 7919) % 3 == 0).count()
        );
        let negatives = 8000 - positives;
        let kept = rows.len() - positives;
        assert_eq!(totals.sampled_out_rows as usize, negatives - kept);
        // A quarter of 6,222 negatives: 1,556 expected, binomial sd 34.
        assert!(
            (1450..=1660).contains(&kept),
            "{kept} of {negatives} negatives kept at 0.25"
        );
        let (again, _) = handed_out();
        assert_eq!(again, rows, "joined again, the same rows");

        let mut all = sampled_table(1 << 20, None, &dir);
        all.add_features(1, 0, features(&[1, 2, 3]))
            .expect("features");
        all.expire(WAIT_MS as i64);
        let mut rows = BTreeMap::new();
        collect(&all.take_output().expect("output"), &mut rows);
        assert_eq!(rows.len(), 3, "no rate: every negative");
    }

    fn labels_of(values: &[f32]) -> ArrayRef {
        Arc::new(Float32Array::from(values.to_vec()))
    }
}
