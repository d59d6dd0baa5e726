//! Request plumbing shared by every handler: JSON bodies with enveloped errors, and request ids.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::response::Response;
use brainstorm_common::ApiError;
use serde::de::DeserializeOwned;
use tower::{Layer, Service};

/// The id of the request being served, as `X-BR-Request-Id` reports it.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-br-request-id");

/// Gives every request an id (kept in its extensions) and echoes it on every response: a layer of
/// its own, where `axum::middleware::from_fn` boxed a clone of the inner service and the future on
/// every request.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIdLayer;

impl<S> Layer<S> for RequestIdLayer {
    type Service = WithRequestId<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WithRequestId { inner }
    }
}

/// A service whose requests get an id (see [`RequestIdLayer`]).
#[derive(Debug, Clone)]
pub struct WithRequestId<S> {
    inner: S,
}

impl<S> Service<Request> for WithRequestId<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = RequestIdFuture<S::Future>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let request_id = brainstorm_common::text::prefixed_uuid("req_", uuid::Uuid::now_v7());
        // The header value is made now, so the id itself moves into the request (no copy).
        let value = HeaderValue::from_str(&request_id).ok();
        request.extensions_mut().insert(RequestId(request_id));
        RequestIdFuture { inner: self.inner.call(request), value }
    }
}

pin_project_lite::pin_project! {
    /// The inner service's answer, with the request id header added.
    pub struct RequestIdFuture<F> {
        #[pin]
        inner: F,
        value: Option<HeaderValue>,
    }
}

impl<F, E> Future for RequestIdFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = std::task::ready!(this.inner.poll(context))?;
        if let Some(value) = this.value.take() {
            response.headers_mut().insert(REQUEST_ID_HEADER, value);
        }
        Poll::Ready(Ok(response))
    }
}

/// A JSON body; any failure to read or parse it is a 400 (or 413) in the error envelope. The
/// content type is not insisted on: many clients omit it.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let JsonBytes(bytes) = JsonBytes::from_request(request, state).await?;
        json(&bytes).map(JsonBody)
    }
}

/// The bytes of a body meant to be JSON, read but not parsed (see `json` for that); failing to
/// read them is a 400 (or 413) in the error envelope.
pub struct JsonBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        Bytes::from_request(request, state).await.map(JsonBytes).map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::payload_too_large("the request body is too large")
            } else {
                ApiError::invalid_request("unreadable_body", format!("the request body could not be read: {rejection}"))
            }
        })
    }
}

/// Parses a required JSON body, with the envelope's errors for an empty or invalid one.
/// A boolean query parameter: absent or `false` is false, `true` true, anything else a 400 naming it.
pub fn query_flag(name: &str, value: Option<&str>) -> Result<bool, ApiError> {
    match value {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(ApiError::invalid_request("invalid_parameter", format!("{name} must be true or false, not `{other}`"))),
    }
}

pub fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid_request("missing_body", "a JSON body is required"));
    }
    serde_json::from_slice(bytes).map_err(|error| {
        let code = if error.is_data() { "invalid_body" } else { "invalid_json" };
        ApiError::invalid_request(code, format!("invalid JSON body: {error}"))
    })
}

/// A JSON body that may be absent or empty (`{}` is assumed).
pub struct OptionalJsonBody<T>(pub T);

impl<S, T> FromRequest<S> for OptionalJsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Default,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state).await.map_err(|rejection| {
            ApiError::invalid_request("unreadable_body", format!("the request body could not be read: {rejection}"))
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(T::default()));
        }
        serde_json::from_slice(&bytes)
            .map(OptionalJsonBody)
            .map_err(|error| ApiError::invalid_request("invalid_body", format!("invalid JSON body: {error}")))
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::extract::Extension;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;

    async fn id_of(router: Router, path: &str) -> (Option<String>, String) {
        let request = Request::builder().uri(path).body(Body::empty()).unwrap_or_default();
        let response = router.oneshot(request).await.unwrap_or_else(|never| match never {});
        let header = response.headers().get(REQUEST_ID_HEADER).and_then(|value| value.to_str().ok()).map(str::to_string);
        let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap_or_default();
        (header, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn every_answer_carries_the_id_its_handler_saw() {
        let router = || {
            Router::new()
                .route("/", get(|Extension(id): Extension<RequestId>| async move { id.0 }))
                .fallback(|| async { "none here" })
                .layer(RequestIdLayer)
        };
        let (header, body) = id_of(router(), "/").await;
        assert!(body.starts_with("req_") && body.len() == 36, "{body}");
        assert_eq!(header.as_deref(), Some(body.as_str()));
        let (other, _) = id_of(router(), "/").await;
        assert_ne!(other, header, "each request has an id of its own");
        let (fallback, body) = id_of(router(), "/missing").await;
        assert_eq!(body, "none here");
        assert!(fallback.is_some_and(|id| id.starts_with("req_")));
    }
}
