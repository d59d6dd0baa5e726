//! Request plumbing shared by every handler: JSON bodies, path and query parameters with enveloped
//! errors, and request ids.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
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

/// A boolean query parameter: absent or `false` is false, `true` true, anything else a 400 naming it.
pub fn query_flag(name: &str, value: Option<&str>) -> Result<bool, ApiError> {
    match value {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(ApiError::invalid_request("invalid_parameter", format!("{name} must be true or false, not `{other}`"))),
    }
}

/// Parses a required JSON body, with the envelope's errors for an empty or invalid one. Text holding
/// a NUL (U+0000) is refused (400 `invalid_text`): what a management body says is stored, and no
/// store here can hold one in both shapes (PostgreSQL's text refuses it).
pub fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    refuse_nul(bytes)?;
    completion_json(bytes)
}

/// [`json`] for a completion's body, whose prompts may hold any text the provider takes: its
/// identifying members are checked for NULs by the pipeline itself.
pub fn completion_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid_request("missing_body", "a JSON body is required"));
    }
    serde_json::from_slice(bytes).map_err(|error| {
        let code = if error.is_data() { "invalid_body" } else { "invalid_json" };
        ApiError::invalid_request(code, format!("invalid JSON body: {error}"))
    })
}

/// Path parameters (axum's `Path`), whose refusal (text that is not UTF-8 once decoded, a number
/// that does not parse) is a 400 `invalid_path_parameter` in the error envelope, not axum's plain text.
pub struct Path<T>(pub T);

impl<S, T> FromRequestParts<S> for Path<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        refuse_encoded_nul(parts.uri.path(), "invalid_path_parameter", "a path parameter")?;
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            // A route whose handler names parameters its path lacks: ours to fix, not the client's.
            Err(rejection) if rejection.status().is_server_error() => {
                tracing::error!(%rejection, "path parameters do not match the route");
                Err(ApiError::internal())
            }
            Err(rejection) => Err(ApiError::invalid_request("invalid_path_parameter", rejection.body_text())),
        }
    }
}

/// Query parameters (axum's `Query`), whose refusal (a value of the wrong type, a parameter the
/// route does not take) is a 400 `invalid_query_parameter` in the error envelope.
pub struct Query<T>(pub T);

impl<S, T> FromRequestParts<S> for Query<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        refuse_encoded_nul(parts.uri.query().unwrap_or_default(), "invalid_query_parameter", "a query parameter")?;
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(|rejection| ApiError::invalid_request("invalid_query_parameter", rejection.body_text()))
    }
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
        refuse_nul(&bytes)?;
        serde_json::from_slice(&bytes)
            .map(OptionalJsonBody)
            .map_err(|error| ApiError::invalid_request("invalid_body", format!("invalid JSON body: {error}")))
    }
}

/// A 400 `invalid_text` when JSON text holds the escape of a NUL (`\u0000`; JSON has no other way
/// to carry one): an escape is one whose backslash is not itself escaped by the one before it.
fn refuse_nul(bytes: &[u8]) -> Result<(), ApiError> {
    let escapes_a_nul = memchr::memmem::find_iter(bytes, b"\\u0000").any(|at| {
        let backslashes_before = bytes[..at].iter().rev().take_while(|&&byte| byte == b'\\').count();
        backslashes_before % 2 == 0
    });
    if escapes_a_nul {
        return Err(ApiError::invalid_request("invalid_text", "text must not contain the NUL character (U+0000)"));
    }
    Ok(())
}

/// A 400 naming `what` when a URI part holds a percent-encoded NUL (`%00`), which no store can hold.
fn refuse_encoded_nul(part: &str, code: &str, what: &str) -> Result<(), ApiError> {
    if memchr::memmem::find(part.as_bytes(), b"%00").is_some() {
        return Err(ApiError::invalid_request(code, format!("{what} must not contain the NUL character (%00)")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::extract::Extension;
    use axum::routing::get;
    use serde_json::Value;
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

    fn code(result: Result<(), ApiError>) -> Option<String> {
        result.err().and_then(|error| error.body()["error"]["code"].as_str().map(str::to_string))
    }

    #[test]
    fn a_nul_escape_is_refused_and_an_escaped_backslash_before_u0000_is_not_one() {
        assert_eq!(code(refuse_nul(br#"{"name": "a\u0000b"}"#)).as_deref(), Some("invalid_text"));
        assert_eq!(code(refuse_nul(br#"{"name": "\\\u0000"}"#)).as_deref(), Some("invalid_text"), "\\\\ then an escape");
        assert_eq!(code(refuse_nul(br#"{"name": "\\u0000"}"#)), None, "the text \\u0000, no NUL");
        assert_eq!(code(refuse_nul(br#"{"name": "u0000 \u0001"}"#)), None);
        assert_eq!(code(refuse_nul(b"")), None);
        let parsed: Result<Value, _> = json(br#"{"name": "\\u0000"}"#);
        assert_eq!(parsed.ok(), Some(serde_json::json!({"name": "\\u0000"})));
        let completion: Result<Value, _> = completion_json(br#"{"content": "a\u0000b"}"#);
        assert_eq!(completion.ok(), Some(serde_json::json!({"content": "a\u{0}b"})), "a prompt may hold one");
    }

    async fn answer(router: Router, path: &str) -> (u16, Value) {
        let request = Request::builder().uri(path).body(Body::empty()).unwrap_or_default();
        let response = router.oneshot(request).await.unwrap_or_else(|never| match never {});
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap_or_default();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn path_and_query_refusals_come_in_the_envelope() {
        #[derive(serde::Deserialize)]
        struct Page {
            limit: Option<u32>,
        }
        let router = || {
            Router::new()
                .route("/items/{id}", get(|Path(id): Path<String>| async move { id }))
                .route("/count/{n}", get(|Path(n): Path<u32>| async move { n.to_string() }))
                .route("/page", get(|Query(page): Query<Page>| async move { page.limit.unwrap_or_default().to_string() }))
        };
        for (path, code) in [
            ("/items/%FF%FE", "invalid_path_parameter"),
            ("/items/a%00b", "invalid_path_parameter"),
            ("/count/-1", "invalid_path_parameter"),
            ("/page?limit=abc", "invalid_query_parameter"),
            ("/page?limit=1&x=%00", "invalid_query_parameter"),
        ] {
            let (status, body) = answer(router(), path).await;
            assert_eq!((status, body["error"]["code"].as_str()), (400, Some(code)), "{path}: {body}");
            assert!(body["recovery"]["action"].is_string(), "{path}: {body}");
        }
        let request = Request::builder().uri("/items/%C3%A9").body(Body::empty()).unwrap_or_default();
        let response = router().oneshot(request).await.unwrap_or_else(|never| match never {});
        assert_eq!(response.status().as_u16(), 200, "UTF-8 is fine");
    }
}
