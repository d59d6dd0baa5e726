//! Request dispatch: which API a request speaks, injected failures, authentication, and the control endpoints.

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::response::Response;
use http::{HeaderMap, Method, StatusCode};
use serde_json::json;

use crate::anthropic::{self, MessagesRequest};
use crate::conversation::Provider;
use crate::gemini::{self, BatchEmbedRequest, GeminiQuery, GenerateRequest};
use crate::journal::{FailSpec, Incoming, Shared};
use crate::openai::{self, ChatRequest, EmbeddingsRequest};
use crate::respond::{self, CONTENT_TYPE_JSON, CONTENT_TYPE_SSE, CONTENT_TYPE_TEXT};

/// Request bodies above this are refused (413); large enough for any benchmark prompt.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
const CONTROL_PREFIX: &str = "/__mock/";

#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    OpenAiChat,
    OpenAiEmbeddings,
    AnthropicMessages,
    AnthropicCountTokens,
    /// `GET /v1/models`, OpenAI's or Anthropic's by the headers.
    Models(Provider),
    Model(Provider, &'a str),
    GeminiModels,
    GeminiModel(&'a str),
    GeminiGenerate {
        model: &'a str,
        stream: bool,
    },
    GeminiCountTokens,
    GeminiBatchEmbed(&'a str),
    NotFound(Provider),
    MethodNotAllowed(Provider),
}

impl<'a> Route<'a> {
    fn of(method: &Method, path: &'a str, headers: &HeaderMap) -> Route<'a> {
        // Anthropic clients send `anthropic-version` (and usually `x-api-key`); OpenAI clients send neither.
        let v1_provider =
            if anthropic::has_version(headers) || headers.contains_key("x-api-key") { Provider::Anthropic } else { Provider::OpenAi };
        let only = |expected: Method, provider: Provider, route: Route<'a>| {
            if *method == expected { route } else { Route::MethodNotAllowed(provider) }
        };
        match path {
            "/v1/chat/completions" => only(Method::POST, Provider::OpenAi, Route::OpenAiChat),
            "/v1/embeddings" => only(Method::POST, Provider::OpenAi, Route::OpenAiEmbeddings),
            "/v1/messages" => only(Method::POST, Provider::Anthropic, Route::AnthropicMessages),
            "/v1/messages/count_tokens" => only(Method::POST, Provider::Anthropic, Route::AnthropicCountTokens),
            "/v1/models" => only(Method::GET, v1_provider, Route::Models(v1_provider)),
            "/v1beta/models" => only(Method::GET, Provider::Gemini, Route::GeminiModels),
            _ => {
                let beta_rest = path.strip_prefix("/v1beta/models/");
                let Some(rest) = beta_rest.or_else(|| path.strip_prefix("/v1/models/")) else {
                    let provider = if path.starts_with("/v1beta/") { Provider::Gemini } else { v1_provider };
                    return Route::NotFound(provider);
                };
                match rest.split_once(':') {
                    Some((model, "generateContent")) => {
                        only(Method::POST, Provider::Gemini, Route::GeminiGenerate { model, stream: false })
                    }
                    Some((model, "streamGenerateContent")) => {
                        only(Method::POST, Provider::Gemini, Route::GeminiGenerate { model, stream: true })
                    }
                    Some((_, "countTokens")) => only(Method::POST, Provider::Gemini, Route::GeminiCountTokens),
                    Some((model, "batchEmbedContents")) => only(Method::POST, Provider::Gemini, Route::GeminiBatchEmbed(model)),
                    Some(_) => Route::NotFound(Provider::Gemini),
                    None if beta_rest.is_some() => only(Method::GET, Provider::Gemini, Route::GeminiModel(rest)),
                    None => only(Method::GET, v1_provider, Route::Model(v1_provider, rest)),
                }
            }
        }
    }

    fn provider(&self) -> Provider {
        match self {
            Route::OpenAiChat | Route::OpenAiEmbeddings => Provider::OpenAi,
            Route::AnthropicMessages | Route::AnthropicCountTokens => Provider::Anthropic,
            Route::GeminiModels
            | Route::GeminiModel(_)
            | Route::GeminiGenerate { .. }
            | Route::GeminiCountTokens
            | Route::GeminiBatchEmbed(_) => Provider::Gemini,
            Route::Models(provider) | Route::Model(provider, _) | Route::NotFound(provider) | Route::MethodNotAllowed(provider) => {
                *provider
            }
        }
    }
}

fn native_error(provider: Provider, status: StatusCode, message: &str) -> Response {
    match provider {
        Provider::OpenAi => openai::error(status, message),
        Provider::Anthropic => anthropic::error(status, message),
        Provider::Gemini => gemini::error(status, message),
    }
}

/// Every request but the control endpoints: recorded, then answered.
pub(crate) async fn dispatch(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if let Some(control) = parts.uri.path().strip_prefix(CONTROL_PREFIX) {
        return handle_control(&shared, &parts.method, control, body).await;
    }
    let seq = shared.next_seq();
    let (body, body_error) = match to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => (body, None),
        Err(error) => (bytes::Bytes::new(), Some(error)),
    };
    let incoming = Incoming { seq, method: parts.method, uri: parts.uri, headers: parts.headers, body };
    let (response, stream) = match body_error {
        None => answer(&shared, &incoming),
        Some(error) => {
            tracing::debug!(%error, "cannot read a request body");
            let provider = Route::of(&incoming.method, incoming.uri.path(), &incoming.headers).provider();
            (native_error(provider, StatusCode::PAYLOAD_TOO_LARGE, "the request body is larger than 64 MiB or could not be read"), false)
        }
    };
    // Recorded before the response leaves, so a stream's end always finds its entry.
    let delayed = !stream && response.status().is_success() && !shared.reply_delay.is_zero();
    shared.record(incoming, response.status(), stream);
    if delayed {
        tokio::time::sleep(shared.reply_delay).await;
    }
    response
}

/// The response, and whether it is a stream.
fn answer(shared: &Arc<Shared>, incoming: &Incoming) -> (Response, bool) {
    let path = incoming.uri.path();
    let route = Route::of(&incoming.method, path, &incoming.headers);
    let provider = route.provider();
    if let Some(failure) = shared.take_failure(path) {
        let response = match &failure.body {
            // A string is sent as it is, to stand for the HTML or text pages of proxies and load balancers.
            Some(serde_json::Value::String(text)) => respond::with_body(failure.status, CONTENT_TYPE_TEXT, Body::from(text.clone())),
            Some(body) => respond::json(failure.status, body),
            None => native_error(provider, failure.status, "mock failure injected"),
        };
        return (response, false);
    }
    let gemini_query_opt = (provider == Provider::Gemini).then(|| GeminiQuery::of(&incoming.uri));
    if let Some(refusal) = refusal(shared, &route, &incoming.headers, gemini_query_opt.as_ref()) {
        return (refusal, false);
    }
    let bad_request = |message: String| (native_error(provider, StatusCode::BAD_REQUEST, &message), false);
    let full = |response: Response| (response, false);
    match route {
        Route::OpenAiChat => match ChatRequest::parse(&incoming.body) {
            Err(message) => bad_request(message),
            Ok(chat) if chat.is_stream() => {
                let (steps, renderer) = chat.stream(incoming.seq);
                (respond::stream(shared, incoming.seq, steps, renderer, CONTENT_TYPE_SSE), true)
            }
            Ok(chat) => full(chat.complete(incoming.seq)),
        },
        Route::AnthropicMessages => match MessagesRequest::parse(&incoming.body) {
            Err(message) => bad_request(message),
            Ok(messages) => {
                let cache = messages.breakpoint().and_then(|point| point.used(shared.cache_prefix(point.digest)));
                if messages.is_stream() {
                    let (steps, renderer) = messages.stream(incoming.seq, cache.as_ref());
                    (respond::stream(shared, incoming.seq, steps, renderer, CONTENT_TYPE_SSE), true)
                } else {
                    full(messages.complete(incoming.seq, cache.as_ref()))
                }
            }
        },
        Route::OpenAiEmbeddings => match EmbeddingsRequest::parse(&incoming.body) {
            Err(message) => bad_request(message),
            Ok(embeddings) => full(embeddings.answer()),
        },
        Route::GeminiBatchEmbed(model) => match BatchEmbedRequest::parse(&incoming.body, model) {
            Err(message) => bad_request(message),
            Ok(batch) => full(batch.answer()),
        },
        Route::AnthropicCountTokens => match MessagesRequest::count(&incoming.body) {
            Err(message) => bad_request(message),
            Ok(input_tokens) => full(respond::json(StatusCode::OK, &json!({"input_tokens": input_tokens}))),
        },
        Route::GeminiCountTokens => match GenerateRequest::count(&incoming.body) {
            Err(message) => bad_request(message),
            Ok(total_tokens) => full(respond::json(StatusCode::OK, &json!({"totalTokens": total_tokens}))),
        },
        Route::GeminiGenerate { model, stream } => match GenerateRequest::parse(&incoming.body) {
            Err(message) => bad_request(message),
            Ok(generate) if stream => {
                let sse = gemini_query_opt.as_ref().and_then(|query| query.alt.as_deref()) == Some("sse");
                let (steps, renderer) = generate.stream(model, incoming.seq, sse);
                let content_type = if sse { CONTENT_TYPE_SSE } else { CONTENT_TYPE_JSON };
                (respond::stream(shared, incoming.seq, steps, renderer, content_type), true)
            }
            Ok(generate) => full(generate.complete(model, incoming.seq)),
        },
        Route::Models(Provider::OpenAi) => full(openai::models()),
        Route::Models(Provider::Anthropic) => full(anthropic::models()),
        Route::Models(Provider::Gemini) | Route::GeminiModels => full(gemini::models()),
        Route::Model(Provider::OpenAi, id) => full(openai::model(id)),
        Route::Model(Provider::Anthropic, id) => full(anthropic::model(id)),
        Route::Model(Provider::Gemini, id) | Route::GeminiModel(id) => full(gemini::model(id)),
        Route::NotFound(provider) => full(native_error(provider, StatusCode::NOT_FOUND, &format!("unknown route {path}"))),
        Route::MethodNotAllowed(provider) => {
            full(native_error(provider, StatusCode::METHOD_NOT_ALLOWED, &format!("method {} is not allowed on {path}", incoming.method)))
        }
    }
}

/// The refusal of a request without an accepted key (when keys are configured) or, for Anthropic, without
/// a version header.
fn refusal(shared: &Shared, route: &Route<'_>, headers: &HeaderMap, gemini_query_opt: Option<&GeminiQuery>) -> Option<Response> {
    if matches!(route, Route::NotFound(_) | Route::MethodNotAllowed(_)) {
        return None;
    }
    match route.provider() {
        Provider::OpenAi => {
            let key_opt = openai::bearer(headers);
            if !shared.key_accepted(key_opt) {
                return Some(openai::unauthorized(key_opt));
            }
        }
        Provider::Anthropic => {
            let key_opt = anthropic::api_key(headers);
            if !shared.key_accepted(key_opt) {
                return Some(anthropic::unauthorized(key_opt));
            }
            if !anthropic::has_version(headers) {
                return Some(anthropic::missing_version());
            }
        }
        Provider::Gemini => {
            let default_query = GeminiQuery::default();
            let key_opt = gemini::api_key(headers, gemini_query_opt.unwrap_or(&default_query));
            if !shared.key_accepted(key_opt) {
                return Some(gemini::unauthorized());
            }
        }
    }
    None
}

/// `GET|DELETE /__mock/requests`, `POST|DELETE /__mock/fail`.
async fn handle_control(shared: &Shared, method: &Method, control: &str, body: Body) -> Response {
    let no_content = || respond::with_body(StatusCode::NO_CONTENT, CONTENT_TYPE_JSON, Body::empty());
    match (method, control) {
        (&Method::GET, "requests") => respond::json(StatusCode::OK, &shared.requests()),
        (&Method::DELETE, "requests") => {
            shared.clear();
            no_content()
        }
        (&Method::POST, "fail") => {
            let spec = match to_bytes(body, MAX_BODY_BYTES).await {
                Ok(bytes) => serde_json::from_slice::<FailSpec>(&bytes).map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            };
            match spec {
                Ok(spec) if StatusCode::from_u16(spec.status).is_ok() => {
                    shared.fail_next(spec);
                    no_content()
                }
                Ok(spec) => control_error(StatusCode::BAD_REQUEST, &format!("invalid status {}", spec.status)),
                Err(error) => control_error(StatusCode::BAD_REQUEST, &format!("invalid fail spec: {error}")),
            }
        }
        (&Method::DELETE, "fail") => {
            shared.clear_failures();
            no_content()
        }
        _ => control_error(StatusCode::NOT_FOUND, &format!("unknown control endpoint {method} {CONTROL_PREFIX}{control}")),
    }
}

fn control_error(status: StatusCode, message: &str) -> Response {
    respond::json(status, &json!({ "error": message }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route<'a>(method: Method, path: &'a str, headers: &[(&'static str, &'static str)]) -> Route<'a> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, value.parse().unwrap());
        }
        Route::of(&method, path, &map)
    }

    #[test]
    fn routes_are_told_apart() {
        assert_eq!(route(Method::POST, "/v1/chat/completions", &[]), Route::OpenAiChat);
        assert_eq!(route(Method::GET, "/v1/chat/completions", &[]), Route::MethodNotAllowed(Provider::OpenAi));
        assert_eq!(route(Method::POST, "/v1/messages", &[]), Route::AnthropicMessages);
        assert_eq!(route(Method::GET, "/v1/models", &[]), Route::Models(Provider::OpenAi));
        assert_eq!(route(Method::GET, "/v1/models", &[("anthropic-version", "2023-06-01")]), Route::Models(Provider::Anthropic));
        assert_eq!(route(Method::GET, "/v1/models", &[("x-api-key", "k")]), Route::Models(Provider::Anthropic));
        assert_eq!(route(Method::GET, "/v1/models/gpt-4o", &[]), Route::Model(Provider::OpenAi, "gpt-4o"));
        assert_eq!(route(Method::GET, "/v1beta/models", &[]), Route::GeminiModels);
        assert_eq!(route(Method::GET, "/v1beta/models/gemini-2.0-flash", &[]), Route::GeminiModel("gemini-2.0-flash"));
        assert_eq!(
            route(Method::POST, "/v1beta/models/gemini-2.0-flash:generateContent", &[]),
            Route::GeminiGenerate { model: "gemini-2.0-flash", stream: false }
        );
        assert_eq!(route(Method::POST, "/v1/models/g:streamGenerateContent", &[]), Route::GeminiGenerate { model: "g", stream: true });
        assert_eq!(route(Method::POST, "/v1beta/models/g:countTokens", &[]), Route::GeminiCountTokens);
        assert_eq!(route(Method::POST, "/v1/messages/count_tokens", &[]), Route::AnthropicCountTokens);
        assert_eq!(route(Method::POST, "/v1beta/models/g:embedContent", &[]), Route::NotFound(Provider::Gemini));
        assert_eq!(route(Method::POST, "/v1/embeddings", &[]), Route::OpenAiEmbeddings);
        assert_eq!(route(Method::POST, "/v1beta/models/e:batchEmbedContents", &[]), Route::GeminiBatchEmbed("e"));
    }
}
