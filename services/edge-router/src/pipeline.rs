//! The completion pipeline shared by both client formats: read the request, resolve the model from
//! in-memory routing data, call the provider (falling back on failure), and answer in the caller's
//! format with exact costs. Streams are translated event by event as they arrive.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_providers::catalog::{Model, Price, base_url};
use brainstorm_providers::chat::{ChatEvent, ChatReply, ChatRequest, InvalidRequest, ReplyAssembler, Usage, reply_events};
use brainstorm_providers::routing::{self, Candidate, Resolution, Route, RouteError};
use brainstorm_providers::upstream::{EventStream, Target, UpstreamError};
use brainstorm_providers::{anthropic, openai};
use futures::StreamExt;
use serde_json::{Map, Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::RequestId;
use crate::routing_cache::route_options;
use crate::sandbox;

/// The client format a request arrived in, and must be answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFormat {
    OpenAi,
    Anthropic,
}

fn invalid(error: InvalidRequest) -> ApiError {
    ApiError::invalid_request(error.code, error.message)
}

fn route_error(error: RouteError) -> ApiError {
    match &error {
        RouteError::ModelNotFound(_) | RouteError::PresetNotFound(_) => ApiError::model_not_found(error.to_string()),
        RouteError::ByokRequired { provider, .. } => ApiError::byok_required(provider, error.to_string()),
        RouteError::NoRunnableModel(_) => ApiError::model_unavailable(error.to_string()),
    }
}

/// Serves one completion.
pub async fn complete(
    state: &EdgeState,
    caller: &Caller,
    request_id: &RequestId,
    body: &Value,
    format: ClientFormat,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let chat = match format {
        ClientFormat::OpenAi => openai::parse_request(body),
        ClientFormat::Anthropic => anthropic::parse_request(body),
    }
    .map_err(invalid)?;
    let options = route_options(body.get("route").unwrap_or(&Value::Null)).map_err(|message| {
        let code = if message.starts_with("route.strategy") { "invalid_strategy" } else { "invalid_route" };
        ApiError::invalid_request(code, message)
    })?;
    let config = state.routing.get(caller.tenant_id()?).await?;
    let reply_id = reply_id(request_id, format);
    let resolution = routing::resolve(&chat.model, &config.routing, &state.models, &chat, &options).map_err(route_error)?;
    let mut route = match resolution {
        Resolution::Sandbox => {
            if !caller.may_use_model(&chat.model) {
                return Err(ApiError::forbidden("model_not_allowed", format!("this key may not use model `{}`", chat.model)));
            }
            return Ok(sandbox_response(&chat, reply_id, format, started));
        }
        Resolution::Route(route) => route,
    };
    route.candidates.retain(|candidate| caller.may_use_model(&candidate.id()));
    if route.candidates.is_empty() {
        return Err(ApiError::forbidden("model_not_allowed", format!("this key may not use model `{}`", chat.model)));
    }
    if !route.allow_fallback {
        route.candidates.truncate(1);
    }
    let routing_overhead = started.elapsed();

    let mut failures: Vec<(String, UpstreamError)> = Vec::new();
    let last = route.candidates.len() - 1;
    for (index, candidate) in route.candidates.iter().enumerate() {
        let Some(api_key) = config.credential(candidate.provider.id) else { continue };
        let default_max_tokens =
            candidate.entry.as_ref().map_or(anthropic::DEFAULT_MAX_TOKENS, |entry| entry.max_output.min(anthropic::DEFAULT_MAX_TOKENS));
        let target = Target {
            provider: candidate.provider,
            base_url: base_url(candidate.provider, &state.base_urls),
            api_key,
            model: &candidate.model,
            default_max_tokens,
        };
        let provider_started = Instant::now();
        let mut headers = route_headers(&route, candidate, &failures, &chat);
        let outcome = if chat.stream {
            state.upstream.stream(&target, &chat).await.map(|events| {
                set(&mut headers, "x-br-provider-latency-ms", &milliseconds(provider_started.elapsed()));
                set(&mut headers, "x-br-routing-overhead-ms", &milliseconds(routing_overhead));
                stream_response(events, headers, candidate, reply_id.clone(), format, &chat)
            })
        } else {
            state.upstream.complete(&target, &chat).await.map(|reply| {
                set(&mut headers, "x-br-provider-latency-ms", &milliseconds(provider_started.elapsed()));
                set(&mut headers, "x-br-routing-overhead-ms", &milliseconds(routing_overhead));
                set(&mut headers, "x-br-total-latency-ms", &milliseconds(started.elapsed()));
                reply_response(reply, headers, candidate, &route, reply_id.clone(), format)
            })
        };
        match outcome {
            Ok(response) => return Ok(response),
            Err(error) => {
                tracing::warn!(provider = candidate.provider.id, model = %candidate.model, %error, "upstream call failed");
                let fall_back = error.may_fall_back() && index < last;
                failures.push((candidate.id(), error));
                if !fall_back {
                    break;
                }
            }
        }
    }
    let Some((failed_model, error)) = failures.pop() else {
        return Err(ApiError::model_unavailable("no candidate model has a usable provider key"));
    };
    let provider = failed_model.split('/').next().unwrap_or_default();
    Err(ApiError::provider_error(error.status(), provider, format!("{failed_model}: {error}")))
}

fn reply_id(request_id: &RequestId, format: ClientFormat) -> String {
    let suffix = request_id.0.trim_start_matches("req_");
    match format {
        ClientFormat::OpenAi => format!("chatcmpl-{suffix}"),
        ClientFormat::Anthropic => format!("msg_{suffix}"),
    }
}

fn milliseconds(duration: std::time::Duration) -> String {
    format!("{:.3}", duration.as_secs_f64() * 1000.0)
}

fn set(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

/// Exact dollars with six decimals, as the cost headers show them.
fn dollars(amount: Usd) -> String {
    amount.format_fixed(6)
}

/// Actual cost as a share of the estimate (1 = the whole estimate was spent).
fn efficiency(actual: Usd, estimated: Usd) -> Option<String> {
    (estimated.nanos() > 0).then(|| {
        let ten_thousandths = i128::from(actual.nanos()) * 10_000 / i128::from(estimated.nanos());
        format!("{}.{:04}", ten_thousandths / 10_000, ten_thousandths % 10_000)
    })
}

fn route_headers(route: &Route, candidate: &Candidate, failures: &[(String, UpstreamError)], chat: &ChatRequest) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let routed = candidate.id();
    set(&mut headers, "x-br-routed-model", &routed);
    if let Some(first) = route.candidates.first() {
        set(&mut headers, "x-br-resolved-model", &first.id());
    }
    set(&mut headers, "x-br-upstream-model", &candidate.model);
    set(&mut headers, "x-br-selection-method", route.method.as_str());
    set(&mut headers, "x-br-route-reason", &route.reason);
    set(&mut headers, "x-br-models-considered", &route.candidates.len().to_string());
    set(&mut headers, "x-model-router-endpoint", candidate.provider.id);
    if let Some(entry) = &candidate.entry {
        set(&mut headers, "x-br-quality-tier", &entry.tier.to_string());
        deprecation_headers(&mut headers, entry);
    }
    if let Some((tier, score)) = route.complexity {
        set(&mut headers, "x-br-complexity-level", &tier.to_string());
        set(&mut headers, "x-br-complexity-score", &score.to_string());
    }
    if let (true, Some(estimate)) = (chat.model != "auto", candidate.estimated_cost) {
        set(&mut headers, "x-br-estimated-cost", &dollars(estimate));
        let usage = routing::estimate_usage(chat, candidate.entry.as_ref());
        set(
            &mut headers,
            "x-br-estimated-cost-basis",
            &format!("input~{} tokens, output<={} tokens", usage.input_tokens, usage.output_tokens),
        );
    }
    if let Some((first_failed, _)) = failures.first() {
        set(&mut headers, "x-br-failover-from", first_failed);
        let mut path: Vec<&str> = failures.iter().map(|(model, _)| model.as_str()).collect();
        path.push(&routed);
        set(&mut headers, "x-br-failover-path", &path.join(","));
    }
    headers
}

/// `X-BR-Deprecation`, `Deprecation` (RFC 9745) and `Sunset` (RFC 8594) for a deprecated model.
fn deprecation_headers(headers: &mut HeaderMap, entry: &Model) {
    let Some(deprecation) = &entry.deprecated else { return };
    let mut notice = format!("{} deprecated on {}; sunset {}", entry.id(), deprecation.date, deprecation.sunset);
    if let Some(replacement) = &deprecation.replacement {
        notice.push_str(&format!("; use {replacement}"));
    }
    set(headers, "x-br-deprecation", &notice);
    let midnight = |date: &str| {
        chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").ok().and_then(|day| day.and_hms_opt(0, 0, 0)).map(|time| time.and_utc())
    };
    if let Some(deprecated_at) = midnight(&deprecation.date) {
        set(headers, "deprecation", &format!("@{}", deprecated_at.timestamp()));
    }
    if let Some(sunset) = midnight(&deprecation.sunset) {
        set(headers, "sunset", &sunset.format("%a, %d %b %Y %H:%M:%S GMT").to_string());
    }
}

fn price_of(candidate: &Candidate) -> Option<Price> {
    candidate.entry.as_ref().map(|entry| entry.price)
}

fn reply_response(
    mut reply: ChatReply,
    mut headers: HeaderMap,
    candidate: &Candidate,
    route: &Route,
    id: String,
    format: ClientFormat,
) -> Response {
    reply.id = id;
    reply.model = candidate.id();
    let cost = price_of(candidate).map(|price| price.cost(reply.usage));
    if let Some(cost) = cost {
        set(&mut headers, "x-br-actual-cost", &dollars(cost));
        if let Some(ratio) = candidate.estimated_cost.and_then(|estimate| efficiency(cost, estimate)) {
            set(&mut headers, "x-br-efficiency", &ratio);
        }
    }
    let body = match format {
        ClientFormat::OpenAi => {
            let mut extra = Map::new();
            extra.insert("cost_usd".to_string(), cost.map_or(Value::Null, Usd::to_json));
            extra.insert("routing_strategy".to_string(), json!(route.strategy));
            openai::render_reply(&reply, chrono::Utc::now().timestamp(), extra)
        }
        ClientFormat::Anthropic => anthropic::render_reply(&reply),
    };
    (headers, Json(body)).into_response()
}

fn sandbox_response(chat: &ChatRequest, id: String, format: ClientFormat, started: Instant) -> Response {
    let reply = sandbox::sandbox_reply(chat, id);
    let mut headers = HeaderMap::new();
    set(&mut headers, "x-br-routed-model", routing::SANDBOX_MODEL);
    set(&mut headers, "x-br-resolved-model", routing::SANDBOX_MODEL);
    set(&mut headers, "x-br-selection-method", "sandbox");
    set(&mut headers, "x-br-route-reason", "no provider key registered: served by the sandbox model");
    if chat.model != "auto" {
        set(&mut headers, "x-br-estimated-cost", "0.000000");
    }
    set(&mut headers, "x-br-actual-cost", "0.000000");
    set(&mut headers, "x-br-total-latency-ms", &milliseconds(started.elapsed()));
    if chat.stream {
        let events = futures::stream::iter(reply_events(&reply).into_iter().map(Ok)).boxed();
        let model = reply.model.clone();
        return relay(
            events,
            headers,
            RelaySpec {
                id: reply.id,
                model,
                price: Some(Price::default()),
                format,
                input_estimate: reply.usage.input_tokens,
                stream_usage: chat.stream_usage,
            },
        );
    }
    let body = match format {
        ClientFormat::OpenAi => {
            let mut extra = Map::new();
            extra.insert("cost_usd".to_string(), Usd::ZERO.to_json());
            extra.insert("routing_strategy".to_string(), json!("price"));
            openai::render_reply(&reply, chrono::Utc::now().timestamp(), extra)
        }
        ClientFormat::Anthropic => anthropic::render_reply(&reply),
    };
    (headers, Json(body)).into_response()
}

fn stream_response(
    events: EventStream,
    headers: HeaderMap,
    candidate: &Candidate,
    id: String,
    format: ClientFormat,
    chat: &ChatRequest,
) -> Response {
    let input_estimate = routing::estimate_usage(chat, candidate.entry.as_ref()).input_tokens;
    relay(
        events,
        headers,
        RelaySpec { id, model: candidate.id(), price: price_of(candidate), format, input_estimate, stream_usage: chat.stream_usage },
    )
}

struct RelaySpec {
    id: String,
    model: String,
    price: Option<Price>,
    format: ClientFormat,
    input_estimate: u64,
    stream_usage: bool,
}

enum Writer {
    OpenAi(openai::StreamWriter),
    Anthropic(anthropic::StreamWriter),
}

impl Writer {
    fn write(&mut self, event: &ChatEvent) -> Vec<String> {
        match self {
            Writer::OpenAi(writer) => writer.write(event),
            Writer::Anthropic(writer) => writer.write(event),
        }
    }

    fn end(&mut self) -> Vec<String> {
        match self {
            Writer::OpenAi(writer) => writer.end(),
            Writer::Anthropic(writer) => writer.end(),
        }
    }

    fn error(&self, message: &str) -> String {
        match self {
            Writer::OpenAi(_) => format!("data: {}\n\n", json!({"error": {"message": message, "type": "provider_error"}})),
            Writer::Anthropic(_) => {
                format!("event: error\ndata: {}\n\n", json!({"type": "error", "error": {"type": "api_error", "message": message}}))
            }
        }
    }
}

/// How a relayed stream ended, for accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOutcome {
    pub usage: Usage,
    pub cost: Option<Usd>,
    /// The client went away before the end.
    pub disconnected: bool,
}

/// Settles a stream exactly once: at its end, or when the client disconnects and the body is dropped.
struct StreamSettlement {
    model: String,
    price: Option<Price>,
    usage: Usage,
    settled: bool,
}

impl StreamSettlement {
    fn settle(&mut self, disconnected: bool) -> StreamOutcome {
        self.settled = true;
        let outcome = StreamOutcome { usage: self.usage, cost: self.price.map(|price| price.cost(self.usage)), disconnected };
        tracing::debug!(
            model = %self.model,
            input_tokens = outcome.usage.input_tokens,
            output_tokens = outcome.usage.output_tokens,
            disconnected = outcome.disconnected,
            "stream settled"
        );
        outcome
    }
}

impl Drop for StreamSettlement {
    fn drop(&mut self) {
        if !self.settled {
            self.settle(true);
        }
    }
}

struct RelayState {
    events: EventStream,
    writer: Writer,
    assembler: ReplyAssembler,
    settlement: StreamSettlement,
    pending: VecDeque<Bytes>,
    ended: bool,
}

/// Streams `events` to the client in its format. Frames are produced as events arrive: the client's
/// reading pace is the upstream's reading pace, and dropping the body drops the upstream connection.
fn relay(events: EventStream, mut headers: HeaderMap, spec: RelaySpec) -> Response {
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let writer = match spec.format {
        ClientFormat::OpenAi => {
            Writer::OpenAi(openai::StreamWriter::new(spec.id, spec.model.clone(), chrono::Utc::now().timestamp(), spec.stream_usage))
        }
        ClientFormat::Anthropic => Writer::Anthropic(anthropic::StreamWriter::new(spec.id, spec.model.clone(), spec.input_estimate)),
    };
    let state = RelayState {
        events,
        writer,
        assembler: ReplyAssembler::default(),
        settlement: StreamSettlement { model: spec.model, price: spec.price, usage: Usage::default(), settled: false },
        pending: VecDeque::new(),
        ended: false,
    };
    let body = futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(frame) = state.pending.pop_front() {
                return Some((Ok::<_, Infallible>(frame), state));
            }
            if state.ended {
                return None;
            }
            match state.events.next().await {
                Some(Ok(event)) => {
                    state.assembler.push(&event);
                    state.pending.extend(state.writer.write(&event).into_iter().map(Bytes::from));
                }
                Some(Err(error)) => {
                    state.pending.push_back(Bytes::from(state.writer.error(&format!("the provider stream failed: {error}"))));
                    state.ended = true;
                    state.settlement.usage = state.assembler.usage;
                    state.settlement.settle(false);
                }
                None => {
                    state.ended = true;
                    state.settlement.usage = state.assembler.usage;
                    let outcome = state.settlement.settle(false);
                    if let Some(cost) = outcome.cost {
                        // Headers are gone by now: the actual cost travels as an SSE comment.
                        state.pending.push_back(Bytes::from(format!(": x-br-actual-cost={}\n\n", dollars(cost))));
                    }
                    state.pending.extend(state.writer.end().into_iter().map(Bytes::from));
                }
            }
        }
    });
    (headers, Body::from_stream(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efficiency_is_exact_to_four_places() {
        assert_eq!(efficiency(Usd::from_nanos(450), Usd::from_nanos(1_000)), Some("0.4500".to_string()));
        assert_eq!(efficiency(Usd::from_nanos(1), Usd::from_nanos(3)), Some("0.3333".to_string()));
        assert_eq!(efficiency(Usd::from_nanos(5), Usd::ZERO), None);
        assert_eq!(dollars(Usd::from_nanos(450_000)), "0.000450");
    }
}
