//! The web dashboard on `server.http_addr`: its pages, compiled into the binary
//! ([`assets`]), and the JSON they read from this server's resources or Kubernetes'
//! ([`source`], `dashboard.resources`), behind the gRPC API's bearer tokens and bounded
//! by their labels as the gRPC API is:
//! - `GET /api/v1/<Kind>[?labels=k=v,...]`: `{"resource_version": n, "items": [...]}`;
//! - `GET /api/v1/<Kind>/<name>`: one resource;
//! - `GET /api/v1/watch?kind=&name=&since=`: the Watch as server-sent events, one per
//!   change (`id` its version, `event` added, modified, appended or deleted, `data` the
//!   resource); a Watch that ends with an error sends an `error` event, and one that
//!   cannot start answers like any failed call (`since` gone: 400, OUT_OF_RANGE);
//! - `GET /api/v1/traces/<job>`: a step of the Job, the sync that moved its push and the
//!   Predicts that used it, read from Jaeger ([`traces`]; 412, FAILED_PRECONDITION, when
//!   no `traces.jaeger_query_url` is set; 503 when Jaeger does not answer).
//!
//! A resource is the document `primus get -o json` prints ([`primus_api_client::document`]):
//! `{kind, metadata, spec, status}`. The pages hold no data: they ask for a token and keep
//! it in the browser tab's `sessionStorage`.

mod assets;
mod source;
mod traces;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::{Stream, StreamExt};
use primus_api_client::document;
use primus_proto::v1::{EventType, ResourceEvent, WatchRequest};
use primus_service::http::{authorization, error_reply, json_reply};
use primus_service::{BearerTokens, Shutdown};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tonic::Status;

pub(crate) use source::Source;

struct Dashboard {
    source: Source,
    tokens: BearerTokens,
    jaeger: Option<traces::Jaeger>,
}

/// Serves the dashboard on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: TcpListener,
    source: Source,
    tokens: BearerTokens,
    jaeger_query_url: Option<String>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let jaeger = jaeger_query_url.as_deref().map(traces::Jaeger::new);
    let router = Router::new()
        .route("/", get(assets::index))
        .route("/assets/{file}", get(assets::file))
        .route("/api/v1/watch", get(watch))
        .route("/api/v1/traces/{job}", get(job_traces))
        .route("/api/v1/{kind}", get(list))
        .route("/api/v1/{kind}/{name}", get(get_one))
        .with_state(Arc::new(Dashboard {
            source,
            tokens,
            jaeger,
        }));
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.wait().await })
        .await?;
    Ok(())
}

#[derive(Deserialize)]
struct ListQuery {
    /// `key=value` pairs, comma-separated: every one must match.
    #[serde(default)]
    labels: String,
}

async fn list(
    State(dashboard): State<Arc<Dashboard>>,
    headers: HeaderMap,
    Path(kind): Path<String>,
    Query(query): Query<ListQuery>,
) -> Response {
    let listed = async {
        let grant = dashboard.tokens.check_header(authorization(&headers))?;
        let labels = label_selector(&query.labels)?;
        dashboard.source.list(kind, labels, &grant).await
    };
    match listed.await {
        Ok((version, resources)) => {
            let items: Vec<Value> = resources.iter().map(document).collect();
            let body = json!({"resource_version": version, "items": items});
            json_reply(StatusCode::OK, body.to_string())
        }
        Err(error) => error_reply(&error),
    }
}

async fn get_one(
    State(dashboard): State<Arc<Dashboard>>,
    headers: HeaderMap,
    Path((kind, name)): Path<(String, String)>,
) -> Response {
    let found = async {
        let grant = dashboard.tokens.check_header(authorization(&headers))?;
        dashboard.source.get(kind, name, &grant).await
    };
    match found.await {
        Ok(resource) => json_reply(StatusCode::OK, document(&resource).to_string()),
        Err(error) => error_reply(&error),
    }
}

async fn job_traces(
    State(dashboard): State<Arc<Dashboard>>,
    headers: HeaderMap,
    Path(job): Path<String>,
) -> Response {
    let found = async {
        let grant = dashboard.tokens.check_header(authorization(&headers))?;
        let jaeger = dashboard.jaeger.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "this API server reads no traces: set traces.jaeger_query_url (Jaeger's query service, http://jaeger:16686)",
            )
        })?;
        let resource = dashboard.source.get("Job".into(), job.clone(), &grant);
        let resource = resource.await?;
        jaeger.step_path(&job, resource.created_unix_ms).await
    };
    match found.await {
        Ok(path) => match serde_json::to_string(&path) {
            Ok(body) => json_reply(StatusCode::OK, body),
            Err(e) => error_reply(&Status::internal(e.to_string())),
        },
        Err(error) => error_reply(&error),
    }
}

#[derive(Deserialize)]
struct WatchQuery {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
    /// 0 (or absent): from now.
    #[serde(default)]
    since: u64,
}

async fn watch(
    State(dashboard): State<Arc<Dashboard>>,
    headers: HeaderMap,
    Query(query): Query<WatchQuery>,
) -> Response {
    let opened = async {
        let grant = dashboard.tokens.check_header(authorization(&headers))?;
        let request = WatchRequest {
            kind: query.kind,
            name: query.name,
            since_version: query.since,
        };
        dashboard.source.watch(request, &grant).await
    };
    match opened.await {
        Ok(events) => Sse::new(server_events(events))
            .keep_alive(KeepAlive::default())
            .into_response(),
        Err(error) => error_reply(&error),
    }
}

/// Each change as a server-sent event; a failed Watch as a last `error` event.
fn server_events(
    events: impl Stream<Item = Result<ResourceEvent, Status>> + Send + 'static,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    events
        .scan(false, |failed, next| {
            let event = match (*failed, next) {
                (true, _) => None,
                (false, Ok(change)) => Some(change_event(&change)),
                (false, Err(error)) => {
                    *failed = true;
                    let body =
                        json!({"code": format!("{:?}", error.code()), "error": error.message()});
                    Some(Event::default().event("error").data(body.to_string()))
                }
            };
            std::future::ready(event)
        })
        .map(Ok)
}

fn change_event(change: &ResourceEvent) -> Event {
    let kind = match EventType::try_from(change.r#type) {
        Ok(EventType::Added) => "added",
        Ok(EventType::Appended) => "appended",
        Ok(EventType::Deleted) => "deleted",
        _ => "modified",
    };
    let resource = change.resource.clone().unwrap_or_default();
    Event::default()
        .id(resource.resource_version.to_string())
        .event(kind)
        .data(document(&resource).to_string())
}

/// `key=value,key=value` as a label selector; a pair without `=` is refused by name.
fn label_selector(text: &str) -> Result<HashMap<String, String>, Status> {
    (text.split(',').filter(|pair| !pair.trim().is_empty()))
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok((key.trim().to_owned(), value.trim().to_owned()))
            }
            _ => Err(Status::invalid_argument(format!(
                "labels: {pair:?} is not key=value"
            ))),
        })
        .collect()
}
