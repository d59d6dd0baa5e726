//! Registration, account, users, claim links and API keys.

use crate::extract::Path;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_proto::identity::*;
use serde::Deserialize;
use serde_json::{Value, json};

use brainstorm_providers::catalog::{base_url, provider_by_id};

use crate::auth::Caller;
use crate::extract::{JsonBody, OptionalJsonBody};
use crate::views;
use crate::{EdgeState, activity};

type Answer = Result<Json<Value>, ApiError>;
type Created = Result<(StatusCode, Json<Value>), ApiError>;

#[derive(Deserialize)]
pub struct RegisterBody {
    tenant_name: Option<String>,
    accept_tos: Option<bool>,
    invite_code: Option<String>,
}

/// `POST /v1/register` (unauthenticated).
pub async fn register(State(state): State<EdgeState>, JsonBody(body): JsonBody<RegisterBody>) -> Created {
    let tenant_name = body.tenant_name.ok_or_else(|| ApiError::invalid_request("missing_field", "tenant_name is required"))?;
    if body.accept_tos != Some(true) {
        return Err(ApiError::invalid_request("tos_not_accepted", "accept_tos must be true to register"));
    }
    let response = state.identity.register(RegisterRequest { tenant_name, invite_code: body.invite_code, tenant_id: None }).await?;
    let (Some(tenant), Some(created), Some(claim)) = (response.tenant, response.api_key, response.claim) else {
        tracing::error!("identity returned an incomplete registration");
        return Err(ApiError::internal());
    };
    let key = created.key.unwrap_or_default();
    let body = json!({
        "tenant": {"id": tenant.id, "name": tenant.name, "plan": tenant.plan, "slug": tenant.slug, "tier": tenant.tier, "status": tenant.status},
        "api_key": {"id": key.id, "key": created.plaintext, "scopes": key.scopes, "role": key.role},
        "claim": {"token": claim.token, "url": claim.url, "expires_at": claim.expires_at},
    });
    Ok((StatusCode::CREATED, Json(body)))
}

/// `GET /v1/account` (config.read).
pub async fn get_account(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let tenant = state.identity.get_tenant(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    Ok(Json(json!({"tenant": views::tenant(&tenant)})))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UpdateAccountBody {
    name: Option<String>,
}

/// `PATCH /v1/account` (config.write).
pub async fn update_account(
    State(state): State<EdgeState>,
    caller: Caller,
    OptionalJsonBody(body): OptionalJsonBody<UpdateAccountBody>,
) -> Answer {
    caller.require("config.write")?;
    let tenant = state.identity.update_tenant(UpdateTenantRequest { tenant_id: caller.tenant_id()?.to_string(), name: body.name }).await?;
    Ok(Json(json!({"tenant": views::tenant(&tenant)})))
}

/// `GET /v1/account/users` (config.read).
pub async fn list_users(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let list = state.identity.list_users(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    let users: Vec<Value> = list.users.iter().map(views::user).collect();
    Ok(Json(json!({"total": users.len(), "users": users})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InviteBody {
    email: Option<String>,
    role: Option<String>,
}

/// `POST /v1/account/users/invite` (config.write): 201 with the invitation; the mail goes to the outbox.
pub async fn invite_user(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<InviteBody>) -> Created {
    caller.require("config.write")?;
    let email = body.email.ok_or_else(|| ApiError::invalid_request("missing_field", "email is required"))?;
    let request = InviteUserRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        email,
        role: body.role.unwrap_or_default(),
        invited_by: caller.identity.key_id.clone(),
    };
    let invitation = state.identity.invite_user(request).await?;
    Ok((StatusCode::CREATED, Json(json!({"invitation": views::invitation(&invitation)}))))
}

/// `DELETE /v1/account/users/{id}` (config.write).
pub async fn delete_user(State(state): State<EdgeState>, caller: Caller, Path(user_id): Path<String>) -> Answer {
    caller.require("config.write")?;
    let user = state.identity.delete_user(DeleteUserRequest { tenant_id: caller.tenant_id()?.to_string(), user_id }).await?;
    Ok(Json(json!({"deleted": {"id": user.id, "email": user.email}})))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ClaimLinkBody {
    role: Option<String>,
    max_uses: Option<u32>,
    expires_in_days: Option<u32>,
}

/// `POST /v1/tenant/claim-link` (tenant admin scope).
pub async fn create_claim_link(
    State(state): State<EdgeState>,
    caller: Caller,
    OptionalJsonBody(body): OptionalJsonBody<ClaimLinkBody>,
) -> Created {
    if !caller.is_tenant_admin() {
        return Err(ApiError::forbidden("forbidden", "claim links need a key with the tenant admin scope"));
    }
    if body.max_uses == Some(0) {
        return Err(ApiError::invalid_request("invalid_max_uses", "max_uses must be between 1 and 1000"));
    }
    if body.expires_in_days == Some(0) {
        return Err(ApiError::invalid_request("invalid_expires_in_days", "expires_in_days must be between 1 and 90"));
    }
    let request = CreateClaimLinkRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        role: body.role.unwrap_or_default(),
        max_uses: body.max_uses.unwrap_or(0),
        expires_in_days: body.expires_in_days.unwrap_or(0),
        created_by: caller.identity.key_id.clone(),
    };
    let claim = state.identity.create_claim_link(request).await?;
    Ok((StatusCode::CREATED, Json(views::claim(&claim))))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKeyBody {
    name: Option<String>,
    role: Option<String>,
    scopes: Option<Vec<String>>,
    budget_limit_usd: Option<serde_json::Number>,
    budget_period: Option<String>,
    rate_limit_rpm: Option<u32>,
    expires_at: Option<String>,
    #[serde(alias = "models")]
    allowed_models: Option<Vec<String>>,
}

/// `POST /v1/api-keys` (config.write): 201; the plaintext key is in this response only.
pub async fn create_api_key(
    State(state): State<EdgeState>,
    caller: Caller,
    OptionalJsonBody(body): OptionalJsonBody<CreateApiKeyBody>,
) -> Created {
    caller.require("config.write")?;
    let budget_limit_nanos = body
        .budget_limit_usd
        .as_ref()
        .map(|amount| Usd::from_json_number(amount).map(Usd::nanos))
        .transpose()
        .map_err(|error| ApiError::invalid_request("invalid_budget_limit", format!("budget_limit_usd: {error}")))?;
    let request = CreateApiKeyRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        name: body.name.unwrap_or_default(),
        role: body.role.unwrap_or_default(),
        scopes: body.scopes.unwrap_or_default(),
        budget_limit_nanos,
        budget_period: body.budget_period,
        rate_limit_rpm: body.rate_limit_rpm,
        expires_at: body.expires_at,
        allowed_models: body.allowed_models.unwrap_or_default(),
        created_by: caller.identity.key_id.clone(),
        creator_permissions: caller.identity.permissions.iter().cloned().collect(),
    };
    let created = state.identity.create_api_key(request).await?;
    let record = created.key.unwrap_or_default();
    let mut event = activity::activity(&record.tenant_id, "api_key.created", activity::key_actor(&caller), &record.id, 1);
    event.data_json = json!({"name": record.name, "role": record.role, "prefix": record.prefix, "scopes": record.scopes}).to_string();
    activity::announce(&state, event);
    let mut key = views::api_key(&record);
    if let Some(object) = key.as_object_mut() {
        object.insert("key".to_string(), json!(created.plaintext));
    }
    Ok((StatusCode::CREATED, Json(json!({"api_key": key}))))
}

/// `GET /v1/api-keys` (config.read): masked keys only.
pub async fn list_api_keys(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let list = state.identity.list_api_keys(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    let keys: Vec<Value> = list.keys.iter().map(views::api_key).collect();
    Ok(Json(json!({"total": keys.len(), "api_keys": keys})))
}

/// `DELETE /v1/api-keys/{id}` (config.write): the key stops authenticating at once on this edge.
pub async fn revoke_api_key(State(state): State<EdgeState>, caller: Caller, Path(key_id): Path<String>) -> Answer {
    caller.require("config.write")?;
    let revoked = state.identity.revoke_api_key(RevokeApiKeyRequest { tenant_id: caller.tenant_id()?.to_string(), key_id }).await?;
    let Some(key) = revoked.key else {
        tracing::error!("identity answered a revocation without its key");
        return Err(ApiError::internal());
    };
    state.authenticator.evict_key(&key.id);
    if revoked.changed {
        let mut event = activity::activity(&key.tenant_id, "api_key.revoked", activity::key_actor(&caller), &key.id, 3);
        event.data_json = json!({"name": key.name, "role": key.role, "prefix": key.prefix}).to_string();
        activity::announce(&state, event);
    }
    Ok(Json(json!({"revoked": true, "api_key": views::api_key(&key)})))
}

/// The daily budget of a plan, for the graduation answers.
fn plan_budget(plan: &str) -> Value {
    brainstorm_budget_ledger::Plan::resolve(plan).daily_spend_limit.map_or(Value::Null, brainstorm_common::money::Usd::to_json)
}

/// `GET /v1/account/graduation` (config.read): what moving from the sandbox to tier `standard` takes.
pub async fn graduation(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let tenant = state.identity.get_tenant(TenantRef { tenant_id: tenant_id.clone() }).await?;
    let config = state.routing.get(&tenant_id).await?;
    let has_key = !config.routing.providers.is_empty();
    Ok(Json(json!({
        "tier": tenant.tier,
        "plan": tenant.plan,
        "graduated": tenant.plan == "standard",
        "criteria": [
            {"id": "provider_key_registered", "required": true, "satisfied": has_key,
             "description": "register a provider key (POST /v1/providers); graduation validates it live"},
            {"id": "email_verified", "required": false, "satisfied": tenant.email_verified_at.is_some(),
             "description": "or verify an email address (POST /v1/account/verify-email, then /confirm)"},
        ],
        "action": {"endpoint": "/v1/account/graduate", "method": "POST", "alternative": "/v1/account/verify-email"},
        "budget_usd_per_day": plan_budget(&tenant.plan),
    })))
}

/// `POST /v1/account/graduate` (config.write): live-validates a registered provider key, then moves the
/// tenant to tier `standard`. Idempotent for a tenant already there.
pub async fn graduate(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let answer = |tier: &str| Json(json!({"graduated": true, "tier": tier, "budget_usd_per_day": plan_budget("standard")}));
    if caller.identity.plan == "standard" {
        return Ok(answer("standard"));
    }
    let config = state.routing.get(&tenant_id).await?;
    if config.routing.providers.is_empty() {
        return Err(ApiError::byok_required("openai", "graduation needs a registered provider key: POST /v1/providers first"));
    }
    let mut refusal = None;
    let mut validated = false;
    for provider_id in &config.routing.providers {
        let (Some(provider), Some(api_key)) = (provider_by_id(provider_id), config.credential(provider_id)) else { continue };
        match state.upstream.validate_key(provider, base_url(provider, &state.base_urls), api_key).await {
            Ok(()) => {
                validated = true;
                break;
            }
            Err(error) => refusal = Some(format!("{provider_id}: {error}")),
        }
    }
    if !validated {
        let reason = refusal.unwrap_or_else(|| "no usable provider key".to_string());
        return Err(ApiError::invalid_request(
            "provider_key_invalid",
            format!("no registered provider key passed live validation ({reason})"),
        ));
    }
    let tenant =
        state.identity.set_tenant_plan(SetTenantPlanRequest { tenant_id: tenant_id.clone(), plan: "standard".to_string() }).await?;
    state.authenticator.evict_tenant(&tenant_id);
    Ok(answer(&tenant.tier))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyEmailBody {
    email: Option<String>,
}

/// `POST /v1/account/verify-email` (config.write): mails a code that expires in 600 seconds.
pub async fn verify_email(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<VerifyEmailBody>) -> Answer {
    caller.require("config.write")?;
    let email = body.email.ok_or_else(|| ApiError::invalid_request("missing_field", "email is required"))?;
    let started = state
        .identity
        .start_email_verification(StartEmailVerificationRequest { tenant_id: caller.tenant_id()?.to_string(), email })
        .await?;
    Ok(Json(json!({"message": started.message, "expires_in_seconds": started.expires_in_seconds})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmEmailBody {
    code: Option<String>,
}

/// `POST /v1/account/verify-email/confirm` (config.write): the right code graduates the tenant.
pub async fn confirm_email(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<ConfirmEmailBody>) -> Answer {
    caller.require("config.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let code =
        body.code.filter(|code| !code.trim().is_empty()).ok_or_else(|| ApiError::invalid_request("missing_field", "code is required"))?;
    let tenant = state.identity.confirm_email_verification(ConfirmEmailVerificationRequest { tenant_id: tenant_id.clone(), code }).await?;
    state.authenticator.evict_tenant(&tenant_id);
    Ok(Json(json!({"tier": tenant.tier, "budget_usd_per_day": plan_budget(&tenant.plan)})))
}
