//! Session-structured data (RecD §3): a user session yields several samples in a row;
//! the user's features (`user_id`, `user_segment`, `user_history`, dedup group `user`)
//! stay the same from one sample to the next unless they change, with a set probability
//! (a new item enters the history); item features (`item_id`, `item_category`,
//! `item_price`) are drawn anew for every sample.
//!
//! RecD's model: with S samples per session and probability d that a sample repeats the
//! previous sample's user features, a batch of whole sessions has DedupeFactor
//! 1 / (1 - (S-1)/S * d); here d = 1 - change_probability.

use std::sync::Arc;

use arrow_array::builder::{ListBuilder, UInt64Builder};
use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use arrow_select::take::take;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal, Zipf};

use primus_spec::dataset::{DenseFeature, DenseTransform, FeatureSchema, SparseFeature};

use crate::hidden::{normal, sigmoid};
use crate::{DatagenError, invalid};

/// How rows are laid out in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// Every row in timestamp order: concurrent sessions interleave.
    Time,
    /// A session's rows together (sessions in order of their first sample): RecD's
    /// clustering, which makes user features compress and deduplicate.
    Clustered,
}

/// How long a session is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SessionLength {
    /// Exactly this many samples per session (controlled experiments).
    Fixed(u32),
    /// 1 + a log-normal draw (sigma 1) with this mean: most sessions short, a few long.
    HeavyTail {
        /// The mean length.
        mean: f64,
    },
}

/// How session data is generated (RecD's feature duplication within sessions).
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Seeds everything.
    pub seed: u64,
    /// Samples per session.
    pub length: SessionLength,
    /// Probability that the user's features change between consecutive samples.
    pub change_probability: f64,
    /// Items in a user's history feature.
    pub history_len: usize,
    /// Distinct items (Zipf-distributed).
    pub items: u64,
    /// Distinct users.
    pub users: u64,
    /// Mean seconds between a session's samples.
    pub mean_gap_s: f64,
    /// Time order, or a session's rows written together (RecD's clustering).
    pub order: RowOrder,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            seed: 1,
            length: SessionLength::HeavyTail { mean: 16.5 },
            change_probability: 0.3,
            history_len: 20,
            items: 1_000_000,
            users: 10_000_000,
            mean_gap_s: 20.0,
            order: RowOrder::Time,
        }
    }
}

/// A generator of session rows.
pub struct Sessions {
    options: SessionOptions,
    rng: StdRng,
    items: Zipf<f64>,
    gaps: Exp<f64>,
    tail: LogNormal<f64>,
    next_session: u64,
}

struct Row {
    ts_ms: i64,
    session: u64,
    user: u64,
    segment: i64,
    history: Vec<u64>,
    item: u64,
    price: f64,
    label: bool,
}

impl Sessions {
    /// A generator with `options`.
    pub fn new(options: SessionOptions) -> Result<Self, DatagenError> {
        if !(0.0..=1.0).contains(&options.change_probability) {
            return Err(invalid("change_probability", "must be in [0, 1]"));
        }
        let mean = match options.length {
            SessionLength::Fixed(0) => return Err(invalid("length", "must be at least 1")),
            SessionLength::Fixed(n) => f64::from(n),
            SessionLength::HeavyTail { mean } if !(mean > 1.5 && mean.is_finite()) => {
                return Err(invalid("length", "mean must be above 1.5"));
            }
            SessionLength::HeavyTail { mean } => mean,
        };
        if options.items < 2 || options.users < 1 {
            return Err(invalid("items", "needs at least 2 items and 1 user"));
        }
        let items =
            Zipf::new(options.items as f64, 1.05).map_err(|e| invalid("items", e.to_string()))?;
        let gaps = Exp::new(1.0 / options.mean_gap_s.max(1e-3))
            .map_err(|e| invalid("mean_gap_s", e.to_string()))?;
        // E[floor(LogNormal)] ~ exp(mu + 1/2) - 1/2, plus the 1 every session has.
        let mu = (mean - 0.5).max(1.0).ln() - 0.5;
        let tail = LogNormal::new(mu, 1.0).map_err(|e| invalid("length", e.to_string()))?;
        Ok(Self {
            rng: StdRng::seed_from_u64(options.seed),
            options,
            items,
            gaps,
            tail,
            next_session: 0,
        })
    }

    /// The Arrow schema of the generated rows.
    pub fn schema() -> SchemaRef {
        let item = Arc::new(Field::new("item", DataType::UInt64, false));
        Arc::new(Schema::new(vec![
            Field::new("label", DataType::Int64, false),
            Field::new("ts_ms", DataType::Int64, false),
            Field::new("session_id", DataType::UInt64, false),
            Field::new("user_id", DataType::UInt64, false),
            Field::new("user_segment", DataType::Int64, false),
            Field::new("user_history", DataType::List(item), false),
            Field::new("item_id", DataType::UInt64, false),
            Field::new("item_category", DataType::Int64, false),
            Field::new("item_price", DataType::Float64, false),
        ]))
    }

    fn session_len(&mut self) -> usize {
        match self.options.length {
            SessionLength::Fixed(n) => n as usize,
            SessionLength::HeavyTail { .. } => 1 + self.tail.sample(&mut self.rng).floor() as usize,
        }
    }

    fn item(&mut self) -> u64 {
        self.items.sample(&mut self.rng) as u64
    }

    /// `sessions` sessions starting in `[start_unix_s, start_unix_s + span_s)`.
    pub fn generate(
        &mut self,
        sessions: usize,
        start_unix_s: i64,
        span_s: i64,
    ) -> Result<RecordBatch, DatagenError> {
        let mut rows = Vec::new();
        let span_ms = span_s.max(1) * 1000;
        for _ in 0..sessions {
            let session = self.next_session;
            self.next_session += 1;
            let user = self.rng.random_range(0..self.options.users);
            let segment = (user % 16) as i64;
            let mut history: Vec<u64> =
                (0..self.options.history_len).map(|_| self.item()).collect();
            let mut ts = start_unix_s * 1000 + self.rng.random_range(0..span_ms);
            for sample in 0..self.session_len() {
                if sample > 0 {
                    ts += (self.gaps.sample(&mut self.rng) * 1000.0) as i64;
                    if self.rng.random::<f64>() < self.options.change_probability {
                        // The user engaged with something new: it enters the history.
                        history.insert(0, self.item());
                        history.truncate(self.options.history_len.max(1));
                    }
                }
                let item = self.item();
                let logit = -1.2
                    + 0.8 * normal(self.options.seed, 1, item)
                    + 0.5 * normal(self.options.seed, 2, user)
                    + 0.4 * normal(self.options.seed, 3, item ^ (segment as u64) << 40);
                rows.push(Row {
                    ts_ms: ts,
                    session,
                    user,
                    segment,
                    history: history.clone(),
                    item,
                    price: 1.0 + (normal(self.options.seed, 4, item).abs() * 20.0),
                    label: self.rng.random::<f64>() < sigmoid(logit),
                });
            }
        }
        let batch = to_batch(&rows)?;
        Ok(match self.options.order {
            RowOrder::Clustered => batch,
            RowOrder::Time => {
                let mut order: Vec<u32> = (0..rows.len() as u32).collect();
                order.sort_by_key(|&i| rows[i as usize].ts_ms);
                let indices = arrow_array::UInt32Array::from(order);
                let columns = batch
                    .columns()
                    .iter()
                    .map(|c| take(c, &indices, None))
                    .collect::<Result<Vec<_>, _>>()?;
                RecordBatch::try_new(batch.schema(), columns)?
            }
        })
    }
}

/// The Dataset feature schema for these columns: user features in dedup group `user`,
/// every id looked up in `table`, the price log1p-transformed.
pub fn feature_schema(table: &str) -> FeatureSchema {
    let sparse = |name: &str, group: Option<&str>, multi_hot| SparseFeature {
        name: name.into(),
        table: table.into(),
        multi_hot,
        dedup_group: group.map(str::to_owned),
        sequence: None,
        same_ids_as: None,
    };
    FeatureSchema {
        label: "label".into(),
        negative_sample_rate: None,
        targets: Vec::new(),
        dense: vec![DenseFeature {
            name: "item_price".into(),
            transform: DenseTransform::Log1p,
            missing: 0.0,
        }],
        sparse: vec![
            sparse("user_id", Some("user"), false),
            sparse("user_segment", Some("user"), false),
            sparse("user_history", Some("user"), true),
            sparse("item_id", None, false),
            sparse("item_category", None, false),
        ],
    }
}

fn to_batch(rows: &[Row]) -> Result<RecordBatch, DatagenError> {
    let mut history = ListBuilder::new(UInt64Builder::new()).with_field(Arc::new(Field::new(
        "item",
        DataType::UInt64,
        false,
    )));
    for row in rows {
        history.values().append_slice(&row.history);
        history.append(true);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| i64::from(r.label)),
        )),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.ts_ms))),
        Arc::new(UInt64Array::from_iter_values(
            rows.iter().map(|r| r.session),
        )),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.user))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.segment))),
        Arc::new(history.finish()),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.item))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| (r.item % 97) as i64),
        )),
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.price))),
    ];
    Ok(RecordBatch::try_new(Sessions::schema(), columns)?)
}
