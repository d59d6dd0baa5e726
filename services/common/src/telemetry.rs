//! Logging and trace export for the binary: structured `tracing` output (text or JSON) and, when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, the process's spans exported over OTLP/gRPC.

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Why trace export could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to OTEL_EXPORTER_OTLP_ENDPOINT: {0}")]
pub struct TelemetryError(String);

/// The installed trace export; `shutdown` flushes the spans still buffered.
#[derive(Debug)]
pub struct TraceExport {
    provider: SdkTracerProvider,
}

impl TraceExport {
    /// Sends what is buffered and stops the exporter (blocking: call it off the async workers).
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "trace export did not flush cleanly");
        }
    }
}

/// Installs the global subscriber; `RUST_LOG` overrides `default_filter`. With `otlp_endpoint`, the
/// spans are also exported over OTLP/gRPC as service `service_name` (`OTEL_SERVICE_NAME` wins), in
/// batches (`OTEL_BSP_*` tune them). Call it inside the tokio runtime: the exporter's channel lives
/// there. Later calls install nothing.
pub fn init(
    format: LogFormat,
    default_filter: &str,
    otlp_endpoint: Option<&str>,
    service_name: &str,
) -> Result<Option<TraceExport>, TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let export = match otlp_endpoint {
        Some(endpoint) => Some(trace_provider(endpoint, service_name)?),
        None => None,
    };
    let otel_layer = export.as_ref().map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("brainstorm")));
    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    let _already_installed = match format {
        LogFormat::Text => registry.with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr)).try_init(),
        LogFormat::Json => registry.with(tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr)).try_init(),
    };
    Ok(export.map(|provider| TraceExport { provider }))
}

fn trace_provider(endpoint: &str, service_name: &str) -> Result<SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|error| TelemetryError(error.to_string()))?;
    let resource = match std::env::var("OTEL_SERVICE_NAME") {
        Ok(name) if !name.trim().is_empty() => opentelemetry_sdk::Resource::builder().build(),
        _ => opentelemetry_sdk::Resource::builder().with_service_name(service_name.to_string()).build(),
    };
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// The W3C trace context of a request's headers (`traceparent`, `tracestate`), to parent its span.
pub fn remote_context(headers: &http::HeaderMap) -> opentelemetry::Context {
    brainstorm_proto::trace::remote_context(|key| headers.get(key).and_then(|value| value.to_str().ok()))
}

/// Makes `span` a child of the request's remote trace context, if it carries a valid one.
pub fn continue_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    brainstorm_proto::trace::continue_from(span, remote_context(headers));
}

/// The trace id and span id (lowercase hex) of the current span when it is exported; None when
/// trace export is off (the edge then makes its own ids for the audit record).
pub fn current_span_ids() -> Option<(String, String)> {
    let context = brainstorm_proto::trace::exported_context()?;
    let span = context.span();
    let ids = span.span_context();
    Some((ids.trace_id().to_string(), ids.span_id().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_becomes_the_remote_parent() {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", http::HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
        let context = remote_context(&headers);
        let span = context.span();
        let parent = span.span_context();
        assert!(parent.is_valid() && parent.is_remote());
        assert_eq!(parent.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(parent.span_id().to_string(), "b7ad6b7169203331");
        headers.insert("traceparent", http::HeaderValue::from_static("00-zz-b7ad6b7169203331-01"));
        assert!(!remote_context(&headers).span().span_context().is_valid());
    }

    #[test]
    fn without_export_there_are_no_span_ids() {
        let span = tracing::info_span!("request");
        let _entered = span.enter();
        assert_eq!(current_span_ids(), None);
    }
}
