//! Time series of one job's metrics, written by the master.

use serde::{Deserialize, Serialize};

use crate::validate::{FieldError, Validate, check_name, fail, field, index};

/// A Job's metrics (`kind: Metric`, named like the Job): time series folded from its executors' reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricSpec {
    /// Name of the Job these metrics belong to.
    pub job: String,
    /// One series per gauge and role.
    #[serde(default)]
    pub series: Vec<MetricSeries>,
}

/// One metric (`samples_per_second`, `loss`, `auc`, `cpu_utilisation`, `data_lag_seconds`,
/// ...), optionally of one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricSeries {
    /// The gauge (`samples_per_second`, `buffer_rows.<source>`, ...).
    pub name: String,
    /// The role it comes from (`trainer`, `data_executor`, ...); rates are summed over a role's executors, other gauges averaged.
    #[serde(default)]
    pub role: Option<String>,
    /// The newest points, oldest first.
    #[serde(default)]
    pub points: Vec<MetricPoint>,
}

/// One value at one time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricPoint {
    /// When (Unix milliseconds).
    pub unix_ms: i64,
    /// The value.
    pub value: f64,
}

/// Metric names may be dotted (`buffer_rows.clicks`: a gauge per data source), unlike
/// resource names.
fn check_metric_name(errors: &mut Vec<FieldError>, path: String, name: &str) {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.".contains(c);
    let ok = (1..=MAX_METRIC_NAME).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(allowed);
    if !ok {
        fail(
            errors,
            path,
            format!(
                "{name:?} is not a valid metric name (1-{MAX_METRIC_NAME} of a-z, 0-9, '_', '-', '.'; starts with a letter)"
            ),
        );
    }
}

/// Room for a prefix, a dot and a resource name of up to 63 characters.
const MAX_METRIC_NAME: usize = 127;

impl Validate for MetricSpec {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        check_name(errors, field(path, "job"), &self.job, false);
        let series = field(path, "series");
        for (i, s) in self.series.iter().enumerate() {
            let at = index(&series, i);
            check_metric_name(errors, field(&at, "name"), &s.name);
            let points = field(&at, "points");
            for (j, pair) in s.points.windows(2).enumerate() {
                if pair[1].unix_ms < pair[0].unix_ms {
                    fail(
                        errors,
                        index(&points, j + 1),
                        "points must be in time order",
                    );
                }
            }
            for (j, point) in s.points.iter().enumerate() {
                if !point.value.is_finite() {
                    fail(
                        errors,
                        field(&index(&points, j), "value"),
                        "must be a finite number",
                    );
                }
            }
        }
    }
}
