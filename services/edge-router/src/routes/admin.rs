//! Platform administration: tenants, invite codes and the digest (platform admin key only).

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use brainstorm_common::ApiError;
use brainstorm_proto::identity::*;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::JsonBody;
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
    let tenant = state.identity.set_tenant_status(SetTenantStatusRequest { tenant_id, status: status.to_string() }).await?;
    state.authenticator.evict_tenant(&tenant.id);
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
