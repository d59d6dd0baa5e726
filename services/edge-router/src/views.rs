//! How service records are shown over REST: the spec's field names, secrets never included.

use brainstorm_common::money::Usd;
use brainstorm_common::time::parse_timestamp;
use brainstorm_proto::identity::{AgentProfile, ApiKey, ClaimToken, Invitation, InviteCode, Tenant, User};
use serde_json::{Value, json};

pub fn tenant(tenant: &Tenant) -> Value {
    json!({
        "id": tenant.id,
        "slug": tenant.slug,
        "name": tenant.name,
        "plan": tenant.plan,
        "tier": tenant.tier,
        "status": tenant.status,
        "user_count": tenant.user_count,
        "created_at": tenant.created_at,
        "updated_at": tenant.updated_at,
        "email_verified_at": tenant.email_verified_at,
        "graduated_at": tenant.graduated_at,
    })
}

pub fn api_key(key: &ApiKey) -> Value {
    let expired = key.expires_at.as_deref().and_then(parse_timestamp).is_some_and(|expires_at| expires_at <= chrono::Utc::now());
    let status = if key.revoked_at.is_some() {
        "revoked"
    } else if expired {
        "expired"
    } else {
        "active"
    };
    json!({
        "id": key.id,
        "name": key.name,
        "prefix": key.prefix,
        "masked_key": format!("{}...", key.prefix),
        "role": key.role,
        "scopes": key.scopes,
        "budget_limit_usd": key.budget_limit_nanos.map(|nanos| Usd::from_nanos(nanos).to_json()),
        "budget_period": key.budget_period,
        "rate_limit_rpm": key.rate_limit_rpm,
        "expires_at": key.expires_at,
        "allowed_models": key.allowed_models,
        "status": status,
        "created_at": key.created_at,
        "revoked_at": key.revoked_at,
    })
}

pub fn user(user: &User) -> Value {
    json!({
        "id": user.id,
        "email": user.email,
        "role": user.role,
        "status": user.status,
        "created_at": user.created_at,
    })
}

pub fn invitation(invitation: &Invitation) -> Value {
    json!({
        "email": invitation.email,
        "role": invitation.role,
        "claim_url": invitation.claim_url,
        "expires_at": invitation.expires_at,
        "user_id": invitation.user_id,
    })
}

pub fn claim(claim: &ClaimToken) -> Value {
    json!({
        "token": claim.token,
        "url": claim.url,
        "expires_at": claim.expires_at,
        "role": claim.role,
        "max_uses": claim.max_uses,
    })
}

pub fn invite_code(code: &InviteCode) -> Value {
    let remaining = code.max_uses.map(|max_uses| max_uses.saturating_sub(code.uses));
    json!({
        "id": code.id,
        "code": code.code,
        "max_uses": code.max_uses,
        "uses": code.uses,
        "remaining_uses": remaining,
        "expires_at": code.expires_at,
        "created_at": code.created_at,
    })
}

/// An agent profile as the spec spells it (camelCase; budgets in US dollars).
pub fn agent_profile(profile: &AgentProfile) -> Value {
    json!({
        "id": profile.id,
        "tenantId": profile.tenant_id,
        "agentId": profile.agent_id,
        "displayName": profile.display_name,
        "ownerId": profile.owner_id,
        "costCenter": profile.cost_center,
        "budgetDailyUsd": profile.budget_daily_nanos.map(|nanos| Usd::from_nanos(nanos).to_json()),
        "budgetMonthlyUsd": profile.budget_monthly_nanos.map(|nanos| Usd::from_nanos(nanos).to_json()),
        "role": profile.role,
        "lifecycleState": profile.lifecycle_state,
        "manifestId": profile.manifest_id,
        "parentAgentId": profile.parent_agent_id,
        "expiresAt": profile.expires_at,
        // Stored as an object's text; anything else (never written) shows as `{}`.
        "metadata": serde_json::from_str::<Value>(&profile.metadata_json).ok().filter(Value::is_object).unwrap_or_else(|| json!({})),
        "createdAt": profile.created_at,
        "updatedAt": profile.updated_at,
    })
}

/// A JSON value stored as text, as an answer shows it (empty or unreadable text: null).
pub fn json_text(text: &str) -> Value {
    if text.is_empty() { Value::Null } else { serde_json::from_str(text).unwrap_or(Value::Null) }
}
