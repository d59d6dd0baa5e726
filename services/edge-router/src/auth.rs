//! Who is calling: API keys resolved through identity and cached in memory, so the hot path makes no
//! call per request; revocations and tenant changes arriving on the bus evict cached entries at once.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use brainstorm_common::bus::EventBus;
use brainstorm_common::collections::HashMap;
use brainstorm_common::config::Secret;
use brainstorm_common::time::parse_timestamp;
use brainstorm_common::{ApiError, Recovery};
use brainstorm_proto::ErrorKind;
use brainstorm_proto::events::{IDENTITY_EVENTS_TOPIC, IdentityEvent, identity_event};
use brainstorm_proto::identity::{
    AgentProfile, AgentProfileRef, ApiKey, AuthenticateAgentCertificateRequest, AuthenticateAgentRequest, AuthenticateRequest,
    IdentityClient, Principal, Tenant,
};
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use brainstorm_policy_firewall::RequestFacts;

use crate::EdgeState;
use crate::extract::RequestId;

/// Permissions held by the platform administrator key.
const PLATFORM_ADMIN_PERMISSIONS: [&str; 3] = ["admin.read", "admin.write", "platform.admin"];

/// An authenticated caller: a tenant key or the platform administrator.
#[derive(Debug, Clone)]
pub struct Caller {
    pub identity: Arc<CallerIdentity>,
}

/// What the edge knows about a caller, resolved once and cached.
#[derive(Debug)]
pub struct CallerIdentity {
    /// None for the platform administrator.
    pub tenant_id: Option<String>,
    pub key_id: String,
    pub role: String,
    pub scopes: Vec<String>,
    pub permissions: BTreeSet<String>,
    pub allowed_models: Vec<String>,
    pub expires_at: Option<DateTime<Utc>>,
    /// The tenant's plan (`sandbox`, `standard`); empty for the platform administrator.
    pub plan: String,
    /// The key's record (budget, rate limit), for tenant keys.
    pub key: Option<ApiKey>,
}

impl Caller {
    /// Fails with 403 `forbidden` unless the caller holds `permission`.
    pub fn require(&self, permission: &str) -> Result<(), ApiError> {
        if self.identity.permissions.contains(permission) { Ok(()) } else { Err(ApiError::missing_permission(permission)) }
    }

    /// The caller's tenant; the platform administrator has none.
    pub fn tenant_id(&self) -> Result<&str, ApiError> {
        self.identity.tenant_id.as_deref().ok_or_else(|| {
            ApiError::forbidden("tenant_key_required", "the platform administrator key belongs to no tenant: use a tenant API key")
        })
    }

    /// Whether the key carries the tenant `admin` role or scope.
    pub fn is_tenant_admin(&self) -> bool {
        self.identity.tenant_id.is_some() && (self.identity.role == "admin" || self.identity.scopes.iter().any(|scope| scope == "admin"))
    }

    /// Whether the key may use `model` (no allowlist means every model). An entry `provider/model`
    /// allows exactly that; a bare entry `model` allows it from any provider.
    pub fn may_use_model(&self, model: &str) -> bool {
        let allowed = &self.identity.allowed_models;
        let bare = model.split_once('/').map_or(model, |(_, bare)| bare);
        allowed.is_empty() || allowed.iter().any(|entry| entry == model || (!entry.contains('/') && entry == bare))
    }
}

struct CacheEntry {
    identity: Arc<CallerIdentity>,
    fetched_at: Instant,
}

/// What an agent's profile says about whether it may act; None in the cache: it has no profile.
#[derive(Debug)]
struct AgentStanding {
    lifecycle_state: String,
    expires_at: Option<DateTime<Utc>>,
    owner_id: Option<String>,
}

/// What the edge knows of an agent a request is attributed to, once it may act.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentAdmission {
    /// A profile exists for the agent id.
    pub registered: bool,
    /// The profile's lifecycle state, when registered.
    pub lifecycle_state: Option<String>,
    /// The profile's owner, when it names one.
    pub owner_id: Option<String>,
}

impl AgentAdmission {
    fn of(standing: Option<&AgentStanding>) -> Self {
        match standing {
            None => AgentAdmission::default(),
            Some(standing) => AgentAdmission {
                registered: true,
                lifecycle_state: Some(standing.lifecycle_state.clone()),
                owner_id: standing.owner_id.clone(),
            },
        }
    }
}

impl AgentStanding {
    /// 403 for an agent that may not act now (quarantined, suspended, terminated, past its expiry).
    fn refusal(&self, agent_id: &str) -> Option<ApiError> {
        let (code, state) = match self.lifecycle_state.as_str() {
            "quarantined" => ("agent_quarantined", "quarantined"),
            "suspended" => ("agent_suspended", "suspended"),
            "terminated" => ("agent_terminated", "terminated"),
            _ if self.expires_at.is_some_and(|expires_at| expires_at <= Utc::now()) => ("agent_expired", "past its expiry"),
            _ => return None,
        };
        let mut error = ApiError::forbidden(code, format!("agent `{agent_id}` is {state}: its requests are refused"));
        error.recovery = Recovery {
            action: "check_agent",
            endpoint: format!("/v1/agent/profiles/{agent_id}"),
            method: "GET",
            body_template: serde_json::Value::Null,
            message: "an admin or operator moves the agent back to active (PATCH /v1/agent/profiles/lifecycle/{agentId})".to_string(),
            wait_ms: None,
            reason: None,
        };
        Some(error)
    }
}

/// Agent standings by tenant, then agent id (looked up without building a key).
type AgentStandings = HashMap<String, HashMap<String, (Option<AgentStanding>, Instant)>>;

/// Agents one tenant's cache holds before stale entries are dropped (attribution can come from
/// end-user ids, so the set of ids is open).
const MAX_CACHED_AGENTS_PER_TENANT: usize = 10_000;

/// Resolves presented keys to callers, with an in-memory cache in front of identity.
pub struct Authenticator {
    identity: IdentityClient,
    platform_admin_digest: Option<[u8; 32]>,
    ttl: Duration,
    cache: RwLock<HashMap<[u8; 32], CacheEntry>>,
    agents: RwLock<AgentStandings>,
}

impl Authenticator {
    /// An authenticator asking `identity` on cache misses; entries live at most `ttl`.
    pub fn new(identity: IdentityClient, platform_admin_key: Option<&Secret>, ttl: Duration) -> Self {
        Authenticator {
            identity,
            platform_admin_digest: platform_admin_key.map(|key| digest(key.expose())),
            ttl,
            cache: RwLock::new(HashMap::default()),
            agents: RwLock::new(HashMap::default()),
        }
    }

    /// Refuses a request attributed to an agent whose profile says it may not act: quarantined,
    /// suspended, terminated or expired (403). Agents without a profile, provisioned and active ones
    /// pass. The standing is cached like keys (evicted by the agent's change events, else by TTL).
    pub async fn admit_agent(&self, tenant_id: &str, agent_id: &str) -> Result<AgentAdmission, ApiError> {
        // Judged under the read lock.
        let cached = self.agents.read().ok().and_then(|agents| {
            let (standing, fetched_at) = agents.get(tenant_id)?.get(agent_id)?;
            (fetched_at.elapsed() < self.ttl).then(|| match standing.as_ref().and_then(|standing| standing.refusal(agent_id)) {
                Some(refusal) => Err(refusal),
                None => Ok(AgentAdmission::of(standing.as_ref())),
            })
        });
        if let Some(admission) = cached {
            return admission;
        }
        let reference = AgentProfileRef { tenant_id: tenant_id.to_string(), agent_id: agent_id.to_string() };
        let standing = match self.identity.get_agent_profile(reference).await {
            Ok(profile) => Some(AgentStanding {
                lifecycle_state: profile.lifecycle_state,
                expires_at: profile.expires_at.as_deref().and_then(parse_timestamp),
                owner_id: profile.owner_id.filter(|owner| !owner.is_empty()),
            }),
            Err(error) if error.kind == ErrorKind::NotFound => None,
            Err(error) => return Err(error.into()),
        };
        let refusal = standing.as_ref().and_then(|standing| standing.refusal(agent_id));
        let admission = AgentAdmission::of(standing.as_ref());
        if let Ok(mut agents) = self.agents.write() {
            let tenant = agents.entry(tenant_id.to_string()).or_default();
            if tenant.len() >= MAX_CACHED_AGENTS_PER_TENANT {
                let ttl = self.ttl;
                tenant.retain(|_, (_, fetched_at)| fetched_at.elapsed() < ttl);
                if tenant.len() >= MAX_CACHED_AGENTS_PER_TENANT {
                    tenant.clear();
                }
            }
            tenant.insert(agent_id.to_string(), (standing, Instant::now()));
        }
        refusal.map_or(Ok(admission), Err)
    }

    /// Forgets an agent whose profile changed.
    pub fn evict_agent(&self, tenant_id: &str, agent_id: &str) {
        if let Ok(mut agents) = self.agents.write()
            && let Some(tenant) = agents.get_mut(tenant_id)
        {
            tenant.remove(agent_id);
        }
    }

    /// Authenticates a request's headers.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let presented = presented_key(headers)?;
        let presented_digest = digest(presented);
        if let Some(admin_digest) = &self.platform_admin_digest
            && bool::from(admin_digest.ct_eq(&presented_digest))
        {
            return Ok(Caller { identity: Arc::new(platform_admin()) });
        }
        if let Some(identity) = self.cached(&presented_digest) {
            return Ok(Caller { identity });
        }
        let principal = self.identity.authenticate(AuthenticateRequest { api_key: presented.to_string() }).await.map_err(ApiError::from)?;
        let identity = Arc::new(caller_identity(principal)?);
        if let Ok(mut cache) = self.cache.write() {
            cache.insert(presented_digest, CacheEntry { identity: identity.clone(), fetched_at: Instant::now() });
        }
        Ok(Caller { identity })
    }

    fn cached(&self, presented_digest: &[u8; 32]) -> Option<Arc<CallerIdentity>> {
        let cache = self.cache.read().ok()?;
        let entry = cache.get(presented_digest)?;
        let fresh = entry.fetched_at.elapsed() < self.ttl;
        let unexpired = entry.identity.expires_at.is_none_or(|expires_at| expires_at > Utc::now());
        (fresh && unexpired).then(|| entry.identity.clone())
    }

    /// Forgets a revoked key.
    pub fn evict_key(&self, key_id: &str) {
        if let Ok(mut cache) = self.cache.write() {
            cache.retain(|_, entry| entry.identity.key_id != key_id);
        }
    }

    /// Forgets every key and agent of a tenant whose status, plan or name changed.
    pub fn evict_tenant(&self, tenant_id: &str) {
        if let Ok(mut cache) = self.cache.write() {
            cache.retain(|_, entry| entry.identity.tenant_id.as_deref() != Some(tenant_id));
        }
        if let Ok(mut agents) = self.agents.write() {
            agents.remove(tenant_id);
        }
    }

    /// Applies identity events from the bus until the bus closes.
    pub async fn follow_identity_events(self: Arc<Self>, bus: Arc<dyn EventBus>, group: String) {
        let mut subscription = match bus.subscribe(IDENTITY_EVENTS_TOPIC, &group).await {
            Ok(subscription) => subscription,
            Err(error) => {
                tracing::error!(%error, "cannot follow identity events: cached keys expire by TTL only");
                return;
            }
        };
        loop {
            let delivery = match subscription.next().await {
                Ok(delivery) => delivery,
                Err(error) => {
                    tracing::warn!(%error, "identity event stream ended");
                    return;
                }
            };
            match delivery.message().decode::<IdentityEvent>() {
                Ok(event) => match &event.kind {
                    Some(identity_event::Kind::ApiKeyRevoked(revoked)) => self.evict_key(&revoked.key_id),
                    Some(identity_event::Kind::TenantChanged(_)) => self.evict_tenant(&event.tenant_id),
                    Some(identity_event::Kind::AgentChanged(changed)) => self.evict_agent(&event.tenant_id, &changed.agent_id),
                    None => {}
                },
                Err(error) => tracing::warn!(%error, "skipping undecodable identity event"),
            }
            delivery.ack();
        }
    }
}

impl FromRequestParts<EdgeState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &EdgeState) -> Result<Self, Self::Rejection> {
        admit(parts, state).await.map_err(|refused| {
            // Completions record their own refusals (`CallerAttempt`); every other `/v1` route's
            // refusal at the door is recorded here.
            match parts.extensions.get::<RequestId>() {
                Some(request_id) if parts.uri.path().starts_with("/v1/") => crate::pipeline::record_refusal(
                    state,
                    refused.identity.as_deref(),
                    request_id,
                    &parts.headers,
                    parts.uri.path(),
                    refused.error,
                ),
                _ => refused.error,
            }
        })
    }
}

/// An agent authenticated by the JWT its bootstrap minted or by the client certificate the agent CA
/// issued it (the agent self endpoints). Resolved by identity on every request, not cached: these
/// endpoints are off the hot path, and a suspension or termination applies to the very next call.
#[derive(Debug, Clone)]
pub struct AgentCaller {
    pub tenant: Tenant,
    pub profile: AgentProfile,
    /// When the presented credential expires (RFC 3339).
    pub token_expires_at: String,
    /// What the agent presented.
    pub credential: AgentCredential,
    owner_missing: bool,
}

/// How an agent proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentCredential {
    /// The JWT bootstrap or delegation minted.
    Jwt,
    /// A client certificate from the agent CA, presented in the TLS handshake.
    Certificate,
}

impl AgentCredential {
    /// The name `/v1/self` and evidence give it: `agent_jwt` or `mtls`.
    pub fn name(self) -> &'static str {
        match self {
            AgentCredential::Jwt => "agent_jwt",
            AgentCredential::Certificate => "mtls",
        }
    }
}

/// The leaf certificate a client presented in the TLS handshake (DER), put on every request of its
/// connection by the HTTPS listener. The handshake proved the client holds its key; whether the
/// agent CA vouches for it is identity's decision, made on each use.
#[derive(Debug, Clone)]
pub struct ClientCertificate(pub Arc<[u8]>);

impl AgentCaller {
    /// Fails with 403 `agent_jwt_required` for a client certificate: delegation and sub-agents
    /// take the agent's JWT only, as the spec has it.
    pub fn require_jwt(&self) -> Result<(), ApiError> {
        match self.credential {
            AgentCredential::Jwt => Ok(()),
            AgentCredential::Certificate => {
                let mut error = ApiError::forbidden(
                    "agent_jwt_required",
                    "this endpoint takes the agent's JWT, not its client certificate: send `Authorization: Bearer <jwt>`",
                );
                error.recovery = Recovery {
                    action: "use_agent_jwt",
                    endpoint: "/v1/agent/bootstrap".to_string(),
                    method: "POST",
                    body_template: serde_json::json!({"agent_id": self.profile.agent_id}),
                    message: "send the agent's JWT (bootstrap with the tenant API key mints a fresh one)".to_string(),
                    wait_ms: None,
                    reason: None,
                };
                Err(error)
            }
        }
    }

    /// Fails with 403 `owner_required` when the gateway requires owners and this agent has none
    /// (every agent endpoint but status, the profile itself and the certificate exchange).
    pub fn require_owner(&self) -> Result<(), ApiError> {
        if !self.owner_missing {
            return Ok(());
        }
        let mut error = ApiError::forbidden(
            "owner_required",
            format!("this gateway requires every agent to have an owner and agent `{}` has none", self.profile.agent_id),
        );
        error.recovery = Recovery {
            action: "set_owner",
            endpoint: format!("/v1/agent/profiles/{}", self.profile.agent_id),
            method: "PATCH",
            body_template: serde_json::json!({"ownerId": "<user id>"}),
            message: "ask an admin or operator to set the agent's ownerId, then call again".to_string(),
            wait_ms: None,
            reason: None,
        };
        Err(error)
    }
}

impl FromRequestParts<EdgeState> for AgentCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &EdgeState) -> Result<Self, Self::Rejection> {
        let (principal, credential) = if presents_credential(&parts.headers) {
            let token = match presented_key(&parts.headers) {
                Ok(token) if looks_like_jwt(token) => token,
                Ok(_) => {
                    return Err(ApiError::agent_unauthenticated(
                        "agent_token_required",
                        "this endpoint takes an agent JWT or an agent client certificate, not an API key: bootstrap the agent with POST /v1/agent/bootstrap and send its jwt",
                    ));
                }
                Err(error) => return Err(error),
            };
            (state.identity.authenticate_agent(AuthenticateAgentRequest { token: token.to_string() }).await?, AgentCredential::Jwt)
        } else if let Some(ClientCertificate(certificate)) = parts.extensions.get::<ClientCertificate>() {
            let request = AuthenticateAgentCertificateRequest { certificate_der: certificate.to_vec() };
            (state.identity.authenticate_agent_certificate(request).await?, AgentCredential::Certificate)
        } else {
            return Err(ApiError::agent_unauthenticated(
                "agent_token_required",
                "no agent JWT: send the jwt from POST /v1/agent/bootstrap as `Authorization: Bearer <jwt>`, or present the agent's client certificate over TLS",
            ));
        };
        let (Some(tenant), Some(profile)) = (principal.tenant, principal.profile) else {
            tracing::error!("identity returned an agent principal without tenant or profile");
            return Err(ApiError::internal());
        };
        let facts = RequestFacts { path: parts.uri.path(), method: parts.method.as_str(), agent_id: None, tool_names: &[], model: None };
        if let Some(error) = state.guardian.kill_switch(&tenant.id, &facts).await.api_error() {
            return Err(error);
        }
        Ok(AgentCaller {
            tenant,
            profile,
            token_expires_at: principal.token_expires_at,
            credential,
            owner_missing: principal.owner_missing,
        })
    }
}

/// Whether a request carries a bearer credential header (`Authorization` or `x-api-key`), well
/// formed or not.
pub fn presents_credential(headers: &HeaderMap) -> bool {
    headers.contains_key(axum::http::header::AUTHORIZATION) || headers.contains_key("x-api-key")
}

/// Whether a request's only credential is a client certificate: the agent-certificate path.
pub fn presents_only_certificate(parts: &Parts) -> bool {
    !presents_credential(&parts.headers) && parts.extensions.get::<ClientCertificate>().is_some()
}

/// Whether the bearer credential of a request is a JWT rather than an API key (three base64url
/// parts with a JSON header), so an endpoint taking one kind can name the other precisely.
pub fn presents_jwt(headers: &HeaderMap) -> bool {
    presented_key(headers).is_ok_and(looks_like_jwt)
}

fn looks_like_jwt(credential: &str) -> bool {
    credential.starts_with("eyJ") && credential.bytes().filter(|byte| *byte == b'.').count() == 2
}

/// A caller that was not admitted: the refusal, and who it was when the key resolved.
pub struct Refused {
    pub error: ApiError,
    pub identity: Option<Arc<CallerIdentity>>,
}

/// `Caller`, or why not: for the routes that record their refusals as evidence (completions).
pub struct CallerAttempt(pub Result<Caller, Refused>);

impl FromRequestParts<EdgeState> for CallerAttempt {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &EdgeState) -> Result<Self, Self::Rejection> {
        Ok(CallerAttempt(admit(parts, state).await))
    }
}

/// Authenticates the request, then applies the tenant's kill switch: every non-exempt path answers
/// 503 while it is active.
async fn admit(parts: &Parts, state: &EdgeState) -> Result<Caller, Refused> {
    let caller = state.authenticator.authenticate(&parts.headers).await.map_err(|error| Refused { error, identity: None })?;
    if let Some(tenant_id) = caller.identity.tenant_id.as_deref() {
        let facts = RequestFacts { path: parts.uri.path(), method: parts.method.as_str(), agent_id: None, tool_names: &[], model: None };
        if let Some(error) = state.guardian.kill_switch(tenant_id, &facts).await.api_error() {
            return Err(Refused { error, identity: Some(caller.identity) });
        }
    }
    Ok(caller)
}

/// The key from `Authorization: Bearer` or, as Anthropic clients send it, `x-api-key`.
fn presented_key(headers: &HeaderMap) -> Result<&str, ApiError> {
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
        let value = value
            .to_str()
            .map_err(|_| ApiError::unauthenticated("malformed_authorization", "the Authorization header is not valid text"))?;
        let (scheme, key) = value.trim().split_once(' ').unwrap_or((value, ""));
        if !scheme.eq_ignore_ascii_case("bearer") || key.trim().is_empty() {
            return Err(ApiError::unauthenticated("malformed_authorization", "expected `Authorization: Bearer <API key>`"));
        }
        return Ok(key.trim());
    }
    if let Some(value) = headers.get("x-api-key") {
        return value
            .to_str()
            .map(str::trim)
            .map_err(|_| ApiError::unauthenticated("malformed_api_key", "the x-api-key header is not valid text"));
    }
    Err(ApiError::unauthenticated("missing_api_key", "no API key: send `Authorization: Bearer <API key>`"))
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn platform_admin() -> CallerIdentity {
    CallerIdentity {
        tenant_id: None,
        key_id: "platform-admin".to_string(),
        role: "platform-admin".to_string(),
        scopes: vec!["platform.admin".to_string()],
        permissions: PLATFORM_ADMIN_PERMISSIONS.iter().map(|permission| permission.to_string()).collect(),
        allowed_models: Vec::new(),
        expires_at: None,
        plan: String::new(),
        key: None,
    }
}

fn caller_identity(principal: Principal) -> Result<CallerIdentity, ApiError> {
    let (Some(tenant), Some(key)) = (principal.tenant, principal.key) else {
        tracing::error!("identity returned a principal without tenant or key");
        return Err(ApiError::internal());
    };
    Ok(CallerIdentity {
        tenant_id: Some(tenant.id),
        key_id: key.id.clone(),
        role: key.role.clone(),
        scopes: key.scopes.clone(),
        permissions: principal.permissions.into_iter().collect(),
        allowed_models: key.allowed_models.clone(),
        expires_at: key.expires_at.as_deref().and_then(parse_timestamp),
        plan: tenant.plan,
        key: Some(key),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(name: &'static str, value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn keys_are_read_from_bearer_or_x_api_key() {
        assert_eq!(presented_key(&headers("authorization", "Bearer br_live_x")).ok(), Some("br_live_x"));
        assert_eq!(presented_key(&headers("authorization", "bearer  br_live_x ")).ok(), Some("br_live_x"));
        assert_eq!(presented_key(&headers("x-api-key", "br_live_y")).ok(), Some("br_live_y"));
        let code = |headers: HeaderMap| presented_key(&headers).err().and_then(|error| error.code.clone());
        assert_eq!(code(HeaderMap::new()).as_deref(), Some("missing_api_key"));
        assert_eq!(code(headers("authorization", "Basic abc")).as_deref(), Some("malformed_authorization"));
        assert_eq!(code(headers("authorization", "Bearer")).as_deref(), Some("malformed_authorization"));
    }

    #[test]
    fn agents_that_may_not_act_are_refused_by_state_and_expiry() {
        let standing = |state: &str, expires_at: Option<DateTime<Utc>>| AgentStanding {
            lifecycle_state: state.to_string(),
            expires_at,
            owner_id: None,
        };
        let code = |standing: AgentStanding| standing.refusal("planner").and_then(|error| error.code.clone());
        for (state, expected) in
            [("quarantined", "agent_quarantined"), ("suspended", "agent_suspended"), ("terminated", "agent_terminated")]
        {
            assert_eq!(code(standing(state, None)).as_deref(), Some(expected));
        }
        assert_eq!(code(standing("active", None)), None);
        assert_eq!(code(standing("provisioned", None)), None);
        let past = Utc::now() - chrono::Duration::seconds(1);
        let future = Utc::now() + chrono::Duration::hours(1);
        assert_eq!(code(standing("active", Some(past))).as_deref(), Some("agent_expired"));
        assert_eq!(code(standing("active", Some(future))), None);
        let refusal = standing("suspended", None).refusal("planner").map(|error| error.recovery.endpoint.clone());
        assert_eq!(refusal.as_deref(), Some("/v1/agent/profiles/planner"));
    }

    #[test]
    fn agent_tokens_are_told_from_api_keys() {
        assert!(presents_jwt(&headers("authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln")));
        assert!(!presents_jwt(&headers("authorization", "Bearer br_live_abcdefghijklmnopqrstuvwxyz0123456789")));
        assert!(!presents_jwt(&headers("authorization", "Bearer eyJhbGciOiJIUzI1NiJ9")));
        assert!(!presents_jwt(&HeaderMap::new()));
    }
}
