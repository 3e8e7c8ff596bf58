//! Criteo-like click data: `label`, dense `i1`..`i13` (non-negative counts, ~10% null),
//! categorical `c1`..`c26` (Zipf-distributed ids). Labels are Bernoulli draws from a hidden
//! logistic model over the ids and log1p of the counts; the model's probabilities are
//! returned with the rows so the data's best achievable AUC can be computed.
//!
//! With `tasks`, two more labels correlated with the click: `conversion` (a click that
//! converted: among clicks, a Bernoulli draw from a second logistic model that shares part
//! of the click's logit and adds weights of its own over `c1`..`c8`) and
//! `log_watch_seconds` (every row: a linear model sharing part of the click's logit, with
//! weights of its own over `c9`..`c16`, plus Gaussian noise). Their hidden expectations
//! come back too, for each task's best achievable AUC or RMSE.

use std::sync::Arc;

use arrow_array::builder::Int64Builder;
use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal, StandardNormal, Zipf};

use primus_spec::dataset::{DenseFeature, DenseTransform, FeatureSchema, SparseFeature};

use crate::hidden::{normal, sigmoid};
use crate::{DatagenError, invalid};

/// Dense columns (`I1`..`I13`).
pub const DENSE: usize = 13;
/// Categorical columns (`C1`..`C26`).
pub const CATEGORICAL: usize = 26;

/// Distinct values per categorical column in the Criteo Kaggle display-ads data.
pub const CRITEO_CARDINALITIES: [u64; CATEGORICAL] = [
    1460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5683, 8_351_593, 3194, 27,
    14_992, 5_461_306, 10, 5652, 2173, 4, 7_046_547, 18, 15, 286_181, 105, 142_572,
];

/// Mean of log(count + 1) per dense column; the counts are log-normal around these.
const DENSE_LOG_MEANS: [f64; DENSE] = [
    0.8, 2.0, 1.5, 1.2, 6.0, 2.5, 1.0, 2.2, 3.0, 0.3, 0.7, 0.2, 1.4,
];
const DENSE_MISSING: f64 = 0.1;
const BIAS: f64 = -1.4;
/// Hidden weight scale per categorical column: 26 of them give the logit a spread
/// (standard deviation ~1.4) like a well-trained CTR model's.
const CATEGORICAL_SCALE: f64 = 0.27;
const DENSE_SCALE: f64 = 0.2;

/// The conversion label's column (with `tasks`).
pub const CONVERSION: &str = "conversion";
/// The continuous target's column (with `tasks`).
pub const WATCH: &str = "log_watch_seconds";
/// Conversion given a click: its logit's bias (rare: ~9% of clicks convert), the share of
/// the click's centred logit it carries, and the categorical columns (`c1`..) with weights
/// of its own.
const CONVERSION_BIAS: f64 = -4.0;
const CONVERSION_SHARE: f64 = 1.0;
const CONVERSION_COLUMNS: std::ops::Range<usize> = 0..8;
/// The watch time's mean at a centred click logit of 0, its share of that logit, its own
/// columns, and the standard deviation of the noise around its hidden mean.
const WATCH_BASE: f64 = 3.0;
const WATCH_SHARE: f64 = 0.5;
const WATCH_COLUMNS: std::ops::Range<usize> = 8..16;
const WATCH_NOISE: f64 = 0.5;
/// Seeds of the two tasks' own weights, apart from the click's.
const CONVERSION_SEED: u64 = 0xc0_4e12;
const WATCH_SEED: u64 = 0x3a7c_4000;

/// How the Criteo-like data is generated.
#[derive(Debug, Clone)]
pub struct CriteoOptions {
    /// Seeds the hidden model and the rows.
    pub seed: u64,
    /// Multiplies every cardinality (at least 2 values per column remain).
    pub cardinality_scale: f64,
    /// Zipf exponent of the id distribution.
    pub zipf_exponent: f64,
    /// Angle the hidden weights rotate by per day (0: no drift).
    pub drift_radians_per_day: f64,
    /// Unix seconds where the drift angle is 0.
    pub epoch_unix_s: i64,
    /// Adds the `conversion` and `log_watch_seconds` labels.
    pub tasks: bool,
}

impl Default for CriteoOptions {
    fn default() -> Self {
        Self {
            seed: 1,
            cardinality_scale: 1.0,
            zipf_exponent: 1.1,
            drift_radians_per_day: 0.0,
            epoch_unix_s: 0,
            tasks: false,
        }
    }
}

/// Rows plus what generated their labels.
pub struct Generated {
    /// The rows.
    pub batch: RecordBatch,
    /// The hidden model's click probability per row.
    pub probabilities: Vec<f64>,
    /// The labels drawn from those probabilities.
    pub labels: Vec<bool>,
    /// With `tasks`: the further labels and their hidden expectations.
    pub tasks: Option<Tasks>,
}

/// The further labels of rows generated with `tasks`, and what generated them.
#[derive(Debug, Clone, Default)]
pub struct Tasks {
    /// The hidden probability of a conversion: of a click times of converting once clicked.
    pub conversion_probabilities: Vec<f64>,
    /// The `conversion` labels.
    pub conversions: Vec<bool>,
    /// The hidden mean of each row's `log_watch_seconds`.
    pub watch_means: Vec<f64>,
    /// The `log_watch_seconds` values drawn around those means.
    pub watch: Vec<f64>,
}

impl Tasks {
    /// Appends `other`'s rows.
    pub fn extend(&mut self, other: Tasks) {
        (self.conversion_probabilities).extend(other.conversion_probabilities);
        self.conversions.extend(other.conversions);
        self.watch_means.extend(other.watch_means);
        self.watch.extend(other.watch);
    }
}

/// A generator of Criteo-like rows whose labels come from a hidden logistic model.
pub struct Criteo {
    options: CriteoOptions,
    ids: Vec<Zipf<f64>>,
    counts: Vec<Normal<f64>>,
    rng: StdRng,
}

impl Criteo {
    /// A generator with `options`.
    pub fn new(options: CriteoOptions) -> Result<Self, DatagenError> {
        if !(options.cardinality_scale > 0.0 && options.cardinality_scale.is_finite()) {
            return Err(invalid("cardinality_scale", "must be a positive number"));
        }
        if !(options.zipf_exponent > 0.0 && options.zipf_exponent.is_finite()) {
            return Err(invalid("zipf_exponent", "must be a positive number"));
        }
        if !options.drift_radians_per_day.is_finite() {
            return Err(invalid("drift_radians_per_day", "must be a finite number"));
        }
        let ids = cardinalities(options.cardinality_scale)
            .iter()
            .map(|&n| Zipf::new(n as f64, options.zipf_exponent))
            .collect::<Result<_, _>>()
            .map_err(|e| invalid("zipf_exponent", e.to_string()))?;
        let counts = DENSE_LOG_MEANS
            .iter()
            .map(|&mean| Normal::new(mean, 1.2))
            .collect::<Result<_, _>>()
            .map_err(|e| invalid("dense", e.to_string()))?;
        let rng = StdRng::seed_from_u64(options.seed);
        Ok(Self {
            options,
            ids,
            counts,
            rng,
        })
    }

    /// The Arrow schema of the generated rows: `label`, `i1`..`i13`, `c1`..`c26`, then with
    /// `tasks` `conversion` and `log_watch_seconds`.
    pub fn schema(tasks: bool) -> SchemaRef {
        let mut fields = vec![Field::new("label", DataType::Int64, false)];
        fields.extend((1..=DENSE).map(|i| Field::new(format!("i{i}"), DataType::Int64, true)));
        fields
            .extend((1..=CATEGORICAL).map(|i| Field::new(format!("c{i}"), DataType::Int64, false)));
        if tasks {
            fields.push(Field::new(CONVERSION, DataType::Int64, false));
            fields.push(Field::new(WATCH, DataType::Float64, false));
        }
        Arc::new(Schema::new(fields))
    }

    /// The hidden weight of `id` in categorical column `column` at `unix_s`.
    fn weight(&self, column: usize, id: u64, angle: f64) -> f64 {
        let seed = self.options.seed;
        let now = normal(seed, column as u64, id);
        if angle == 0.0 {
            return CATEGORICAL_SCALE * now;
        }
        let later = normal(seed ^ 0xd1f7, column as u64, id);
        CATEGORICAL_SCALE * (angle.cos() * now + angle.sin() * later)
    }

    fn dense_weight(&self, column: usize) -> f64 {
        DENSE_SCALE * normal(self.options.seed, 1000 + column as u64, 0)
    }

    /// `rows` rows stamped at `unix_s` (drift is evaluated at that time).
    pub fn generate(&mut self, rows: usize, unix_s: i64) -> Result<Generated, DatagenError> {
        let days = (unix_s - self.options.epoch_unix_s) as f64 / 86_400.0;
        let angle = self.options.drift_radians_per_day * days;
        let mut logits = vec![BIAS; rows];
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(1 + DENSE + CATEGORICAL);
        let mut dense_columns = Vec::with_capacity(DENSE);
        for (j, log_mean) in DENSE_LOG_MEANS.iter().enumerate() {
            let mut column = Int64Builder::with_capacity(rows);
            let w = self.dense_weight(j);
            for logit in logits.iter_mut() {
                if self.rng.random::<f64>() < DENSE_MISSING {
                    column.append_null();
                    continue;
                }
                let log_count = self.counts[j].sample(&mut self.rng).max(0.0);
                let count = log_count.exp_m1().floor();
                // Centred, so a missing count (which adds nothing) reads as a typical one.
                *logit += w * (count.ln_1p() - log_mean);
                column.append_value(count as i64);
            }
            dense_columns.push(Arc::new(column.finish()) as ArrayRef);
        }
        let mut categorical = Vec::with_capacity(CATEGORICAL);
        let mut ids = Vec::with_capacity(CATEGORICAL);
        for c in 0..CATEGORICAL {
            let mut values = Vec::with_capacity(rows);
            for logit in logits.iter_mut() {
                let id = self.ids[c].sample(&mut self.rng) as u64;
                *logit += self.weight(c, id, angle);
                values.push(id as i64);
            }
            if self.options.tasks {
                ids.push(values.clone());
            }
            categorical.push(Arc::new(Int64Array::from(values)) as ArrayRef);
        }
        let probabilities: Vec<f64> = logits.iter().map(|&l| sigmoid(l)).collect();
        let labels: Vec<bool> = probabilities
            .iter()
            .map(|&p| self.rng.random::<f64>() < p)
            .collect();
        columns.push(Arc::new(Int64Array::from_iter_values(
            labels.iter().map(|&l| i64::from(l)),
        )));
        columns.extend(dense_columns);
        columns.extend(categorical);
        let tasks = self
            .options
            .tasks
            .then(|| self.tasks(&logits, &probabilities, &labels, &ids));
        if let Some(tasks) = &tasks {
            let conversions = tasks.conversions.iter().map(|&c| i64::from(c));
            columns.push(Arc::new(Int64Array::from_iter_values(conversions)));
            columns.push(Arc::new(Float64Array::from(tasks.watch.clone())));
        }
        Ok(Generated {
            batch: RecordBatch::try_new(Self::schema(self.options.tasks), columns)?,
            probabilities,
            labels,
            tasks,
        })
    }

    /// The further labels of rows with click `logits` (and so `probabilities` and
    /// `labels`) and categorical `ids` (per column, per row).
    fn tasks(
        &mut self,
        logits: &[f64],
        probabilities: &[f64],
        labels: &[bool],
        ids: &[Vec<i64>],
    ) -> Tasks {
        let own = |seed: u64, columns: std::ops::Range<usize>, row: usize| -> f64 {
            (columns.map(|c| CATEGORICAL_SCALE * normal(seed, c as u64, ids[c][row] as u64))).sum()
        };
        let seed = self.options.seed;
        let mut tasks = Tasks::default();
        for (row, &logit) in logits.iter().enumerate() {
            let shared = logit - BIAS;
            let converting = sigmoid(
                CONVERSION_BIAS
                    + CONVERSION_SHARE * shared
                    + own(seed ^ CONVERSION_SEED, CONVERSION_COLUMNS, row),
            );
            let converted = self.rng.random::<f64>() < converting;
            tasks.conversions.push(labels[row] && converted);
            (tasks.conversion_probabilities).push(probabilities[row] * converting);
            let mean =
                WATCH_BASE + WATCH_SHARE * shared + own(seed ^ WATCH_SEED, WATCH_COLUMNS, row);
            let noise: f64 = StandardNormal.sample(&mut self.rng);
            tasks.watch_means.push(mean);
            tasks.watch.push(mean + WATCH_NOISE * noise);
        }
        tasks
    }
}

/// The Dataset feature schema for these columns: log1p counts (null -> the column's typical
/// count), every categorical column looked up in `table`; the click is the label.
pub fn feature_schema(table: &str) -> FeatureSchema {
    FeatureSchema {
        label: "label".into(),
        negative_sample_rate: None,
        targets: Vec::new(),
        dense: DENSE_LOG_MEANS
            .iter()
            .enumerate()
            .map(|(j, log_mean)| DenseFeature {
                name: format!("i{}", j + 1),
                transform: DenseTransform::Log1p,
                // The column's typical count: a missing count adds nothing to the hidden
                // logit, like a count whose log1p is the column's mean.
                missing: log_mean.exp_m1(),
            })
            .collect(),
        sparse: (1..=CATEGORICAL)
            .map(|i| SparseFeature {
                name: format!("c{i}"),
                table: table.into(),
                multi_hot: false,
                dedup_group: None,
                sequence: None,
                same_ids_as: None,
            })
            .collect(),
    }
}

/// Criteo's cardinalities times `scale`, at least 2 each.
pub fn cardinalities(scale: f64) -> Vec<u64> {
    CRITEO_CARDINALITIES
        .iter()
        .map(|&n| ((n as f64 * scale).round() as u64).max(2))
        .collect()
}
