//! A Job's traces for the dashboard, read from Jaeger's query API (`traces.jaeger_query_url`):
//! `GET /api/v1/traces/<job>` answers one path through the system, as span rows ready to
//! draw as waterfalls:
//! - `step`: a `trainer.step` of the Job and everything under it (its lookups and PS calls,
//!   its push and the PS's `ps.push_tables` on every shard);
//! - `sync`: the `serving_sync.sparse` cycle whose span links name that push, with its
//!   `ExportDelta` and `ApplyDelta` calls;
//! - `predicts`: the first Predicts (`serving.predict`) after that cycle whose replica held
//!   the pushed shard at the push's version or later.
//!
//! The step is the newest one whose push a serving-sync cycle moved; a Job without serving
//! gets its newest step alone. Jaeger's JSON is read here into [`SpanRow`]s; how the path
//! is chosen is plain code over them.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::Uri;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::Value;
use tonic::Status;

/// Cycles looked at for one whose push is still in Jaeger.
const CYCLES: usize = 200;
/// Links of the newest cycles tried before giving up on a sync.
const LINKS_TRIED: usize = 5;
/// Predicts shown.
const PREDICTS: usize = 3;
const QUERY_TIMEOUT: Duration = Duration::from_secs(20);

/// One span as the page draws it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SpanRow {
    pub trace_id: String,
    pub span_id: String,
    pub parent_id: Option<String>,
    /// Levels below the first row of its group.
    pub depth: usize,
    /// The process's `service.name`.
    pub service: String,
    /// The process's `service.instance.id` (the executor: `ps-0`, `serving-0`), if any.
    pub instance: String,
    pub operation: String,
    pub start_us: u64,
    pub duration_us: u64,
    /// The span's attributes.
    pub attributes: BTreeMap<String, Value>,
    /// The process's `primus.job`, if any.
    #[serde(skip)]
    pub job: String,
    /// Spans this one links to: (trace id, span id).
    #[serde(skip)]
    pub links: Vec<(String, String)>,
}

/// The path the page draws.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct StepPath {
    pub job: String,
    pub step: Vec<SpanRow>,
    /// The shard and version of the push that `sync` moved (None: no cycle moved it).
    pub push: Option<PushedAt>,
    pub sync: Vec<SpanRow>,
    pub predicts: Vec<Vec<SpanRow>>,
}

/// A push as serving sees it: the training shard and its version once the push applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct PushedAt {
    pub shard: String,
    pub version: u64,
}

/// Jaeger's query API over plain HTTP.
pub(crate) struct Jaeger {
    base: String,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Jaeger {
    pub(super) fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// GET `/api/...`; the answer's `data`. Jaeger away or wrong: UNAVAILABLE naming it.
    async fn get(&self, path_and_query: &str) -> Result<Value, Status> {
        let url = format!("{}{path_and_query}", self.base);
        let failed = |what: String| {
            Status::unavailable(format!(
                "Jaeger's query API (traces.jaeger_query_url) at {url}: {what}"
            ))
        };
        let uri: Uri = url.parse().map_err(|e| failed(format!("{e}")))?;
        let response = tokio::time::timeout(QUERY_TIMEOUT, self.client.get(uri))
            .await
            .map_err(|_| failed(format!("no answer within {QUERY_TIMEOUT:?}")))?
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let body = (response.into_body().collect().await)
            .map_err(|e| failed(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return Err(failed(format!("HTTP {status}: {}", text.trim())));
        }
        let answer: Value =
            serde_json::from_slice(&body).map_err(|e| failed(format!("not JSON: {e}")))?;
        Ok(answer["data"].clone())
    }

    /// Spans of `operation` of `service` between `start_us` and `end_us`, newest traces
    /// first, with every span of their traces.
    async fn search(
        &self,
        service: &str,
        operation: &str,
        (start_us, end_us): (u64, u64),
        limit: usize,
    ) -> Result<Vec<Vec<SpanRow>>, Status> {
        let query = format!(
            "/api/traces?service={}&operation={}&start={start_us}&end={end_us}&limit={limit}",
            encode(service),
            encode(operation)
        );
        Ok(traces(&self.get(&query).await?))
    }

    async fn trace(&self, trace_id: &str) -> Result<Vec<SpanRow>, Status> {
        let data = self
            .get(&format!("/api/traces/{}", encode(trace_id)))
            .await?;
        Ok(traces(&data).into_iter().next().unwrap_or_default())
    }

    /// The path of Job `job`, created at `created_unix_ms`; NOT_FOUND when Jaeger holds no
    /// step of it.
    pub(super) async fn step_path(
        &self,
        job: &str,
        created_unix_ms: i64,
    ) -> Result<StepPath, Status> {
        let window = (
            u64::try_from(created_unix_ms).unwrap_or(0) * 1000,
            primus_spec::time::unix_us() + 60_000_000,
        );
        let cycles = self
            .search("primus-serving-sync", "serving_sync.sparse", window, CYCLES)
            .await?;
        for (cycle, (trace_id, span_id)) in linked_pushes(&cycles, job).take(LINKS_TRIED) {
            let trace = self.trace(&trace_id).await?;
            let Some((step, push)) = step_of_push(&trace, &span_id) else {
                continue;
            };
            let after = cycle.first().map_or(0, |c| c.start_us);
            let predicts = self
                .search("primus-ps", "serving.predict", (after, window.1), 100)
                .await?;
            return Ok(StepPath {
                job: job.to_owned(),
                predicts: predicts_using(&predicts, job, &push, after),
                step,
                push: Some(push),
                sync: cycle,
            });
        }
        let steps = self
            .search("primus-trainer", "trainer.step", window, 50)
            .await?;
        let step = newest_step(&steps, job).ok_or_else(|| {
            Status::not_found(format!(
                "Jaeger holds no trainer.step of Job {job} (its trainers export spans when telemetry.otlp_endpoint is set)"
            ))
        })?;
        Ok(StepPath {
            job: job.to_owned(),
            step,
            push: None,
            sync: Vec::new(),
            predicts: Vec::new(),
        })
    }
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Jaeger's `data` (a list of traces) as rows, one list per trace, in its order.
pub(crate) fn traces(data: &Value) -> Vec<Vec<SpanRow>> {
    (data.as_array().into_iter().flatten())
        .map(|trace| {
            let processes = &trace["processes"];
            (trace["spans"].as_array().into_iter().flatten())
                .map(|span| row(span, &processes[span["processID"].as_str().unwrap_or("")]))
                .collect()
        })
        .collect()
}

fn row(span: &Value, process: &Value) -> SpanRow {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    let references = span["references"].as_array().into_iter().flatten();
    let of_type = |kind: &'static str| {
        references
            .clone()
            .filter(move |r| r["refType"] == kind)
            .map(|r| (text(&r["traceID"]), text(&r["spanID"])))
    };
    let trace_id = text(&span["traceID"]);
    let parent_id = of_type("CHILD_OF")
        .find(|(trace, _)| *trace == trace_id)
        .map(|(_, span)| span);
    let process_tag = |key: &str| {
        (process["tags"].as_array().into_iter().flatten())
            .find(|t| t["key"] == key)
            .map(|t| text(&t["value"]))
            .unwrap_or_default()
    };
    SpanRow {
        span_id: text(&span["spanID"]),
        parent_id,
        depth: 0,
        service: text(&process["serviceName"]),
        instance: process_tag("service.instance.id"),
        operation: text(&span["operationName"]),
        start_us: span["startTime"].as_u64().unwrap_or(0),
        duration_us: span["duration"].as_u64().unwrap_or(0),
        attributes: (span["tags"].as_array().into_iter().flatten())
            .filter_map(|t| Some((t["key"].as_str()?.to_owned(), t["value"].clone())))
            .collect(),
        job: process_tag("primus.job"),
        links: of_type("FOLLOWS_FROM").collect(),
        trace_id,
    }
}

/// `root` and every span under it, each after its parent and siblings in start order,
/// with depths from `root`.
pub(crate) fn subtree(spans: &[SpanRow], root: &SpanRow) -> Vec<SpanRow> {
    let mut children: HashMap<&str, Vec<&SpanRow>> = HashMap::new();
    for span in spans {
        if let Some(parent) = &span.parent_id {
            children.entry(parent.as_str()).or_default().push(span);
        }
    }
    for list in children.values_mut() {
        list.sort_by_key(|s| (s.start_us, s.span_id.clone()));
    }
    let mut out = Vec::new();
    let mut stack = vec![(root, 0)];
    while let Some((span, depth)) = stack.pop() {
        out.push(SpanRow {
            depth,
            ..span.clone()
        });
        if let Some(list) = children.get(span.span_id.as_str()) {
            stack.extend(list.iter().rev().map(|child| (*child, depth + 1)));
        }
    }
    out
}

/// The sparse cycles of Job `job` that applied a delta to a replica, newest first, each
/// with each push span it links to: (the cycle's spans, (trace id, span id) of the push).
pub(crate) fn linked_pushes<'a>(
    traces: &'a [Vec<SpanRow>],
    job: &'a str,
) -> impl Iterator<Item = (Vec<SpanRow>, (String, String))> + 'a {
    let mut cycles: Vec<(&Vec<SpanRow>, &SpanRow)> = (traces.iter())
        .filter_map(|spans| {
            let cycle = spans.iter().find(|s| {
                s.operation == "serving_sync.sparse"
                    && s.attributes.get("primus.job").and_then(Value::as_str) == Some(job)
            })?;
            let applied = spans
                .iter()
                .any(|s| s.operation.ends_with("ServingService/ApplyDelta"));
            (applied && !cycle.links.is_empty()).then_some((spans, cycle))
        })
        .collect();
    cycles.sort_by_key(|(_, cycle)| std::cmp::Reverse(cycle.start_us));
    cycles.into_iter().flat_map(|(spans, cycle)| {
        let tree = subtree(spans, cycle);
        cycle
            .links
            .iter()
            .map(move |link| (tree.clone(), link.clone()))
    })
}

/// The `trainer.step` above push span `push_span_id` of `trace`, with its spans, and where
/// the push left its shard; None when the span is not a push of a step in this trace.
pub(crate) fn step_of_push(
    trace: &[SpanRow],
    push_span_id: &str,
) -> Option<(Vec<SpanRow>, PushedAt)> {
    let by_id: HashMap<&str, &SpanRow> = trace.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let push = by_id.get(push_span_id)?;
    if push.operation != "ps.push_tables" {
        return None;
    }
    let pushed = PushedAt {
        shard: push.instance.clone(),
        version: push.attributes.get("primus.version").and_then(number)?,
    };
    let step = std::iter::successors(Some(*push), |s| by_id.get(s.parent_id.as_deref()?).copied())
        .find(|s| s.operation == "trainer.step")?;
    Some((subtree(trace, step), pushed))
}

/// An attribute's number: tracers send a u64 beyond i64 as a string, and some as text anyway.
fn number(value: &Value) -> Option<u64> {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|text| text.parse().ok()))
}

/// The Predicts of Job `job` that started after `after_us` on a replica holding `push`'s
/// shard at its version or later, earliest first, at most [`PREDICTS`], each with its spans.
pub(crate) fn predicts_using(
    traces: &[Vec<SpanRow>],
    job: &str,
    push: &PushedAt,
    after_us: u64,
) -> Vec<Vec<SpanRow>> {
    let mut found: Vec<Vec<SpanRow>> = (traces.iter())
        .flat_map(|spans| {
            (spans.iter())
                .filter(|s| {
                    s.operation == "serving.predict"
                        && s.job == job
                        && s.start_us > after_us
                        && holds(s, push)
                })
                .map(|s| subtree(spans, s))
        })
        .collect();
    found.sort_by_key(|spans| spans.first().map_or(0, |s| s.start_us));
    found.truncate(PREDICTS);
    found
}

/// Whether Predict span `predict`'s replica held `push`'s shard at its version or later
/// (`primus.applied` is `<shard>=<version>` pairs).
fn holds(predict: &SpanRow, push: &PushedAt) -> bool {
    let applied = predict
        .attributes
        .get("primus.applied")
        .and_then(Value::as_str);
    (applied.unwrap_or_default().split_whitespace())
        .filter_map(|pair| pair.split_once('='))
        .any(|(shard, version)| {
            shard == push.shard && version.parse::<u64>().is_ok_and(|v| v >= push.version)
        })
}

/// The newest `trainer.step` of Job `job`, with its spans.
pub(crate) fn newest_step(traces: &[Vec<SpanRow>], job: &str) -> Option<Vec<SpanRow>> {
    (traces.iter())
        .flat_map(|spans| spans.iter().map(move |s| (spans, s)))
        .filter(|(_, s)| s.operation == "trainer.step" && s.job == job)
        .max_by_key(|(_, s)| s.start_us)
        .map(|(spans, step)| subtree(spans, step))
}

#[cfg(test)]
mod tests;
