//! An agent's own endpoints: bootstrap with a tenant API key (a profile and an agent JWT), then the
//! JWT-authenticated views of itself (`/v1/agent/status`, `/limits/me`, `/anomaly/me`,
//! `/profiles/me`, `/v1/self`). Snake_case, as the spec spells these.

use crate::extract::Path;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::{Extension, Json};
use brainstorm_budget_ledger::{BudgetContext, ScopeKind, ScopeLevel};
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_common::time::parse_timestamp;
use brainstorm_proto::ServiceError;
use brainstorm_proto::budget::{AgentBudget, AgentLimit, PutAgentBudgetRequest, TenantRef as BudgetTenantRef, WriteAgentLimitsRequest};
use brainstorm_proto::identity::{
    AgentProfile, AgentProfileRef, BootstrapAgentRequest, DelegateAgentRequest, EndSubAgentRequest, EndedSubAgent,
    IssueAgentCertificateRequest, TenantRef,
};
use brainstorm_proto::policy::ListAnomaliesRequest;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::{self, AgentCaller, AgentCredential, Caller, ClientCertificate};
use crate::extract::{JsonBody, OptionalJsonBody};
use crate::routes::agent_certificates;
use crate::routes::agents::nanos;
use crate::routes::budget::optional_usd;
use crate::{EdgeState, activity};
use crate::{self_view, views};

type Answer = Result<Json<Value>, ApiError>;

/// The permission bootstrap needs: a key that may drive completions may bring up its agent.
const BOOTSTRAP: &str = "router.write";
/// Recent anomaly events shown for one agent.
const RECENT_ANOMALIES: usize = 50;
/// The rate a bootstrapped agent gets when it has no `/v1/agent-limits` entry and the bootstrapping
/// key has no tighter one: completions attributed to it per minute (an operator changes it with
/// `PATCH /v1/agent-limits`).
pub const DEFAULT_AGENT_RPM: u32 = 600;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapBody {
    agent_id: Option<String>,
    owner_id: Option<String>,
    display_name: Option<String>,
    cost_center: Option<String>,
    budget_daily_usd: Option<serde_json::Number>,
    budget_monthly_usd: Option<serde_json::Number>,
    metadata: Option<Value>,
}

/// `POST /v1/agent/bootstrap` (a tenant API key with `router.write`; an agent JWT or a client
/// certificate alone is refused): 201
/// with a new profile (active; owner `owner_id`, else `key:<the bootstrapping key's id>`) or 200
/// with the existing one, and a fresh agent JWT either way. A profile created with
/// `budget_daily_usd` gets that budget enforced (the ledger's agent budget, action `stop`) unless
/// the agent already has one.
pub async fn bootstrap(
    State(state): State<EdgeState>,
    headers: HeaderMap,
    certificate: Option<Extension<ClientCertificate>>,
    caller: Result<Caller, ApiError>,
    JsonBody(body): JsonBody<BootstrapBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if auth::presents_jwt(&headers) {
        return Err(ApiError::forbidden("api_key_required", "bootstrap takes a tenant API key, not an agent JWT"));
    }
    if certificate.is_some() && !auth::presents_credential(&headers) {
        return Err(ApiError::forbidden("api_key_required", "bootstrap takes a tenant API key, not a client certificate"));
    }
    let caller = caller?;
    caller.require(BOOTSTRAP)?;
    let tenant_id = caller.tenant_id()?.to_string();
    let agent_id = body
        .agent_id
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
        .ok_or_else(|| ApiError::invalid_request("agent_id_required", "agent_id is required"))?;
    // The token's trust envelope carries an XDR's risk score in force for the agent.
    let risk = state.guardian.config(&tenant_id).await?.agent_risk(&agent_id).cloned();
    let request = BootstrapAgentRequest {
        tenant_id: tenant_id.clone(),
        agent_id: agent_id.clone(),
        owner_id: body.owner_id,
        display_name: body.display_name,
        cost_center: body.cost_center,
        budget_daily_nanos: nanos("budget_daily_usd", body.budget_daily_usd.as_ref())?,
        budget_monthly_nanos: nanos("budget_monthly_usd", body.budget_monthly_usd.as_ref())?,
        metadata_json: body.metadata.map(|metadata| metadata.to_string()),
        // Keys belong to the tenant, not to a user: the key that brings the agent up answers for it.
        key_owner_id: Some(format!("key:{}", caller.identity.key_id)),
        xdr_risk: risk.as_ref().map(|risk| risk.risk_score),
        xdr_risk_source: risk.map(|risk| risk.source),
    };
    let bootstrapped = state.identity.bootstrap_agent(request).await?;
    let profile = bootstrapped.profile.ok_or_else(ApiError::internal)?;
    // Created, or moved from provisioned: this edge's view of whether it may act is stale.
    state.authenticator.evict_agent(&tenant_id, &agent_id);
    let mut budget = state.budget_settings.agent(&tenant_id, &agent_id).await?;
    if bootstrapped.created
        && budget.is_none()
        && let Some(per_day_nanos) = profile.budget_daily_nanos
    {
        budget = Some(put_budget(&state, &tenant_id, &agent_id, per_day_nanos, "stop").await?);
    }
    if bootstrapped.created {
        let key_rpm = caller.identity.key.as_ref().and_then(|key| key.rate_limit_rpm);
        default_rate(&state, &tenant_id, &agent_id, key_rpm).await?;
    }
    let minted =
        Minted { profile, token: bootstrapped.token, token_expires_at: bootstrapped.token_expires_at, created: bootstrapped.created };
    minted.answer(&state, &caller.identity.plan, budget.as_ref(), json!({})).await
}

/// A profile with a fresh JWT (bootstrap and delegation answer alike).
struct Minted {
    profile: AgentProfile,
    token: String,
    token_expires_at: String,
    created: bool,
}

impl Minted {
    /// 201 (created) or 200: `{profile, jwt, jwt_expires_at, budget, next_steps}` and `extra`'s members.
    async fn answer(
        self,
        state: &EdgeState,
        plan: &str,
        budget: Option<&AgentBudget>,
        extra: Value,
    ) -> Result<(StatusCode, Json<Value>), ApiError> {
        let profile = &self.profile;
        let limit = state.budget_settings.agent_limit(&profile.tenant_id, &profile.agent_id).await?;
        let enforced = Enforced::of(plan, &profile.tenant_id, &profile.agent_id, budget, limit.as_ref());
        let agent = &profile.agent_id;
        let mut body = json!({
            "profile": views::agent_profile(profile),
            "jwt": self.token,
            "jwt_expires_at": self.token_expires_at,
            "budget": {
                "profile_daily_usd": optional_usd(profile.budget_daily_nanos),
                "profile_monthly_usd": optional_usd(profile.budget_monthly_nanos),
                "enforced_daily_usd": optional_usd(enforced.daily_nanos()),
                "enforced_rpm": enforced.rpm(),
            },
            "next_steps": {
                "authenticate": "send the jwt as `Authorization: Bearer <jwt>` to GET /v1/agent/status, /v1/agent/profiles/me, /v1/agent/limits/me and /v1/agent/anomaly/me",
                "completions": format!("call /v1/chat/completions or /v1/messages with the tenant API key and the header `X-BR-Agent-Id: {agent}`, so this agent's budget, kill switches and evidence apply"),
                "refresh": "bootstrap again before jwt_expires_at: the same profile, a fresh jwt",
                "status": "GET /v1/agent/status",
            },
        });
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        Ok((if self.created { StatusCode::CREATED } else { StatusCode::OK }, Json(body)))
    }
}

/// Gives a new agent without a `/v1/agent-limits` entry one with a rate (`inherited`: the
/// bootstrapping key's, or a sub-agent's parent's, when it has one; else [`DEFAULT_AGENT_RPM`]), so
/// its enforced rate is a number from the start; an entry an operator wrote first stays as it is.
/// A failed write is 503, as the spec has it.
async fn default_rate(state: &EdgeState, tenant_id: &str, agent_id: &str, inherited: Option<u32>) -> Result<(), ApiError> {
    let unavailable = |error: ServiceError| {
        tracing::warn!(tenant_id, agent_id, error = %error.message, "cannot write a bootstrapped agent's rate limit");
        ApiError::unavailable("agent_limits_unavailable", "the agent's limits could not be written; bootstrap again")
    };
    let current = state.budget.get_agent_limits(BudgetTenantRef { tenant_id: tenant_id.to_string() }).await.map_err(unavailable)?;
    if current.limits.contains_key(agent_id) {
        return Ok(());
    }
    let limit = AgentLimit { max_budget_nanos: None, max_requests_per_minute: Some(inherited.unwrap_or(DEFAULT_AGENT_RPM)) };
    let request = WriteAgentLimitsRequest {
        tenant_id: tenant_id.to_string(),
        merge: true,
        set: [(agent_id.to_string(), limit)].into_iter().collect(),
        removed: Vec::new(),
    };
    state.budget.write_agent_limits(request).await.map_err(unavailable)?;
    state.budget_settings.evict(tenant_id);
    Ok(())
}

/// Sets an agent's ledger budget (what the guard refuses on) and forgets this edge's cached copy.
async fn put_budget(state: &EdgeState, tenant_id: &str, agent_id: &str, per_day_nanos: i64, action: &str) -> Result<AgentBudget, ApiError> {
    let put = PutAgentBudgetRequest {
        tenant_id: tenant_id.to_string(),
        agent_id: agent_id.to_string(),
        per_day_nanos,
        exhaustion_action: action.to_string(),
    };
    let budget = state.budget.put_agent_budget(put).await?;
    state.budget_settings.evict(tenant_id);
    Ok(budget)
}

/// After its profile's daily budget moved (delegation, refund): a parent with a ledger budget gets
/// the profile's amount there too, so what is enforced follows what was moved.
async fn follow_parent_budget(state: &EdgeState, parent: &AgentProfile) -> Result<(), ApiError> {
    let enforced = state.budget_settings.agent(&parent.tenant_id, &parent.agent_id).await?;
    if let (Some(enforced), Some(per_day_nanos)) = (enforced, parent.budget_daily_nanos) {
        put_budget(state, &parent.tenant_id, &parent.agent_id, per_day_nanos, &enforced.exhaustion_action).await?;
    }
    Ok(())
}

/// The agent's level today in the counters its budget is enforced on (`context` names the agent).
async fn agent_daily_level(state: &EdgeState, context: &BudgetContext) -> Result<Option<ScopeLevel>, ApiError> {
    let view = state.guard.remaining(context).await.map_err(counters_unavailable)?;
    Ok(view.levels.into_iter().find(|level| level.scope.kind == ScopeKind::AgentDaily))
}

/// An agent's spend today, by the counters its budget is enforced on.
async fn spent_today(state: &EdgeState, plan: &str, tenant_id: &str, agent_id: &str) -> Result<i64, ApiError> {
    let context = BudgetContext::new(tenant_id, plan).with_agent(agent_id, None);
    Ok(agent_daily_level(state, &context).await?.map_or(0, |level| level.spent))
}

/// 503 `budget_unavailable`: the budget counters (in memory or Redis) could not be read.
pub(crate) fn counters_unavailable(error: brainstorm_budget_ledger::CounterError) -> ApiError {
    tracing::warn!(%error, "cannot read the budget counters");
    ApiError::unavailable("budget_unavailable", "the budget counters cannot be read right now")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegateBody {
    agent_id: Option<String>,
    budget_allocation_usd: Option<serde_json::Number>,
    requested_role: Option<String>,
    requested_name: Option<String>,
    ttl_seconds: Option<u32>,
    metadata: Option<Value>,
}

/// `POST /v1/agent/delegate` (agent JWT; an active parent whose metadata holds `can_delegate:
/// true`): creates a sub-agent with `budget_allocation_usd` moved from the parent's daily budget (the
/// parent keeps at least USD 0.01, else 402), a role at most the parent's, an optional lifetime;
/// answered like bootstrap, with the parent's remaining budget. Again for the same child: 200,
/// nothing moved, a fresh JWT.
pub async fn delegate(
    State(state): State<EdgeState>,
    agent: AgentCaller,
    JsonBody(body): JsonBody<DelegateBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    agent.require_jwt()?;
    agent.require_owner()?;
    let child_id = body
        .agent_id
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
        .ok_or_else(|| ApiError::invalid_request("agent_id_required", "agent_id is required"))?;
    let allocation = nanos("budget_allocation_usd", body.budget_allocation_usd.as_ref())?
        .ok_or_else(|| ApiError::invalid_request("allocation_required", "budget_allocation_usd is required"))?;
    end_expired_children(&state, &agent).await?;
    let request = DelegateAgentRequest {
        tenant_id: agent.tenant.id.clone(),
        parent_agent_id: agent.profile.agent_id.clone(),
        parent_profile_id: agent.profile.id.clone(),
        agent_id: child_id.clone(),
        allocation_nanos: allocation,
        role: body.requested_role,
        display_name: body.requested_name,
        ttl_seconds: body.ttl_seconds,
        metadata_json: body.metadata.map(|metadata| metadata.to_string()),
    };
    let delegated = state.identity.delegate_agent(request).await?;
    let (Some(child), Some(parent)) = (delegated.profile, delegated.parent) else { return Err(ApiError::internal()) };
    state.authenticator.evict_agent(&child.tenant_id, &child.agent_id);
    let budget = if delegated.created {
        // The allocation is the child's enforced budget; the parent's follows what it gave.
        follow_parent_budget(&state, &parent).await?;
        // A sub-agent is held to its parent's rate: it cannot outrun the agent that made it.
        let parent_rpm =
            state.budget_settings.agent_limit(&parent.tenant_id, &parent.agent_id).await?.and_then(|limit| limit.max_requests_per_minute);
        default_rate(&state, &child.tenant_id, &child.agent_id, parent_rpm).await?;
        Some(put_budget(&state, &child.tenant_id, &child.agent_id, allocation, "stop").await?)
    } else {
        state.budget_settings.agent(&child.tenant_id, &child.agent_id).await?
    };
    let parent_view = json!({"parent": {"agent_id": parent.agent_id, "budget_daily_usd": optional_usd(parent.budget_daily_nanos)}});
    let minted =
        Minted { profile: child, token: delegated.token, token_expires_at: delegated.token_expires_at, created: delegated.created };
    minted.answer(&state, &agent.tenant.plan, budget.as_ref(), parent_view).await
}

/// Terminates one of the caller's sub-agents, refunding what it left unspent today.
async fn end_child(state: &EdgeState, parent: &AgentCaller, child: &AgentProfile) -> Result<EndedSubAgent, ApiError> {
    let spent = spent_today(state, &parent.tenant.plan, &child.tenant_id, &child.agent_id).await?;
    let refund = child.budget_daily_nanos.unwrap_or(0).saturating_sub(spent).max(0);
    let request = EndSubAgentRequest {
        tenant_id: child.tenant_id.clone(),
        parent_agent_id: parent.profile.agent_id.clone(),
        child_agent_id: child.agent_id.clone(),
        refund_nanos: refund,
    };
    let ended = state.identity.end_sub_agent(request).await?;
    state.authenticator.evict_agent(&child.tenant_id, &child.agent_id);
    if !ended.already_terminated {
        // Nothing more is spent under the child's id; the parent's enforced budget takes the refund.
        put_budget(state, &child.tenant_id, &child.agent_id, 0, "stop").await?;
        if let Some(parent) = &ended.parent {
            follow_parent_budget(state, parent).await?;
        }
    }
    Ok(ended)
}

/// The caller's sub-agents past their `expires_at` are ended (terminated, unspent budget refunded)
/// before it delegates or lists: expiry stops a child's own token at once, and its termination is
/// recorded at its parent's next call.
async fn end_expired_children(state: &EdgeState, parent: &AgentCaller) -> Result<Vec<AgentProfile>, ApiError> {
    let profiles = state.identity.list_agent_profiles(TenantRef { tenant_id: parent.tenant.id.clone() }).await?.profiles;
    let now = chrono::Utc::now();
    let mut live = Vec::new();
    for child in profiles.into_iter().filter(|profile| profile.parent_agent_id.as_deref() == Some(parent.profile.agent_id.as_str())) {
        if child.lifecycle_state == "terminated" {
            continue;
        }
        let expired = child.expires_at.as_deref().and_then(parse_timestamp).is_some_and(|expires_at| expires_at <= now);
        if expired {
            end_child(state, parent, &child).await?;
        } else {
            live.push(child);
        }
    }
    Ok(live)
}

/// `GET /v1/agent/sub-agents` (agent JWT): the caller's sub-agents that are not terminated.
pub async fn sub_agents(State(state): State<EdgeState>, agent: AgentCaller) -> Answer {
    agent.require_jwt()?;
    agent.require_owner()?;
    let children = end_expired_children(&state, &agent).await?;
    let listed: Vec<Value> = children
        .iter()
        .map(|child| {
            json!({
                "agent_id": child.agent_id,
                "display_name": child.display_name,
                "role": child.role,
                "budget_daily_usd": optional_usd(child.budget_daily_nanos),
                "lifecycle_state": child.lifecycle_state,
                "expires_at": child.expires_at,
                "created_at": child.created_at,
            })
        })
        .collect();
    Ok(Json(json!({"total": listed.len(), "sub_agents": listed})))
}

/// `DELETE /v1/agent/sub-agents/{child_agent_id}` (agent JWT, the child's parent): terminates it and
/// refunds its unspent daily budget to the parent; again: `already_terminated: true`, refund 0.
pub async fn end_sub_agent(State(state): State<EdgeState>, agent: AgentCaller, Path(child_agent_id): Path<String>) -> Answer {
    agent.require_jwt()?;
    agent.require_owner()?;
    let child = state.identity.get_agent_profile(AgentProfileRef { tenant_id: agent.tenant.id.clone(), agent_id: child_agent_id }).await?;
    let ended = end_child(&state, &agent, &child).await?;
    Ok(Json(json!({
        "ok": true,
        "terminated_agent_id": child.agent_id,
        "already_terminated": ended.already_terminated,
        "budget_refunded_usd": Usd::from_nanos(ended.refunded_nanos).to_json(),
    })))
}

/// What the guard enforces on an agent's completions: its budget capped by its `/v1/agent-limits`
/// entry, and that entry's rate.
struct Enforced {
    context: BudgetContext,
}

impl Enforced {
    fn of(plan: &str, tenant_id: &str, agent_id: &str, budget: Option<&AgentBudget>, limit: Option<&AgentLimit>) -> Self {
        let mut context = BudgetContext::new(tenant_id, plan).with_agent(agent_id, budget);
        if let Some(limit) = limit {
            context = context.with_agent_limit(limit);
        }
        Enforced { context }
    }

    fn agent(&self) -> Option<&brainstorm_budget_ledger::AgentContext> {
        self.context.agent.as_ref()
    }

    fn daily_nanos(&self) -> Option<i64> {
        self.agent().and_then(|agent| agent.budget).map(|budget| budget.per_day.nanos())
    }

    fn rpm(&self) -> Option<u32> {
        self.agent().and_then(|agent| agent.rate_limit_rpm)
    }
}

/// The agent's limits as enforced now: its profile's budgets, the enforced daily budget and rate, and
/// what today's spend and this minute's requests leave of them.
async fn limits(state: &EdgeState, agent: &AgentCaller) -> Result<Value, ApiError> {
    let (tenant_id, profile) = (&agent.tenant.id, &agent.profile);
    let budget = state.budget_settings.agent(tenant_id, &profile.agent_id).await?;
    let limit = state.budget_settings.agent_limit(tenant_id, &profile.agent_id).await?;
    let enforced = Enforced::of(&agent.tenant.plan, tenant_id, &profile.agent_id, budget.as_ref(), limit.as_ref());
    let level = agent_daily_level(state, &enforced.context).await?;
    let requests_this_minute = match enforced.rpm() {
        Some(rpm) => Some(state.guard.agent_requests_this_minute(tenant_id, &profile.agent_id, rpm).await.map_err(counters_unavailable)?),
        None => None,
    };
    Ok(json!({
        "profile_daily_usd": optional_usd(profile.budget_daily_nanos),
        "profile_monthly_usd": optional_usd(profile.budget_monthly_nanos),
        "enforced_daily_usd": optional_usd(enforced.daily_nanos()),
        "enforced_daily_spent_usd": optional_usd(Some(level.as_ref().map_or(0, |level| level.spent))),
        "enforced_daily_remaining_usd": optional_usd(level.as_ref().and_then(ScopeLevel::remaining)),
        "exhaustion_action": enforced.agent().and_then(|agent| agent.budget).map(|budget| budget.exhaustion_action.as_str()),
        "enforced_rpm": enforced.rpm(),
        "requests_this_minute": requests_this_minute,
    }))
}

/// The tenant's recent anomaly alerts about this agent, newest first.
async fn anomalies(state: &EdgeState, agent: &AgentCaller) -> Result<Vec<Value>, ApiError> {
    let list = state.policy.list_anomalies(ListAnomaliesRequest { tenant_id: agent.tenant.id.clone(), limit: 1000 }).await?;
    list.alerts
        .iter()
        .filter(|alert| alert.entity_type == "agent" && alert.entity_id == agent.profile.agent_id)
        .take(RECENT_ANOMALIES)
        .map(|alert| serde_json::to_value(alert).map_err(|_| ApiError::internal()))
        .collect()
}

fn governance(profile: &AgentProfile) -> Value {
    json!({"lifecycle_state": profile.lifecycle_state, "manifest_id": profile.manifest_id, "role": profile.role})
}

/// `GET /v1/agent/status` (agent JWT; allowed without an owner): profile, limits, recent anomalies,
/// governance.
pub async fn status(State(state): State<EdgeState>, agent: AgentCaller) -> Answer {
    let limits = limits(&state, &agent).await?;
    let recent_events = anomalies(&state, &agent).await?;
    let guardian = state.guardian.config(&agent.tenant.id).await?;
    let trust = guardian.agent_risk(&agent.profile.agent_id).map_or(Value::Null, |risk| {
        json!({
            "xdr_risk": risk.risk_score,
            "source": risk.source,
            "expires_at": risk.expires_at,
            "restricted": risk.risk_score >= brainstorm_policy_firewall::RESTRICTING_RISK,
        })
    });
    Ok(Json(json!({
        "profile": views::agent_profile(&agent.profile),
        "limits": limits,
        "anomaly": {"recent_events": recent_events},
        "governance": governance(&agent.profile),
        "trust": trust,
    })))
}

/// `GET /v1/agent/limits/me` (agent JWT).
pub async fn my_limits(State(state): State<EdgeState>, agent: AgentCaller) -> Answer {
    agent.require_owner()?;
    Ok(Json(json!({"limits": limits(&state, &agent).await?})))
}

/// `GET /v1/agent/anomaly/me` (agent JWT).
pub async fn my_anomalies(State(state): State<EdgeState>, agent: AgentCaller) -> Answer {
    agent.require_owner()?;
    Ok(Json(json!({"events": anomalies(&state, &agent).await?})))
}

/// `GET /v1/agent/profiles/me` (agent JWT; allowed without an owner).
pub async fn my_profile(agent: AgentCaller) -> Answer {
    Ok(Json(json!({"profile": views::agent_profile(&agent.profile)})))
}

/// `GET /v1/self`: who the presented credential is, an agent (its JWT or client certificate) or an API key, with the
/// spec's one-call view (`self_view`): identity, capabilities, health, budget, memory,
/// configuration, suggestions, recent errors, models available and endpoints. The platform
/// administrator, who belongs to no tenant, gets only who it is.
pub async fn whoami(State(state): State<EdgeState>, mut parts: Parts) -> Answer {
    if auth::presents_jwt(&parts.headers) || auth::presents_only_certificate(&parts) {
        let agent = AgentCaller::from_request_parts(&mut parts, &state).await?;
        agent.require_owner()?;
        let profile = &agent.profile;
        let principal = self_view::Principal {
            tenant_id: &agent.tenant.id,
            auth_method: agent.credential.name(),
            key_id: None,
            agent_id: Some(&profile.agent_id),
            roles: vec![profile.role.clone()],
            scopes: Vec::new(),
            permissions: grants(agent.credential),
        };
        let mut view = self_view::render(&state, principal).await?;
        merge(
            &mut view,
            json!({
                "type": "agent",
                "tenant_id": agent.tenant.id,
                "agent_id": profile.agent_id,
                "role": profile.role,
                "lifecycle_state": profile.lifecycle_state,
                "owner_id": profile.owner_id,
                "parent_agent_id": profile.parent_agent_id,
                "auth_method": agent.credential.name(),
                "jwt_expires_at": (agent.credential == AgentCredential::Jwt).then_some(&agent.token_expires_at),
                "certificate_expires_at": (agent.credential == AgentCredential::Certificate).then_some(&agent.token_expires_at),
            }),
        );
        return Ok(Json(view));
    }
    let caller = Caller::from_request_parts(&mut parts, &state).await?;
    let identity = &caller.identity;
    let who = json!({
        "type": if identity.tenant_id.is_some() { "api_key" } else { "platform_admin" },
        "tenant_id": identity.tenant_id,
        "key_id": identity.key_id,
        "role": identity.role,
        "scopes": identity.scopes,
        "permissions": identity.permissions,
    });
    let Some(tenant_id) = identity.tenant_id.as_deref() else { return Ok(Json(who)) };
    let principal = self_view::Principal {
        tenant_id,
        auth_method: "api_key",
        key_id: Some(&identity.key_id),
        agent_id: None,
        roles: vec![identity.role.clone()],
        scopes: identity.scopes.clone(),
        permissions: identity.permissions.iter().cloned().collect(),
    };
    let mut view = self_view::render(&state, principal).await?;
    merge(&mut view, who);
    Ok(Json(view))
}

/// `POST /v1/agent/auth/cert` (agent JWT or client certificate; allowed without an owner): the
/// certificate exchange. Issues the agent a short-lived X.509 client certificate from the agent CA
/// for mutual TLS: for the public key of `csr` (PEM PKCS#10, proving the agent holds the key), or,
/// without one, for a fresh ECDSA P-256 key returned once as `private_key`. `ttl_seconds` 300 to
/// 604800 (default one day). A certificate presented to the gateway's HTTPS listener then
/// authenticates the agent on its self endpoints instead of the JWT; presenting it here renews it.
pub async fn exchange_certificate(
    State(state): State<EdgeState>,
    agent: AgentCaller,
    OptionalJsonBody(body): OptionalJsonBody<CertificateBody>,
) -> Result<(StatusCode, [(HeaderName, &'static str); 1], Json<Value>), ApiError> {
    let lifetime_seconds = body
        .ttl_seconds
        .map(|ttl| {
            ttl.as_u64()
                .and_then(|ttl| u32::try_from(ttl).ok())
                .ok_or_else(|| ApiError::invalid_request("invalid_ttl", "ttl_seconds must be a whole number of seconds, 300 to 604800"))
        })
        .transpose()?;
    let key_source = if body.csr.is_some() { "csr" } else { "generated" };
    let request = IssueAgentCertificateRequest {
        tenant_id: agent.tenant.id.clone(),
        agent_id: agent.profile.agent_id.clone(),
        profile_id: agent.profile.id.clone(),
        csr_pem: body.csr,
        lifetime_seconds,
    };
    let issued = state.identity.issue_agent_certificate(request).await?;
    let mut event = activity::activity(&agent.tenant.id, "agent_certificate.issued", activity::agent_actor(&agent), &issued.serial, 1);
    event.data_json = agent_certificates::certificate_data(&agent.profile.agent_id, &issued.fingerprint_sha256, &issued.not_after);
    activity::announce(&state, event);
    let answer = json!({
        "agent_id": agent.profile.agent_id,
        "tenant_id": agent.tenant.id,
        "certificate": issued.certificate_pem,
        "ca_certificate": issued.ca_certificate_pem,
        "private_key": issued.private_key_pem,
        "key_source": key_source,
        "serial": issued.serial,
        "fingerprint_sha256": issued.fingerprint_sha256,
        "spiffe_id": issued.spiffe_id,
        "not_before": issued.not_before,
        "not_after": issued.not_after,
        "mtls_available": state.serves_tls || state.forwarded_certificate_header.is_some(),
        "next_steps": {
            "authenticate": if state.serves_tls || state.forwarded_certificate_header.is_some() {
                "present the certificate and its key in the TLS handshake with this gateway (or with the ingress that forwards client certificates to it); the agent self endpoints (/v1/agent/status, /limits/me, /anomaly/me, /profiles/me, /v1/self) then need no JWT"
            } else {
                "this edge serves plain HTTP, where no certificate reaches it: use an edge started with BR_TLS_CERT_FILE and BR_TLS_KEY_FILE (the chart's services.edge-router.tls.secretName), or behind an ingress that verifies client certificates and forwards them (BR_CLIENT_CERT_HEADER), or keep the JWT"
            },
            "renew": "POST /v1/agent/auth/cert again before not_after, with the JWT or this certificate",
            "revoke": "POST /v1/agent/auth/cert/{serial}/revoke once the agent has moved to a newer certificate, or at once if its key leaked",
        },
    });
    // The answer may hold a private key: no cache may keep it.
    Ok((StatusCode::CREATED, [(header::CACHE_CONTROL, "no-store")], Json(answer)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CertificateBody {
    csr: Option<String>,
    ttl_seconds: Option<serde_json::Number>,
}

/// What an agent's own credential reaches (API keys' routes need a key): a client certificate
/// everything a JWT does but delegation and sub-agents, which take the JWT only.
const AGENT_GRANTS: [(&str, bool); 11] = [
    ("GET /v1/self", true),
    ("GET /v1/agent/status", true),
    ("GET /v1/agent/limits/me", true),
    ("GET /v1/agent/anomaly/me", true),
    ("GET /v1/agent/profiles/me", true),
    ("POST /v1/agent/auth/cert", true),
    ("GET /v1/agent/auth/cert", true),
    ("POST /v1/agent/auth/cert/{serial}/revoke", true),
    ("POST /v1/agent/delegate", false),
    ("GET /v1/agent/sub-agents", false),
    ("DELETE /v1/agent/sub-agents/{child_agent_id}", false),
];

/// The routes `credential` reaches.
fn grants(credential: AgentCredential) -> Vec<String> {
    AGENT_GRANTS
        .iter()
        .filter(|(_, certificate_too)| credential == AgentCredential::Jwt || *certificate_too)
        .map(|(grant, _)| grant.to_string())
        .collect()
}

/// `extra`'s members added to `view` (both objects).
fn merge(view: &mut Value, extra: Value) {
    if let (Some(view), Value::Object(extra)) = (view.as_object_mut(), extra) {
        view.extend(extra);
    }
}
