//! W3C trace context across the gRPC hop: an outgoing call carries the current exported span's
//! `traceparent` in its metadata, and the serving side runs the call in a span that continues it.
//! When traces are not exported nothing is added and no span is made.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C fields a trace context travels in.
const FIELDS: [&str; 2] = ["traceparent", "tracestate"];

/// The caller's trace context, read by `lookup` (a header or metadata map's getter by name); valid
/// only when the caller sent a well-formed `traceparent`.
pub fn remote_context<'a>(lookup: impl Fn(&str) -> Option<&'a str>) -> Context {
    TraceContextPropagator::new().extract(&Fields(lookup, std::marker::PhantomData))
}

/// The current span's context when that span is exported (trace export on and a span entered).
pub fn exported_context() -> Option<Context> {
    let span = tracing::Span::current();
    if span.is_none() {
        return None;
    }
    let context = span.context();
    let valid = context.span().span_context().is_valid();
    valid.then_some(context)
}

/// Makes `span` a child of `parent` when `parent` carries a valid remote span.
pub fn continue_from(span: &tracing::Span, parent: Context) {
    if parent.span().span_context().is_valid() {
        let _ignored = span.set_parent(parent);
    }
}

/// Adds the current span's trace context to an outgoing call, if that span is exported.
pub fn inject(metadata: &mut MetadataMap) {
    if let Some(context) = exported_context() {
        TraceContextPropagator::new().inject_context(&context, &mut MetadataInjector(metadata));
    }
}

/// The span an incoming call runs in (`Service/method`, a child of the caller's span) when the
/// caller sent a trace context; a disabled span otherwise.
pub fn server_span(service: &str, method: &str, metadata: &MetadataMap) -> tracing::Span {
    if metadata.get("traceparent").is_none() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!("grpc", otel.name = %format_args!("{service}/{method}"), otel.kind = "server", rpc.system = "grpc", rpc.service = service, rpc.method = method);
    continue_from(&span, remote_context(|key| metadata.get(key).and_then(|value| value.to_str().ok())));
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

/// The W3C fields of any map, through its getter (whose answers outlive the extractor).
struct Fields<'a, F>(F, std::marker::PhantomData<&'a str>);

impl<'a, F: Fn(&str) -> Option<&'a str>> Extractor for Fields<'a, F> {
    fn get(&self, key: &str) -> Option<&str> {
        (self.0)(key)
    }

    fn keys(&self) -> Vec<&str> {
        FIELDS.to_vec()
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
