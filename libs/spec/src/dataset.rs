//! Primus's three-tier data definition: a dataset holds data streams (served one after
//! another or together); a stream mixes data sources under a sliding hourly or daily
//! window; a source is a time-partitioned Parquet prefix or a JetStream subject.
//! The feature schema says how rows become samples.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::defaults;
use crate::validate::{
    FieldError, Validate, check_name, check_positive, check_unique, fail, field, index,
};

/// A Dataset (`kind: Dataset`): streams of sources over time windows, and how their rows become features.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    /// Data streams, each a window sliding over its sources.
    pub streams: Vec<DataStream>,
    /// Whether streams are served one after the other or together.
    #[serde(default)]
    pub order: StreamOrder,
    /// Which columns are the label and the features, and how each is transformed.
    pub schema: FeatureSchema,
}

/// How a Dataset's streams are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamOrder {
    /// Each stream is served after the previous one is exhausted.
    #[default]
    Sequential,
    /// All streams are served together.
    Simultaneous,
}

/// A stream: sources read window by window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataStream {
    /// Unique within the Dataset.
    pub name: String,
    /// The windows to read, from a start to an optional end.
    pub window: Window,
    /// The sources read in each window.
    pub sources: Vec<DataSource>,
}

/// The time window that slides over a stream's sources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Hourly or daily windows.
    pub unit: WindowUnit,
    /// First window: `YYYY-MM-DD` (daily) or `YYYY-MM-DDTHH` (hourly), UTC.
    pub start: String,
    /// Window after the last one (exclusive); unset means open-ended (keep following).
    #[serde(default)]
    pub end: Option<String>,
}

/// The length of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WindowUnit {
    /// One hour: partitions `date=YYYY-MM-DD/hour=HH`.
    Hourly,
    /// One day: partitions `date=YYYY-MM-DD`.
    Daily,
}

/// Exactly one of `parquet`, `jetstream` and `join`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataSource {
    /// Unique within the Dataset; metrics and stream consumers are named after it.
    pub name: String,
    /// Priority weight w_i in the serving policy argmax w_i * sigmoid(q_i) (Primus Eq. 4).
    #[serde(default = "defaults::one")]
    pub weight: f64,
    /// Parquet files in hourly or daily partitions.
    #[serde(default)]
    pub parquet: Option<ParquetSource>,
    /// A JetStream subject carrying rows.
    #[serde(default)]
    pub jetstream: Option<JetStreamSource>,
    /// An online joiner of a features subject and an actions subject.
    #[serde(default)]
    pub join: Option<JoinSource>,
}

impl DataSource {
    /// Whether the source is live (JetStream or joiner) rather than bounded Parquet.
    pub fn is_stream(&self) -> bool {
        self.jetstream.is_some() || self.join.is_some()
    }

    /// The JetStream durable consumer of this source in `job`: the same for every
    /// executor that consumes it (a join source's two add `-features` and `-actions`).
    pub fn durable(&self, job: &str) -> String {
        format!("{job}-{}", self.name)
    }
}

/// Files under `<uri>/date=YYYY-MM-DD/hour=HH/*.parquet` (hourly) or `<uri>/date=YYYY-MM-DD/` (daily).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParquetSource {
    /// Object-store URL of the partitions' parent (`s3://bucket/logs`, `file:///data/logs`, a path).
    pub uri: String,
}

/// A JetStream subject whose messages carry rows (`SampleRows`: Arrow IPC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JetStreamSource {
    /// The JetStream stream (created over the subject when missing).
    pub stream: String,
    /// The subject (wildcards allowed).
    pub subject: String,
}

/// Monolith's online joiner (§2.2.2): serving logs feature rows on `features`, user actions
/// (the label) arrive on `actions`, both carrying `request_id`. A feature row waits for its
/// action up to `wait_seconds` after it was stored in the stream (in memory, then on disk
/// beyond `memory_rows`), is trained with the action's label when it comes, and as a
/// negative (label 0) when it does not. An action waits as long for its features.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinSource {
    /// The JetStream stream holding both subjects.
    pub stream: String,
    /// Subject of the feature rows (with the request id).
    pub features: String,
    /// Subject of the actions (request id and label).
    pub actions: String,
    /// Column present in both: integer or string.
    pub request_id: String,
    /// How long a feature row waits for its action, in seconds after it was stored.
    #[serde(default = "defaults::join_wait_seconds")]
    pub wait_seconds: f64,
    /// Waiting feature rows kept in memory; older messages' rows spill to local disk.
    #[serde(default = "defaults::join_memory_rows")]
    pub memory_rows: u64,
}

/// Which columns are the label and the features, and which share of negatives is trained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FeatureSchema {
    /// Column holding the 0/1 label.
    pub label: String,
    /// Join sources train this share of their negative (label 0) rows, chosen by request
    /// id, and the model exported for serving shifts its logit by ln(rate) so its
    /// probabilities hold for all rows (Monolith §2.2.2). Every source of the Dataset must
    /// then be a join source. Unset: every negative is trained.
    #[serde(default)]
    pub negative_sample_rate: Option<f64>,
    /// Further label columns, numeric, for a model graph's heads beyond the one on `label`
    /// (a conversion, a watch time): each minibatch carries them by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    /// Dense (numeric) features, in the order the model sees them.
    #[serde(default)]
    pub dense: Vec<DenseFeature>,
    /// Sparse (id) features, each looked up in an embedding table.
    pub sparse: Vec<SparseFeature>,
}

/// A numeric column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DenseFeature {
    /// The column's name.
    pub name: String,
    /// How the value is transformed before training.
    #[serde(default)]
    pub transform: DenseTransform,
    /// Value used when the column is null.
    #[serde(default)]
    pub missing: f64,
}

/// A dense feature's transform (`kind` selects it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DenseTransform {
    /// The value as it is.
    #[default]
    None,
    /// log(1 + max(x, 0)).
    Log1p,
    /// (x - mean) / std.
    Standardize {
        /// Subtracted first.
        mean: f64,
        /// Divided by then.
        std: f64,
    },
    /// Clamped to [min, max].
    Clip {
        /// Lowest value.
        min: f64,
        /// Highest value.
        max: f64,
    },
}

/// An id column (or a list of ids with `multi_hot`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SparseFeature {
    /// The column's name.
    pub name: String,
    /// Embedding table (in the Job's model) this feature's ids are looked up in.
    pub table: String,
    /// The column holds a list of values (multi-hot) rather than one.
    #[serde(default)]
    pub multi_hot: bool,
    /// RecD dedup group: features of a group are deduplicated together per session.
    #[serde(default)]
    pub dedup_group: Option<String>,
    /// Kept as a sequence rather than pooled (a `multi_hot` list whose order means
    /// something, oldest first: a user's behaviour history). A model reads it with a
    /// graph's `sequence` input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<SequenceSpec>,
    /// Another feature of the same table whose ids this column holds: its ids are keyed as
    /// that feature's, so an id is the same embedding row in both (a history of items
    /// beside the item). Unset: the feature's own keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_ids_as: Option<String>,
}

impl SparseFeature {
    /// The feature whose name keys this one's ids.
    pub fn key_feature(&self) -> &str {
        self.same_ids_as.as_deref().unwrap_or(&self.name)
    }
}

/// How a sequence feature is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SequenceSpec {
    /// The most ids kept: a longer list keeps its last (most recent) `max_length`, a
    /// shorter one leaves the rest empty.
    pub max_length: u32,
}

/// The longest sequence a feature may keep: each position is a slot of the sample's
/// embedding row.
pub const MAX_SEQUENCE_LENGTH: u32 = 1024;

/// Checks `YYYY-MM-DD` (and `THH` when `hourly`) without a calendar library: month 1-12,
/// day within the month (leap years counted), hour 0-23.
fn check_window_time(errors: &mut Vec<FieldError>, path: String, value: &str, unit: WindowUnit) {
    let (date, hour) = match unit {
        WindowUnit::Daily => (value, None),
        WindowUnit::Hourly => match value.split_once('T') {
            Some((date, hour)) => (date, Some(hour)),
            None => (value, Some("")),
        },
    };
    let parts: Vec<Option<u32>> = date.split('-').map(|p| p.parse().ok()).collect();
    let valid_date = match parts[..] {
        [Some(y), Some(m), Some(d)] if date.len() == 10 && (1..=12).contains(&m) => {
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let days = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            (1..=days[m as usize - 1]).contains(&d)
        }
        _ => false,
    };
    let valid_hour = hour.is_none_or(|h| h.len() == 2 && h.parse::<u32>().is_ok_and(|h| h < 24));
    if !(valid_date && valid_hour) {
        let format = match unit {
            WindowUnit::Daily => "YYYY-MM-DD",
            WindowUnit::Hourly => "YYYY-MM-DDTHH",
        };
        fail(errors, path, format!("{value:?} is not a {format} time"));
    }
}

impl Validate for DatasetSpec {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        let streams = field(path, "streams");
        if self.streams.is_empty() {
            fail(
                errors,
                streams.clone(),
                "a dataset needs at least one stream",
            );
        }
        check_unique(
            errors,
            &streams,
            "stream",
            self.streams.iter().map(|s| s.name.as_str()),
        );
        let all_sources = self
            .streams
            .iter()
            .flat_map(|s| s.sources.iter().map(|src| src.name.as_str()));
        check_unique(errors, &field(path, "sources"), "source", all_sources);
        for (i, stream) in self.streams.iter().enumerate() {
            stream.validate(&index(&streams, i), errors);
        }
        self.schema.validate(&field(path, "schema"), errors);
        if self.schema.negative_sample_rate.is_some() {
            self.check_sources_sample_negatives(&streams, errors);
        }
        if !self.schema.targets.is_empty() {
            self.check_sources_carry_targets(&streams, errors);
        }
    }
}

impl DatasetSpec {
    /// A join source's actions carry one label; targets come with batch and stream rows.
    fn check_sources_carry_targets(&self, streams: &str, errors: &mut Vec<FieldError>) {
        for (i, stream) in self.streams.iter().enumerate() {
            let sources = field(&index(streams, i), "sources");
            for (j, source) in stream.sources.iter().enumerate() {
                if source.join.is_some() {
                    fail(
                        errors,
                        field(&index(&sources, j), "join"),
                        "schema.targets are read from a source's rows, and a join source's \
                         actions carry only the label",
                    );
                }
            }
        }
    }

    /// Only the joiner samples negatives: a source whose rows bypass it would train every
    /// negative, and the served model's correction would then overstate the odds.
    fn check_sources_sample_negatives(&self, streams: &str, errors: &mut Vec<FieldError>) {
        for (i, stream) in self.streams.iter().enumerate() {
            let sources = field(&index(streams, i), "sources");
            for (j, source) in stream.sources.iter().enumerate() {
                if source.join.is_none() {
                    fail(
                        errors,
                        index(&sources, j),
                        "schema.negative_sample_rate is set, but only join sources sample \
                         negatives: this source's rows would train every negative",
                    );
                }
            }
        }
    }
}

impl Validate for DataStream {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        check_name(errors, field(path, "name"), &self.name, false);
        let window = field(path, "window");
        check_window_time(
            errors,
            field(&window, "start"),
            &self.window.start,
            self.window.unit,
        );
        if let Some(end) = &self.window.end {
            check_window_time(errors, field(&window, "end"), end, self.window.unit);
            // Both have the same fixed-width format, so text order is time order.
            if end.len() == self.window.start.len() && end <= &self.window.start {
                fail(errors, field(&window, "end"), "must be after window.start");
            }
        }
        let sources = field(path, "sources");
        if self.sources.is_empty() {
            fail(
                errors,
                sources.clone(),
                "a stream needs at least one source",
            );
        }
        for (i, source) in self.sources.iter().enumerate() {
            source.validate(&index(&sources, i), errors);
        }
    }
}

impl Validate for DataSource {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        check_name(errors, field(path, "name"), &self.name, false);
        check_positive(errors, field(path, "weight"), self.weight);
        match (&self.parquet, &self.jetstream, &self.join) {
            (Some(parquet), None, None) => {
                if parquet.uri.trim().is_empty() {
                    fail(
                        errors,
                        field(&field(path, "parquet"), "uri"),
                        "must not be empty",
                    );
                }
            }
            (None, Some(js), None) => {
                let at = field(path, "jetstream");
                check_stream_name(errors, field(&at, "stream"), &js.stream);
                check_subject(errors, field(&at, "subject"), &js.subject);
            }
            (None, None, Some(join)) => join.validate(&field(path, "join"), errors),
            _ => fail(
                errors,
                path.to_owned(),
                "needs exactly one of `parquet`, `jetstream` and `join`",
            ),
        }
    }
}

impl Validate for JoinSource {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        check_stream_name(errors, field(path, "stream"), &self.stream);
        check_subject(errors, field(path, "features"), &self.features);
        check_subject(errors, field(path, "actions"), &self.actions);
        if self.features == self.actions {
            fail(
                errors,
                field(path, "actions"),
                "must differ from `features` (the joiner tells the two apart by subject)",
            );
        }
        if self.request_id.trim().is_empty() {
            fail(
                errors,
                field(path, "request_id"),
                "must name the column both subjects carry",
            );
        }
        check_positive(errors, field(path, "wait_seconds"), self.wait_seconds);
        check_positive(errors, field(path, "memory_rows"), self.memory_rows as f64);
    }
}

fn check_stream_name(errors: &mut Vec<FieldError>, at: String, stream: &str) {
    if stream.is_empty() || stream.contains(['.', ' ', '*', '>']) {
        fail(
            errors,
            at,
            "must be a JetStream stream name (no '.', ' ', '*', '>')",
        );
    }
}

fn check_subject(errors: &mut Vec<FieldError>, at: String, subject: &str) {
    if subject.is_empty() || subject.contains(char::is_whitespace) {
        fail(errors, at, "must be a NATS subject");
    }
}

impl FeatureSchema {
    /// Each target a distinct column, neither the label nor a feature.
    fn check_targets(&self, targets: &str, errors: &mut Vec<FieldError>) {
        for (i, target) in self.targets.iter().enumerate() {
            let at = index(targets, i);
            check_name(errors, at.clone(), target, true);
            if self.targets[..i].contains(target) {
                fail(errors, at, format!("duplicate target {target:?}"));
            } else if *target == self.label {
                fail(errors, at, "the label column is already a label");
            } else if (self.dense.iter().map(|d| &d.name))
                .chain(self.sparse.iter().map(|s| &s.name))
                .any(|name| name == target)
            {
                fail(errors, at, "a feature column cannot be a label");
            }
        }
    }
}

impl Validate for FeatureSchema {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        if self.label.is_empty() {
            fail(errors, field(path, "label"), "must name the label column");
        }
        if let Some(rate) = self.negative_sample_rate
            && !(rate > 0.0 && rate <= 1.0)
        {
            fail(
                errors,
                field(path, "negative_sample_rate"),
                format!("must be in (0, 1] (got {rate})"),
            );
        }
        let dense = field(path, "dense");
        let sparse = field(path, "sparse");
        if self.sparse.is_empty() {
            fail(errors, sparse.clone(), "needs at least one sparse feature");
        }
        let names = self
            .dense
            .iter()
            .map(|d| d.name.as_str())
            .chain(self.sparse.iter().map(|s| s.name.as_str()));
        check_unique(errors, &field(path, "features"), "feature", names);
        self.check_targets(&field(path, "targets"), errors);
        for (i, feature) in self.dense.iter().enumerate() {
            let at = index(&dense, i);
            check_name(errors, field(&at, "name"), &feature.name, true);
            if feature.name == self.label {
                fail(
                    errors,
                    field(&at, "name"),
                    "the label column cannot be a feature",
                );
            }
            let transform = field(&at, "transform");
            match feature.transform {
                DenseTransform::Standardize { std, .. } => {
                    check_positive(errors, field(&transform, "std"), std)
                }
                DenseTransform::Clip { min, max }
                    if min.partial_cmp(&max) != Some(std::cmp::Ordering::Less) =>
                {
                    fail(errors, field(&transform, "max"), "must be greater than min")
                }
                _ => {}
            }
        }
        for (i, feature) in self.sparse.iter().enumerate() {
            let at = index(&sparse, i);
            check_name(errors, field(&at, "name"), &feature.name, true);
            check_name(errors, field(&at, "table"), &feature.table, true);
            if let Some(group) = &feature.dedup_group {
                check_name(errors, field(&at, "dedup_group"), group, true);
            }
            if let Some(other) = &feature.same_ids_as {
                let at = field(&at, "same_ids_as");
                match self.sparse.iter().find(|f| f.name == *other) {
                    None => fail(
                        errors,
                        at,
                        format!("the schema has no sparse feature {other:?}"),
                    ),
                    Some(o) if o.name == feature.name => {
                        fail(errors, at, "names the feature itself")
                    }
                    Some(o) if o.table != feature.table => fail(
                        errors,
                        at,
                        format!(
                            "{other:?} reads table {:?}, this feature {:?}: shared ids share a table",
                            o.table, feature.table
                        ),
                    ),
                    Some(_) => {}
                }
            }
            if let Some(sequence) = feature.sequence {
                if !feature.multi_hot {
                    fail(
                        errors,
                        field(&at, "sequence"),
                        "a sequence is a list of ids: set multi_hot: true",
                    );
                }
                if !(1..=MAX_SEQUENCE_LENGTH).contains(&sequence.max_length) {
                    fail(
                        errors,
                        field(&field(&at, "sequence"), "max_length"),
                        format!("must be 1 to {MAX_SEQUENCE_LENGTH}"),
                    );
                }
            }
        }
    }
}
