//! W3C trace context across the gRPC hop: an outgoing call carries the current exported span's
//! `traceparent` in its metadata, and the serving side runs the call in a span that continues it.
//! When traces are not exported nothing is added and no span is made.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Adds the current span's trace context to an outgoing call, if that span is exported.
pub fn inject(metadata: &mut MetadataMap) {
    let span = tracing::Span::current();
    if span.is_none() {
        return;
    }
    let context = span.context();
    if context.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&context, &mut MetadataInjector(metadata));
    }
}

/// The span an incoming call runs in (`Service/method`, a child of the caller's span) when the
/// caller sent a trace context; a disabled span otherwise.
pub fn server_span(service: &str, method: &str, metadata: &MetadataMap) -> tracing::Span {
    if metadata.get("traceparent").is_none() {
        return tracing::Span::none();
    }
    let parent = TraceContextPropagator::new().extract(&MetadataExtractor(metadata));
    let span = tracing::info_span!("grpc", otel.name = %format_args!("{service}/{method}"), otel.kind = "server", rpc.system = "grpc", rpc.service = service, rpc.method = method);
    if parent.span().span_context().is_valid() {
        let _ignored = span.set_parent(parent);
    }
    span
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (MetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(value.as_str())) {
            self.0.insert(key, value);
        }
    }
}

struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_trace_nothing_is_sent_and_no_span_is_made() {
        let mut metadata = MetadataMap::new();
        inject(&mut metadata);
        assert!(metadata.is_empty());
        assert!(server_span("IdentityService", "get_tenant", &metadata).is_none());
    }
}
