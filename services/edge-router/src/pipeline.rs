//! The completion pipeline shared by both client formats: read the request, resolve the model from
//! in-memory routing data, call the provider (falling back on failure), and answer in the caller's
//! format with exact costs. Streams are translated event by event as they arrive.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use brainstorm_audit_lineage::Submitted;
use brainstorm_budget_ledger::{ActualUsage, BudgetContext, BudgetDenial, Estimate, Outcome, Plan, RemainingView, Reservation};
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_policy_firewall::{FirewallMode, RequestFacts, ToolCall, glob_matches};
use brainstorm_proto::audit::{
    AgentContext, AuditRecord, CandidateDecision, DecisionPath, GrantContext, Principal as AuditPrincipal, TraceContext,
};
use brainstorm_providers::catalog::{Model, Price, base_url};
use brainstorm_providers::chat::{ChatEvent, ChatReply, ChatRequest, FinishReason, InvalidRequest, ReplyAssembler, Usage, reply_events};
use brainstorm_providers::routing::{self, Candidate, Resolution, Route, RouteError};
use brainstorm_providers::upstream::{EventStream, Target, UpstreamError};
use brainstorm_providers::{anthropic, openai};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::agent_loop::{AgentLoop, Mode};
use crate::auth::{Caller, CallerIdentity, Refused};
use crate::circuits::Admission;
use crate::extract::RequestId;
use crate::header_value::{self, Millis};
use crate::liaison::{self, PlanOutcome, PlanSettler};
use crate::mesh::MeshHop;
use crate::reply_guard::{GuardReport, ReplyGuard, ToolVerdict};
use crate::response_cache::{self, CacheKey, CacheUse, CachedReply, Lookup};
use crate::routing_cache::route_options;
use crate::sandbox;

/// Sets header `$name` (a literal, made a `HeaderName` at compile time) to `$value` when the value
/// is a valid header value.
macro_rules! set {
    ($headers:expr, $name:literal, $value:expr $(,)?) => {
        put($headers, const { HeaderName::from_static($name) }, $value)
    };
}

/// Sets header `$name` to `$value` (an `Option<HeaderValue>`, from `header_value`) when it is Some.
macro_rules! set_value {
    ($headers:expr, $name:literal, $value:expr $(,)?) => {
        if let Some(value) = $value {
            $headers.insert(const { HeaderName::from_static($name) }, value);
        }
    };
}

pub mod embeddings;

/// The client format a request arrived in, and must be answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFormat {
    OpenAi,
    Anthropic,
}

/// A completion request's body: read straight into the neutral request when it has its format's
/// common shape (`openai::read_request`, `anthropic::read_request`), else a JSON tree that the
/// format's reader, and the pipeline's own members (`user`, `route`, `x_firewall_mode`,
/// `conversation_id`), are read from.
pub enum CompletionBody {
    Read(Box<ChatRequest>),
    Tree(Value),
}

impl CompletionBody {
    /// Reads a body's bytes: typed when the format and shape allow, else as a tree (with the
    /// envelope's errors for an empty or invalid body). A body committing a liaison plan
    /// (`under_plan`) may omit `model`: it then stands for the plan's (`liaison::OMITTED_MODEL`).
    pub fn parse(bytes: &[u8], format: ClientFormat, under_plan: bool) -> Result<Self, ApiError> {
        let read = match format {
            ClientFormat::OpenAi => openai::read_request(bytes),
            ClientFormat::Anthropic => anthropic::read_request(bytes),
        };
        if let Some(chat) = read {
            return Ok(CompletionBody::Read(Box::new(chat)));
        }
        let mut tree: Value = crate::extract::completion_json(bytes)?;
        if under_plan
            && let Some(members) = tree.as_object_mut()
            && members.get("model").is_none_or(Value::is_null)
        {
            members.insert("model".to_string(), Value::String(liaison::OMITTED_MODEL.to_string()));
        }
        Ok(CompletionBody::Tree(tree))
    }

    /// The `model` member as sent.
    fn model(&self) -> &str {
        match self {
            CompletionBody::Read(chat) => &chat.model,
            CompletionBody::Tree(tree) => tree.get("model").and_then(Value::as_str).unwrap_or_default(),
        }
    }

    /// The `user` member of a body in `format`.
    fn user(&self, format: ClientFormat) -> Option<&str> {
        match (self, format) {
            // OpenAI's `user` is the neutral request's; an Anthropic body with a `user` member
            // (its user is `metadata.user_id`) is never read typed.
            (CompletionBody::Read(chat), ClientFormat::OpenAi) => chat.user.as_deref(),
            (CompletionBody::Read(_), ClientFormat::Anthropic) => None,
            (CompletionBody::Tree(tree), _) => tree.get("user").and_then(Value::as_str),
        }
    }

    /// The first of the body's identifying members (`user`, `conversation_id`) whose text holds a NUL
    /// (U+0000): they name agents and conversations in the ledger and the stores, where no text may
    /// hold one (PostgreSQL's refuses it), so such a body is refused whole, in both shapes.
    fn identifier_with_nul(&self, format: ClientFormat) -> Option<&'static str> {
        if self.user(format).is_some_and(|user| user.contains('\0')) {
            return Some("user");
        }
        match self {
            CompletionBody::Tree(tree) => {
                tree.get("conversation_id").and_then(Value::as_str).filter(|id| id.contains('\0')).map(|_| "conversation_id")
            }
            CompletionBody::Read(_) => None,
        }
    }

    /// The neutral request (or why the body is not one), and the tree when there is one.
    fn into_parts(self, format: ClientFormat) -> (Result<ChatRequest, InvalidRequest>, Option<Value>) {
        match self {
            CompletionBody::Read(chat) => (Ok(*chat), None),
            CompletionBody::Tree(tree) => {
                let chat = match format {
                    ClientFormat::OpenAi => openai::parse_request(&tree),
                    ClientFormat::Anthropic => anthropic::parse_request(&tree),
                };
                (chat, Some(tree))
            }
        }
    }
}

/// A completion request as received: its body, and the mesh hop its headers describe.
pub struct Submission {
    body: CompletionBody,
    mesh: Option<MeshHop>,
}

impl Submission {
    /// Reads a request's body (`CompletionBody::parse`) and its mesh headers (`MeshHop::read`,
    /// checked against the body's bytes).
    pub fn read(bytes: &[u8], headers: &HeaderMap, format: ClientFormat) -> Result<Self, ApiError> {
        let mesh = MeshHop::read(headers, bytes)?;
        let body = CompletionBody::parse(bytes, format, liaison::names_a_plan(headers))?;
        Ok(Submission { body, mesh })
    }
}

impl From<CompletionBody> for Submission {
    /// A body the gateway made itself (a prompt run): no mesh hop.
    fn from(body: CompletionBody) -> Self {
        Submission { body, mesh: None }
    }
}

pub(crate) fn invalid(error: InvalidRequest) -> ApiError {
    ApiError::invalid_request(error.code, error.message)
}

/// 403: the key's model allowlist leaves nothing of what the request names.
pub(crate) fn model_not_allowed(model: &str) -> ApiError {
    ApiError::forbidden("model_not_allowed", format!("this key may not use model `{model}`"))
}

pub(crate) fn route_error(error: RouteError) -> ApiError {
    match &error {
        RouteError::ModelNotFound(_) | RouteError::PresetNotFound(_) => ApiError::model_not_found(error.to_string()),
        RouteError::ByokRequired { provider, .. } => ApiError::byok_required(provider, error.to_string()),
        RouteError::NoRunnableModel(_) => ApiError::model_unavailable(error.to_string()),
    }
}

/// The agent id a request names by header: `X-BR-Agent-Id`, else `X-User-Id`. (Request headers are
/// looked up by a `HeaderName` made at compile time, here and below: a lookup by text parses and
/// validates the name on every request.)
fn agent_header(request_headers: &HeaderMap) -> Option<&str> {
    let header = |name: &HeaderName| {
        request_headers.get(name).and_then(|value| value.to_str().ok()).map(str::trim).filter(|value| !value.is_empty())
    };
    header(&const { HeaderName::from_static("x-br-agent-id") }).or_else(|| header(&const { HeaderName::from_static("x-user-id") }))
}

/// The agent a request is attributed to: `X-BR-Agent-Id`, else `X-User-Id`, else the body's `user`.
fn agent_of(request_headers: &HeaderMap, body_user: Option<&str>) -> Option<String> {
    agent_header(request_headers).or(body_user).map(|agent| agent.chars().take(128).collect())
}

/// How the agent id of `agent_of` reached the edge: `header` (`X-BR-Agent-Id`, `X-User-Id`) or
/// `user_field` (the body's `user`); either is asserted, not proven.
fn agent_source(request_headers: &HeaderMap) -> &'static str {
    if agent_header(request_headers).is_some() { "header" } else { "user_field" }
}

/// The agent family of headers for a request attributed to `agent_id`: `X-BR-Agent-Id`,
/// `X-BR-Agent-Assertion` (registered or unregistered), and the profile's `X-BR-Agent-Owner` and
/// `X-BR-Agent-Lifecycle` when it has them.
fn agent_headers(agent_id: Option<&str>, agent: Option<&AgentContext>) -> Vec<(HeaderName, HeaderValue)> {
    let (Some(agent_id), Some(agent)) = (agent_id, agent) else { return Vec::new() };
    let mut headers = Vec::with_capacity(4);
    let mut put = |name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.push((HeaderName::from_static(name), value));
        }
    };
    put("x-br-agent-id", agent_id);
    put("x-br-agent-assertion", if agent.registered { "registered" } else { "unregistered" });
    if let Some(owner) = &agent.owner_id {
        put("x-br-agent-owner", owner);
    }
    if let Some(lifecycle) = &agent.lifecycle_state {
        put("x-br-agent-lifecycle", lifecycle);
    }
    headers
}

/// The budget scopes a caller's completion counts against (tenant, key, plan, and the agent's).
pub(crate) async fn budget_context(
    state: &EdgeState,
    caller: &Caller,
    agent_id: Option<&str>,
    request_headers: &HeaderMap,
    body_conversation_id: Option<&str>,
) -> Result<BudgetContext, ApiError> {
    let tenant_id = caller.tenant_id()?;
    let mut context =
        BudgetContext::new(tenant_id, caller.identity.plan.clone()).with_tenant_limits(&state.budget_settings.limits(tenant_id).await?);
    if let Some(key) = &caller.identity.key {
        context = context.with_api_key(key);
    }
    if let Some(agent_id) = agent_id {
        let budget = state.budget_settings.agent(tenant_id, agent_id).await?;
        context = context.with_agent(agent_id.to_string(), budget.as_ref());
        if let Some(limit) = state.budget_settings.agent_limit(tenant_id, agent_id).await? {
            context = context.with_agent_limit(&limit);
        }
    }
    context.conversation_id = request_headers
        .get(&const { HeaderName::from_static("x-conversation-id") })
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
        .or_else(|| body_conversation_id.map(str::to_string));
    Ok(context)
}

fn budget_headers(headers: &mut HeaderMap, remaining: &RemainingView) {
    remaining.each_header(|name, value| {
        if let Some(value) = header_value::shown(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    });
}

fn tokens(usage: Usage) -> i64 {
    i64::try_from(usage.input_tokens + usage.output_tokens).unwrap_or(i64::MAX)
}

/// What the pipeline learned about a request, for its audit record.
#[derive(Default)]
pub struct AuditFacts {
    /// The agent the request is attributed to (see `agent_of`), found once per request.
    agent_id: Option<String>,
    /// What the edge knew of that agent once it was admitted (registered, owner, how its id came).
    agent: Option<AgentContext>,
    model_requested: String,
    model_resolved: String,
    model_executed: String,
    provider: String,
    strategy: String,
    selection_method: String,
    reason: String,
    candidates: Vec<String>,
    /// Headers the guardian stages add (guardrail status, ...).
    guardian_headers: Vec<(HeaderName, HeaderValue)>,
    /// `X-BR-Guardian-Status`: on, off, warned, approved or blocked.
    guardian_status: &'static str,
    /// Time spent in the guardian stages before the response started.
    guardian_overhead: std::time::Duration,
    /// A guardian decision that refused part of an answered request (its audit reason code).
    denial: Option<&'static str>,
    /// A streamed answer's record waits for the stream's end (tokens, cost) and is submitted there.
    stream_evidence: Option<tokio::sync::oneshot::Sender<PendingEvidence>>,
    /// The liaison plan the request claimed, settled once its outcome is known (boxed: most requests
    /// carry none, and the facts are moved along the request path).
    plan: Option<Box<PlanSettler>>,
    /// The mesh hop the request took (`X-BR-Mesh-*`).
    mesh: Option<MeshHop>,
    /// The grant the request was made under: its liaison plan's (`X-BR-Grant-Id`).
    grant: Option<GrantContext>,
    input_tokens: u64,
    output_tokens: u64,
    cost: Option<Usd>,
}

/// `bytes` (at most 16) random bytes as lowercase hex.
fn random_hex(bytes: usize) -> String {
    let mut text = brainstorm_common::text::simple_uuid(uuid::Uuid::new_v4());
    text.truncate(bytes.min(16) * 2);
    text
}

/// The W3C trace context: the caller's `traceparent` continued, or a new trace.
fn trace_context(request_headers: &HeaderMap) -> TraceContext {
    let incoming =
        request_headers.get(&const { HeaderName::from_static("traceparent") }).and_then(|value| value.to_str().ok()).and_then(|value| {
            let parts: Vec<&str> = value.trim().split('-').collect();
            let valid =
                parts.len() == 4 && parts[1].len() == 32 && parts[2].len() == 16 && parts[1].bytes().all(|byte| byte.is_ascii_hexdigit());
            valid.then(|| (parts[1].to_lowercase(), parts[2].to_lowercase()))
        });
    // Traces exported: the record names the request's exported span (same trace, same span id).
    if let Some((trace_id, span_id)) = brainstorm_common::telemetry::current_span_ids() {
        let origin = if incoming.is_some() { "traceparent" } else { "generated" };
        return TraceContext {
            trace_id,
            span_id,
            parent_span_id: incoming.map(|(_, parent)| parent),
            origin: origin.to_string(),
            inbound_trusted: false,
        };
    }
    match incoming {
        Some((trace_id, parent)) => TraceContext {
            trace_id,
            span_id: random_hex(8),
            parent_span_id: Some(parent),
            origin: "traceparent".to_string(),
            inbound_trusted: false,
        },
        None => TraceContext {
            // Time-ordered like a UUIDv7 (the chain's trace index then grows at its end instead of
            // dirtying a random page per request); the rightmost 7 bytes stay random, which is what
            // W3C Trace Context level 2 samplers rely on.
            trace_id: brainstorm_common::text::simple_uuid(uuid::Uuid::now_v7()),
            span_id: random_hex(8),
            parent_span_id: None,
            origin: "generated".to_string(),
            inbound_trusted: false,
        },
    }
}

/// The chain that holds evidence of requests that belong to no tenant (unknown keys, the platform
/// administrator's key): tenant ids are UUIDs, so it cannot collide with one.
pub const PLATFORM_CHAIN: &str = "platform";

/// Who a request's evidence belongs to.
struct Attribution {
    tenant_id: String,
    key_id: Option<String>,
    owner_id: Option<String>,
}

impl Attribution {
    fn of(identity: Option<&CallerIdentity>) -> Self {
        match identity {
            Some(identity) => Attribution {
                tenant_id: identity.tenant_id.clone().unwrap_or_else(|| PLATFORM_CHAIN.to_string()),
                key_id: Some(identity.key_id.clone()),
                owner_id: identity.key.as_ref().and_then(|key| key.created_by.clone()),
            },
            None => Attribution { tenant_id: PLATFORM_CHAIN.to_string(), key_id: None, owner_id: None },
        }
    }
}

/// Serves one completion request from its first byte: admission (key, kill switch, permission), the
/// body, then the pipeline. Every outcome, refusals at the door included, is recorded as evidence.
pub async fn serve(
    state: &EdgeState,
    attempt: Result<Caller, Refused>,
    request_id: &RequestId,
    request_headers: &HeaderMap,
    submission: Result<Submission, ApiError>,
    format: ClientFormat,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let (body, mesh) = match submission {
        Ok(Submission { body, mesh }) => (Ok(body), mesh),
        Err(error) => (Err(error), None),
    };
    let body = body.and_then(|body| match body.identifier_with_nul(format) {
        Some(member) => Err(ApiError::invalid_request("invalid_text", format!("`{member}` must not contain the NUL character (U+0000)"))),
        None => Ok(body),
    });
    let model_requested = body.as_ref().map_or("", CompletionBody::model).to_string();
    let mut facts = AuditFacts { model_requested, mesh, ..AuditFacts::default() };
    let agent_id = agent_of(request_headers, body.as_ref().ok().and_then(|body| body.user(format)));
    let (identity, result) = admitted(attempt, body, async |caller, body| {
        let request = Incoming { headers: request_headers, body, agent_id: agent_id.as_deref() };
        complete_inner(state, caller, request_id, request, format, &mut facts).await
    })
    .await;
    facts.agent_id = agent_id;
    let attribution = Attribution::of(identity.as_deref());
    let endpoint = match format {
        ClientFormat::OpenAi => "/v1/chat/completions",
        ClientFormat::Anthropic => "/v1/messages",
    };
    // A claimed plan is settled here, unless a stream answers: then with the stream's evidence.
    let streams = facts.stream_evidence.is_some() && result.is_ok();
    let plan = if streams { None } else { facts.plan.take() };
    let Some(plan) = plan else {
        return seal(state, attribution, request_id, request_headers, endpoint, started, facts, result);
    };
    // Answered: the provider answered (an answer the guardian then withheld was still paid for).
    let answered = result.is_ok() || facts.cost.is_some_and(|cost| cost > Usd::ZERO);
    let (cost, input_tokens, output_tokens) = (facts.cost, facts.input_tokens, facts.output_tokens);
    let (provider, strategy, method) = (facts.provider.clone(), facts.strategy.clone(), facts.selection_method.clone());
    let sealed = seal(state, attribution, request_id, request_headers, endpoint, started, facts, result);
    // (Read in a block: the answer's body is not `Sync`, so no borrow of it may live across an await.)
    let (commitment, traceparent, error_code) = {
        let text = |name: &str| match &sealed {
            Ok(response) => response.headers().get(name).and_then(|value| value.to_str().ok()).unwrap_or_default().to_string(),
            Err(error) => liaison::header_text(&error.headers, name).to_string(),
        };
        let error_code = sealed.as_ref().err().and_then(|error| error.code.clone()).unwrap_or_default();
        (text("x-br-audit-hash"), text("traceparent"), error_code)
    };
    plan.settle(PlanOutcome {
        answered,
        provider: &provider,
        strategy: &strategy,
        selection_method: &method,
        cost,
        input_tokens,
        output_tokens,
        latency_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
        audit_commitment: &commitment,
        traceparent: &traceparent,
        error_code: &error_code,
    })
    .await;
    sealed
}

/// Whether the caller switched the guardian off for this request (`X-BR-Guardian: off`), honoured
/// only for keys that could change the tenant's security configuration anyway.
fn guardian_switched_off(caller: &Caller, request_headers: &HeaderMap) -> bool {
    caller.identity.permissions.contains("security.write")
        && request_headers
            .get(&const { HeaderName::from_static("x-br-guardian") })
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.eq_ignore_ascii_case("off"))
}

/// The tenant's input guardrails on `text`: their headers recorded, a block refused (`blocked`),
/// a flag noted (`warned`).
async fn guard_input(state: &EdgeState, tenant_id: &str, text: &str, facts: &mut AuditFacts) -> Result<(), ApiError> {
    if let Some(scan) = state.guardian.scan_input(tenant_id, text).await? {
        facts.guardian_headers.extend(scan.headers());
        if let Some(error) = scan.api_error() {
            facts.guardian_status = "blocked";
            return Err(error);
        }
        if scan.action != brainstorm_policy_firewall::ScanAction::Pass {
            facts.guardian_status = "warned";
        }
    }
    Ok(())
}

/// Admission: a refused caller, one without `router.write`, or an unreadable body is the answer;
/// else `run` with the caller and the body. The caller's identity comes back for the evidence.
async fn admitted<B>(
    attempt: Result<Caller, Refused>,
    body: Result<B, ApiError>,
    run: impl AsyncFnOnce(&Caller, B) -> Result<Response, ApiError>,
) -> (Option<std::sync::Arc<CallerIdentity>>, Result<Response, ApiError>) {
    match (attempt, body) {
        (Err(refused), _) => (refused.identity, Err(refused.error)),
        (Ok(caller), Err(error)) => (Some(caller.identity), Err(error)),
        (Ok(caller), Ok(body)) => {
            let result = match caller.require("router.write") {
                Ok(()) => run(&caller, body).await,
                Err(error) => Err(error),
            };
            (Some(caller.identity), result)
        }
    }
}

/// Records a refusal at the door of any other `/v1` route (unknown key, tenant kill switch) and adds
/// the evidence headers to it. The refusal stands whether or not the record could be queued.
pub fn record_refusal(
    state: &EdgeState,
    identity: Option<&CallerIdentity>,
    request_id: &RequestId,
    request_headers: &HeaderMap,
    endpoint: &str,
    error: ApiError,
) -> ApiError {
    let attribution = Attribution::of(identity);
    let facts = AuditFacts { agent_id: agent_of(request_headers, None), ..AuditFacts::default() };
    match seal(state, attribution, request_id, request_headers, endpoint, Instant::now(), facts, Err(error.clone())) {
        Err(recorded) if recorded.status == error.status => recorded,
        _ => error,
    }
}

/// Records a request's evidence and adds the evidence headers to its answer.
#[allow(clippy::too_many_arguments)]
fn seal(
    state: &EdgeState,
    attribution: Attribution,
    request_id: &RequestId,
    request_headers: &HeaderMap,
    endpoint: &str,
    started: Instant,
    mut facts: AuditFacts,
    result: Result<Response, ApiError>,
) -> Result<Response, ApiError> {
    let Attribution { tenant_id, key_id, owner_id } = attribution;
    let (noted_key, noted_agent) = if result.is_err() { (key_id.clone(), facts.agent_id.clone()) } else { (None, None) };
    let (outcome, reason_code) = match &result {
        Ok(_) if facts.denial.is_some() => ("denied", facts.denial.unwrap_or_default().to_string()),
        Ok(_) => ("allowed", "ok".to_string()),
        Err(error) if error.status.is_client_error() => ("denied", error.code.clone().unwrap_or_else(|| error.error_type.to_string())),
        Err(error) => ("error", error.code.clone().unwrap_or_else(|| error.error_type.to_string())),
    };
    let trace = trace_context(request_headers);
    let traceparent = header_value::formatted(format_args!("00-{}-{}-01", trace.trace_id, trace.span_id));
    let mut agent_headers = agent_headers(facts.agent_id.as_deref(), facts.agent.as_ref());
    // A mesh hop is the agent context's too (with or without an agent id), and answered with the
    // headers the next hop sends on.
    if let Some(mesh) = facts.mesh.take() {
        agent_headers.extend(mesh.headers(&trace.trace_id));
        let agent = facts.agent.get_or_insert_with(AgentContext::default);
        agent.mesh_hop_count = i64::from(mesh.hop_count());
        agent.mesh_source = Some(mesh.source);
    }
    // A human approval the reply guard redeemed is part of the grant the request ran under.
    let approval_id =
        Some(liaison::header_text(&facts.guardian_headers, "x-br-approval-id")).filter(|id| !id.is_empty()).map(str::to_string);
    let grant = match (facts.grant.take(), approval_id) {
        (Some(grant), approval_id) => Some(GrantContext { approval_id, ..grant }),
        (None, Some(approval_id)) => Some(GrantContext { approval_id: Some(approval_id), ..GrantContext::default() }),
        (None, None) => None,
    };
    let record = AuditRecord {
        request_id: request_id.0.clone(),
        tenant_id,
        occurred_at: brainstorm_common::time::now_timestamp(),
        endpoint: endpoint.to_string(),
        principal: key_id.as_ref().map(|key_id| AuditPrincipal {
            id: key_id.clone(),
            auth_method: "api_key".to_string(),
            spiffe_id: None,
            owner_id: owner_id.clone(),
        }),
        key_id,
        agent_id: facts.agent_id,
        agent: facts.agent,
        model_requested: facts.model_requested,
        model_resolved: facts.model_resolved,
        model_executed: facts.model_executed.clone(),
        provider: facts.provider,
        strategy: facts.strategy,
        input_tokens: i64::try_from(facts.input_tokens).unwrap_or(i64::MAX),
        output_tokens: i64::try_from(facts.output_tokens).unwrap_or(i64::MAX),
        cost_nanos: facts.cost.map_or(0, Usd::nanos),
        outcome: outcome.to_string(),
        reason_code,
        latency_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
        trace: Some(trace),
        decision: Some(DecisionPath {
            selected_model: facts.model_executed,
            selection_method: facts.selection_method,
            reason: facts.reason,
            candidates: facts.candidates.into_iter().map(|model| CandidateDecision { model, ..CandidateDecision::default() }).collect(),
            ..DecisionPath::default()
        }),
        coverage: "captured".to_string(),
        grant,
        conversation_id: request_headers
            .get(&const { HeaderName::from_static("x-conversation-id") })
            .and_then(|value| value.to_str().ok())
            .map(str::to_string),
        ..AuditRecord::default()
    };
    // The guardian stages' headers and the agent's, for the answer or the error alike.
    let mut guardian_headers = std::mem::take(&mut facts.guardian_headers);
    guardian_headers.extend(agent_headers);
    // Evidence and guardian status headers, for the answer or the error alike.
    let mut evidence: Vec<(HeaderName, Option<HeaderValue>)> = Vec::with_capacity(8);
    if !facts.guardian_status.is_empty() {
        evidence.push((const { HeaderName::from_static("x-br-guardian-status") }, header_value::fixed(facts.guardian_status)));
        evidence
            .push((const { HeaderName::from_static("x-br-guardian-overhead-ms") }, header_value::shown(Millis(facts.guardian_overhead))));
    }
    evidence.push((const { HeaderName::from_static("x-br-explain") }, HeaderValue::from_str(&request_id.0).ok()));
    evidence.push((
        const { HeaderName::from_static("x-br-verdict-id") },
        header_value::formatted(format_args!("vrd_{}", request_id.0.trim_start_matches("req_"))),
    ));
    evidence.push((const { HeaderName::from_static("traceparent") }, traceparent));
    match facts.stream_evidence.take() {
        // A stream's record is completed (tokens, cost, how it ended) and submitted when the stream
        // ends; its commitment then travels as a trailing SSE comment.
        Some(pending) if result.is_ok() => {
            let _ = pending.send(PendingEvidence { record, publisher: state.audit_publisher.clone(), plan: facts.plan.take() });
        }
        _ => {
            let (commitment, coverage) = match state.audit_publisher.submit(record) {
                Ok(Submitted::Queued { commitment }) => (commitment, "captured"),
                Ok(Submitted::Dropped { commitment }) => (commitment, "dropped"),
                // Evidence is not optional: without room to record it, the request is refused.
                Err(error) => {
                    return Err(ApiError::unavailable("audit_unavailable", format!("audit evidence cannot be recorded: {error}")));
                }
            };
            evidence.push((
                const { HeaderName::from_static("x-br-evidence-receipt") },
                header_value::formatted(format_args!("sha256:{commitment}")),
            ));
            evidence.push((const { HeaderName::from_static("x-br-audit-hash") }, HeaderValue::from_str(&commitment).ok()));
            evidence.push((const { HeaderName::from_static("x-br-evidence-coverage") }, header_value::fixed(coverage)));
        }
    }
    match result {
        Ok(mut response) => {
            for (name, value) in evidence {
                if let Some(value) = value {
                    response.headers_mut().insert(name, value);
                }
            }
            for (name, value) in guardian_headers {
                response.headers_mut().insert(name, value);
            }
            Ok(response)
        }
        Err(mut error) => {
            // Kept for the caller's `GET /v1/self` (`recent_errors`).
            let noted = json!({
                "request_id": request_id.0,
                "endpoint": endpoint,
                "status": error.status.as_u16(),
                "type": error.error_type,
                "code": error.code,
                "message": error.message,
                "occurred_at": brainstorm_common::time::now_timestamp(),
            });
            if let Some(agent_id) = &noted_agent {
                state.recent_errors.record(agent_id, noted.clone());
            }
            if let Some(key_id) = &noted_key {
                state.recent_errors.record(key_id, noted);
            }
            for (name, value) in evidence {
                if let Some(value) = value {
                    error.push_header_value(name, value);
                }
            }
            for (name, value) in guardian_headers {
                error.push_header_value(name, value);
            }
            Err(error)
        }
    }
}

/// A parsed completion request as it came in.
struct Incoming<'a> {
    headers: &'a HeaderMap,
    body: CompletionBody,
    /// Its agent (see `agent_of`).
    agent_id: Option<&'a str>,
}

/// The completion itself.
async fn complete_inner(
    state: &EdgeState,
    caller: &Caller,
    request_id: &RequestId,
    request: Incoming<'_>,
    format: ClientFormat,
    facts: &mut AuditFacts,
) -> Result<Response, ApiError> {
    let Incoming { headers: request_headers, body, agent_id } = request;
    let started = Instant::now();
    let (chat, tree) = body.into_parts(format);
    let mut chat = chat.map_err(invalid)?;
    // The pipeline's own members; a body read typed holds none of them.
    let member = |name: &str| tree.as_ref().and_then(|tree| tree.get(name));
    let mut options = route_options(member("route").unwrap_or(&Value::Null)).map_err(|message| {
        let code = if message.starts_with("route.strategy") { "invalid_strategy" } else { "invalid_route" };
        ApiError::invalid_request(code, message)
    })?;
    let tenant_id = caller.tenant_id()?;
    // A liaison plan the request commits: its model stands for an omitted one, its token budget for
    // an unset one, and fallback is off (the grant is checked against the model executed).
    let plan_headers = liaison::plan_headers(request_headers)?;
    let mode = Mode::of(member("mode"))?;
    if mode == Mode::Agentic && plan_headers.is_some() {
        return Err(ApiError::invalid_request("invalid_mode", "a liaison plan's commit runs one model call: send it without mode agentic"));
    }
    // The response cache answers whole replies only, never a plan's commit (which must run once)
    // nor the agent loop (whose memory changes between calls).
    let cache_applies = state.response_cache.is_some() && !chat.stream && plan_headers.is_none() && mode == Mode::Proxy;
    let cache_use = CacheUse::of(cache_applies, member, request_headers)?;
    let plan = match &plan_headers {
        Some(headers) => {
            let plan = liaison::fetch(state, tenant_id, headers).await?;
            // The plan's grant, for the answer (`X-BR-Grant-Id`) and the evidence, allowed or denied.
            let grant_id = liaison::grant_id(&plan);
            if let Ok(value) = HeaderValue::from_str(&grant_id) {
                facts.guardian_headers.push((const { HeaderName::from_static("x-br-grant-id") }, value));
            }
            facts.grant = Some(GrantContext { grant_id: Some(grant_id), plan_id: Some(plan.plan_id.clone()), approval_id: None });
            if chat.model == liaison::OMITTED_MODEL {
                chat.model.clone_from(&plan.model);
            }
            if chat.max_tokens.is_none() {
                chat.max_tokens = u32::try_from(plan.max_tokens).ok();
            }
            options.models.clear();
            options.allow_fallback = Some(false);
            Some(plan)
        }
        None => None,
    };
    // Guardian, before anything is spent: scoped kill switches (agent, tool, provider) ...
    let guardian_started = Instant::now();
    let tool_names: Vec<&str> = chat.tools.iter().map(|tool| tool.name.as_str()).collect();
    let facts_for_switch = RequestFacts {
        path: match format {
            ClientFormat::OpenAi => "/v1/chat/completions",
            ClientFormat::Anthropic => "/v1/messages",
        },
        method: "POST",
        agent_id,
        tool_names: &tool_names,
        model: Some(&chat.model),
    };
    if let Some(error) = state.guardian.kill_switch(tenant_id, &facts_for_switch).await.api_error() {
        return Err(error);
    }
    if let Some(agent_id) = agent_id {
        let admission = state.authenticator.admit_agent(tenant_id, agent_id).await?;
        facts.agent = Some(AgentContext {
            registered: admission.registered,
            owner_source: if admission.owner_id.is_some() { "agent_profile" } else { "" }.to_string(),
            owner_id: admission.owner_id,
            identity_source: agent_source(request_headers).to_string(),
            lifecycle_state: admission.lifecycle_state,
            ..AgentContext::default()
        });
    }
    let requested_mode = match member("x_firewall_mode") {
        None | Some(Value::Null) => None,
        Some(Value::String(mode)) => Some(FirewallMode::parse(mode).ok_or_else(|| {
            ApiError::invalid_request("invalid_firewall_mode", format!("x_firewall_mode `{mode}` is not enforce, monitor or off"))
        })?),
        Some(_) => return Err(ApiError::invalid_request("invalid_firewall_mode", "x_firewall_mode must be a string")),
    };
    // ... then guardrails on the prompt and the tool firewall's request-side decisions, unless the
    // caller switched the guardian off for this request (honoured only for keys that could change
    // the tenant's security configuration anyway).
    let guardian_off = guardian_switched_off(caller, request_headers);
    facts.guardian_status = if guardian_off { "off" } else { "on" };
    let mut reply_guard = None;
    let mut downgrade_tool = None;
    let mut output_scanned = false;
    // Read once: the guardian's stages and an agent's XDR risk score (below) both come from it.
    let tenant_guardian = if guardian_off && agent_id.is_none() { None } else { Some(state.guardian.config(tenant_id).await?) };
    if let Some(tenant_guardian) = tenant_guardian.as_ref().filter(|_| !guardian_off) {
        if tenant_guardian.guardrails.config().enabled {
            // The system prompt and every message's text, newline-separated, copied once.
            let texts: Vec<std::borrow::Cow<'_, str>> = chat
                .system
                .iter()
                .map(|system| system.as_str().into())
                .chain(chat.messages.iter().map(|message| message.text_borrowed()))
                .collect();
            guard_input(state, tenant_id, &texts.join("\n"), facts).await?;
        }
        let guardrails = tenant_guardian.guardrails.config();
        output_scanned = guardrails.enabled && guardrails.scan_output;
        let firewall = tenant_guardian.firewall.config();
        let mode = FirewallMode::effective(firewall.mode, requested_mode);
        if mode == FirewallMode::Enforce {
            downgrade_tool = tool_names
                .iter()
                .find(|name| firewall.downgrade_on_tools.iter().any(|pattern| glob_matches(pattern, name)))
                .map(|name| name.to_string());
        }
        if mode != FirewallMode::Off {
            reply_guard = Some(ReplyGuard {
                guardian: state.guardian.clone(),
                tenant_id: tenant_id.to_string(),
                identity: caller.identity.clone(),
                agent_id: agent_id.map(str::to_string),
                requested_mode,
                surface: match format {
                    ClientFormat::OpenAi => "chat_completions",
                    ClientFormat::Anthropic => "messages",
                },
                request_id: request_id.0.clone(),
            });
        }
    }
    facts.guardian_overhead = guardian_started.elapsed();
    // The agent loop: core memory into the system prompt (after the guardrails judged what the
    // caller sent), the memory tools offered.
    let mut agent = match mode {
        Mode::Agentic => Some(AgentLoop::prepare(state, caller, &request_id.0, request_headers, &mut chat).await?),
        Mode::Proxy => None,
    };
    let config = state.routing.get(tenant_id).await?;
    let context = budget_context(state, caller, agent_id, request_headers, member("conversation_id").and_then(Value::as_str)).await?;
    let reply_id = reply_id(request_id, format);
    let learned = state.learned.get(tenant_id);
    let signals = routing::Signals { learned: &learned, cost_first: Plan::resolve(&caller.identity.plan).cost_first };
    let routing_started = Instant::now();
    let resolution = routing::resolve_with(&chat.model, &config.routing, &state.models, &chat, &options, signals);
    let router_latency = routing_started.elapsed();
    let mut resolution = match (&plan, resolution) {
        (Some(_), Err(error)) => return Err(liaison::unresolved(&chat.model, error)),
        (None, resolution) => resolution.map_err(route_error)?,
        (Some(_), Ok(resolution)) => resolution,
    };
    if let (Some(plan), Some(headers)) = (&plan, &plan_headers) {
        let worst_case = match &mut resolution {
            Resolution::Sandbox => Usd::ZERO,
            Resolution::Route(route) => {
                route.candidates.retain(|candidate| caller.may_use_model(candidate.id()));
                if route.candidates.is_empty() {
                    return Err(model_not_allowed(&chat.model));
                }
                route.candidates.first().and_then(|candidate| candidate.estimated_cost).unwrap_or(Usd::ZERO)
            }
        };
        let commit = liaison::Commit {
            headers,
            plan,
            label: liaison::executed_label(&resolution, &chat.model, &config.routing)?,
            chat: &chat,
            worst_case,
            tenant_has_provider_keys: !config.routing.providers.is_empty(),
        };
        facts.plan = Some(Box::new(liaison::commit(state, caller, &request_id.0, commit).await?));
        // The committed plan: `X-BR-Plan-Id` and its ceiling in USD, `X-BR-Plan-Ceiling`.
        if let Ok(plan_id) = HeaderValue::from_str(&plan.plan_id) {
            facts.guardian_headers.push((const { HeaderName::from_static("x-br-plan-id") }, plan_id));
        }
        if let Some(ceiling) = header_value::shown(Usd::from_nanos(plan.ceiling_nanos).fixed(6)) {
            facts.guardian_headers.push((const { HeaderName::from_static("x-br-plan-ceiling") }, ceiling));
        }
        if let Resolution::Route(route) = &mut resolution {
            route.reason = format!("{}; liaison plan {}", route.reason, plan.plan_id);
        }
    }
    let mut route = match resolution {
        Resolution::Sandbox => {
            if !caller.may_use_model(&chat.model) {
                return Err(model_not_allowed(&chat.model));
            }
            facts.model_resolved = routing::SANDBOX_MODEL.to_string();
            facts.model_executed = routing::SANDBOX_MODEL.to_string();
            facts.provider = "brainstorm".to_string();
            facts.strategy = "price".to_string();
            facts.selection_method = "sandbox".to_string();
            facts.reason = "no provider key registered".to_string();
            facts.cost = Some(Usd::ZERO);
            let estimate =
                Estimate { request_id: request_id.0.clone(), cost: Usd::ZERO, tokens: tokens(routing::estimate_usage(&chat, None)) };
            let reservation = state.guard.reserve(&context, &estimate).await.map_err(|denial| denial.to_api_error())?;
            return Ok(sandbox_response(&chat, reply_id, format, started, reservation).await);
        }
        Resolution::Route(route) => route,
    };
    route.candidates.retain(|candidate| caller.may_use_model(candidate.id()));
    if route.candidates.is_empty() {
        return Err(model_not_allowed(&chat.model));
    }
    if !route.allow_fallback {
        route.candidates.truncate(1);
    }
    // An agent an XDR scored as risky (`/v1/admin/xdr/risk-push`, 0.7 or more) is routed as a
    // restricted one whatever its tier: cheapest candidates first.
    if let (Some(agent_id), Some(tenant_guardian)) = (agent_id, &tenant_guardian)
        && let Some(risk) = tenant_guardian.agent_risk(agent_id)
        && risk.risk_score >= brainstorm_policy_firewall::RESTRICTING_RISK
    {
        cheapest_first(&mut route, &format!("restricted: XDR risk {} from {}", risk.risk_score, risk.source));
        facts.guardian_headers.push((HeaderName::from_static("x-br-trust-restricted"), HeaderValue::from_static("xdr_risk")));
    }
    if let Some(tool) = &downgrade_tool {
        // The request offers a tool the firewall downgrades on: cheapest candidates first.
        cheapest_first(&mut route, &format!("downgraded: the request offers tool `{tool}`"));
        facts.guardian_headers.push((HeaderName::from_static("x-br-tool-firewall-status"), HeaderValue::from_static("downgrade")));
        if let Ok(reason) = HeaderValue::try_from(format!("deny_list: `{tool}` downgrades the request")) {
            facts.guardian_headers.push((HeaderName::from_static("x-br-tool-firewall-reason"), reason));
        }
    }
    facts.model_resolved = route.candidates.first().map(|first| first.id().to_string()).unwrap_or_default();
    facts.strategy = route.strategy.clone();
    facts.selection_method = route.method.as_str().to_string();
    facts.reason = route.reason.clone();
    facts.candidates = route.candidates.iter().map(|candidate| candidate.id().to_string()).collect();

    // A repeat of a request answered before, on the same model and strategy, is answered from the
    // response cache; a miss is stored once the guardian passed it. A miss while an identical
    // request is being answered waits for that answer; the first miss leads (`_flight` lives until
    // the request is done, so its reply is stored before its followers look again).
    let (cache_key, _flight) = match (cache_use, &state.response_cache) {
        (CacheUse::Use, Some(cache)) => {
            let key = CacheKey::of(tenant_id, &facts.model_resolved, &route.strategy, &mut chat);
            let mut lookup = cache.lookup(&key);
            if let Lookup::Follow(flight) = lookup {
                response_cache::landed(flight).await;
                lookup = cache.lookup(&key);
            }
            match lookup {
                // The stored answer may come from a fallback model: it serves only a caller whose
                // route holds that model (a key's allowlist may leave it out).
                Lookup::Hit(hit) => match route.candidates.iter().find(|candidate| candidate.id() == hit.model) {
                    Some(candidate) => {
                        let guard = (reply_guard.as_ref(), guardian_off);
                        let cached = Cached { context: &context, route: &route, candidate, chat: &chat, hit, reply_id, started };
                        return answer_from_cache(state, tenant_id, request_id, cached, guard, format, facts).await;
                    }
                    None => (Some(key), None),
                },
                Lookup::Lead(flight) => (Some(key), Some(flight)),
                // Another flight took off meanwhile: one wait is enough; call the provider.
                Lookup::Follow(_) => (Some(key), None),
            }
        }
        _ => (None, None),
    };

    // Reserve the worst case before any upstream call (the agent loop's: each of its steps'); settle
    // the actual cost after.
    let steps = i64::from(agent.as_ref().map_or(1, AgentLoop::step_bound));
    let estimate_of = |route: &Route| {
        let first = route.candidates.first();
        let cost = first.and_then(|candidate| candidate.estimated_cost).unwrap_or(Usd::ZERO);
        Estimate {
            request_id: request_id.0.clone(),
            cost: Usd::from_nanos(cost.nanos().saturating_mul(steps)),
            tokens: tokens(route.usage(&chat, first.and_then(|candidate| candidate.entry.as_ref()))).saturating_mul(steps),
        }
    };
    let reservation = match state.guard.reserve(&context, &estimate_of(&route)).await {
        Ok(reservation) => reservation,
        Err(BudgetDenial::Downgrade(_)) => {
            // The agent's budget is spent and it asked to be downgraded: cheapest candidates first.
            cheapest_first(&mut route, "downgraded: the agent's daily budget is spent");
            state.guard.reserve_downgraded(&context, &estimate_of(&route)).await.map_err(|denial| denial.to_api_error())?
        }
        Err(denial) => return Err(denial.to_api_error()),
    };
    let routing_overhead = started.elapsed();

    let mut failures: Vec<(String, UpstreamError)> = Vec::new();
    // The soonest an open circuit among the candidates lets a trial through.
    let mut circuit_wait: Option<std::time::Duration> = None;
    let last = route.candidates.len() - 1;
    for (index, candidate) in route.candidates.iter().enumerate() {
        let Some(api_key) = config.credential(candidate.provider.id) else { continue };
        if let Admission::Skip(wait) = state.circuits.admit(candidate.id()) {
            circuit_wait = Some(circuit_wait.map_or(wait, |soonest| soonest.min(wait)));
            continue;
        }
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
        set_value!(&mut headers, "x-br-routing-overhead-ms", header_value::shown(Millis(routing_overhead)));
        set_value!(&mut headers, "x-model-router-latency-ms", header_value::shown(Millis(router_latency)));
        let outcome = if chat.stream {
            state.upstream.stream(&target, &chat).await.map(Ok)
        } else {
            state.upstream.complete(&target, &chat).await.map(Err)
        };
        let provider_latency = provider_started.elapsed();
        facts.model_executed = candidate.id().to_string();
        facts.provider = candidate.provider.id.to_string();
        set_value!(&mut headers, "x-br-provider-latency-ms", header_value::shown(Millis(provider_latency)));
        match &outcome {
            Ok(_) => state.circuits.succeeded(candidate.id()),
            Err(error) => {
                if state.circuits.failed(candidate.id(), error) {
                    tracing::warn!(model = candidate.id(), "circuit opened: the model's provider keeps failing");
                }
            }
        }
        match outcome {
            Ok(Ok(events)) => {
                budget_headers(&mut headers, reservation.remaining());
                let spec = stream_spec(candidate, reply_id, format, &chat, route.input_tokens);
                let (evidence, pending) = tokio::sync::oneshot::channel();
                facts.stream_evidence = Some(evidence);
                let output_scan = output_scanned.then(|| OutputScan { guardian: state.guardian.clone(), tenant_id: tenant_id.to_string() });
                return Ok(relay(events, headers, spec, reservation, reply_guard.take(), Some(pending), output_scan));
            }
            Ok(Err(mut reply)) => {
                // The agent loop's steps run on this candidate; the guardian judges each reply.
                let looped = match agent.as_mut() {
                    Some(agent) => {
                        let guard = (reply_guard.as_ref(), guardian_off);
                        Some(agent_steps(state, tenant_id, agent, (&target, &mut chat), &mut reply, guard, facts).await)
                    }
                    None => None,
                };
                if let Some(agent) = &agent {
                    agent.headers(&mut headers);
                    facts.reason = format!("{}; {}", facts.reason, agent.summary());
                    if agent.streams() && matches!(looped, Some(Ok(()))) {
                        // The client asked for a stream: the final reply is streamed (and settled
                        // by the relay, as a provider's stream would be).
                        budget_headers(&mut headers, reservation.remaining());
                        let spec = stream_spec(candidate, reply_id, format, &chat, route.input_tokens);
                        let (evidence, pending) = tokio::sync::oneshot::channel();
                        facts.stream_evidence = Some(evidence);
                        let events = futures::stream::iter(reply_events(&reply).into_iter().map(Ok)).boxed();
                        return Ok(relay(events, headers, spec, reservation, None, Some(pending), None));
                    }
                }
                let cost = price_of(candidate).map_or(Usd::ZERO, |price| price.cost(reply.usage));
                facts.input_tokens = reply.usage.input_tokens;
                facts.output_tokens = reply.usage.output_tokens;
                facts.cost = Some(cost);
                match reservation.settle(succeeded(candidate, cost, reply.usage, provider_latency)).await {
                    Ok(remaining) => budget_headers(&mut headers, &remaining),
                    Err(error) => tracing::error!(%error, "settling a completion failed; the reservation stays counted"),
                }
                match looped {
                    // The loop's replies were judged as they came.
                    Some(judged) => judged?,
                    None => {
                        // Stored as the provider gave it (a hit is judged by the guardian again).
                        let stored = cache_key.map(|key| (key, reply.clone()));
                        guard_whole_reply(state, tenant_id, reply_guard.as_ref(), guardian_off, &mut reply, facts).await?;
                        if let (Some((key, raw)), Some(cache)) = (stored, &state.response_cache) {
                            cache.put(key, raw, candidate.id(), cost);
                        }
                    }
                }
                cache_use.headers(&mut headers);
                set_value!(&mut headers, "x-br-total-latency-ms", header_value::shown(Millis(started.elapsed())));
                return Ok(reply_response(reply, headers, candidate, &route, reply_id, format));
            }
            Err(error) => {
                tracing::warn!(provider = candidate.provider.id, model = %candidate.model, %error, "upstream call failed");
                let fall_back = error.may_fall_back() && index < last;
                failures.push((candidate.id().to_string(), error));
                if !fall_back {
                    break;
                }
            }
        }
    }
    // Nothing was spent: give the reservation back; a provider's failure is recorded (as `failed`,
    // on the last model tried), so usage, success rates and learned routing count it.
    let released = match failures.last() {
        Some((model, _)) => {
            let provider = model.split('/').next().unwrap_or_default().to_string();
            reservation.release_failed(model.clone(), provider, None).await
        }
        None => reservation.release().await,
    };
    if let Err(error) = released {
        tracing::warn!(%error, "releasing a reservation failed");
    }
    let Some((failed_model, error)) = failures.pop() else {
        if let Some(wait) = circuit_wait {
            let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
            return Err(ApiError::circuit_open(
                format!("every candidate model's circuit is open after repeated provider failures (the first of them: {})", chat.model),
                wait_ms,
            ));
        }
        return Err(ApiError::model_unavailable("no candidate model has a usable provider key"));
    };
    let provider = failed_model.split('/').next().unwrap_or_default();
    Err(ApiError::provider_error(error.status(), provider, format!("{failed_model}: {error}")))
}

/// The agent loop from its first reply, on one candidate: each reply is judged by the guardian (the
/// tool firewall masks or blocks a memory call before it runs), its memory calls run and are
/// answered back, and the model is called again, until it answers, calls the client's tools, or
/// has no step left. `reply` ends as the final reply carrying every step's token counts; an error
/// (the guardian's, or a provider's on a later step) still leaves them there, as spent.
async fn agent_steps(
    state: &EdgeState,
    tenant_id: &str,
    agent: &mut AgentLoop,
    (target, chat): (&Target<'_>, &mut ChatRequest),
    reply: &mut ChatReply,
    (reply_guard, guardian_off): (Option<&ReplyGuard>, bool),
    facts: &mut AuditFacts,
) -> Result<(), ApiError> {
    agent.stepped();
    let mut spent = reply.usage;
    let outcome = loop {
        if let Err(error) = guard_whole_reply(state, tenant_id, reply_guard, guardian_off, reply, facts).await {
            break Err(error);
        }
        if reply.finish == FinishReason::ContentFilter || !agent.continues(reply) {
            agent.finish(state, reply).await;
            break Ok(());
        }
        agent.answer_calls(state, chat, reply).await;
        let next = state.upstream.complete(target, chat).await;
        let model = [target.provider.id, "/", target.model].concat();
        agent.stepped();
        match next {
            Ok(next) => {
                state.circuits.succeeded(&model);
                crate::agent_loop::add_usage(&mut spent, next.usage);
                *reply = next;
            }
            Err(error) => {
                state.circuits.failed(&model, &error);
                break Err(ApiError::provider_error(error.status(), target.provider.id, format!("{model} (agent loop step): {error}")));
            }
        }
    };
    reply.usage = spent;
    outcome
}

/// A request the response cache answers, and what answering it needs.
struct Cached<'a> {
    context: &'a BudgetContext,
    route: &'a Route,
    /// The route's candidate that gave the stored answer.
    candidate: &'a Candidate,
    chat: &'a ChatRequest,
    hit: std::sync::Arc<CachedReply>,
    reply_id: String,
    started: Instant,
}

/// Answers from the response cache. The request is admitted as one that costs nothing (rate limits
/// and spent budgets still refuse it) and settled at $0 on `brainstorm/cache`, so usage shows hits
/// apart and what routing learns of the model is not skewed; the stored reply is judged by the
/// guardian as a fresh one would be.
async fn answer_from_cache(
    state: &EdgeState,
    tenant_id: &str,
    request_id: &RequestId,
    cached: Cached<'_>,
    (reply_guard, guardian_off): (Option<&ReplyGuard>, bool),
    format: ClientFormat,
    facts: &mut AuditFacts,
) -> Result<Response, ApiError> {
    let Cached { context, route, candidate, chat, hit, reply_id, started } = cached;
    let estimate = Estimate { request_id: request_id.0.clone(), cost: Usd::ZERO, tokens: 0 };
    let reservation = match state.guard.reserve(context, &estimate).await {
        Ok(reservation) => reservation,
        Err(BudgetDenial::Downgrade(_)) => {
            state.guard.reserve_downgraded(context, &estimate).await.map_err(|denial| denial.to_api_error())?
        }
        Err(denial) => return Err(denial.to_api_error()),
    };
    let mut headers = route_headers(route, candidate, &[], chat);
    facts.model_executed.clone_from(&hit.model);
    facts.provider = response_cache::CACHE_PROVIDER.to_string();
    facts.reason = format!("{}; answered from the response cache (stored {} s ago)", route.reason, hit.age_seconds());
    facts.cost = Some(Usd::ZERO);
    let actual = ActualUsage {
        cost: Usd::ZERO,
        input_tokens: 0,
        output_tokens: 0,
        model: response_cache::CACHE_MODEL.to_string(),
        provider: response_cache::CACHE_PROVIDER.to_string(),
        outcome: Outcome::Succeeded,
        latency_ms: u64::try_from(started.elapsed().as_millis()).ok(),
    };
    match reservation.settle(actual).await {
        Ok(remaining) => budget_headers(&mut headers, &remaining),
        Err(error) => tracing::error!(%error, "settling a cached answer failed; the reservation stays counted"),
    }
    let mut reply = hit.reply.clone();
    guard_whole_reply(state, tenant_id, reply_guard, guardian_off, &mut reply, facts).await?;
    response_cache::hit_headers(&mut headers, &hit);
    set_value!(&mut headers, "x-br-actual-cost", header_value::shown(Usd::ZERO.fixed(6)));
    set_value!(&mut headers, "x-br-total-latency-ms", header_value::shown(Millis(started.elapsed())));
    reply.id = reply_id;
    reply.model.clone_from(&hit.model);
    Ok(answer(&reply, headers, format, Usd::ZERO.to_json(), &route.strategy))
}

/// Orders the route's candidates cheapest first (unpriced ones last) and says why in its reason.
fn cheapest_first(route: &mut Route, why: &str) {
    route.candidates.sort_by_key(|candidate| candidate.estimated_cost.map_or(i64::MAX, Usd::nanos));
    route.reason = format!("{}; {why}", route.reason);
}

/// The guardian on a whole reply: the tool firewall and approvals on its tool calls, then the output
/// guardrails (when the tenant turned `scanOutput` on).
async fn guard_whole_reply(
    state: &EdgeState,
    tenant_id: &str,
    guard: Option<&ReplyGuard>,
    guardian_off: bool,
    reply: &mut ChatReply,
    facts: &mut AuditFacts,
) -> Result<(), ApiError> {
    let started = Instant::now();
    let mut report = GuardReport::default();
    let guarded = match guard {
        Some(guard) => guard.guard_reply(reply, &mut report).await,
        None => Ok(()),
    };
    facts.guardian_headers.append(&mut report.headers);
    if let Some(status) = report.status {
        facts.guardian_status = status;
    }
    if reply.finish == FinishReason::ContentFilter && report.status == Some("blocked") {
        facts.denial = Some("tool_firewall_blocked");
    }
    if guarded.is_ok()
        && !guardian_off
        && let Some(scan) = state.guardian.scan_output(tenant_id, &reply.readable_text()).await?
    {
        if scan.action != brainstorm_policy_firewall::ScanAction::Pass {
            facts.guardian_headers.extend(scan.headers());
            facts.guardian_status = if scan.action == brainstorm_policy_firewall::ScanAction::Block { "blocked" } else { "warned" };
        }
        if let Some(error) = scan.api_error() {
            facts.guardian_overhead += started.elapsed();
            return Err(error);
        }
    }
    facts.guardian_overhead += started.elapsed();
    guarded
}

fn reply_id(request_id: &RequestId, format: ClientFormat) -> String {
    let suffix = request_id.0.trim_start_matches("req_");
    match format {
        ClientFormat::OpenAi => ["chatcmpl-", suffix].concat(),
        ClientFormat::Anthropic => ["msg_", suffix].concat(),
    }
}

/// Sets header `name` to `value` when `value` is a valid header value.
fn put(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(name, value);
    }
}

/// Actual cost as a share of the estimate (1 = the whole estimate was spent).
fn efficiency(actual: Usd, estimated: Usd) -> Option<Efficiency> {
    (estimated.nanos() > 0).then(|| Efficiency(i128::from(actual.nanos()) * 10_000 / i128::from(estimated.nanos())))
}

/// A ratio in ten-thousandths, shown with four decimals (`0.4500`).
struct Efficiency(i128);

impl std::fmt::Display for Efficiency {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let magnitude = self.0.unsigned_abs();
        let whole = u64::try_from(magnitude / 10_000).unwrap_or(u64::MAX);
        brainstorm_common::money::write_fixed(formatter, self.0 < 0, whole, (magnitude % 10_000) as u64, 4)
    }
}

fn route_headers(route: &Route, candidate: &Candidate, failures: &[(String, UpstreamError)], chat: &ChatRequest) -> HeaderMap {
    // An answer carries up to about forty headers (routing, cost, budget, evidence): room for them at
    // once instead of growing the map three times.
    let mut headers = HeaderMap::with_capacity(40);
    set!(&mut headers, "x-br-routed-model", candidate.id());
    if let Some(first) = route.candidates.first() {
        set!(&mut headers, "x-br-resolved-model", first.id());
    }
    set!(&mut headers, "x-br-upstream-model", &candidate.model);
    set_value!(&mut headers, "x-br-selection-method", header_value::fixed(route.method.as_str()));
    set!(&mut headers, "x-br-route-reason", &route.reason);
    headers.insert(const { HeaderName::from_static("x-br-models-considered") }, HeaderValue::from(route.candidates.len()));
    set_value!(&mut headers, "x-model-router-endpoint", header_value::fixed(candidate.provider.id));
    if let Some(entry) = &candidate.entry {
        set_value!(&mut headers, "x-br-quality-tier", header_value::shown(entry.tier));
        deprecation_headers(&mut headers, entry);
    }
    if let Some((tier, score)) = route.complexity {
        set_value!(&mut headers, "x-br-complexity-level", header_value::shown(tier));
        set_value!(&mut headers, "x-br-complexity-score", header_value::shown(score));
    }
    if let Some(selection) = &route.selection {
        set_value!(&mut headers, "x-br-selection-confidence", header_value::formatted(format_args!("{:.2}", selection.confidence)));
        set!(&mut headers, "x-br-selection-reason", &selection.reason);
        if let Some(savings) = selection.savings {
            set_value!(&mut headers, "x-br-routing-savings", header_value::shown(savings.fixed(6)));
        }
    }
    if let (true, Some(estimate)) = (chat.model != "auto", candidate.estimated_cost) {
        set_value!(&mut headers, "x-br-estimated-cost", header_value::shown(estimate.fixed(6)));
        let usage = route.usage(chat, candidate.entry.as_ref());
        set_value!(
            &mut headers,
            "x-br-estimated-cost-basis",
            header_value::formatted(format_args!("input~{} tokens, output<={} tokens", usage.input_tokens, usage.output_tokens)),
        );
    }
    if let Some((first_failed, _)) = failures.first() {
        set!(&mut headers, "x-br-failover-from", first_failed);
        let mut path: Vec<&str> = failures.iter().map(|(model, _)| model.as_str()).collect();
        path.push(candidate.id());
        set!(&mut headers, "x-br-failover-path", &path.join(","));
    }
    headers
}

/// `X-BR-Deprecation`, `Deprecation` (RFC 9745), `Sunset` (RFC 8594) and `Link` for a deprecated
/// model: its own entry (`GET /v1/models/{id}`, which carries the deprecation) as `rel="deprecation"`,
/// and its replacement's as `rel="successor-version"` (RFC 5829).
fn deprecation_headers(headers: &mut HeaderMap, entry: &Model) {
    let Some(deprecation) = &entry.deprecated else { return };
    let mut notice = format!("{} deprecated on {}; sunset {}", entry.id(), deprecation.date, deprecation.sunset);
    if let Some(replacement) = &deprecation.replacement {
        notice.push_str(&format!("; use {replacement}"));
    }
    set!(headers, "x-br-deprecation", &notice);
    let midnight = |date: &str| {
        chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").ok().and_then(|day| day.and_hms_opt(0, 0, 0)).map(|time| time.and_utc())
    };
    if let Some(deprecated_at) = midnight(&deprecation.date) {
        set!(headers, "deprecation", &format!("@{}", deprecated_at.timestamp()));
    }
    if let Some(sunset) = midnight(&deprecation.sunset) {
        set!(headers, "sunset", &sunset.format("%a, %d %b %Y %H:%M:%S GMT").to_string());
    }
    let mut links = format!("</v1/models/{}>; rel=\"deprecation\"; type=\"application/json\"", entry.id());
    if let Some(replacement) = &deprecation.replacement {
        links.push_str(&format!(", </v1/models/{replacement}>; rel=\"successor-version\"; type=\"application/json\""));
    }
    set!(headers, "link", &links);
}

/// What a candidate's successful call cost, for the reservation's settlement.
fn succeeded(candidate: &Candidate, cost: Usd, usage: Usage, provider_latency: std::time::Duration) -> ActualUsage {
    ActualUsage {
        cost,
        input_tokens: i64::try_from(usage.input_tokens).unwrap_or(i64::MAX),
        output_tokens: i64::try_from(usage.output_tokens).unwrap_or(i64::MAX),
        model: candidate.id().to_string(),
        provider: candidate.provider.id.to_string(),
        outcome: Outcome::Succeeded,
        latency_ms: u64::try_from(provider_latency.as_millis()).ok(),
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
    reply.model = candidate.id().to_string();
    let cost = price_of(candidate).map(|price| price.cost(reply.usage));
    if let Some(cost) = cost {
        set_value!(&mut headers, "x-br-actual-cost", header_value::shown(cost.fixed(6)));
        if let Some(ratio) = candidate.estimated_cost.and_then(|estimate| efficiency(cost, estimate)) {
            set_value!(&mut headers, "x-br-efficiency", header_value::shown(ratio));
        }
    }
    answer(&reply, headers, format, cost.map_or(Value::Null, Usd::to_json), &route.strategy)
}

/// A whole reply in the client's format; OpenAI's usage also carries `cost_usd` and `routing_strategy`.
fn answer(reply: &ChatReply, headers: HeaderMap, format: ClientFormat, cost_usd: Value, strategy: &str) -> Response {
    match format {
        ClientFormat::OpenAi => {
            let extra = openai::UsageExtra { cost_usd: &cost_usd, routing_strategy: strategy };
            json_response(headers, &openai::render_reply(reply, chrono::Utc::now().timestamp(), Some(extra)))
        }
        ClientFormat::Anthropic => json_response(headers, &anthropic::render_reply(reply)),
    }
}

/// A 200 JSON answer carrying `headers` as they are: the map is moved into the response instead of
/// being inserted header by header (as `(headers, Json(..))` does), and the body is written once
/// into a buffer sized for a typical reply.
fn json_response(mut headers: HeaderMap, body: &impl serde::Serialize) -> Response {
    let mut buffer = Vec::with_capacity(768);
    match serde_json::to_writer(&mut buffer, body) {
        Ok(()) => {
            headers.insert(header::CONTENT_TYPE, const { HeaderValue::from_static("application/json") });
            let mut response = Response::new(Body::from(buffer));
            *response.headers_mut() = headers;
            response
        }
        Err(error) => {
            tracing::error!(%error, "a reply could not be serialized");
            ApiError::internal().into_response()
        }
    }
}

async fn sandbox_response(chat: &ChatRequest, id: String, format: ClientFormat, started: Instant, reservation: Reservation) -> Response {
    let reply = sandbox::sandbox_reply(chat, id);
    let mut headers = HeaderMap::new();
    set!(&mut headers, "x-br-routed-model", routing::SANDBOX_MODEL);
    set!(&mut headers, "x-br-resolved-model", routing::SANDBOX_MODEL);
    set!(&mut headers, "x-br-selection-method", "sandbox");
    set!(&mut headers, "x-br-route-reason", "no provider key registered: served by the sandbox model");
    if chat.model != "auto" {
        set!(&mut headers, "x-br-estimated-cost", "0.000000");
    }
    set!(&mut headers, "x-br-actual-cost", "0.000000");
    set_value!(&mut headers, "x-br-total-latency-ms", header_value::shown(Millis(started.elapsed())));
    if chat.stream {
        budget_headers(&mut headers, reservation.remaining());
        let events = futures::stream::iter(reply_events(&reply).into_iter().map(Ok)).boxed();
        let model = reply.model.clone();
        let spec = RelaySpec {
            id: reply.id,
            model,
            provider: "brainstorm".to_string(),
            price: Some(Price::default()),
            format,
            input_estimate: reply.usage.input_tokens,
            stream_usage: chat.stream_usage,
        };
        return relay(events, headers, spec, reservation, None, None, None);
    }
    let actual = ActualUsage {
        cost: Usd::ZERO,
        input_tokens: i64::try_from(reply.usage.input_tokens).unwrap_or(i64::MAX),
        output_tokens: i64::try_from(reply.usage.output_tokens).unwrap_or(i64::MAX),
        model: routing::SANDBOX_MODEL.to_string(),
        provider: "brainstorm".to_string(),
        outcome: Outcome::Succeeded,
        latency_ms: Some(0),
    };
    match reservation.settle(actual).await {
        Ok(remaining) => budget_headers(&mut headers, &remaining),
        Err(error) => tracing::error!(%error, "settling a sandbox completion failed"),
    }
    answer(&reply, headers, format, Usd::ZERO.to_json(), "price")
}

/// What a stream from `candidate` relays: ids, price and the client's format.
fn stream_spec(candidate: &Candidate, id: String, format: ClientFormat, chat: &ChatRequest, input_estimate: u64) -> RelaySpec {
    RelaySpec {
        id,
        model: candidate.id().to_string(),
        provider: candidate.provider.id.to_string(),
        price: price_of(candidate),
        format,
        input_estimate,
        stream_usage: chat.stream_usage,
    }
}

struct RelaySpec {
    id: String,
    model: String,
    provider: String,
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
    fn begin(&mut self) -> Vec<String> {
        match self {
            Writer::OpenAi(writer) => writer.begin(),
            Writer::Anthropic(writer) => writer.begin(),
        }
    }

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

    /// A refusal inside a stream whose headers are gone: the error envelope as the client's SDK
    /// reads a stream error.
    fn refusal(&self, error: &ApiError) -> String {
        let body = error.body();
        match self {
            Writer::OpenAi(_) => format!("data: {body}\n\n"),
            Writer::Anthropic(_) => {
                let mut event = json!({"type": "error", "error": body["error"].clone(), "recovery": body["recovery"].clone()});
                event["error"]["type"] = json!(error.error_type);
                format!("event: error\ndata: {event}\n\n")
            }
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

/// Settles a stream's reservation exactly once: at its end, or when the client disconnects and the
/// body is dropped (then with what the upstream produced so far).
struct StreamSettlement {
    model: String,
    provider: String,
    price: Option<Price>,
    usage: Usage,
    started: Instant,
    reservation: Option<Reservation>,
    /// The request's audit record, completed and submitted when the stream settles.
    evidence: Option<tokio::sync::oneshot::Receiver<PendingEvidence>>,
}

/// A streamed request's audit record, waiting for the stream's end.
struct PendingEvidence {
    record: AuditRecord,
    publisher: brainstorm_audit_lineage::AuditPublisher,
    /// The liaison plan the stream's request claimed: committed once the stream's evidence is.
    plan: Option<Box<PlanSettler>>,
}

impl StreamSettlement {
    /// Completes the stream's audit record with what the stream used and submits it; returns the
    /// commitment and coverage for the trailer.
    fn submit_evidence(&mut self, outcome: Outcome, cost: Option<Usd>) -> Option<(String, &'static str)> {
        let PendingEvidence { mut record, publisher, plan } = self.evidence.take()?.try_recv().ok()?;
        record.input_tokens = i64::try_from(self.usage.input_tokens).unwrap_or(i64::MAX);
        record.output_tokens = i64::try_from(self.usage.output_tokens).unwrap_or(i64::MAX);
        record.cost_nanos = cost.map_or(0, Usd::nanos);
        record.latency_ms = record.latency_ms.saturating_add(i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX));
        match outcome {
            Outcome::Succeeded => {}
            Outcome::Failed => {
                record.outcome = "error".to_string();
                record.reason_code = "stream_failed".to_string();
            }
            Outcome::ClientDisconnected => record.reason_code = "client_disconnected".to_string(),
        }
        let settled_plan = plan.map(|plan| {
            let trace = record.trace.as_ref().map(|trace| format!("00-{}-{}-01", trace.trace_id, trace.span_id)).unwrap_or_default();
            let method = record.decision.as_ref().map(|decision| decision.selection_method.clone()).unwrap_or_default();
            (plan, trace, method, record.provider.clone(), record.strategy.clone(), record.latency_ms)
        });
        let submitted = match publisher.submit(record) {
            Ok(Submitted::Queued { commitment }) => Some((commitment, "captured")),
            Ok(Submitted::Dropped { commitment }) => Some((commitment, "dropped")),
            Err(error) => {
                tracing::error!(%error, "a stream's audit record could not be recorded");
                None
            }
        };
        if let Some((plan, traceparent, method, provider, strategy, latency_ms)) = settled_plan
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // The stream was answered: its plan is committed with the stream's cost and evidence.
            let commitment = submitted.as_ref().map(|(commitment, _)| commitment.clone()).unwrap_or_default();
            let usage = self.usage;
            runtime.spawn(async move {
                plan.settle(PlanOutcome {
                    answered: true,
                    provider: &provider,
                    strategy: &strategy,
                    selection_method: &method,
                    cost,
                    input_tokens: usage.input_tokens,
                    output_tokens: usage.output_tokens,
                    latency_ms,
                    audit_commitment: &commitment,
                    traceparent: &traceparent,
                    error_code: "",
                })
                .await;
            });
        }
        submitted
    }

    /// Settles (once), records the stream's evidence, and returns the exact cost and the evidence
    /// trailer (commitment, coverage).
    fn settle(&mut self, outcome: Outcome) -> (Option<Usd>, Option<(String, &'static str)>) {
        let cost = self.price.map(|price| price.cost(self.usage));
        let evidence = self.submit_evidence(outcome, cost);
        if let Some(reservation) = self.reservation.take() {
            tracing::debug!(model = %self.model, input_tokens = self.usage.input_tokens, output_tokens = self.usage.output_tokens, outcome = outcome.as_str(), "stream settled");
            reservation.settle_in_background(ActualUsage {
                cost: cost.unwrap_or(Usd::ZERO),
                input_tokens: i64::try_from(self.usage.input_tokens).unwrap_or(i64::MAX),
                output_tokens: i64::try_from(self.usage.output_tokens).unwrap_or(i64::MAX),
                model: self.model.clone(),
                provider: self.provider.clone(),
                outcome,
                latency_ms: u64::try_from(self.started.elapsed().as_millis()).ok(),
            });
        }
        (cost, evidence)
    }
}

impl Drop for StreamSettlement {
    fn drop(&mut self) {
        if self.reservation.is_some() || self.evidence.is_some() {
            self.settle(Outcome::ClientDisconnected);
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
    /// The tool firewall, when it applies: tool-call events are held until the calls are complete.
    guard: Option<ReplyGuard>,
    held: Vec<ToolCall>,
    /// A refusal (approval required) replaces the rest of the stream; it is sent at the end.
    refusal: Option<Bytes>,
    /// Output guardrails, when the tenant scans output: the whole reply is held until judged.
    output_scan: Option<OutputScan>,
    held_events: Vec<ChatEvent>,
}

/// The output guardrails a stream answers to.
pub struct OutputScan {
    pub guardian: std::sync::Arc<brainstorm_policy_firewall::Guardian>,
    pub tenant_id: String,
}

impl RelayState {
    /// Holds a tool-call event when the firewall applies; false means "write it now".
    fn hold(&mut self, event: &ChatEvent) -> bool {
        if self.guard.is_none() {
            return false;
        }
        let slot = |held: &mut Vec<ToolCall>, index: usize| {
            while held.len() <= index {
                held.push(ToolCall::default());
            }
            index
        };
        match event {
            ChatEvent::ToolCallStart { index, id, name } => {
                let index = slot(&mut self.held, *index);
                self.held[index].id = id.clone();
                self.held[index].name = name.clone();
                true
            }
            ChatEvent::ToolCallDelta { index, arguments } => {
                let index = slot(&mut self.held, *index);
                self.held[index].arguments.push_str(arguments);
                true
            }
            _ => false,
        }
    }

    /// The per-event path: tool calls held for the firewall, everything else written as it comes.
    async fn forward(&mut self, event: ChatEvent) {
        if self.refusal.is_some() || self.hold(&event) {
            return;
        }
        let event = match event {
            ChatEvent::Finish(_) if self.release().await => ChatEvent::Finish(FinishReason::ContentFilter),
            event => event,
        };
        if self.refusal.is_none() {
            self.pending.extend(self.writer.write(&event).into_iter().map(Bytes::from));
        }
    }

    /// Scans the whole held reply with the output guardrails, then lets it through (with the
    /// guardrail headers as SSE comments) or replaces it with the `guardrail_blocked` refusal.
    async fn judge_output(&mut self) {
        let Some(scan) = self.output_scan.take() else { return };
        let held = std::mem::take(&mut self.held_events);
        match scan.guardian.scan_output(&scan.tenant_id, &self.assembler.readable_text()).await {
            Ok(Some(result)) => {
                if result.action != brainstorm_policy_firewall::ScanAction::Pass {
                    for (name, value) in result.headers() {
                        self.pending.push_back(sse_comment(&name, &value));
                    }
                }
                if let Some(error) = result.api_error() {
                    self.refusal = Some(Bytes::from(self.writer.refusal(&error)));
                    return;
                }
            }
            Ok(None) => {}
            Err(error) => {
                // Fail closed: a reply the guardrails could not judge is not released.
                let error = ApiError::from(error);
                self.refusal = Some(Bytes::from(self.writer.refusal(&error)));
                return;
            }
        }
        for event in held {
            self.forward(event).await;
        }
    }

    /// Runs the firewall on the held calls and writes what it lets through. Returns true when the
    /// calls were blocked (the reply must finish with `content_filter`).
    async fn release(&mut self) -> bool {
        let Some(guard) = &self.guard else { return false };
        let calls = std::mem::take(&mut self.held);
        if calls.is_empty() {
            return false;
        }
        let mut report = GuardReport::default();
        let verdict = guard.inspect(calls, &mut report).await;
        for (name, value) in &report.headers {
            // Headers are gone by now: the firewall's verdict travels as SSE comments.
            self.pending.push_back(sse_comment(name, value));
        }
        match verdict {
            Ok(ToolVerdict::Calls(calls)) => {
                for (index, call) in calls.into_iter().enumerate() {
                    let start = ChatEvent::ToolCallStart { index, id: call.id, name: call.name };
                    let delta = ChatEvent::ToolCallDelta { index, arguments: call.arguments };
                    for event in [start, delta] {
                        self.pending.extend(self.writer.write(&event).into_iter().map(Bytes::from));
                    }
                }
                false
            }
            Ok(ToolVerdict::Blocked) => true,
            Err(error) => {
                self.refusal = Some(Bytes::from(self.writer.refusal(&error)));
                true
            }
        }
    }
}

/// A header as an SSE comment line (`: name=value`), for a stream whose headers are already sent.
fn sse_comment(name: &HeaderName, value: &HeaderValue) -> Bytes {
    Bytes::from(format!(": {name}={}\n\n", String::from_utf8_lossy(value.as_bytes())))
}

/// Streams `events` to the client in its format. Frames are produced as events arrive: the client's
/// reading pace is the upstream's reading pace, and dropping the body drops the upstream connection.
fn relay(
    events: EventStream,
    mut headers: HeaderMap,
    spec: RelaySpec,
    reservation: Reservation,
    guard: Option<ReplyGuard>,
    evidence: Option<tokio::sync::oneshot::Receiver<PendingEvidence>>,
    output_scan: Option<OutputScan>,
) -> Response {
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let mut writer = match spec.format {
        ClientFormat::OpenAi => {
            Writer::OpenAi(openai::StreamWriter::new(spec.id, spec.model.clone(), chrono::Utc::now().timestamp(), spec.stream_usage))
        }
        ClientFormat::Anthropic => Writer::Anthropic(anthropic::StreamWriter::new(spec.id, spec.model.clone(), spec.input_estimate)),
    };
    // The opening frame goes with the headers, before the first token: the client's first byte does
    // not wait for the provider's first event. Where output guardrails hold the whole reply, nothing
    // leaves before they have judged it (a refusal is then the stream's only event).
    let opening = if output_scan.is_none() { writer.begin() } else { Vec::new() };
    let state = RelayState {
        events,
        writer,
        assembler: ReplyAssembler::default(),
        settlement: StreamSettlement {
            model: spec.model,
            provider: spec.provider,
            price: spec.price,
            usage: Usage::default(),
            started: Instant::now(),
            reservation: Some(reservation),
            evidence,
        },
        pending: opening.into_iter().map(Bytes::from).collect(),
        ended: false,
        guard,
        held: Vec::new(),
        refusal: None,
        output_scan,
        held_events: Vec::new(),
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
                    if state.output_scan.is_some() {
                        // Output guardrails judge the whole reply: nothing leaves before they have.
                        let finished = matches!(event, ChatEvent::Finish(_));
                        state.held_events.push(event);
                        if finished {
                            state.judge_output().await;
                        }
                        continue;
                    }
                    state.forward(event).await;
                }
                Some(Err(error)) => {
                    state.pending.push_back(Bytes::from(state.writer.error(&format!("the provider stream failed: {error}"))));
                    state.ended = true;
                    state.settlement.usage = state.assembler.usage;
                    state.settlement.settle(Outcome::Failed);
                }
                None => {
                    // A reply still held (a stream that never said it finished) is judged now.
                    if state.output_scan.is_some() {
                        state.judge_output().await;
                    }
                    if state.release().await && state.refusal.is_none() {
                        state
                            .pending
                            .extend(state.writer.write(&ChatEvent::Finish(FinishReason::ContentFilter)).into_iter().map(Bytes::from));
                    }
                    state.ended = true;
                    state.settlement.usage = state.assembler.usage;
                    let (cost, evidence) = state.settlement.settle(Outcome::Succeeded);
                    // Headers are gone by now: the actual cost and the evidence travel as SSE comments.
                    if let Some(cost) = cost {
                        state.pending.push_back(Bytes::from(format!(": x-br-actual-cost={}\n\n", cost.fixed(6))));
                    }
                    if let Some((commitment, coverage)) = evidence {
                        state.pending.push_back(Bytes::from(format!(
                            ": x-br-audit-hash={commitment}\n\n: x-br-evidence-receipt=sha256:{commitment}\n\n: x-br-evidence-coverage={coverage}\n\n"
                        )));
                    }
                    match state.refusal.take() {
                        Some(refusal) => state.pending.push_back(refusal),
                        None => state.pending.extend(state.writer.end().into_iter().map(Bytes::from)),
                    }
                }
            }
        }
    });
    // The header map moves into the response whole (see `json_response`).
    let mut response = Response::new(Body::from_stream(body));
    *response.headers_mut() = headers;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efficiency_is_exact_to_four_places() {
        let shown = |actual, estimated| efficiency(Usd::from_nanos(actual), Usd::from_nanos(estimated)).map(|ratio| ratio.to_string());
        assert_eq!(shown(450, 1_000), Some("0.4500".to_string()));
        assert_eq!(shown(1, 3), Some("0.3333".to_string()));
        assert_eq!(shown(5, 0), None);
        assert_eq!(Usd::from_nanos(450_000).fixed(6).to_string(), "0.000450");
    }
}
