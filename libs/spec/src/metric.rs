//! Time series of one job's metrics, written by the master.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validate::{FieldError, Validate, check_name, fail, field, index};

/// A Job's metrics (`kind: Metric`, named like the Job): time series folded from its executors' reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricSeries {
    /// The gauge (`samples_per_second`, `buffer_rows.<source>`, ...).
    pub name: String,
    /// The role it comes from (`trainer`, `data_executor`, ...); rates are summed over a role's executors, other gauges averaged.
    #[serde(default)]
    pub role: Option<String>,
    /// The one executor it comes from (`trainer-0`), for a gauge measured per executor
    /// (`cpu_cores`, `memory_bytes`); unset for the role's sum or mean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// The newest points, oldest first.
    #[serde(default)]
    pub points: Vec<MetricPoint>,
}

/// One value at one time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricPoint {
    /// When (Unix milliseconds).
    pub unix_ms: i64,
    /// The value.
    pub value: f64,
}

impl MetricSpec {
    /// What `self` adds to `previous`: per series, the points after the last one `previous`
    /// holds (series without new points left out). None unless `self` is `previous` with
    /// points appended (and the oldest possibly dropped): a series gone, a point rewritten
    /// or another Job's metrics must travel whole.
    pub fn appended_to(&self, previous: &MetricSpec) -> Option<MetricSpec> {
        if self.job != previous.job {
            return None;
        }
        let same = |a: &MetricSeries, b: &MetricSeries| a.same_series(b);
        let kept = |old: &MetricSeries| self.series.iter().any(|s| same(s, old));
        if !previous.series.iter().all(kept) {
            return None;
        }
        let mut series = Vec::new();
        for newer in &self.series {
            let old = previous.series.iter().find(|old| same(newer, old));
            let old_points = old.map_or(&[][..], |old| &old.points[..]);
            let fresh = appended_points(old_points, &newer.points)?;
            if !fresh.is_empty() {
                series.push(MetricSeries {
                    points: fresh.to_vec(),
                    ..newer.clone()
                });
            }
        }
        Some(MetricSpec {
            job: self.job.clone(),
            series,
        })
    }

    /// Adds `appended` (as [`MetricSpec::appended_to`] gives it) to these series, keeping
    /// the newest `max_points` of each.
    pub fn append(&mut self, appended: MetricSpec, max_points: usize) {
        for fresh in appended.series {
            let found = (self.series.iter_mut()).find(|s| s.same_series(&fresh));
            let points = match found {
                Some(series) => {
                    series.points.extend(fresh.points);
                    &mut series.points
                }
                None => {
                    self.series.push(fresh);
                    let Some(last) = self.series.last_mut() else {
                        return;
                    };
                    &mut last.points
                }
            };
            let excess = points.len().saturating_sub(max_points);
            points.drain(..excess);
        }
    }
}

impl MetricSeries {
    /// Whether `other` is a version of this series (same gauge, role and executor).
    pub fn same_series(&self, other: &MetricSeries) -> bool {
        self.name == other.name && self.role == other.role && self.executor == other.executor
    }
}

/// The points of `now` after those it shares with the end of `old`; None when `now` does
/// not begin with a run of `old`'s newest points (in order, values equal).
fn appended_points<'a>(old: &[MetricPoint], now: &'a [MetricPoint]) -> Option<&'a [MetricPoint]> {
    let Some(last) = old.last() else {
        return Some(now);
    };
    let shared = now.iter().take_while(|p| p.unix_ms <= last.unix_ms).count();
    let tail = old.get(old.len().checked_sub(shared)?..)?;
    (tail == &now[..shared]).then_some(&now[shared..])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, points: &[(i64, f64)]) -> MetricSeries {
        MetricSeries {
            name: name.to_owned(),
            role: Some("trainer".to_owned()),
            executor: None,
            points: (points.iter())
                .map(|&(unix_ms, value)| MetricPoint { unix_ms, value })
                .collect(),
        }
    }

    fn spec(series: Vec<MetricSeries>) -> MetricSpec {
        MetricSpec {
            job: "ctr".to_owned(),
            series,
        }
    }

    #[test]
    fn appended_points_rebuild_the_newer_series() {
        let before = spec(vec![series("auc", &[(1, 0.5), (2, 0.6), (3, 0.7)])]);
        // The oldest point dropped (a cap of 3), one point appended, a new series.
        let after = spec(vec![
            series("auc", &[(2, 0.6), (3, 0.7), (4, 0.8)]),
            series("loss", &[(4, 0.4)]),
        ]);
        let appended = after.appended_to(&before).expect("an append");
        assert_eq!(
            appended,
            spec(vec![
                series("auc", &[(4, 0.8)]),
                series("loss", &[(4, 0.4)])
            ])
        );
        let mut watched = before.clone();
        watched.append(appended, 3);
        assert_eq!(watched, after);
        assert_eq!(
            after.appended_to(&after),
            Some(spec(Vec::new())),
            "nothing new"
        );
    }

    #[test]
    fn a_change_that_is_not_an_append_travels_whole() {
        let before = spec(vec![
            series("auc", &[(1, 0.5), (2, 0.6)]),
            series("loss", &[(2, 0.4)]),
        ]);
        let rewritten = spec(vec![
            series("auc", &[(1, 0.5), (2, 0.9), (3, 0.7)]),
            series("loss", &[(2, 0.4)]),
        ]);
        assert_eq!(rewritten.appended_to(&before), None, "a point rewritten");
        let dropped = spec(vec![series("auc", &[(1, 0.5), (2, 0.6), (3, 0.7)])]);
        assert_eq!(dropped.appended_to(&before), None, "a series gone");
        let other = MetricSpec {
            job: "other".to_owned(),
            ..before.clone()
        };
        assert_eq!(other.appended_to(&before), None, "another Job");
    }
}
