//! How resources are shown: tables per kind, YAML or JSON documents, `describe` pages.

use primus_api_client::document;
use primus_proto::v1::Resource;
use primus_spec::Kind;
use primus_spec::dataset::DatasetSpec;
use primus_spec::job::JobSpec;
use primus_spec::metric::MetricSpec;
use primus_spec::status::Status;
use primus_spec::time::unix_ms;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Yaml,
    Json,
}

/// Renders `resources` of `kind`; `single` (a get by name) prints one object, not a list.
pub fn render(
    kind: Kind,
    resources: &[Resource],
    format: Format,
    single: bool,
) -> anyhow::Result<String> {
    match format {
        Format::Table => Ok(table(kind, resources)),
        Format::Json => {
            let documents: Vec<Value> = resources.iter().map(document).collect();
            let value = match (single, documents.as_slice()) {
                (true, [one]) => one.clone(),
                _ => Value::Array(documents),
            };
            Ok(serde_json::to_string_pretty(&value)? + "\n")
        }
        Format::Yaml => {
            let mut text = String::new();
            for (i, resource) in resources.iter().enumerate() {
                if i > 0 {
                    text.push_str("---\n");
                }
                text.push_str(&serde_yaml_ng::to_string(&document(resource))?);
            }
            Ok(text)
        }
    }
}

fn table(kind: Kind, resources: &[Resource]) -> String {
    let now = unix_ms();
    let (header, rows): (&[&str], Vec<Vec<String>>) = match kind {
        Kind::Job => (
            &[
                "NAME",
                "PHASE",
                "MODE",
                "PROGRESS",
                "SAMPLES/S",
                "AUC",
                "VERSION",
                "AGE",
            ],
            resources.iter().map(|r| job_row(r, now)).collect(),
        ),
        Kind::Dataset => (
            &["NAME", "STREAMS", "SOURCES", "ORDER", "VERSION", "AGE"],
            resources.iter().map(|r| dataset_row(r, now)).collect(),
        ),
        Kind::Metric => (
            &["NAME", "JOB", "SERIES", "POINTS", "VERSION", "AGE"],
            resources.iter().map(|r| metric_row(r, now)).collect(),
        ),
    };
    if rows.is_empty() {
        return format!("no {}s\n", kind.as_str().to_lowercase());
    }
    align(header, &rows)
}

fn status_of(resource: &Resource) -> Status {
    serde_json::from_str(&resource.status_json).unwrap_or_default()
}

fn job_row(resource: &Resource, now: i64) -> Vec<String> {
    let spec = serde_json::from_str::<JobSpec>(&resource.spec_json).ok();
    let status = status_of(resource);
    let progress = status.progress.as_ref();
    vec![
        resource.name.clone(),
        format!("{:?}", status.phase),
        spec.map_or("-".into(), |s| {
            serde_json::to_value(s.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        }),
        progress
            .and_then(|p| p.fraction)
            .map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
        progress.map_or("-".into(), |p| format!("{:.0}", p.samples_per_second)),
        progress
            .and_then(|p| p.auc)
            .map_or("-".into(), |a| format!("{a:.4}")),
        resource.resource_version.to_string(),
        age(resource.created_unix_ms, now),
    ]
}

fn dataset_row(resource: &Resource, now: i64) -> Vec<String> {
    let spec = serde_json::from_str::<DatasetSpec>(&resource.spec_json).ok();
    let (streams, sources, order) = spec.map_or(("-".into(), "-".into(), "-".into()), |s| {
        let sources: usize = s.streams.iter().map(|st| st.sources.len()).sum();
        let order = serde_json::to_value(s.order)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        (s.streams.len().to_string(), sources.to_string(), order)
    });
    vec![
        resource.name.clone(),
        streams,
        sources,
        order,
        resource.resource_version.to_string(),
        age(resource.created_unix_ms, now),
    ]
}

fn metric_row(resource: &Resource, now: i64) -> Vec<String> {
    let spec = serde_json::from_str::<MetricSpec>(&resource.spec_json).ok();
    let (job, series, points) = spec.map_or(("-".into(), "-".into(), "-".into()), |s| {
        let points: usize = s.series.iter().map(|x| x.points.len()).sum();
        (s.job, s.series.len().to_string(), points.to_string())
    });
    vec![
        resource.name.clone(),
        job,
        series,
        points,
        resource.resource_version.to_string(),
        age(resource.created_unix_ms, now),
    ]
}

/// Left-aligned columns, two spaces apart.
pub fn align(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.trim_end().to_owned() + "\n"
    };
    let mut text = line(header.to_vec());
    for row in rows {
        text.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    text
}

/// The `describe` page of one resource.
pub fn describe(resource: &Resource) -> anyhow::Result<String> {
    let now = unix_ms();
    let labels: Vec<String> = {
        let mut labels: Vec<_> = resource.labels.iter().collect();
        labels.sort();
        labels.iter().map(|(k, v)| format!("{k}={v}")).collect()
    };
    let status = status_of(resource);
    let mut text = String::new();
    let mut field = |name: &str, value: String| text.push_str(&format!("{name:<13}{value}\n"));
    field("Kind:", resource.kind.clone());
    field("Name:", resource.name.clone());
    field(
        "Labels:",
        if labels.is_empty() {
            "<none>".into()
        } else {
            labels.join(", ")
        },
    );
    field(
        "Version:",
        format!(
            "{} (generation {})",
            resource.resource_version, resource.generation
        ),
    );
    field(
        "Created:",
        format!("{} ago", age(resource.created_unix_ms, now)),
    );
    field(
        "Updated:",
        format!("{} ago", age(resource.updated_unix_ms, now)),
    );
    field(
        "Phase:",
        format!(
            "{:?} (observed generation {})",
            status.phase, status.observed_generation
        ),
    );
    if let Some(p) = &status.progress {
        let mut parts = Vec::new();
        if let Some(f) = p.fraction {
            parts.push(format!("{:.1}%", f * 100.0));
        }
        parts.push(format!("{} samples", p.samples));
        parts.push(format!("{} steps", p.steps));
        parts.push(format!("{:.0} samples/s", p.samples_per_second));
        if let Some(auc) = p.auc {
            parts.push(format!("AUC {auc:.4}"));
        }
        if p.retrained_samples > 0 {
            parts.push(format!(
                "{} samples trained again after rollbacks",
                p.retrained_samples
            ));
        }
        field("Progress:", parts.join(", "));
        if !p.heads.is_empty() {
            let heads: Vec<String> = (p.heads.iter())
                .map(|head| {
                    let score = match (head.auc, head.rmse) {
                        (Some(auc), _) => format!(" AUC {auc:.4}"),
                        (None, Some(rmse)) => format!(" RMSE {rmse:.4}"),
                        (None, None) => String::new(),
                    };
                    format!("{}{score}", head.name)
                })
                .collect();
            field("Heads:", heads.join(", "));
        }
        for source in &p.sources {
            let mut line = format!(
                "{}: {} rows read, {} samples trained",
                source.source, source.rows_read, source.samples
            );
            if source.retrained_samples > 0 {
                line.push_str(&format!(
                    ", {} trained again after rollbacks",
                    source.retrained_samples
                ));
            }
            field("  source", line);
        }
    }
    if let Some(r) = &status.replicas {
        let mut running = format!(
            "{} PS, {} data executors, {} trainers",
            r.ps, r.data_executors, r.trainers
        );
        if r.serving > 0 {
            running.push_str(&format!(", {} serving", r.serving));
        }
        field("Running:", running);
    }
    if !status.executors.is_empty() {
        text.push_str("Executors:\n");
        let rows: Vec<Vec<String>> = (status.executors.iter())
            .map(|e| {
                vec![
                    e.id.clone(),
                    e.address.clone(),
                    format!("{:?}", e.state),
                    age(e.since_unix_ms, now),
                    e.restarts.to_string(),
                    e.last_exit.clone().unwrap_or_default(),
                ]
            })
            .collect();
        let header = ["ID", "ADDRESS", "STATE", "AGE", "RESTARTS", "LAST EXIT"];
        for line in align(&header, &rows).lines() {
            text.push_str(&format!("  {}\n", line.trim_end()));
        }
    }
    if !status.conditions.is_empty() {
        text.push_str("Conditions:\n");
        let rows: Vec<Vec<String>> = status
            .conditions
            .iter()
            .map(|c| {
                vec![
                    c.kind.clone(),
                    c.status.to_string(),
                    c.reason.clone(),
                    age(c.last_transition_unix_ms, now),
                    c.message.clone(),
                ]
            })
            .collect();
        for line in align(&["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], &rows).lines() {
            text.push_str(&format!("  {line}\n"));
        }
    }
    if !status.events.is_empty() {
        text.push_str("Events:\n");
        let rows: Vec<Vec<String>> = status
            .events
            .iter()
            .map(|e| vec![age(e.unix_ms, now), e.reason.clone(), e.message.clone()])
            .collect();
        for line in align(&["AGE", "REASON", "MESSAGE"], &rows).lines() {
            text.push_str(&format!("  {line}\n"));
        }
    }
    text.push_str("Spec:\n");
    let spec: Value = serde_json::from_str(&resource.spec_json)?;
    for line in serde_yaml_ng::to_string(&spec)?.lines() {
        text.push_str(&format!("  {line}\n"));
    }
    Ok(text)
}

/// `42s`, `5m`, `3h`, `2d`.
pub fn age(since_ms: i64, now_ms: i64) -> String {
    if since_ms <= 0 {
        return "-".into();
    }
    let seconds = (now_ms - since_ms).max(0) / 1000;
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let now = 10_000_000_000;
        assert_eq!(age(now - 5_000, now), "5s");
        assert_eq!(age(now - 600_000, now), "10m");
        assert_eq!(age(now - 3 * 3_600_000, now), "3h");
        assert_eq!(age(now - 3 * 86_400_000, now), "3d");
        assert_eq!(age(0, now), "-");
    }

    #[test]
    fn columns_line_up() {
        let text = align(
            &["NAME", "PHASE"],
            &[
                vec!["a".into(), "Running".into()],
                vec!["longer-name".into(), "Pending".into()],
            ],
        );
        assert_eq!(
            text,
            "NAME         PHASE\na            Running\nlonger-name  Pending\n"
        );
    }

    #[test]
    fn a_job_page_shows_what_runs_now_and_its_events() {
        let mut status = Status::default();
        status.replicas = Some(primus_spec::status::Replicas {
            ps: 2,
            data_executors: 3,
            trainers: 1,
            serving: 0,
        });
        let at = unix_ms() - 5_000;
        status.push_event(at, "ScaledOut", "started data_executor-2".into());
        status.executors.push(primus_spec::status::ExecutorStatus {
            id: "trainer-0".into(),
            role: "trainer".into(),
            address: "127.0.0.1:7301".into(),
            state: primus_spec::status::ExecutorState::Running,
            restarts: 2,
            last_exit: Some("signal: 9 (SIGKILL)".into()),
            since_unix_ms: at,
        });
        let resource = Resource {
            kind: "Job".into(),
            name: "ctr".into(),
            spec_json: "{}".into(),
            status_json: serde_json::to_string(&status).expect("status as JSON"),
            ..Resource::default()
        };
        let page = describe(&resource).expect("a page");
        assert!(
            page.contains("Running:     2 PS, 3 data executors, 1 trainers\n"),
            "{page}"
        );
        assert!(page.contains("Events:\n"), "{page}");
        assert!(
            page.lines().any(|l| l.starts_with("  trainer-0")
                && l.contains("Running")
                && l.contains(" 2 ")
                && l.ends_with("signal: 9 (SIGKILL)")),
            "{page}"
        );
        assert!(
            page.lines()
                .any(|l| l.contains("ScaledOut") && l.contains("started data_executor-2")),
            "{page}"
        );
    }
}
