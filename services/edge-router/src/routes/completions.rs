//! `POST /v1/chat/completions`, `POST /v1/messages` and `GET /v1/models`.
//!
//! While a tenant has no provider key, every completion is answered by the synthetic
//! `brainstorm/sandbox` model, in the caller's own format, streaming or not.

use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::Extension;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::extract::{JsonBody, RequestId};
use crate::sandbox::{self, ChatReply, ChatRequest, SANDBOX_MODEL};

/// The client format a request arrived in, and must be answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    OpenAi,
    Anthropic,
}

/// `POST /v1/chat/completions` (router.write).
pub async fn chat_completions(
    caller: Caller,
    Extension(request_id): Extension<RequestId>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    caller.require("router.write")?;
    let request = sandbox::parse_openai(&body)?;
    complete(&caller, &request_id, request, Format::OpenAi)
}

/// `POST /v1/messages` (router.write).
pub async fn messages(
    caller: Caller,
    Extension(request_id): Extension<RequestId>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    caller.require("router.write")?;
    let request = sandbox::parse_anthropic(&body)?;
    complete(&caller, &request_id, request, Format::Anthropic)
}

fn complete(caller: &Caller, request_id: &RequestId, request: ChatRequest, format: Format) -> Result<Response, ApiError> {
    let started = Instant::now();
    if !caller.may_use_model(&request.model) {
        return Err(ApiError::forbidden("model_not_allowed", format!("this key may not use model `{}`", request.model)));
    }
    let suffix = request_id.0.trim_start_matches("req_");
    let reply_id = match format {
        Format::OpenAi => format!("chatcmpl-{suffix}"),
        Format::Anthropic => format!("msg_{suffix}"),
    };
    let reply = sandbox::sandbox_reply(&request, reply_id);
    let mut headers = routing_headers(&request);
    let strategy = request.strategy.as_deref().unwrap_or("price");
    insert_header(&mut headers, "x-br-total-latency-ms", &format!("{:.3}", started.elapsed().as_secs_f64() * 1000.0));
    if request.stream {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        let frames = match format {
            Format::OpenAi => sandbox::openai_stream(&reply, request.stream_usage),
            Format::Anthropic => sandbox::anthropic_stream(&reply),
        };
        let body = Body::from_stream(futures::stream::iter(frames.into_iter().map(|frame| Ok::<_, Infallible>(Bytes::from(frame)))));
        return Ok((headers, body).into_response());
    }
    let body = render(&reply, format, strategy);
    Ok((headers, Json(body)).into_response())
}

fn render(reply: &ChatReply, format: Format, strategy: &str) -> Value {
    match format {
        Format::OpenAi => sandbox::openai_completion(reply, "0.000000", strategy),
        Format::Anthropic => sandbox::anthropic_message(reply),
    }
}

/// Headers that say how the request was routed; the sandbox costs nothing.
fn routing_headers(request: &ChatRequest) -> HeaderMap {
    let mut headers = HeaderMap::new();
    insert_header(&mut headers, "x-br-routed-model", SANDBOX_MODEL);
    insert_header(&mut headers, "x-br-resolved-model", SANDBOX_MODEL);
    insert_header(&mut headers, "x-br-selection-method", "sandbox");
    insert_header(&mut headers, "x-br-route-reason", "no provider key registered: served by the sandbox model");
    if request.model != "auto" {
        insert_header(&mut headers, "x-br-estimated-cost", "0.000000");
    }
    insert_header(&mut headers, "x-br-actual-cost", "0.000000");
    headers
}

fn insert_header(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

/// `GET /v1/models` (router.read): the models this key can run; the sandbox model while no provider
/// key is registered.
pub async fn list_models(caller: Caller) -> Result<Json<Value>, ApiError> {
    caller.require("router.read")?;
    let models: Vec<Value> = [SANDBOX_MODEL]
        .into_iter()
        .filter(|model| caller.may_use_model(model))
        .map(|model| json!({"id": model, "object": "model", "created": 1_767_225_600, "owned_by": "brainstorm"}))
        .collect();
    Ok(Json(json!({"object": "list", "data": models})))
}
