//! One span per request when trace export is on (`OTEL_EXPORTER_OTLP_ENDPOINT`): named by method and
//! route, a child of the caller's `traceparent`, carrying the request id and the answer's status.
//! The completion pipeline's audit record and `traceparent` answer header then name this span, so
//! a trace in the collector and the evidence in the chain point at each other.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::extract::RequestId;

/// The middleware: wraps the rest of the request in its span (added only when traces are exported,
/// so the hot path pays nothing otherwise).
pub async fn trace_request(request: Request, next: Next) -> Response {
    let route =
        request.extensions().get::<MatchedPath>().map_or_else(|| request.uri().path().to_string(), |path| path.as_str().to_string());
    let request_id = request.extensions().get::<RequestId>().map(|id| id.0.clone()).unwrap_or_default();
    let method = request.method().clone();
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        url.path = %request.uri().path(),
        br.request_id = %request_id,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    brainstorm_common::telemetry::continue_trace(&span, request.headers());
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}
