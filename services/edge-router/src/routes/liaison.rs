//! Liaison binding contracts: `POST /v1/liaison/open`, `GET /v1/liaison/{id}`,
//! `POST /v1/liaison/{id}/plan`, `GET /v1/liaison/{id}/events` (SSE) and `POST /v1/liaison/{id}/close`.
//! A plan is priced here (the model resolved as routing would, its worst case on the plan's token
//! budget, the ceiling that plus the slack) and signed and stored by the policy firewall; a completion
//! commits it (`crate::liaison`).

use std::time::Duration;

use crate::extract::{Path, Query};
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_policy_firewall::liaison::{
    self, ANY, DEFAULT_COST_SLACK, DEFAULT_PLAN_TTL_SECONDS, MAX_PLAN_TOKENS, MAX_PLAN_TTL_SECONDS, MAX_SESSION_TTL_SECONDS, SANDBOX_LABEL,
};
use brainstorm_proto::policy::{
    LiaisonPlan, LiaisonRef, LiaisonSession, ListLiaisonEventsRequest, MintPlanRequest, OpenLiaisonRequest, PolicyFirewallClient,
};
use brainstorm_providers::catalog::{ModelCatalog, provider_by_id};
use brainstorm_providers::openai;
use brainstorm_providers::routing::{self, Resolution, RouteOptions};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::{JsonBody, OptionalJsonBody};
use crate::pipeline::{invalid, model_not_allowed, route_error};
use crate::routes::budget::usd;

/// How often an event stream looks for new events, and how long it stays quiet before a keep-alive.
const EVENT_POLL: Duration = Duration::from_millis(250);
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// At most this many tools in a grant, each name or pattern at most this long.
const MAX_GRANT_ENTRIES: usize = 128;
const MAX_GRANT_CHARS: usize = 128;

/// A session as the API shows it.
fn session_view(session: &LiaisonSession) -> Value {
    let summary = session.summary.clone().unwrap_or_default();
    let mut cost_summary = brainstorm_policy_firewall::liaison_summary_json(&summary);
    if let Some(members) = cost_summary.as_object_mut() {
        members.insert("currency".to_string(), json!("USD"));
    }
    json!({
        "liaison_id": session.liaison_id,
        "tenant_id": session.tenant_id,
        "status": session.status,
        "agent_id": (!session.agent_id.is_empty()).then_some(&session.agent_id),
        "label": (!session.label.is_empty()).then_some(&session.label),
        "metadata": serde_json::from_str::<Value>(&session.metadata_json).unwrap_or_else(|_| json!({})),
        "opened_at": session.opened_at,
        "expires_at": session.expires_at,
        "closed_at": (!session.closed_at.is_empty()).then_some(&session.closed_at),
        "last_event_seq": session.last_event_seq,
        "cost_summary": cost_summary,
        "trace_digest": summary.trace_digest,
        "endpoints": {
            "plan": format!("/v1/liaison/{}/plan", session.liaison_id),
            "events": format!("/v1/liaison/{}/events", session.liaison_id),
            "close": format!("/v1/liaison/{}/close", session.liaison_id),
        },
    })
}

/// A plan as the API shows it (the envelope, version 2, with its signature and commit headers).
fn plan_view(plan: &LiaisonPlan) -> Value {
    json!({
        "v": plan.v,
        "plan_id": plan.plan_id,
        "liaison_id": plan.liaison_id,
        "tenant_id": plan.tenant_id,
        "model": plan.model,
        "ceiling_usd": usd(plan.ceiling_nanos),
        "estimated_cost_usd": usd(plan.estimated_nanos),
        "allowed_models": plan.allowed_models,
        "allowed_tools": plan.allowed_tools,
        "grant_id": crate::liaison::grant_id(plan),
        "prompt_fingerprint": plan.prompt_fingerprint,
        "issued_at": plan.issued_at,
        "ttl_seconds": plan.ttl_seconds,
        "expires_at": plan.issued_at + plan.ttl_seconds,
        "max_tokens": plan.max_tokens,
        "signature": plan.signature,
        "state": plan.state,
        "x402_compat": {"scheme": "exact", "currency": "USD", "amount": Usd::from_nanos(plan.ceiling_nanos).to_string()},
        "commit": {"headers": {"X-BR-Plan-Id": plan.plan_id, "X-BR-Liaison": plan.liaison_id}},
    })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct OpenBody {
    agent_id: Option<String>,
    label: Option<String>,
    ttl_seconds: Option<Value>,
    metadata: Option<Value>,
}

/// A whole number from `low` to `high` (`name` in the error), or `default` when absent.
fn bounded(name: &str, value: Option<&Value>, low: i64, high: i64, default: i64, code: &str) -> Result<i64, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(default),
        Some(value) => value
            .as_i64()
            .filter(|number| (low..=high).contains(number))
            .ok_or_else(|| ApiError::invalid_request(code, format!("{name} is a whole number from {low} to {high}"))),
    }
}

/// `POST /v1/liaison/open` (router.write): `{agent_id?, label?, ttl_seconds? (default 3600, at most
/// 86400), metadata? (object)}`; 201 with the session and its signed `liaison_id`.
pub async fn open(
    State(state): State<EdgeState>,
    caller: Caller,
    OptionalJsonBody(body): OptionalJsonBody<OpenBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require("router.write")?;
    let ttl_seconds = bounded("ttl_seconds", body.ttl_seconds.as_ref(), 1, MAX_SESSION_TTL_SECONDS, 0, "invalid_ttl")?;
    let metadata_json = match body.metadata {
        None | Some(Value::Null) => String::new(),
        Some(metadata @ Value::Object(_)) => metadata.to_string(),
        Some(_) => return Err(ApiError::invalid_request("invalid_metadata", "metadata is a JSON object")),
    };
    let request = OpenLiaisonRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        key_id: caller.identity.key_id.clone(),
        agent_id: body.agent_id.map(|agent| agent.trim().to_string()).unwrap_or_default(),
        label: body.label.map(|label| label.trim().to_string()).unwrap_or_default(),
        ttl_seconds,
        metadata_json,
    };
    let session = state.policy.open_liaison(request).await?;
    Ok((StatusCode::CREATED, Json(session_view(&session))))
}

fn reference(caller: &Caller, liaison_id: String) -> Result<LiaisonRef, ApiError> {
    Ok(LiaisonRef { tenant_id: caller.tenant_id()?.to_string(), liaison_id })
}

/// `GET /v1/liaison/{liaison_id}` (router.read): the session, its summary so far.
pub async fn get(State(state): State<EdgeState>, caller: Caller, Path(liaison_id): Path<String>) -> Result<Json<Value>, ApiError> {
    caller.require("router.read")?;
    let session = state.policy.get_liaison(reference(&caller, liaison_id)?).await?;
    Ok(Json(session_view(&session)))
}

/// `POST /v1/liaison/{liaison_id}/close` (router.write): the session closed, with its cost summary
/// and trace digest (also the stream's last event, `liaison.closed`).
pub async fn close(State(state): State<EdgeState>, caller: Caller, Path(liaison_id): Path<String>) -> Result<Json<Value>, ApiError> {
    caller.require("router.write")?;
    let session = state.policy.close_liaison(reference(&caller, liaison_id)?).await?;
    Ok(Json(session_view(&session)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanBody {
    messages: Option<Value>,
    model: Option<String>,
    max_tokens: Option<Value>,
    cost_slack: Option<Value>,
    max_cost_usd: Option<Value>,
    ttl_seconds: Option<Value>,
    allowed_models: Option<Value>,
    allowed_tools: Option<Value>,
}

/// A grant's entries: a JSON array of non-empty strings (`name` in the error).
fn grant_entries(name: &str, value: &Value, code: &str) -> Result<Vec<String>, ApiError> {
    let invalid = || ApiError::invalid_request(code, format!("{name} is an array of at most {MAX_GRANT_ENTRIES} non-empty strings"));
    let entries = value.as_array().filter(|entries| entries.len() <= MAX_GRANT_ENTRIES).ok_or_else(invalid)?;
    entries
        .iter()
        .map(|entry| {
            entry
                .as_str()
                .map(str::trim)
                .filter(|entry| !entry.is_empty() && entry.chars().count() <= MAX_GRANT_CHARS)
                .map(str::to_string)
                .ok_or_else(invalid)
        })
        .collect()
}

/// A grant entry in canonical form: a catalog `provider/model-id` (the catalog's spelling, the
/// provider lowercase) with its variant suffix, or the sandbox; None for anything else.
fn canonical_model(entry: &str, catalog: &ModelCatalog) -> Option<String> {
    if entry.eq_ignore_ascii_case(SANDBOX_LABEL) {
        return Some(SANDBOX_LABEL.to_string());
    }
    let variant = liaison::variant_of(entry);
    let base = if variant.is_empty() { entry } else { &entry[..entry.len() - variant.len() - 1] };
    let (provider, model) = base.split_once('/')?;
    let provider = provider_by_id(&provider.to_ascii_lowercase())?;
    let found = catalog
        .find(provider.id, model)
        .or_else(|| catalog.models().iter().find(|known| known.provider == provider.id && known.model.eq_ignore_ascii_case(model)))?;
    let label = [provider.id, "/", found.model.as_str()].concat();
    Some(if variant.is_empty() { label } else { format!("{label}:{variant}") })
}

/// The model grant by the spec's rules: omitted, only the minted model; `["*"]` alone, any; `[]`
/// refused; every other entry a known catalog label, stored canonical; a pinned variant must be in it.
fn model_grant(value: Option<&Value>, minted: &str, catalog: &ModelCatalog) -> Result<Vec<String>, ApiError> {
    let Some(value) = value.filter(|value| !value.is_null()) else { return Ok(vec![minted.to_string()]) };
    let entries = grant_entries("allowed_models", value, "invalid_allowed_models")?;
    if entries.is_empty() {
        return Err(ApiError::invalid_request(
            "allowed_models_empty",
            "allowed_models may not be empty: omit it to allow only the plan's model",
        ));
    }
    if entries.iter().any(|entry| entry == ANY) {
        if entries.len() > 1 {
            return Err(ApiError::invalid_request("invalid_allowed_models", "`*` grants any model and must stand alone"));
        }
        return Ok(entries);
    }
    let mut grant: Vec<String> = Vec::with_capacity(entries.len());
    for entry in &entries {
        let label = canonical_model(entry, catalog).ok_or_else(|| {
            ApiError::invalid_request(
                "unknown_allowed_model",
                format!("`{entry}` is not a catalog `provider/model-id` (see GET /v1/models)"),
            )
        })?;
        if !grant.contains(&label) {
            grant.push(label);
        }
    }
    if !liaison::variant_of(minted).is_empty() && !grant.iter().any(|label| label == minted) {
        return Err(ApiError::conflict("plan_grant_inconsistent", format!("the plan pins `{minted}`, which its allowed_models leave out")));
    }
    Ok(grant)
}

/// `POST /v1/liaison/{liaison_id}/plan` (router.write): prices and signs a plan for `messages` on
/// `model` (omitted: the cheapest runnable model the prompt needs; the sandbox for a tenant without
/// provider keys); 201 with the signed envelope.
pub async fn plan(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(liaison_id): Path<String>,
    JsonBody(body): JsonBody<PlanBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require("router.write")?;
    let tenant_id = caller.tenant_id()?;
    let messages = match body.messages {
        Some(messages @ Value::Array(_)) => messages,
        Some(_) => return Err(ApiError::invalid_request("invalid_messages", "messages is an array of chat messages")),
        None => return Err(ApiError::invalid_request("missing_field", "messages is required")),
    };
    let max_tokens = match body.max_tokens.as_ref().filter(|value| !value.is_null()) {
        None => None,
        Some(value) => Some(bounded("max_tokens", Some(value), 1, MAX_PLAN_TOKENS, 0, "invalid_max_tokens")?),
    };
    let ttl_seconds = bounded("ttl_seconds", body.ttl_seconds.as_ref(), 1, MAX_PLAN_TTL_SECONDS, DEFAULT_PLAN_TTL_SECONDS, "invalid_ttl")?;
    let cost_slack = match body.cost_slack.as_ref().filter(|value| !value.is_null()) {
        None => DEFAULT_COST_SLACK,
        Some(value) => value
            .as_f64()
            .filter(|slack| (0.0..=10.0).contains(slack))
            .ok_or_else(|| ApiError::invalid_request("invalid_cost_slack", "cost_slack is a number from 0 to 10"))?,
    };
    let max_cost = match body.max_cost_usd.as_ref().filter(|value| !value.is_null()) {
        None => None,
        Some(value) => Some(
            value
                .as_number()
                .and_then(|number| Usd::from_json_number(number).ok())
                .filter(|max| *max >= Usd::ZERO)
                .ok_or_else(|| ApiError::invalid_request("invalid_max_cost", "max_cost_usd is a number of dollars, 0 or more"))?,
        ),
    };
    let allowed_tools = match body.allowed_tools.as_ref().filter(|value| !value.is_null()) {
        None => Vec::new(),
        Some(value) => grant_entries("allowed_tools", value, "invalid_allowed_tools")?,
    };
    let requested = body.model.map(|model| model.trim().to_string()).filter(|model| !model.is_empty());
    let mut members = json!({"model": requested.as_deref().unwrap_or("auto"), "messages": messages});
    if let Some(max_tokens) = max_tokens {
        members["max_tokens"] = json!(max_tokens);
    }
    let mut chat = openai::parse_request(&members).map_err(invalid)?;

    // The model, resolved as a completion would be without fallback: one label.
    let config = state.routing.get(tenant_id).await?;
    let no_fallback = RouteOptions { allow_fallback: Some(false), ..RouteOptions::default() };
    let requested_label = requested.as_deref().unwrap_or("auto");
    let (label, entry, candidate_cost) =
        match routing::resolve(requested_label, &config.routing, &state.models, &chat, &no_fallback).map_err(route_error)? {
            Resolution::Sandbox => (SANDBOX_LABEL.to_string(), None, None),
            Resolution::Route(route) => {
                let candidate = route
                    .candidates
                    .into_iter()
                    .find(|candidate| caller.may_use_model(candidate.id()))
                    .ok_or_else(|| model_not_allowed(requested_label))?;
                let named = config.routing.aliases.get(requested_label).map_or(requested_label, String::as_str);
                let variant = liaison::variant_of(named);
                let label = if variant.is_empty() { candidate.id().to_string() } else { format!("{}:{variant}", candidate.id()) };
                (label, candidate.entry, candidate.estimated_cost)
            }
        };
    // The plan's token budget: as asked, else the model's default output estimate; the estimate is
    // the prompt's tokens and that budget at the model's prices.
    let usage = routing::estimate_usage(&chat, entry.as_ref());
    chat.max_tokens = u32::try_from(usage.output_tokens).ok();
    let estimate = match &entry {
        Some(entry) if label != SANDBOX_LABEL => entry.price.cost(usage),
        _ => candidate_cost.unwrap_or(Usd::ZERO),
    };
    if let Some(max_cost) = max_cost
        && estimate > max_cost
    {
        return Err(ApiError::ceiling_exceeds_max(format!(
            "the plan's estimate, USD {estimate}, is above max_cost_usd ({max_cost}): raise it, lower max_tokens or name a cheaper model"
        )));
    }
    let mut ceiling_nanos = (estimate.nanos() as f64 * (1.0 + cost_slack)).ceil() as i64;
    if let Some(max_cost) = max_cost {
        ceiling_nanos = ceiling_nanos.min(max_cost.nanos()).max(estimate.nanos());
    }
    let allowed_models = model_grant(body.allowed_models.as_ref(), &label, &state.models)?;
    let request = MintPlanRequest {
        tenant_id: tenant_id.to_string(),
        liaison_id,
        prompt_digest: liaison::prompt_digest(&chat),
        model: label,
        ceiling_nanos,
        estimated_nanos: estimate.nanos(),
        allowed_models,
        allowed_tools,
        ttl_seconds,
        max_tokens: i64::try_from(usage.output_tokens).unwrap_or(MAX_PLAN_TOKENS).min(MAX_PLAN_TOKENS),
    };
    let plan = state.policy.mint_plan(request).await?;
    Ok((StatusCode::CREATED, Json(plan_view(&plan))))
}

#[derive(Deserialize, Default)]
pub struct EventsQuery {
    after: Option<String>,
}

/// `GET /v1/liaison/{liaison_id}/events` (router.read): the session's events as server-sent events
/// (`id` the sequence number, `event` the kind, `data` its JSON), from the first (or after `?after=`
/// or `Last-Event-ID`), new ones as they happen; the stream ends after `liaison.closed` or when the
/// session expires.
pub async fn events(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(liaison_id): Path<String>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    caller.require("router.read")?;
    let resume = headers.get("last-event-id").and_then(|value| value.to_str().ok()).map(str::to_string);
    let after = match query.after.or(resume) {
        None => 0,
        Some(after) => after
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|after| *after >= 0)
            .ok_or_else(|| ApiError::invalid_request("invalid_after", "after (or Last-Event-ID) is an event's sequence number"))?,
    };
    let request = ListLiaisonEventsRequest { tenant_id: caller.tenant_id()?.to_string(), liaison_id, after_seq: after, limit: 0 };
    // The first page is read before answering, so an unknown session is a 404, not an empty stream.
    let first = state.policy.list_liaison_events(request.clone()).await?;
    let feed = EventFeed {
        policy: state.policy.clone(),
        request,
        first: Some(first),
        quiet: Duration::ZERO,
        done: false,
        stopping: state.stopping.clone(),
    };
    let stream =
        futures::stream::unfold(feed, |mut feed| async move { feed.next().await.map(|bytes| (Ok::<_, std::io::Error>(bytes), feed)) });
    let mut response = Body::from_stream(stream).into_response();
    let response_headers = response.headers_mut();
    response_headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response_headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// Reads a session's events page by page, polling while it is open.
struct EventFeed {
    policy: PolicyFirewallClient,
    request: ListLiaisonEventsRequest,
    first: Option<brainstorm_proto::policy::LiaisonEventList>,
    /// How long the stream has sent nothing.
    quiet: Duration,
    done: bool,
    /// The process is stopping: the stream ends (the client resumes elsewhere with `Last-Event-ID`).
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl EventFeed {
    /// The next bytes to send: a page of events, a keep-alive, or None once the stream is over.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            let page = match self.first.take() {
                Some(page) => page,
                None => {
                    tokio::select! {
                        () = tokio::time::sleep(EVENT_POLL) => {}
                        // (A watch whose sender is gone never stops the stream: the branch is disabled.)
                        Ok(_) = self.stopping.wait_for(|stopping| *stopping) => {
                            self.done = true;
                            return None;
                        }
                    }
                    self.quiet += EVENT_POLL;
                    match self.policy.list_liaison_events(self.request.clone()).await {
                        Ok(page) => page,
                        Err(error) => {
                            self.done = true;
                            let data = json!({"code": error.reason, "message": error.message});
                            return Some(Bytes::from(format!("event: error\ndata: {data}\n\n")));
                        }
                    }
                }
            };
            if let Some(last) = page.events.last() {
                self.request.after_seq = last.seq;
                let full = page.events.len() as u32 >= 100;
                // A session no longer open ends with its last page of events.
                self.done = page.status != "open" && !full;
                self.quiet = Duration::ZERO;
                let mut text = String::new();
                for event in &page.events {
                    text.push_str(&format!("id: {}\nevent: {}\ndata: {}\n\n", event.seq, event.kind, event.data_json));
                }
                return Some(Bytes::from(text));
            }
            if page.status != "open" {
                self.done = true;
                return None;
            }
            if self.quiet >= KEEP_ALIVE {
                self.quiet = Duration::ZERO;
                return Some(Bytes::from_static(b": keep-alive\n\n"));
            }
        }
    }
}
