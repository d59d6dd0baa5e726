//! Agent profiles and their lifecycle (`/v1/agent/profiles`), camelCase as the spec spells them.

use crate::extract::Path;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_proto::identity::{
    AgentProfileRef, CreateAgentProfileRequest, SetAgentLifecycleRequest, TenantRef, UpdateAgentProfileRequest,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::extract::JsonBody;
use crate::views;
use crate::{EdgeState, activity};

type Answer = Result<Json<Value>, ApiError>;

/// Who may create, change and move profiles: the roles that manage agents (admin, operator).
const MANAGE: &str = "agent.lifecycle.manage";
/// Who may read them (admin, operator, auditor).
const READ: &str = "agent.profile.read";

/// A member that may be absent (unchanged), null (cleared) or a value.
#[derive(Default)]
enum Patch<T> {
    #[default]
    Absent,
    Null,
    Value(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Patch<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Option::<T>::deserialize(deserializer)?.map_or(Patch::Null, Patch::Value))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateBody {
    agent_id: Option<String>,
    display_name: Option<String>,
    owner_id: Option<String>,
    cost_center: Option<String>,
    budget_daily_usd: Option<serde_json::Number>,
    budget_monthly_usd: Option<serde_json::Number>,
    role: Option<String>,
    metadata: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateBody {
    #[serde(default)]
    display_name: Patch<String>,
    #[serde(default)]
    owner_id: Patch<String>,
    #[serde(default)]
    cost_center: Patch<String>,
    #[serde(default)]
    budget_daily_usd: Patch<serde_json::Number>,
    #[serde(default)]
    budget_monthly_usd: Patch<serde_json::Number>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifecycleBody {
    state: Option<String>,
}

/// A dollar amount of a body as nano-dollars (400 `invalid_budget` naming `field`).
pub(crate) fn nanos(field: &str, amount: Option<&serde_json::Number>) -> Result<Option<i64>, ApiError> {
    amount
        .map(|amount| Usd::from_json_number(amount).map(Usd::nanos))
        .transpose()
        .map_err(|error| ApiError::invalid_request("invalid_budget", format!("{field}: {error}")))
}

/// `GET /v1/agent/profiles` (agent.profile.read): `{profiles[], total}`.
pub async fn list(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require(READ)?;
    let list = state.identity.list_agent_profiles(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    let profiles: Vec<Value> = list.profiles.iter().map(views::agent_profile).collect();
    Ok(Json(json!({"total": profiles.len(), "profiles": profiles})))
}

/// `POST /v1/agent/profiles` (admin, operator): 201 `{profile}`; 409 when the agent id exists.
pub async fn create(
    State(state): State<EdgeState>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require(MANAGE)?;
    let agent_id = body
        .agent_id
        .filter(|id| !id.trim().is_empty())
        .ok_or_else(|| ApiError::invalid_request("agent_id_required", "agentId is required"))?;
    let request = CreateAgentProfileRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        agent_id,
        display_name: body.display_name,
        owner_id: body.owner_id,
        cost_center: body.cost_center,
        budget_daily_nanos: nanos("budgetDailyUsd", body.budget_daily_usd.as_ref())?,
        budget_monthly_nanos: nanos("budgetMonthlyUsd", body.budget_monthly_usd.as_ref())?,
        role: body.role,
        metadata_json: body.metadata.map(|metadata| metadata.to_string()),
    };
    let profile = state.identity.create_agent_profile(request).await?;
    state.authenticator.evict_agent(&profile.tenant_id, &profile.agent_id);
    Ok((StatusCode::CREATED, Json(json!({"profile": views::agent_profile(&profile)}))))
}

/// `GET /v1/agent/profiles/{agentId}` (agent.profile.read).
pub async fn get(State(state): State<EdgeState>, caller: Caller, Path(agent_id): Path<String>) -> Answer {
    caller.require(READ)?;
    let profile = state.identity.get_agent_profile(AgentProfileRef { tenant_id: caller.tenant_id()?.to_string(), agent_id }).await?;
    Ok(Json(json!({"profile": views::agent_profile(&profile)})))
}

/// `PATCH /v1/agent/profiles/{agentId}` (admin, operator): absent members stay, null ones clear.
pub async fn update(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(agent_id): Path<String>,
    JsonBody(body): JsonBody<UpdateBody>,
) -> Answer {
    caller.require(MANAGE)?;
    let mut cleared = Vec::new();
    let mut text = |name: &str, patch: Patch<String>| match patch {
        Patch::Absent => None,
        Patch::Null => {
            cleared.push(name.to_string());
            None
        }
        Patch::Value(value) => Some(value),
    };
    let display_name = text("display_name", body.display_name);
    let owner_id = text("owner_id", body.owner_id);
    let cost_center = text("cost_center", body.cost_center);
    let mut money = |name: &str, field: &str, patch: Patch<serde_json::Number>| match patch {
        Patch::Absent => Ok(None),
        Patch::Null => {
            cleared.push(name.to_string());
            Ok(None)
        }
        Patch::Value(amount) => nanos(field, Some(&amount)),
    };
    let budget_daily_nanos = money("budget_daily_nanos", "budgetDailyUsd", body.budget_daily_usd)?;
    let budget_monthly_nanos = money("budget_monthly_nanos", "budgetMonthlyUsd", body.budget_monthly_usd)?;
    let request = UpdateAgentProfileRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        agent_id,
        display_name,
        owner_id,
        cost_center,
        budget_daily_nanos,
        budget_monthly_nanos,
        role: body.role,
        metadata_json: body.metadata.map(|metadata| metadata.to_string()),
        cleared,
    };
    let profile = state.identity.update_agent_profile(request).await?;
    state.authenticator.evict_agent(&profile.tenant_id, &profile.agent_id);
    Ok(Json(json!({"profile": views::agent_profile(&profile)})))
}

/// `DELETE /v1/agent/profiles/{agentId}` (admin): a hard delete, `{ok, agentId}`.
pub async fn delete(State(state): State<EdgeState>, caller: Caller, Path(agent_id): Path<String>) -> Answer {
    if !caller.is_tenant_admin() {
        return Err(ApiError::forbidden("admin_required", "deleting an agent profile needs a tenant admin key"));
    }
    let deleted = state.identity.delete_agent_profile(AgentProfileRef { tenant_id: caller.tenant_id()?.to_string(), agent_id }).await?;
    state.authenticator.evict_agent(&deleted.tenant_id, &deleted.agent_id);
    Ok(Json(json!({"ok": true, "agentId": deleted.agent_id})))
}

/// `PATCH /v1/agent/profiles/lifecycle/{agentId}` (agent.lifecycle.manage): `{state}` -> `{profile}`;
/// 409 for a move the lifecycle does not allow.
pub async fn lifecycle(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(agent_id): Path<String>,
    JsonBody(body): JsonBody<LifecycleBody>,
) -> Answer {
    caller.require(MANAGE)?;
    let target = body
        .state
        .filter(|state| !state.trim().is_empty())
        .ok_or_else(|| ApiError::invalid_request("state_required", "state is required"))?;
    let request = SetAgentLifecycleRequest { tenant_id: caller.tenant_id()?.to_string(), agent_id, state: target };
    let profile = state.identity.set_agent_lifecycle(request).await?;
    state.authenticator.evict_agent(&profile.tenant_id, &profile.agent_id);
    // Stopping an agent (quarantine, suspension, termination) weighs more than starting one.
    let severity = if profile.lifecycle_state == "active" { 1 } else { 3 };
    let mut event =
        activity::activity(&profile.tenant_id, "agent.lifecycle_changed", activity::key_actor(&caller), &profile.agent_id, severity);
    event.data_json = json!({"state": profile.lifecycle_state}).to_string();
    activity::announce(&state, event);
    Ok(Json(json!({"profile": views::agent_profile(&profile)})))
}
