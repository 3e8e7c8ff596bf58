//! W3C trace context (`traceparent`, `tracestate`) across gRPC and NATS.
//!
//! Senders call [`inject_grpc`] / [`inject_nats`] (or use [`TraceInterceptor`] on a tonic
//! client); receivers make their span a child of the sender's with [`grpc_server_span`]
//! (for `tonic::transport::Server::trace_fn`) or [`nats_span`]. Data that outlives a call
//! (a minibatch read by a data task and trained on later) carries a [`TraceCarrier`].

use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct HttpHeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HttpHeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct NatsInjector<'a>(&'a mut async_nats::HeaderMap);

impl Injector for NatsInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

struct NatsExtractor<'a>(&'a async_nats::HeaderMap);

impl Extractor for NatsExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_ref()).collect()
    }
}

fn current_context() -> Context {
    tracing::Span::current().context()
}

/// Writes the current span's trace context into outgoing gRPC metadata.
pub fn inject_grpc(metadata: &mut MetadataMap) {
    let cx = current_context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut MetadataInjector(metadata))
    });
}

/// Writes the current span's trace context into outgoing NATS headers.
pub fn inject_nats(headers: &mut async_nats::HeaderMap) {
    let cx = current_context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut NatsInjector(headers))
    });
}

/// W3C trace context as plain strings (`traceparent`, `tracestate`), for messages that
/// carry it in their own fields. Empty when the span it was taken from is not exported.
pub type TraceCarrier = HashMap<String, String>;

/// The current span's trace context as a [`TraceCarrier`].
pub fn current_carrier() -> TraceCarrier {
    let cx = current_context();
    let mut carrier = TraceCarrier::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier
}

/// The current span's W3C `traceparent`, when it is exported.
pub fn current_traceparent() -> Option<String> {
    current_carrier().remove("traceparent")
}

/// Links `span` (OpenTelemetry span links) to the spans of `traceparents`: work that
/// follows from several traces without being a child of any (a sync cycle moving the rows
/// of many pushes). Unreadable ones are skipped.
pub fn add_links(span: &tracing::Span, traceparents: impl IntoIterator<Item = String>) {
    use opentelemetry::trace::TraceContextExt;
    for traceparent in traceparents {
        let carrier: TraceCarrier = [("traceparent".to_owned(), traceparent)].into();
        let context = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
        let linked = context.span().span_context().clone();
        if linked.is_valid() {
            span.add_link(linked);
        }
    }
}

/// Makes `span` a child of the span a [`TraceCarrier`] was taken from (if any).
pub fn set_parent_from_carrier(span: &tracing::Span, carrier: &TraceCarrier) {
    if !carrier.is_empty() {
        set_parent(
            span,
            opentelemetry::global::get_text_map_propagator(|p| p.extract(carrier)),
        );
    }
}

/// The sender's context from incoming NATS headers (empty when there are none).
pub fn extract_nats(headers: Option<&async_nats::HeaderMap>) -> Context {
    match headers {
        Some(h) => opentelemetry::global::get_text_map_propagator(|p| p.extract(&NatsExtractor(h))),
        None => Context::new(),
    }
}

/// The sender's context from incoming HTTP/2 (gRPC) headers.
pub fn extract_http(headers: &http::HeaderMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&HttpHeaderExtractor(headers)))
}

/// Makes `span` a child of `parent` when `parent` carries a remote span.
pub fn set_parent(span: &tracing::Span, parent: Context) {
    use opentelemetry::trace::TraceContextExt;
    if parent.span().span_context().is_valid() {
        // Fails only when the span is disabled, in which case there is nothing to link.
        let _ = span.set_parent(parent);
    }
}

/// A span for one incoming gRPC request, child of the caller's span.
/// Use as `Server::builder().trace_fn(grpc_server_span)`.
pub fn grpc_server_span<B>(request: &http::Request<B>) -> tracing::Span {
    let span = tracing::info_span!(
        "grpc.server",
        otel.name = %request.uri().path(),
        rpc.system = "grpc",
        otel.kind = "server",
    );
    set_parent(&span, extract_http(request.headers()));
    span
}

/// A span for handling one NATS message, child of the publisher's span.
pub fn nats_span(subject: &str, headers: Option<&async_nats::HeaderMap>) -> tracing::Span {
    let span = tracing::info_span!(
        "nats.receive",
        otel.name = %format!("receive {subject}"),
        messaging.system = "nats",
        messaging.destination = %subject,
        otel.kind = "consumer",
    );
    set_parent(&span, extract_nats(headers));
    span
}

/// A tonic client interceptor that sends the current trace context with every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceInterceptor;

impl tonic::service::Interceptor for TraceInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        inject_grpc(request.metadata_mut());
        Ok(request)
    }
}
