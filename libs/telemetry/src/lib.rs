//! Logs and traces for every Primus process.
//!
//! [`init`] installs the `tracing` subscriber (env filter; pretty or JSON logs) and, when
//! `telemetry.otlp_endpoint` is set, an OpenTelemetry layer exporting spans over OTLP/gRPC.
//! [`propagation`] carries W3C trace context across process boundaries: into and out of
//! tonic metadata and NATS headers, so one trace follows work from service to service.
//! [`error_chain`] reports an error with its causes on one line, each cause once.

#![warn(missing_docs)]

pub mod propagation;
mod report;

pub use report::error_chain;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use primus_config::{LogFormat, TelemetrySettings};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Why logs or traces could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter does not parse.
    #[error("setting `telemetry.log_filter` = {filter:?} is not a valid filter: {message}")]
    Filter {
        /// The filter.
        filter: String,
        /// What is wrong.
        message: String,
    },
    /// The OTLP exporter cannot be built.
    #[error(
        "setting `telemetry.otlp_endpoint` = {endpoint:?}: cannot build the OTLP exporter: {message}"
    )]
    Exporter {
        /// The endpoint.
        endpoint: String,
        /// Why.
        message: String,
    },
    /// This process installed logging before.
    #[error("a global tracing subscriber is already installed in this process")]
    AlreadyInstalled,
}

/// Keeps the trace pipeline alive; [`Telemetry::shutdown`] flushes spans still buffered.
#[must_use = "dropping the guard without shutdown() may lose the last spans"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported (an OTLP endpoint is configured).
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports every finished span now.
    pub fn flush(&self) {
        if let Some(provider) = &self.provider
            && let Err(e) = provider.force_flush()
        {
            tracing::warn!(error = %e, "flushing spans failed");
        }
    }

    /// Flushes and stops the exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            tracing::warn!(error = %e, "stopping the span exporter failed");
        }
    }
}

/// Installs logging (and trace export when configured) for the process `service`.
///
/// With an OTLP endpoint this must run inside a multi-threaded tokio runtime (the gRPC
/// exporter runs on it). `RUST_LOG`, when set, overrides `telemetry.log_filter`.
#[expect(
    clippy::disallowed_methods,
    reason = "RUST_LOG overrides the log filter, as users of Rust services expect"
)]
pub fn init(service: &str, settings: &TelemetrySettings) -> Result<Telemetry, TelemetryError> {
    let directives = std::env::var("RUST_LOG").unwrap_or_else(|_| settings.log_filter.clone());
    let filter = EnvFilter::try_new(&directives).map_err(|e| TelemetryError::Filter {
        filter: directives.clone(),
        message: e.to_string(),
    })?;
    let logs = match settings.log_format {
        LogFormat::Json => tracing_subscriber::fmt::layer().json().boxed(),
        LogFormat::Pretty => tracing_subscriber::fmt::layer().boxed(),
    };
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let provider = settings
        .otlp_endpoint
        .as_deref()
        .map(|endpoint| tracer_provider(service, endpoint))
        .transpose()?;
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(service.to_owned()))
            .boxed()
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(traces)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(Telemetry { provider })
}

fn tracer_provider(service: &str, endpoint: &str) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| TelemetryError::Exporter {
            endpoint: endpoint.into(),
            message: e.to_string(),
        })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource(service))
        .build())
}

/// The process's resource: its service name and, for a Job's executor, which executor of
/// which Job it is (the environment the master starts executors with), so that a trace
/// backend tells `ps-0`'s spans from `ps-1`'s.
#[expect(
    clippy::disallowed_methods,
    reason = "the master-given identity variables label every span"
)]
fn resource(service: &str) -> Resource {
    let identity = [
        ("PRIMUS_EXECUTOR_ID", "service.instance.id"),
        ("PRIMUS_JOB", "primus.job"),
    ];
    let attributes = identity.into_iter().filter_map(|(variable, key)| {
        let value = std::env::var(variable).ok().filter(|v| !v.is_empty())?;
        Some(opentelemetry::KeyValue::new(key, value))
    });
    Resource::builder()
        .with_service_name(service.to_owned())
        .with_attributes(attributes)
        .build()
}
