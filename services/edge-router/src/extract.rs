//! Request plumbing shared by every handler: JSON bodies with enveloped errors, and request ids.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use brainstorm_common::ApiError;
use serde::de::DeserializeOwned;

/// The id of the request being served, as `X-BR-Request-Id` reports it.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-br-request-id");

/// Gives every request an id (kept in its extensions) and echoes it on every response.
pub async fn assign_request_id(mut request: Request, next: Next) -> Response {
    let request_id = format!("req_{}", uuid::Uuid::now_v7().simple());
    // The header value is made now, so the id itself moves into the request (no copy).
    let value = HeaderValue::from_str(&request_id).ok();
    request.extensions_mut().insert(RequestId(request_id));
    let mut response = next.run(request).await;
    if let Some(value) = value {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
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
