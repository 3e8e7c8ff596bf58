//! A Job's metrics: [`follow`] receives its executors' `MetricsReport`s from NATS,
//! [`MetricsFold`] folds them into its Metric resource series and its progress, and
//! `write()` applies the Metric resource.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::resources::Resources;
use primus_bus::Bus;
use primus_proto::v1::{Endpoint, MetricsReport, Role};
use primus_spec::metric::{MetricPoint, MetricSeries, MetricSpec};
use primus_spec::status::{HeadProgress, Progress, SourceProgress};

/// Points kept per series (older ones are dropped).
pub const MAX_POINTS: usize = 720;

/// Bytes a Metric resource's spec may take as JSON: the API server's limit for a
/// resource, with room to spare.
const SPEC_BUDGET: usize = primus_spec::MAX_DOCUMENT_BYTES / 10 * 9;

#[derive(Default)]
pub struct MetricsFold {
    /// Latest report per executor id.
    latest: HashMap<String, MetricsReport>,
    /// Executors the Job no longer runs: their totals count, their gauges no longer do.
    retired: HashSet<String>,
    /// What the backend measured of each executor, as gauges of a report.
    usage: HashMap<String, MetricsReport>,
    fresh: bool,
    /// By gauge, role and executor ("" for the role's sum or mean).
    series: BTreeMap<(String, String, String), Vec<MetricPoint>>,
}

/// A trainer's scores over the newest samples it trained (its progressive evaluation).
const EVALUATION: [&str; 3] = ["auc", "logloss", "calibration"];

/// A head's scores (`head.<name>.<score>`) of a model with several.
const HEAD_EVALUATION: [&str; 3] = [".auc", ".logloss", ".rmse"];

fn is_evaluation(gauge: &str) -> bool {
    EVALUATION.contains(&gauge)
        || (gauge.starts_with("head.") && HEAD_EVALUATION.iter().any(|s| gauge.ends_with(s)))
}

/// A trainer process that has scored nothing yet (one restarted, say) keeps the scores its
/// executor last reported: the newest samples trained under its id are still those.
fn keep_evaluation(previous: &MetricsReport, report: &mut MetricsReport) {
    if report.gauges.keys().any(|name| is_evaluation(name)) {
        return;
    }
    for (name, value) in &previous.gauges {
        if is_evaluation(name) {
            report.gauges.insert(name.clone(), *value);
        }
    }
}

fn role_name(report: &MetricsReport) -> String {
    let role = report
        .endpoint
        .as_ref()
        .and_then(|e| Role::try_from(e.role).ok())
        .unwrap_or(Role::Unspecified);
    role.as_str_name()
        .trim_start_matches("ROLE_")
        .to_ascii_lowercase()
}

impl MetricsFold {
    pub fn add(&mut self, mut report: MetricsReport) {
        let id = report
            .endpoint
            .as_ref()
            .map(|e| e.id.clone())
            .unwrap_or_default();
        if let Some(previous) = self.latest.get(&id) {
            keep_evaluation(previous, &mut report);
        }
        if self.retired.contains(&id) {
            report.gauges.clear();
        }
        self.latest.insert(id, report);
        self.fresh = true;
    }

    /// Executor `id` left the Job: its samples and steps stay in the totals; its gauges
    /// (rates, buffer fill) leave the series, now and in a report still on its way.
    pub fn retire(&mut self, id: &str) {
        self.retired.insert(id.to_owned());
        self.usage.remove(id);
        if let Some(report) = self.latest.get_mut(id) {
            report.gauges.clear();
        }
        self.fresh = true;
    }

    /// The backend's measurement of executor `endpoint`: `cpu_cores` and `memory_bytes`
    /// series of its role, and of the executor itself.
    pub fn add_usage(&mut self, endpoint: Endpoint, cpu_cores: f64, memory_bytes: u64) {
        if self.retired.contains(&endpoint.id) {
            return;
        }
        let report = MetricsReport {
            job: String::new(),
            gauges: [
                ("cpu_cores".to_owned(), cpu_cores),
                ("memory_bytes".to_owned(), memory_bytes as f64),
            ]
            .into(),
            endpoint: Some(endpoint.clone()),
            ..MetricsReport::default()
        };
        self.usage.insert(endpoint.id, report);
        self.fresh = true;
    }

    /// The latest value of gauge `name` executor `id` reported.
    pub fn gauge(&self, id: &str, name: &str) -> Option<f64> {
        self.latest.get(id)?.gauges.get(name).copied()
    }

    /// Executor `id` runs again (started under a retired id; a trainer continues its
    /// totals, so its reports replace the retired one's).
    pub fn rejoin(&mut self, id: &str) {
        self.retired.remove(id);
    }

    /// Appends one point per (gauge, role) from the latest reports, and per (gauge,
    /// executor) from the backend's measurements, if any arrived since the last tick.
    /// Returns whether anything changed.
    pub fn tick(&mut self, unix_ms: i64) -> bool {
        if !std::mem::take(&mut self.fresh) {
            return false;
        }
        let mut values: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
        let mut add = |key: (String, String, String), value: f64| {
            if value.is_finite() {
                values.entry(key).or_default().push(value);
            }
        };
        for report in self.latest.values().chain(self.usage.values()) {
            let role = role_name(report);
            for (name, value) in &report.gauges {
                add((name.clone(), role.clone(), String::new()), *value);
            }
        }
        for (id, usage) in &self.usage {
            let role = role_name(usage);
            for (name, value) in &usage.gauges {
                add((name.clone(), role.clone(), id.clone()), *value);
            }
        }
        for ((name, role, executor), v) in values {
            let value = if name.ends_with("_per_second") {
                v.iter().sum()
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            };
            let points = self.series.entry((name, role, executor)).or_default();
            points.push(MetricPoint { unix_ms, value });
            if points.len() > MAX_POINTS {
                points.drain(..points.len() - MAX_POINTS);
            }
        }
        true
    }

    /// The Metric resource's spec: every series with as many of its newest points (up to
    /// [`MAX_POINTS`]) as fit the API server's limit for a resource. A Job of many
    /// executors has many series, whose full history would be refused whole, and its
    /// metrics would then stop moving.
    pub fn spec(&self, job: &str) -> MetricSpec {
        let mut kept = MAX_POINTS;
        if self.json_bytes_at_most(job) <= SPEC_BUDGET {
            return self.newest(job, kept);
        }
        loop {
            let spec = self.newest(job, kept);
            let bytes = serde_json::to_string(&spec).map_or(0, |json| json.len());
            if bytes <= SPEC_BUDGET || kept == 1 {
                return spec;
            }
            kept = (kept * SPEC_BUDGET / bytes).clamp(1, kept - 1);
        }
    }

    /// More bytes than the whole spec takes as JSON, counted without writing it (most
    /// Jobs' specs fit well within the limit): a point is at most 64 bytes (the longest
    /// `i64` and `f64`), a series' other fields at most twice their text (escapes) and 96.
    fn json_bytes_at_most(&self, job: &str) -> usize {
        let series: usize = (self.series.iter())
            .map(|((name, role, executor), points)| {
                2 * (name.len() + role.len() + executor.len()) + 96 + 64 * points.len()
            })
            .sum();
        2 * job.len() + 64 + series
    }

    /// Every series with its newest `kept` points.
    fn newest(&self, job: &str, kept: usize) -> MetricSpec {
        MetricSpec {
            job: job.to_owned(),
            series: self
                .series
                .iter()
                .map(|((name, role, executor), points)| MetricSeries {
                    name: name.clone(),
                    role: Some(role.clone()),
                    executor: (!executor.is_empty()).then(|| executor.clone()),
                    points: points[points.len().saturating_sub(kept)..].to_vec(),
                })
                .collect(),
        }
    }

    /// The trainers' totals and latest gauges as job progress (None before any report).
    pub fn progress(&self) -> Option<Progress> {
        let trainers: Vec<&MetricsReport> = self
            .latest
            .values()
            .filter(|r| {
                r.endpoint
                    .as_ref()
                    .is_some_and(|e| e.role == Role::Trainer as i32)
            })
            .collect();
        if trainers.is_empty() {
            return None;
        }
        let aucs: Vec<f64> = trainers
            .iter()
            .filter_map(|r| r.gauges.get("auc").copied())
            .collect();
        Some(Progress {
            samples: trainers.iter().map(|r| r.samples).sum(),
            steps: trainers.iter().map(|r| r.steps).max().unwrap_or(0),
            fraction: None,
            samples_per_second: trainers
                .iter()
                .filter_map(|r| r.gauges.get("samples_per_second"))
                .sum(),
            auc: (!aucs.is_empty()).then(|| aucs.iter().sum::<f64>() / aucs.len() as f64),
            retrained_samples: 0,
            tasks: None,
            heads: head_scores(&trainers),
            sources: source_samples(&trainers)
                .into_iter()
                .map(|(source, samples)| SourceProgress {
                    source,
                    samples,
                    ..SourceProgress::default()
                })
                .collect(),
        })
    }
}

/// Each head's scores (`head.<name>.auc`, `.rmse`), averaged over the trainers that
/// report them, by head name.
fn head_scores(trainers: &[&MetricsReport]) -> Vec<HeadProgress> {
    let mut names: Vec<&str> = Vec::new();
    for report in trainers {
        for gauge in report.gauges.keys() {
            let head = gauge.strip_prefix("head.").and_then(|g| g.rsplit_once('.'));
            if let Some((name, _)) = head
                && !names.contains(&name)
            {
                names.push(name);
            }
        }
    }
    names.sort_unstable();
    let mean = |head: &str, score: &str| {
        let gauge = format!("head.{head}.{score}");
        let values: Vec<f64> = (trainers.iter())
            .filter_map(|r| r.gauges.get(&gauge).copied())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    (names.into_iter())
        .map(|name| HeadProgress {
            name: name.to_owned(),
            auc: mean(name, "auc"),
            rmse: mean(name, "rmse"),
        })
        .collect()
}

/// The trainers' samples per source, summed.
fn source_samples(trainers: &[&MetricsReport]) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    for (source, samples) in trainers.iter().flat_map(|r| &r.source_samples) {
        *sums.entry(source.clone()).or_default() += samples;
    }
    sums
}

/// Sends every metrics report of `job`'s executors to `reports` until it closes.
pub async fn follow(bus: Bus, job: String, reports: tokio::sync::mpsc::Sender<MetricsReport>) {
    let subject = match bus.subjects().metrics(&job, "*", "*") {
        Ok(subject) => subject,
        Err(e) => return tracing::error!(%job, error = %e, "metrics subject"),
    };
    let mut messages = match bus.subscribe::<MetricsReport>(subject).await {
        Ok(messages) => messages,
        Err(e) => return tracing::error!(%job, error = %e, "metrics subscription"),
    };
    while let Some(message) = messages.next().await {
        match message {
            Ok(received) => {
                if reports.send(received.message).await.is_err() {
                    return;
                }
            }
            Err(e) => tracing::warn!(%job, error = %e, "undecodable metrics report"),
        }
    }
}

/// Applies `job`'s Metric resource, labelled `labels`, from the fold; a failure is logged
/// (the next write carries every point).
pub(crate) async fn write(
    resources: &Resources,
    job: &str,
    labels: BTreeMap<String, String>,
    fold: &MetricsFold,
) {
    if let Err(e) = resources.write_metric(job, labels, fold.spec(job)).await {
        tracing::warn!(%job, error = %e, "writing the Metric resource");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(id: &str, sps: f64, auc: f64, samples: u64) -> MetricsReport {
        MetricsReport {
            job: "j".into(),
            endpoint: Some(Endpoint {
                role: Role::Trainer as i32,
                id: id.into(),
                grpc_addr: String::new(),
            }),
            unix_ms: 1,
            gauges: [("samples_per_second".into(), sps), ("auc".into(), auc)].into(),
            samples,
            steps: samples / 10,
            source_samples: [
                ("files".into(), samples * 3 / 4),
                ("live".into(), samples / 4),
            ]
            .into(),
        }
    }

    /// 80 series over the whole history would be over 2 MB: the spec keeps every series,
    /// with the newest points that fit the API server's limit.
    #[test]
    fn a_spec_of_many_series_keeps_their_newest_points_within_the_resource_limit() {
        let mut fold = MetricsFold::default();
        for tick in 0..MAX_POINTS as i64 {
            let mut report = report("t0", 100.0, 0.7, 1000);
            report.gauges = (0..80)
                .map(|g| (format!("gauge_{g}"), tick as f64 / 7.0 + f64::from(g) / 3.0))
                .collect();
            fold.add(report);
            fold.tick(1_795_000_000_000 + tick * 1000);
        }
        let whole = fold.newest("j", MAX_POINTS);
        let whole_bytes = serde_json::to_string(&whole).expect("json").len();
        assert!(
            whole_bytes > primus_spec::MAX_DOCUMENT_BYTES,
            "{whole_bytes} bytes"
        );

        assert!(fold.json_bytes_at_most("j") >= whole_bytes);
        let spec = fold.spec("j");
        let bytes = serde_json::to_string(&spec).expect("json").len();
        assert!(bytes <= SPEC_BUDGET, "{bytes} bytes");
        assert_eq!(spec.series.len(), whole.series.len());
        for (kept, all) in spec.series.iter().zip(&whole.series) {
            assert!(
                kept.points.len() >= MAX_POINTS / 4,
                "{} points",
                kept.points.len()
            );
            assert!(
                all.points.ends_with(&kept.points),
                "the newest points of {}",
                all.name
            );
        }
    }

    #[test]
    fn rates_add_up_and_other_gauges_average() {
        let mut fold = MetricsFold::default();
        assert!(!fold.tick(1));
        fold.add(report("t0", 100.0, 0.7, 1000));
        fold.add(report("t1", 50.0, 0.8, 500));
        assert!(fold.tick(2));
        let spec = fold.spec("j");
        let value = |name: &str| {
            spec.series
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.points[0].value)
        };
        assert_eq!(value("samples_per_second"), Some(150.0));
        assert!((value("auc").unwrap_or_default() - 0.75).abs() < 1e-12);
        let progress = fold.progress().expect("trainers reported");
        assert_eq!(progress.samples, 1500);
        assert_eq!(progress.samples_per_second, 150.0);
        let per_source: Vec<(&str, u64)> = (progress.sources.iter())
            .map(|s| (s.source.as_str(), s.samples))
            .collect();
        assert_eq!(per_source, [("files", 1125), ("live", 375)]);
        assert!(!fold.tick(3), "no new report, no new point");
    }

    #[test]
    fn a_restarted_trainer_keeps_its_scores_until_it_scores_again() {
        let mut fold = MetricsFold::default();
        let mut first = report("t0", 100.0, 0.7, 1000);
        first.gauges.insert("head.watch.rmse".into(), 1.5);
        first.gauges.insert("head.watch.loss".into(), 2.25);
        fold.add(first);
        let mut restarted = report("t0", 0.0, 0.0, 1000);
        restarted.gauges.remove("auc");
        fold.add(restarted);
        let progress = fold.progress().expect("trainers reported");
        assert_eq!(progress.auc, Some(0.7));
        assert_eq!(
            fold.gauge("t0", "head.watch.rmse"),
            Some(1.5),
            "a head's score"
        );
        assert_eq!(fold.gauge("t0", "head.watch.loss"), None, "a training loss");
        let heads = fold.progress().expect("trainers reported").heads;
        let want = HeadProgress {
            name: "watch".into(),
            auc: None,
            rmse: Some(1.5),
        };
        assert_eq!(heads, [want], "each head's score in the Job's progress");
        assert_eq!(progress.samples_per_second, 0.0, "rates are not kept");
        fold.add(report("t0", 90.0, 0.72, 1200));
        assert_eq!(fold.progress().and_then(|p| p.auc), Some(0.72));
    }

    #[test]
    fn usage_is_a_series_per_executor_beside_its_roles_mean() {
        let mut fold = MetricsFold::default();
        let trainer = |id: &str| Endpoint {
            role: Role::Trainer as i32,
            id: id.into(),
            grpc_addr: String::new(),
        };
        fold.add_usage(trainer("trainer-0"), 1.0, 100);
        fold.add_usage(trainer("trainer-1"), 0.5, 300);
        assert!(fold.tick(7));
        let spec = fold.spec("j");
        let cpu = |executor: Option<&str>| {
            (spec.series.iter())
                .find(|s| s.name == "cpu_cores" && s.executor.as_deref() == executor)
                .map(|s| (s.role.clone(), s.points[0].value))
        };
        let trainer_role = Some("trainer".to_owned());
        assert_eq!(cpu(None), Some((trainer_role.clone(), 0.75)));
        assert_eq!(cpu(Some("trainer-0")), Some((trainer_role.clone(), 1.0)));
        assert_eq!(cpu(Some("trainer-1")), Some((trainer_role, 0.5)));
        let memory = (spec.series.iter())
            .filter(|s| s.name == "memory_bytes")
            .count();
        assert_eq!(memory, 3, "the role's mean and one per executor");
    }

    #[test]
    fn a_retired_trainer_keeps_its_samples_but_not_its_rate() {
        let mut fold = MetricsFold::default();
        fold.add(report("t0", 100.0, 0.7, 1000));
        fold.add(report("t1", 50.0, 0.8, 500));
        fold.retire("t1");
        // Its last report arrives after it was stopped.
        fold.add(report("t1", 40.0, 0.9, 600));
        let progress = fold.progress().expect("trainers reported");
        assert_eq!(progress.samples, 1600);
        assert_eq!(progress.samples_per_second, 100.0);
        assert_eq!(progress.auc, Some(0.7));
        // Started again under its id, it continues its totals and counts again.
        fold.rejoin("t1");
        fold.add(report("t1", 30.0, 0.8, 700));
        let progress = fold.progress().expect("trainers reported");
        assert_eq!(progress.samples, 1700);
        assert_eq!(progress.samples_per_second, 130.0);
    }
}
