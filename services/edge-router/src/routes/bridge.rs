//! The identity bridge: an identity provider's users claim tenants (`POST /auth/claim`), see them
//! (`GET /auth/me`), and link devices by the device authorization grant (`POST
//! /v1/auth/device/authorize` and `/token` from the device, `POST /auth/device/confirm` from the
//! browser); a tenant admin makes a single-use browser link (`POST /v1/auth/link`). The `/auth/*`
//! routes take the provider's JWT (`crate::idp`), `X-BR-Tenant-Id` choosing among several tenants.

use axum::Json;
use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use brainstorm_common::ApiError;
use brainstorm_proto::identity::{
    ConfirmDeviceRequest, CreateClaimLinkRequest, IdpMembership, IdpSubject, PollDeviceTokenRequest, ProvisionTenantRequest,
    RedeemClaimRequest, StartDeviceAuthorizationRequest, Tenant,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::{Caller, CallerIdentity};
use crate::extract::{JsonBody, OptionalJsonBody};
use crate::idp::IdpIdentity;

/// A request authenticated by the identity provider's JWT.
pub struct IdpCaller {
    identity: IdpIdentity,
    /// `X-BR-Tenant-Id`, when sent.
    tenant_id: Option<String>,
}

impl IdpCaller {
    fn subject(&self) -> IdpSubject {
        IdpSubject { issuer: self.identity.issuer.clone(), subject: self.identity.subject.clone(), email: self.identity.email.clone() }
    }
}

impl FromRequestParts<EdgeState> for IdpCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &EdgeState) -> Result<Self, Self::Rejection> {
        let verifier = state.idp.as_ref().ok_or_else(unconfigured)?;
        let token = bearer(parts).ok_or_else(|| {
            ApiError::unauthenticated("idp_token_required", "send the identity provider's JWT as `Authorization: Bearer <jwt>`")
        })?;
        let identity = verifier.verify(token).await?;
        let tenant_id = parts
            .headers
            .get("x-br-tenant-id")
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|value| !value.is_empty())
            .map(str::to_string);
        Ok(IdpCaller { identity, tenant_id })
    }
}

/// A request the identity provider's user makes in one of their tenants (`X-BR-Tenant-Id`, or the
/// only one they have claimed), acting with their role there: the dashboard bridge's caller. It holds
/// no key, so key-level data (`key_id`, `key_budget`) is always null for it.
pub struct MemberCaller(pub Caller);

impl FromRequestParts<EdgeState> for MemberCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &EdgeState) -> Result<Self, Self::Rejection> {
        let caller = IdpCaller::from_request_parts(parts, state).await?;
        let memberships = state.identity.list_idp_memberships(caller.subject()).await?.memberships;
        let membership = match selected(&memberships, caller.tenant_id.as_deref())? {
            Some(membership) => membership.clone(),
            None if memberships.is_empty() => {
                return Err(ApiError::forbidden(
                    "not_a_member",
                    "this identity has claimed no tenant: redeem a claim token with POST /auth/claim",
                ));
            }
            None => {
                return Err(ApiError::invalid_request(
                    "tenant_selection_required",
                    "this identity belongs to several tenants: name one with X-BR-Tenant-Id",
                ));
            }
        };
        let tenant = membership.tenant.unwrap_or_default();
        // As a key of the tenant would be refused: a rejected or pending tenant's members act in it for nothing.
        match tenant.status.as_str() {
            "rejected" => return Err(ApiError::forbidden("tenant_rejected", "this tenant's registration was rejected")),
            "pending" => {
                return Err(ApiError::forbidden("tenant_pending_approval", "this tenant awaits approval by a platform administrator"));
            }
            _ => {}
        }
        let identity = CallerIdentity {
            tenant_id: Some(tenant.id),
            key_id: format!("idp:{}", caller.identity.subject),
            role: membership.role,
            scopes: Vec::new(),
            permissions: membership.permissions.into_iter().collect(),
            allowed_models: Vec::new(),
            expires_at: None,
            plan: tenant.plan,
            key: None,
        };
        Ok(MemberCaller(Caller { identity: std::sync::Arc::new(identity) }))
    }
}

/// The caller of a route the dashboard reaches with its user's JWT and a tenant key reaches alike
/// (the OAuth consent): a bearer that looks like a JWT, with an identity provider configured, is a
/// member (`MemberCaller`); anything else is a key (`Caller`).
pub struct DashboardCaller(pub Caller);

impl FromRequestParts<EdgeState> for DashboardCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &EdgeState) -> Result<Self, Self::Rejection> {
        let jwt = bearer(parts).is_some_and(|token| token.starts_with("eyJ") && token.matches('.').count() == 2);
        if jwt && state.idp.is_some() {
            return MemberCaller::from_request_parts(parts, state).await.map(|MemberCaller(caller)| DashboardCaller(caller));
        }
        Caller::from_request_parts(parts, state).await.map(DashboardCaller)
    }
}

/// The `/auth/budget/*` mirror of `/v1/budget/*` for the dashboard, tenant-level data only.
pub mod budget_mirror {
    use crate::extract::{Path, Query};
    use axum::extract::State;
    use serde_json::Value;

    use super::MemberCaller;
    use crate::EdgeState;
    use crate::extract::JsonBody;
    use crate::routes::budget::{self, Answer, LimitQuery};

    /// `GET /auth/budget/status`.
    pub async fn status(state: State<EdgeState>, MemberCaller(caller): MemberCaller) -> Answer {
        budget::status(state, caller).await
    }

    /// `GET /auth/budget/forecast`.
    pub async fn forecast(state: State<EdgeState>, MemberCaller(caller): MemberCaller) -> Answer {
        budget::forecast(state, caller).await
    }

    /// `GET /auth/budget/agents`.
    pub async fn agents(state: State<EdgeState>, MemberCaller(caller): MemberCaller) -> Answer {
        budget::agents(state, caller).await
    }

    /// `PUT /auth/budget/agents/{agent_id}`.
    pub async fn put_agent(
        state: State<EdgeState>,
        MemberCaller(caller): MemberCaller,
        agent: Path<String>,
        body: JsonBody<Value>,
    ) -> Answer {
        budget::put_agent(state, caller, agent, body).await
    }

    /// `GET /auth/budget/alerts/config`.
    pub async fn get_alert_config(state: State<EdgeState>, MemberCaller(caller): MemberCaller) -> Answer {
        budget::get_alert_config(state, caller).await
    }

    /// `PUT /auth/budget/alerts/config`.
    pub async fn put_alert_config(state: State<EdgeState>, MemberCaller(caller): MemberCaller, body: JsonBody<Value>) -> Answer {
        budget::put_alert_config(state, caller, body).await
    }

    /// `GET /auth/budget/alerts/history`.
    pub async fn alert_history(state: State<EdgeState>, MemberCaller(caller): MemberCaller, query: Query<LimitQuery>) -> Answer {
        budget::alert_history(state, caller, query).await
    }
}

/// The dashboard's mirrors of `GET /v1/killswitch/status` and `GET /v1/firewall/interceptions`
/// (`/auth/killswitch/status`, `/auth/firewall/interceptions`): the same answers, for the member's
/// JWT in the tenant it selects, under the member's role.
pub mod guardian_mirror {
    use axum::extract::State;

    use super::MemberCaller;
    use crate::EdgeState;
    use crate::extract::Query;
    use crate::routes::budget::Answer;
    use crate::routes::guardian::{self, PageQuery};

    /// `GET /auth/killswitch/status`.
    pub async fn kill_switch_status(state: State<EdgeState>, MemberCaller(caller): MemberCaller) -> Answer {
        guardian::status(state, caller).await
    }

    /// `GET /auth/firewall/interceptions?limit=&offset=` (security.read).
    pub async fn interceptions(state: State<EdgeState>, MemberCaller(caller): MemberCaller, query: Query<PageQuery>) -> Answer {
        guardian::interceptions(state, caller, query).await
    }
}

/// 503 `identity_provider_unconfigured`: the bridge needs an identity provider.
fn unconfigured() -> ApiError {
    ApiError::unavailable(
        "identity_provider_unconfigured",
        "no identity provider is configured: set BR_IDP_ISSUER and BR_IDP_JWKS_URL (or BR_IDP_JWKS_FILE)",
    )
}

/// The membership a request acts in: the tenant `X-BR-Tenant-Id` names (403 `not_a_member` when the
/// identity has not claimed it), else the only one, else none.
fn selected<'a>(memberships: &'a [IdpMembership], tenant_id: Option<&str>) -> Result<Option<&'a IdpMembership>, ApiError> {
    match tenant_id {
        Some(tenant_id) => memberships
            .iter()
            .find(|membership| membership.tenant.as_ref().is_some_and(|tenant| tenant.id == tenant_id))
            .map(Some)
            .ok_or_else(|| ApiError::forbidden("not_a_member", "this identity has not claimed the tenant X-BR-Tenant-Id names")),
        None if memberships.len() == 1 => Ok(memberships.first()),
        None => Ok(None),
    }
}

/// The bearer token of a request, if it sends one.
fn bearer(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
}

fn tenant_view(tenant: Option<&Tenant>) -> Value {
    tenant.map_or(
        Value::Null,
        |tenant| json!({"id": tenant.id, "name": tenant.name, "slug": tenant.slug, "plan": tenant.plan, "status": tenant.status}),
    )
}

fn membership_view(membership: &IdpMembership) -> Value {
    json!({
        "tenant": tenant_view(membership.tenant.as_ref()),
        "user_id": membership.user_id,
        "role": membership.role,
        "claim_role": membership.claim_role,
        "email": membership.email,
        "claimed_at": membership.claimed_at,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    token: Option<String>,
}

/// `POST /auth/claim` (identity provider JWT): `{token}` -> 201 with the membership made (a user in
/// the tenant, its role from the token's: owner and admin -> admin, member -> developer).
pub async fn claim(
    State(state): State<EdgeState>,
    caller: IdpCaller,
    JsonBody(body): JsonBody<ClaimBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let token = body
        .token
        .filter(|token| !token.trim().is_empty())
        .ok_or_else(|| ApiError::invalid_request("missing_field", "token is required"))?;
    let membership = state.identity.redeem_claim(RedeemClaimRequest { identity: Some(caller.subject()), token }).await?;
    Ok((StatusCode::CREATED, Json(membership_view(&membership))))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ProvisionBody {
    tenant_name: Option<String>,
    invite_code: Option<String>,
}

/// `POST /auth/provision` (identity provider JWT): the identity's own tenant. The first call makes
/// it (sandbox plan, the identity its admin member, an admin API key shown this once): 201; later
/// calls find it: 200, without a key. `{tenant_name?, invite_code?}` as `/v1/register` takes them.
pub async fn provision(
    State(state): State<EdgeState>,
    caller: IdpCaller,
    OptionalJsonBody(body): OptionalJsonBody<ProvisionBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let request = ProvisionTenantRequest {
        identity: Some(caller.subject()),
        tenant_name: body.tenant_name.unwrap_or_default(),
        invite_code: body.invite_code,
    };
    let provisioned = state.identity.provision_tenant(request).await?;
    let membership = provisioned.membership.as_ref().map_or(Value::Null, membership_view);
    let api_key = provisioned.api_key.as_ref().map_or(Value::Null, |created| {
        let key = created.key.clone().unwrap_or_default();
        json!({"id": key.id, "key": created.plaintext, "prefix": key.prefix, "scopes": key.scopes, "role": key.role})
    });
    let status = if provisioned.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"created": provisioned.created, "membership": membership, "api_key": api_key}))))
}

/// `GET /auth/me` (identity provider JWT): the identity and the tenants it has claimed; the selected
/// one (`X-BR-Tenant-Id`, or the only one) as `tenant` (403 `not_a_member` for one it has not claimed).
pub async fn me(State(state): State<EdgeState>, caller: IdpCaller) -> Result<Json<Value>, ApiError> {
    let memberships = state.identity.list_idp_memberships(caller.subject()).await?.memberships;
    let selected = selected(&memberships, caller.tenant_id.as_deref())?;
    Ok(Json(json!({
        "identity": {"issuer": caller.identity.issuer, "subject": caller.identity.subject, "email": caller.identity.email},
        "tenants": memberships.iter().map(membership_view).collect::<Vec<_>>(),
        "tenant": selected.map_or(Value::Null, membership_view),
    })))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DeviceAuthorizeBody {
    client_name: Option<String>,
}

/// `POST /v1/auth/device/authorize` (no authentication): starts a device authorization; the device
/// shows `user_code` and `verification_uri` and polls `/v1/auth/device/token` with `device_code`.
pub async fn device_authorize(
    State(state): State<EdgeState>,
    OptionalJsonBody(body): OptionalJsonBody<DeviceAuthorizeBody>,
) -> Result<Json<Value>, ApiError> {
    // Without a provider no one could confirm the code: say so now rather than after ten minutes.
    if state.idp.is_none() {
        return Err(unconfigured());
    }
    let request = StartDeviceAuthorizationRequest { client_name: body.client_name.unwrap_or_default() };
    let started = state.identity.start_device_authorization(request).await?;
    let verification_uri = format!("{}/device", state.dashboard_url);
    Ok(Json(json!({
        "device_code": started.device_code,
        "user_code": started.user_code,
        "verification_uri": verification_uri,
        "verification_uri_complete": format!("{verification_uri}?user_code={}", started.user_code),
        "interval": started.interval,
        "expires_in": started.expires_in,
        "expires_at": started.expires_at,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceTokenBody {
    device_code: Option<String>,
    grant_type: Option<String>,
}

/// RFC 8628's grant type, the only one `/v1/auth/device/token` takes (it may be left out).
const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// `POST /v1/auth/device/token` (no authentication): `{device_code}` -> `{status:
/// authorization_pending | slow_down, interval}` until a member confirms, then once `{status: linked,
/// tenant, api_key}`; 400 `expired_token` when the code lapsed, `invalid_device_code` when unknown or
/// already delivered.
pub async fn device_token(State(state): State<EdgeState>, JsonBody(body): JsonBody<DeviceTokenBody>) -> Result<Json<Value>, ApiError> {
    if body.grant_type.as_deref().is_some_and(|grant| grant != DEVICE_GRANT) {
        return Err(ApiError::invalid_request("unsupported_grant_type", format!("grant_type is `{DEVICE_GRANT}`")));
    }
    let device_code = body
        .device_code
        .filter(|code| !code.trim().is_empty())
        .ok_or_else(|| ApiError::invalid_request("missing_field", "device_code is required"))?;
    let result = state.identity.poll_device_token(PollDeviceTokenRequest { device_code }).await?;
    if result.status != "linked" {
        return Ok(Json(json!({"status": result.status, "interval": result.interval})));
    }
    Ok(Json(json!({
        "status": "linked",
        "tenant": tenant_view(result.tenant.as_ref()),
        "api_key": {"key": result.key, "id": result.key_id, "role": result.role, "expires_at": result.expires_at},
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfirmBody {
    user_code: Option<String>,
}

/// `POST /auth/device/confirm` (identity provider JWT): `{user_code}` links the waiting device to the
/// caller's tenant (`X-BR-Tenant-Id` when it has claimed several) with the caller's role there.
pub async fn device_confirm(
    State(state): State<EdgeState>,
    caller: IdpCaller,
    JsonBody(body): JsonBody<DeviceConfirmBody>,
) -> Result<Json<Value>, ApiError> {
    let user_code = body.user_code.ok_or_else(|| ApiError::invalid_request("missing_field", "user_code is required"))?;
    let request =
        ConfirmDeviceRequest { identity: Some(caller.subject()), user_code, tenant_id: caller.tenant_id.clone().unwrap_or_default() };
    let confirmed = state.identity.confirm_device(request).await?;
    Ok(Json(json!({
        "confirmed": true,
        "user_code": confirmed.user_code,
        "client_name": confirmed.client_name,
        "tenant": tenant_view(confirmed.tenant.as_ref()),
        "role": confirmed.role,
        "confirmed_at": confirmed.confirmed_at,
    })))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LinkBody {
    role: Option<String>,
}

/// `POST /v1/auth/link` (tenant admin scope): `{role? (owner | admin | member, default admin)}` -> 201
/// with a browser link that claims the tenant once, for seven days.
pub async fn link(
    State(state): State<EdgeState>,
    caller: Caller,
    OptionalJsonBody(body): OptionalJsonBody<LinkBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if !caller.is_tenant_admin() {
        return Err(ApiError::forbidden("forbidden", "browser links need a key with the tenant admin scope"));
    }
    let request = CreateClaimLinkRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        role: body.role.unwrap_or_else(|| "admin".to_string()),
        max_uses: 1,
        expires_in_days: 7,
        created_by: caller.identity.key_id.clone(),
    };
    let claim = state.identity.create_claim_link(request).await?;
    Ok((StatusCode::CREATED, Json(crate::views::claim(&claim))))
}
