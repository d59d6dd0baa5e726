//! Platform administration: tenants, invite codes and the digest (platform admin key only).

use crate::extract::{Path, Query};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use brainstorm_common::ApiError;
use brainstorm_proto::identity::*;
use serde::Deserialize;
use serde_json::{Value, json};

use brainstorm_policy_firewall::{MAX_RISK_FIELD_CHARS, MAX_RISK_TTL_SECONDS};

use crate::EdgeState;
use crate::activity;
use crate::auth::Caller;
use crate::extract::{JsonBody, query_flag};
use crate::views;

type Answer = Result<Json<Value>, ApiError>;

#[derive(Deserialize)]
pub struct TenantFilter {
    status: Option<String>,
}

/// `GET /v1/admin/tenants?status=` (admin.read).
pub async fn list_tenants(State(state): State<EdgeState>, caller: Caller, Query(filter): Query<TenantFilter>) -> Answer {
    caller.require("admin.read")?;
    let list = state.identity.list_tenants(ListTenantsRequest { status: filter.status }).await?;
    let tenants: Vec<Value> = list.tenants.iter().map(views::tenant).collect();
    Ok(Json(json!({"total": tenants.len(), "tenants": tenants})))
}

/// `GET /v1/admin/tenants/{id}` (admin.read).
pub async fn get_tenant(State(state): State<EdgeState>, caller: Caller, Path(tenant_id): Path<String>) -> Answer {
    caller.require("admin.read")?;
    let tenant = state.identity.get_tenant(TenantRef { tenant_id }).await?;
    Ok(Json(json!({"tenant": views::tenant(&tenant)})))
}

/// `POST /v1/admin/tenants/{id}/approve` (admin.write): status `active`.
pub async fn approve_tenant(state: State<EdgeState>, caller: Caller, tenant_id: Path<String>) -> Answer {
    set_status(state, caller, tenant_id, "active").await
}

/// `POST /v1/admin/tenants/{id}/reject` (admin.write): status `rejected`; the tenant's keys stop working.
pub async fn reject_tenant(state: State<EdgeState>, caller: Caller, tenant_id: Path<String>) -> Answer {
    set_status(state, caller, tenant_id, "rejected").await
}

async fn set_status(State(state): State<EdgeState>, caller: Caller, Path(tenant_id): Path<String>, status: &str) -> Answer {
    caller.require("admin.write")?;
    let moved = state.identity.set_tenant_status(SetTenantStatusRequest { tenant_id, status: status.to_string() }).await?;
    let tenant = moved.tenant.unwrap_or_default();
    state.authenticator.evict_tenant(&tenant.id);
    if moved.changed {
        activity::announce(
            &state,
            activity::tenant_status_changed(&tenant.id, activity::key_actor(&caller), &moved.previous_status, &tenant.status),
        );
    }
    Ok(Json(json!({"ok": true, "tenant": views::tenant(&tenant)})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InviteCodeBody {
    code: Option<String>,
    max_uses: Option<i64>,
    expires_at: Option<String>,
}

/// `POST /v1/admin/invite-codes` (admin.write).
pub async fn create_invite_code(
    State(state): State<EdgeState>,
    caller: Caller,
    JsonBody(body): JsonBody<InviteCodeBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require("admin.write")?;
    let code = body.code.ok_or_else(|| ApiError::invalid_request("missing_field", "code is required"))?;
    let max_uses = match body.max_uses {
        None => None,
        Some(uses) => Some(
            u32::try_from(uses)
                .ok()
                .filter(|uses| *uses > 0)
                .ok_or_else(|| ApiError::invalid_request("invalid_max_uses", "max_uses must be an integer greater than 0, or null"))?,
        ),
    };
    let invite_code = state.identity.create_invite_code(CreateInviteCodeRequest { code, max_uses, expires_at: body.expires_at }).await?;
    Ok((StatusCode::CREATED, Json(json!({"invite_code": views::invite_code(&invite_code)}))))
}

/// `GET /v1/admin/invite-codes` (admin.read): with usage counts.
pub async fn list_invite_codes(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("admin.read")?;
    let list = state.identity.list_invite_codes(ListInviteCodesRequest {}).await?;
    let codes: Vec<Value> = list.invite_codes.iter().map(views::invite_code).collect();
    Ok(Json(json!({"total": codes.len(), "invite_codes": codes})))
}

/// `DELETE /v1/admin/invite-codes/{id}` (admin.write).
pub async fn delete_invite_code(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("admin.write")?;
    let response = state.identity.delete_invite_code(DeleteInviteCodeRequest { id }).await?;
    Ok(Json(json!({"deleted": response.deleted})))
}

/// `GET /v1/admin/digest` (admin.read).
pub async fn digest(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("admin.read")?;
    let digest = state.identity.digest(DigestRequest {}).await?;
    Ok(Json(json!({"digest": {
        "tenants_total": digest.tenants_total,
        "tenants_by_status": digest.tenants_by_status,
        "tenants_by_plan": digest.tenants_by_plan,
        "registrations_last_24h": digest.registrations_last_24h,
        "users_total": digest.users_total,
        "api_keys_active": digest.api_keys_active,
        "invite_codes_active": digest.invite_codes_active,
        "generated_at": digest.generated_at,
    }})))
}

/// `?dry_run=true` of the risk-push routes.
#[derive(Deserialize, Default)]
pub struct DryRun {
    dry_run: Option<String>,
}

impl DryRun {
    fn requested(&self) -> Result<bool, ApiError> {
        query_flag("dry_run", self.dry_run.as_deref())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RiskPushBody {
    tenant_id: Option<String>,
    agent_id: Option<String>,
    risk_score: Option<Value>,
    source: Option<String>,
    ttl_seconds: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RiskClearBody {
    tenant_id: Option<String>,
    agent_id: Option<String>,
}

/// The time to live of a pushed score when the body gives none: a day.
const DEFAULT_RISK_TTL_SECONDS: u64 = 86_400;

/// The risk-push routes answer only the platform administrator, and only with the gateway's
/// bidirectional-XDR switch on (`BR_XDR_BIDIRECTIONAL`).
fn risk_push_allowed(state: &EdgeState, caller: &Caller) -> Result<(), ApiError> {
    caller.require("platform.admin")?;
    if !state.xdr_bidirectional {
        return Err(ApiError::forbidden(
            "feature_disabled",
            "pushing XDR risk scores is off: the gateway's bidirectional XDR switch (BR_XDR_BIDIRECTIONAL) is not enabled",
        ));
    }
    Ok(())
}

/// Whether the caller may push (see `risk_push_allowed`), whether it asked for a dry run, and the
/// tenant and agent the body names.
fn risk_target(
    state: &EdgeState,
    caller: &Caller,
    dry_run: &DryRun,
    tenant_id: Option<String>,
    agent_id: Option<String>,
) -> Result<(bool, String, String), ApiError> {
    risk_push_allowed(state, caller)?;
    Ok((dry_run.requested()?, identifier("tenant_id", tenant_id)?, identifier("agent_id", agent_id)?))
}

/// A required, non-empty identifier of the body.
fn identifier(name: &str, value: Option<String>) -> Result<String, ApiError> {
    value
        .map(|value| value.trim().to_string())
        .filter(|value| !value.is_empty() && value.chars().count() <= MAX_RISK_FIELD_CHARS)
        .ok_or_else(|| ApiError::invalid_request("invalid_field", format!("{name} is required (1 to {MAX_RISK_FIELD_CHARS} characters)")))
}

/// The tenant, which must exist (404 otherwise).
async fn existing_tenant(state: &EdgeState, tenant_id: &str) -> Result<(), ApiError> {
    state.identity.get_tenant(TenantRef { tenant_id: tenant_id.to_string() }).await?;
    Ok(())
}

fn risk_view(risk: &brainstorm_proto::policy::AgentRisk) -> Value {
    json!({
        "tenant_id": risk.tenant_id,
        "agent_id": risk.agent_id,
        "risk_score": risk.risk_score,
        "source": risk.source,
        "set_at": risk.set_at,
        "expires_at": risk.expires_at,
        "restricted": risk.risk_score >= brainstorm_policy_firewall::RESTRICTING_RISK,
    })
}

/// `POST /v1/admin/xdr/risk-push` (platform.admin; `BR_XDR_BIDIRECTIONAL`): `{tenant_id, agent_id,
/// risk_score 0-1, source, ttl_seconds?}` sets the agent's score; `?dry_run=true` shows what would be
/// set. A score of 0.7 or more restricts the agent's routing; its next token carries the score.
pub async fn push_risk(
    State(state): State<EdgeState>,
    caller: Caller,
    Query(dry_run): Query<DryRun>,
    JsonBody(body): JsonBody<RiskPushBody>,
) -> Answer {
    let (dry_run, tenant_id, agent_id) = risk_target(&state, &caller, &dry_run, body.tenant_id, body.agent_id)?;
    let source = identifier("source", body.source)?;
    let risk_score = body
        .risk_score
        .as_ref()
        .and_then(Value::as_f64)
        .filter(|score| (0.0..=1.0).contains(score))
        .ok_or_else(|| ApiError::invalid_request("invalid_field", "risk_score is required: a number from 0 to 1"))?;
    let ttl_seconds = match &body.ttl_seconds {
        None | Some(Value::Null) => DEFAULT_RISK_TTL_SECONDS,
        Some(value) => value.as_u64().filter(|ttl| (1..=MAX_RISK_TTL_SECONDS).contains(ttl)).ok_or_else(|| {
            ApiError::invalid_request("invalid_field", format!("ttl_seconds is an integer from 1 to {MAX_RISK_TTL_SECONDS}"))
        })?,
    };
    existing_tenant(&state, &tenant_id).await?;
    if dry_run {
        let expires_at = brainstorm_common::time::format_timestamp(
            chrono::Utc::now() + chrono::Duration::seconds(i64::try_from(ttl_seconds).unwrap_or(i64::MAX)),
        );
        return Ok(Json(json!({
            "dry_run": true,
            "would_set": {
                "tenant_id": tenant_id,
                "agent_id": agent_id,
                "risk_score": risk_score,
                "source": source,
                "ttl_seconds": ttl_seconds,
                "expires_at": expires_at,
                "restricted": risk_score >= brainstorm_policy_firewall::RESTRICTING_RISK,
            },
        })));
    }
    let request = brainstorm_proto::policy::SetAgentRiskRequest { tenant_id: tenant_id.clone(), agent_id, risk_score, source, ttl_seconds };
    let risk = state.policy.set_agent_risk(request).await?;
    // This edge applies it at once; others hear the policy event (or read it within the cache's life).
    state.guardian.evict(&tenant_id);
    Ok(Json(json!({"ok": true, "risk": risk_view(&risk)})))
}

/// `DELETE /v1/admin/xdr/risk-push` (platform.admin; `BR_XDR_BIDIRECTIONAL`): `{tenant_id, agent_id}`
/// clears the agent's score; `?dry_run=true` shows what would be cleared.
pub async fn clear_risk(
    State(state): State<EdgeState>,
    caller: Caller,
    Query(dry_run): Query<DryRun>,
    JsonBody(body): JsonBody<RiskClearBody>,
) -> Answer {
    let (dry_run, tenant_id, agent_id) = risk_target(&state, &caller, &dry_run, body.tenant_id, body.agent_id)?;
    existing_tenant(&state, &tenant_id).await?;
    if dry_run {
        state.guardian.evict(&tenant_id);
        let guardian = state.guardian.config(&tenant_id).await?;
        let current = guardian.agent_risk(&agent_id).map(risk_view);
        return Ok(Json(json!({"dry_run": true, "would_clear": current})));
    }
    let request = brainstorm_proto::policy::AgentRiskRef { tenant_id: tenant_id.clone(), agent_id: agent_id.clone() };
    let cleared = state.policy.clear_agent_risk(request).await?.cleared;
    state.guardian.evict(&tenant_id);
    Ok(Json(json!({"ok": true, "cleared": cleared, "tenant_id": tenant_id, "agent_id": agent_id})))
}
