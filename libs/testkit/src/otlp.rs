//! An OTLP/gRPC trace receiver on loopback: the processes under test export their spans
//! to it (`telemetry.otlp_endpoint`) and the test reads them back.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// A received span and the `service.name` of the process that sent it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The exporting service's name.
    pub service: String,
    /// The span as received.
    pub span: Span,
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|span| ReceivedSpan {
                    service: service.clone(),
                    span,
                }));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The receiver; it stops with the test's runtime.
pub struct OtlpReceiver {
    endpoint: String,
    collector: Collector,
}

impl OtlpReceiver {
    /// Listens on a free loopback port (inside a tokio runtime).
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let collector = Collector::default();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector.clone()))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Ok(Self {
            endpoint,
            collector,
        })
    }

    /// `http://127.0.0.1:<port>`, for `telemetry.otlp_endpoint`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.collector
            .spans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
