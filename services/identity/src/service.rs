//! Identity's rules: registration, authentication, users, keys and administration, over its store.

use std::sync::Arc;

use async_trait::async_trait;
use brainstorm_common::bus::EventBus;
use brainstorm_common::config::RegistrationMode;
use brainstorm_common::money::Usd;
use brainstorm_common::outbox::{Mail, MailOutbox};
use brainstorm_common::store::{Database, is_unique_violation};
use brainstorm_common::time::{format_timestamp, now_timestamp, parse_timestamp};
use brainstorm_proto::events::{self, IdentityEvent, identity_event};
use brainstorm_proto::identity::*;
use brainstorm_proto::{ErrorKind, ServiceError, ServiceResult};
use chrono::{Duration, Utc};
use prost::Message;

use crate::agent_cert::{self, AgentCertificateAuthority, AgentSubject, CertError, RequestedKey};
use crate::agent_token::{AgentTokenSigner, TokenError, TrustClaims};
use crate::agents::{self, AgentStore, Delegation};
use crate::bridge::{self, DEVICE_CODE_PREFIX, DEVICE_CODE_SECONDS, DEVICE_KEY_DAYS, POLL_INTERVAL_SECONDS};
use crate::certificates::{self, CertificateStore, Selection};
use crate::oauth;
use crate::rbac::{self, ROLES};
use crate::secrets::{self, CLAIM_TOKEN_PREFIX, LIVE_KEY_PREFIX};
use crate::store::{
    ApiKeyRecord, ClaimTokenRecord, DeviceRow, EmailVerificationRecord, IdentityStore, MembershipRow, OAuthCodeRecord, PLANS, SANDBOX_PLAN,
    STANDARD_PLAN, TenantGrouping, tier_of_plan,
};

const REGISTRATION_CLAIM_DAYS: i64 = 7;
const INVITATION_DAYS: i64 = 7;
const MAX_NAME_CHARS: usize = 128;
const TENANT_STATUSES: [&str; 3] = ["active", "pending", "rejected"];
const CLAIM_ROLES: [&str; 3] = ["owner", "admin", "member"];
/// Lifetime of a mailed verification code (the spec's `expires_in_seconds`).
const VERIFICATION_CODE_SECONDS: u32 = 600;
/// Confirmations a code allows, the successful one included; the fifth wrong one invalidates it.
const MAX_VERIFICATION_ATTEMPTS: i64 = 5;

/// What identity needs besides its store.
#[derive(Debug, Clone)]
pub struct IdentityOptions {
    /// Base of claim and invitation links (`{dashboard_url}`).
    pub dashboard_url: String,
    pub registration_mode: RegistrationMode,
    pub outbox: MailOutbox,
    /// The owner-required switch (`BR_REQUIRE_AGENT_OWNER`): every agent profile needs an owner.
    pub require_agent_owner: bool,
    /// Mints and verifies agent JWTs; None (no master key) answers bootstrap and agent
    /// authentication with 503 `agent_tokens_unavailable`.
    pub agent_tokens: Option<AgentTokenSigner>,
    /// Issues and verifies agent client certificates (mTLS); None (no master key) answers both
    /// with 503 `agent_certificates_unavailable`.
    pub agent_ca: Option<Arc<AgentCertificateAuthority>>,
}

/// The identity service.
#[derive(Clone)]
pub struct IdentityServiceImpl {
    store: IdentityStore,
    agents: AgentStore,
    certificates: CertificateStore,
    bus: Arc<dyn EventBus>,
    options: Arc<IdentityOptions>,
}

impl IdentityServiceImpl {
    /// Identity over a migrated database, publishing its changes on `bus`.
    pub fn new(database: Database, bus: Arc<dyn EventBus>, options: IdentityOptions) -> Self {
        IdentityServiceImpl {
            store: IdentityStore::new(database.clone()),
            agents: AgentStore::new(database.clone()),
            certificates: CertificateStore::new(database),
            bus,
            options: Arc::new(options),
        }
    }

    /// A new tenant's status under the registration mode: `active`, or `pending` (approval mode
    /// without an invite code); invite mode without a code is refused.
    fn registration_status(&self, invite_code: Option<&str>) -> ServiceResult<&'static str> {
        if invite_code.is_none() && self.options.registration_mode == RegistrationMode::Invite {
            return Err(ServiceError::invalid("invite_code_required", "registration requires an invite code (field `invite_code`)"));
        }
        Ok(match (invite_code, self.options.registration_mode) {
            (None, RegistrationMode::Approval) => "pending",
            _ => "active",
        })
    }

    /// A stored membership as the bridge shows it; None when its tenant or user was deleted since.
    async fn membership_of(&self, row: MembershipRow) -> ServiceResult<Option<IdpMembership>> {
        let Some(tenant) = self.store.tenant(&row.tenant_id).await.map_err(store_failure)? else { return Ok(None) };
        let Some(user) = self.store.user(&row.tenant_id, &row.user_id).await.map_err(store_failure)? else { return Ok(None) };
        Ok(Some(idp_membership(tenant, user, row)))
    }

    /// The tenant the identity provisioned before, as a membership (no key: it was shown once); 404
    /// `provisioned_tenant_gone` when that tenant or the identity's user in it was deleted since.
    async fn provisioned(&self, identity: &IdpSubject) -> ServiceResult<Option<ProvisionedTenant>> {
        let Some(tenant_id) = self.store.provisioned_tenant(&identity.issuer, &identity.subject).await.map_err(store_failure)? else {
            return Ok(None);
        };
        let rows = self.store.memberships(&identity.issuer, &identity.subject).await.map_err(store_failure)?;
        let membership = match rows.into_iter().find(|row| row.tenant_id == tenant_id) {
            Some(row) => self.membership_of(row).await?,
            None => None,
        };
        let membership = membership.ok_or_else(|| {
            ServiceError::not_found("provisioned_tenant_gone", "the tenant this identity provisioned, or its user there, was deleted")
        })?;
        Ok(Some(ProvisionedTenant { membership: Some(membership), api_key: None, created: false }))
    }

    async fn agent_or_not_found(&self, tenant_id: &str, agent_id: &str) -> ServiceResult<AgentProfile> {
        self.agents
            .get(tenant_id, agent_id)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("agent_not_found", format!("no agent profile `{agent_id}`")))
    }

    fn agent_tokens(&self) -> ServiceResult<&AgentTokenSigner> {
        self.options.agent_tokens.as_ref().ok_or_else(|| {
            ServiceError::unavailable("agent_tokens_unavailable", "agent tokens need a signing secret: start identity with BR_MASTER_KEY")
        })
    }

    /// An existing profile bootstrapped again: refused when suspended, terminated, expired or owned by
    /// another owner than the one requested; a `provisioned` profile becomes `active` (its agent is up).
    async fn bootstrapped_again(&self, mut profile: AgentProfile, request: &BootstrapAgentRequest) -> ServiceResult<AgentProfile> {
        usable_agent(&profile)?;
        let requested_owner = request.owner_id.as_deref().map(str::trim).filter(|owner| !owner.is_empty());
        if let (Some(requested), Some(owner)) = (requested_owner, profile.owner_id.as_deref())
            && requested != owner
        {
            return Err(ServiceError::conflict(
                "agent_exists",
                format!(
                    "agent `{}` already exists with another owner: bootstrap it as its owner or pick another agent_id",
                    profile.agent_id
                ),
            ));
        }
        if profile.lifecycle_state == "provisioned" {
            profile.lifecycle_state = "active".to_string();
            profile.updated_at = now_timestamp();
            if !self.agents.update(&profile, "provisioned").await.map_err(store_failure)? {
                return Err(ServiceError::conflict("concurrent_change", "the agent profile changed meanwhile; bootstrap again"));
            }
            tracing::info!(tenant_id = %profile.tenant_id, agent_id = %profile.agent_id, "agent bootstrapped: provisioned -> active");
            self.publish_agent_changed(&profile, false).await;
        }
        Ok(profile)
    }

    fn claim_url(&self, token: &str) -> String {
        format!("{}/claim?token={token}", self.options.dashboard_url)
    }

    async fn tenant_or_not_found(&self, tenant_id: &str) -> ServiceResult<Tenant> {
        self.store
            .tenant(tenant_id)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("tenant_not_found", format!("tenant `{tenant_id}` does not exist")))
    }

    /// Tells every edge that the tenant changed (its cached principals carry the tenant) and returns it.
    async fn publish_tenant_changed(&self, tenant_id: &str) -> ServiceResult<Tenant> {
        let tenant = self.tenant_or_not_found(tenant_id).await?;
        let changed = events::TenantChanged { status: tenant.status.clone() };
        self.publish(tenant_id, identity_event::Kind::TenantChanged(changed)).await;
        Ok(tenant)
    }

    /// Tells every edge that an agent's profile changed (they cache whether it may act).
    async fn publish_agent_changed(&self, profile: &AgentProfile, deleted: bool) {
        let state = if deleted { String::new() } else { profile.lifecycle_state.clone() };
        let changed = events::AgentChanged { agent_id: profile.agent_id.clone(), lifecycle_state: state };
        self.publish(&profile.tenant_id, identity_event::Kind::AgentChanged(changed)).await;
    }

    /// Why a confirmation that could not count an attempt is refused, given the tenant's pending
    /// verification (read in the attempt's transaction, which must be over: this may read the tenant).
    async fn refusal_without_attempt(&self, tenant_id: &str, pending: Option<EmailVerificationRecord>) -> ServiceError {
        match pending {
            None => match self.tenant_or_not_found(tenant_id).await {
                Ok(_) => {
                    ServiceError::invalid("no_pending_verification", "no verification code is pending: request one with verify-email first")
                }
                Err(error) => error,
            },
            Some(pending) if pending.attempts >= MAX_VERIFICATION_ATTEMPTS => too_many_attempts(),
            Some(_) => ServiceError::invalid("code_expired", "the verification code has expired: request a new one with verify-email"),
        }
    }

    /// Publishes a change for every edge's cache; a lost event only delays invalidation until the
    /// cache entry's TTL, so it is logged rather than failing the change that already committed.
    async fn publish(&self, tenant_id: &str, kind: identity_event::Kind) {
        let event = IdentityEvent { tenant_id: tenant_id.to_string(), occurred_at: now_timestamp(), kind: Some(kind) };
        let result = self.bus.publish(events::IDENTITY_EVENTS_TOPIC, tenant_id, event.encode_to_vec().into()).await;
        if let Err(error) = result {
            tracing::warn!(%error, tenant_id, "could not publish identity event");
        }
    }
}

#[async_trait]
impl IdentityService for IdentityServiceImpl {
    async fn register(&self, request: RegisterRequest) -> ServiceResult<RegisterResponse> {
        let name = validated_name("tenant_name", &request.tenant_name)?;
        let invite_code = request.invite_code.as_deref().map(str::trim).filter(|code| !code.is_empty());
        let status = self.registration_status(invite_code)?;
        let id = match request.tenant_id.as_deref() {
            None => uuid::Uuid::new_v4(),
            Some(text) => {
                uuid::Uuid::parse_str(text).map_err(|_| ServiceError::invalid("invalid_tenant_id", "tenant_id must be a UUID"))?
            }
        };
        let now = Utc::now();
        let created_at = format_timestamp(now);
        let tenant = new_sandbox_tenant(id.hyphenated().to_string(), name, status, &created_at);
        let (key, plaintext_key) = new_admin_key(&tenant.id, "registration", &created_at);
        let claim_token = secrets::mint(CLAIM_TOKEN_PREFIX);
        let claim = ClaimTokenRecord {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: tenant.id.clone(),
            token_hash: secrets::digest(&claim_token),
            role: "owner".to_string(),
            max_uses: 1,
            purpose: "registration".to_string(),
            email: None,
            expires_at: format_timestamp(now + Duration::days(REGISTRATION_CLAIM_DAYS)),
            created_at: created_at.clone(),
            created_by: None,
        };

        let mut transaction = self.store.begin().await.map_err(store_failure)?;
        insert_new_tenant(&mut transaction, invite_code, &tenant, &key, &plaintext_key).await?;
        IdentityStore::insert_claim_token(&mut transaction, &claim).await.map_err(store_failure)?;
        transaction.commit().await.map_err(store_failure)?;
        tracing::info!(tenant_id = %tenant.id, slug = %tenant.slug, status, "tenant registered");

        Ok(RegisterResponse {
            claim: Some(ClaimToken {
                url: self.claim_url(&claim_token),
                token: claim_token,
                expires_at: claim.expires_at,
                role: claim.role,
                max_uses: 1,
            }),
            tenant: Some(tenant),
            api_key: Some(CreatedApiKey { key: Some(key), plaintext: plaintext_key }),
        })
    }

    async fn authenticate(&self, request: AuthenticateRequest) -> ServiceResult<Principal> {
        if !secrets::looks_like_api_key(&request.api_key) {
            return Err(ServiceError::unauthenticated(
                "malformed_api_key",
                "the API key is malformed: expected br_live_... or br_test_...",
            ));
        }
        let key = self.store.api_key_by_hash(&secrets::digest(&request.api_key)).await.map_err(store_failure)?;
        let Some(key) = key else {
            return Err(ServiceError::unauthenticated("invalid_api_key", "the API key is not recognised"));
        };
        if key.revoked_at.is_some() {
            return Err(ServiceError::unauthenticated("revoked_api_key", "the API key has been revoked"));
        }
        let expired = key.expires_at.as_deref().and_then(parse_timestamp).is_some_and(|expires_at| expires_at <= Utc::now());
        if expired {
            return Err(ServiceError::unauthenticated("expired_api_key", "the API key has expired"));
        }
        let tenant = self.tenant_or_not_found(&key.tenant_id).await?;
        usable_tenant(&tenant)?;
        let permissions = rbac::resolve_permissions(&key.scopes)
            .map_err(|error| ServiceError::internal(format!("stored key has invalid scopes: {error}")))?;
        Ok(Principal { tenant: Some(tenant), key: Some(key), permissions: permissions.into_iter().collect() })
    }

    async fn get_tenant(&self, request: TenantRef) -> ServiceResult<Tenant> {
        self.tenant_or_not_found(&request.tenant_id).await
    }

    async fn update_tenant(&self, request: UpdateTenantRequest) -> ServiceResult<Tenant> {
        if let Some(name) = request.name.as_deref() {
            let name = validated_name("name", name)?;
            let renamed = self.store.rename_tenant(&request.tenant_id, &name, &now_timestamp()).await.map_err(store_failure)?;
            if !renamed {
                return Err(ServiceError::not_found("tenant_not_found", "tenant does not exist"));
            }
            self.publish(&request.tenant_id, identity_event::Kind::TenantChanged(events::TenantChanged::default())).await;
        }
        self.tenant_or_not_found(&request.tenant_id).await
    }

    async fn list_users(&self, request: TenantRef) -> ServiceResult<UserList> {
        let users = self.store.users(&request.tenant_id).await.map_err(store_failure)?;
        Ok(UserList { users })
    }

    async fn invite_user(&self, request: InviteUserRequest) -> ServiceResult<Invitation> {
        let email = validated_email(&request.email)?;
        let claim_role = if request.role.is_empty() { "member" } else { request.role.as_str() };
        let user_role = user_role_of_claim_role(claim_role)?;
        let tenant = self.tenant_or_not_found(&request.tenant_id).await?;
        let now = Utc::now();
        let user = User {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: tenant.id.clone(),
            email: email.clone(),
            role: user_role.to_string(),
            status: "invited".to_string(),
            created_at: format_timestamp(now),
        };
        let token = secrets::mint(CLAIM_TOKEN_PREFIX);
        let claim = ClaimTokenRecord {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: tenant.id.clone(),
            token_hash: secrets::digest(&token),
            role: claim_role.to_string(),
            max_uses: 1,
            purpose: "invitation".to_string(),
            email: Some(email.clone()),
            expires_at: format_timestamp(now + Duration::days(INVITATION_DAYS)),
            created_at: user.created_at.clone(),
            created_by: Some(request.invited_by.clone()).filter(|by| !by.is_empty()),
        };
        let mut transaction = self.store.begin().await.map_err(store_failure)?;
        if let Err(error) = IdentityStore::insert_user(&mut transaction, &user).await {
            return Err(if is_unique_violation(&error) {
                ServiceError::conflict("user_exists", format!("{email} is already a user of this tenant"))
            } else {
                store_failure(error)
            });
        }
        IdentityStore::insert_claim_token(&mut transaction, &claim).await.map_err(store_failure)?;
        transaction.commit().await.map_err(store_failure)?;

        let claim_url = self.claim_url(&token);
        let mail = Mail {
            to: email.clone(),
            subject: format!("You are invited to {} on Brainstorm", tenant.name),
            body: format!(
                "You have been invited to join the tenant \"{}\" on Brainstorm as {claim_role}.\n\nAccept the invitation: {claim_url}\n\nThe link expires at {}.\n",
                tenant.name, claim.expires_at
            ),
        };
        // The invitation stands even if the mail cannot be written: its link is in the response.
        if let Err(error) = self.options.outbox.deliver(&mail).await {
            tracing::error!(%error, tenant_id = %tenant.id, "invitation mail not written");
        }
        Ok(Invitation { email, role: claim_role.to_string(), claim_url, expires_at: claim.expires_at, user_id: user.id })
    }

    async fn delete_user(&self, request: DeleteUserRequest) -> ServiceResult<User> {
        let not_found = || ServiceError::not_found("user_not_found", format!("user `{}` does not exist in this tenant", request.user_id));
        let user = self.store.user(&request.tenant_id, &request.user_id).await.map_err(store_failure)?.ok_or_else(not_found)?;
        if !self.store.delete_user(&user).await.map_err(store_failure)? {
            return Err(not_found());
        }
        Ok(user)
    }

    async fn create_claim_link(&self, request: CreateClaimLinkRequest) -> ServiceResult<ClaimToken> {
        let role = if request.role.is_empty() { "member" } else { request.role.as_str() };
        user_role_of_claim_role(role)?;
        let max_uses = if request.max_uses == 0 { 1 } else { request.max_uses };
        if max_uses > 1000 {
            return Err(ServiceError::invalid("invalid_max_uses", "max_uses must be between 1 and 1000"));
        }
        let days = if request.expires_in_days == 0 { 7 } else { request.expires_in_days };
        if days > 90 {
            return Err(ServiceError::invalid("invalid_expires_in_days", "expires_in_days must be between 1 and 90"));
        }
        self.tenant_or_not_found(&request.tenant_id).await?;
        let now = Utc::now();
        let token = secrets::mint(CLAIM_TOKEN_PREFIX);
        let claim = ClaimTokenRecord {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: request.tenant_id.clone(),
            token_hash: secrets::digest(&token),
            role: role.to_string(),
            max_uses: i64::from(max_uses),
            purpose: "claim_link".to_string(),
            email: None,
            expires_at: format_timestamp(now + Duration::days(i64::from(days))),
            created_at: format_timestamp(now),
            created_by: Some(request.created_by.clone()).filter(|by| !by.is_empty()),
        };
        let mut transaction = self.store.begin().await.map_err(store_failure)?;
        IdentityStore::insert_claim_token(&mut transaction, &claim).await.map_err(store_failure)?;
        transaction.commit().await.map_err(store_failure)?;
        Ok(ClaimToken { url: self.claim_url(&token), token, expires_at: claim.expires_at, role: claim.role, max_uses })
    }

    async fn create_api_key(&self, request: CreateApiKeyRequest) -> ServiceResult<CreatedApiKey> {
        let name = if request.name.trim().is_empty() { "api key".to_string() } else { validated_name("name", &request.name)? };
        let role = if request.role.is_empty() { "developer".to_string() } else { request.role.clone() };
        if !ROLES.contains(&role.as_str()) {
            return Err(ServiceError::invalid("invalid_role", format!("role must be one of {}", ROLES.join(", "))));
        }
        let scopes = if request.scopes.is_empty() { vec![role.clone()] } else { request.scopes.clone() };
        let granted = rbac::resolve_permissions(&scopes).map_err(|error| ServiceError::invalid("invalid_scope", error.to_string()))?;
        let beyond_creator: Vec<&String> = granted.iter().filter(|permission| !request.creator_permissions.contains(permission)).collect();
        if !beyond_creator.is_empty() {
            let listed: Vec<&str> = beyond_creator.iter().map(|permission| permission.as_str()).collect();
            return Err(ServiceError::permission_denied(
                "privilege_escalation",
                format!("a key cannot grant permissions its creator lacks: {}", listed.join(", ")),
            ));
        }
        if request.budget_limit_nanos.is_some_and(|nanos| nanos < 0) {
            return Err(ServiceError::invalid("invalid_budget_limit", "budget_limit_usd must not be negative"));
        }
        let budget_period = match request.budget_period.as_deref() {
            None if request.budget_limit_nanos.is_some() => Some("monthly".to_string()),
            None => None,
            Some(period @ ("daily" | "monthly")) => Some(period.to_string()),
            Some(_) => return Err(ServiceError::invalid("invalid_budget_period", "budget_period must be daily or monthly")),
        };
        if request.rate_limit_rpm == Some(0) {
            return Err(ServiceError::invalid("invalid_rate_limit", "rate_limit_rpm must be at least 1"));
        }
        let now = Utc::now();
        let expires_at = match request.expires_at.as_deref() {
            None => None,
            Some(text) => {
                let instant = parse_timestamp(text)
                    .ok_or_else(|| ServiceError::invalid("invalid_expires_at", "expires_at must be an ISO 8601 date-time"))?;
                if instant <= now {
                    return Err(ServiceError::invalid("invalid_expires_at", "expires_at must be in the future"));
                }
                Some(format_timestamp(instant))
            }
        };
        if request.allowed_models.iter().any(|model| model.trim().is_empty()) {
            return Err(ServiceError::invalid("invalid_allowed_models", "allowed model ids must not be empty"));
        }
        self.tenant_or_not_found(&request.tenant_id).await?;
        let plaintext = secrets::mint(LIVE_KEY_PREFIX);
        let key = ApiKey {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: request.tenant_id.clone(),
            name,
            prefix: secrets::display_prefix(&plaintext),
            role,
            scopes,
            budget_limit_nanos: request.budget_limit_nanos,
            budget_period,
            rate_limit_rpm: request.rate_limit_rpm,
            expires_at,
            allowed_models: request.allowed_models.iter().map(|model| model.trim().to_string()).collect(),
            created_at: format_timestamp(now),
            revoked_at: None,
            created_by: Some(request.created_by.clone()).filter(|by| !by.is_empty()),
        };
        let key_hash = secrets::digest(&plaintext);
        let mut transaction = self.store.begin().await.map_err(store_failure)?;
        IdentityStore::insert_api_key(&mut transaction, ApiKeyRecord { key: &key, key_hash: &key_hash }).await.map_err(store_failure)?;
        transaction.commit().await.map_err(store_failure)?;
        tracing::info!(tenant_id = %key.tenant_id, key_id = %key.id, role = %key.role, "api key created");
        Ok(CreatedApiKey { key: Some(key), plaintext })
    }

    async fn list_api_keys(&self, request: TenantRef) -> ServiceResult<ApiKeyList> {
        let keys = self.store.api_keys(&request.tenant_id).await.map_err(store_failure)?;
        Ok(ApiKeyList { keys })
    }

    async fn revoke_api_key(&self, request: RevokeApiKeyRequest) -> ServiceResult<RevokedApiKey> {
        let revoked_now = self.store.revoke_api_key(&request.tenant_id, &request.key_id, &now_timestamp()).await.map_err(store_failure)?;
        let key = self.store.api_key(&request.tenant_id, &request.key_id).await.map_err(store_failure)?.ok_or_else(|| {
            ServiceError::not_found("api_key_not_found", format!("API key `{}` does not exist in this tenant", request.key_id))
        })?;
        if revoked_now {
            tracing::info!(tenant_id = %key.tenant_id, key_id = %key.id, "api key revoked");
            let revoked = events::ApiKeyRevoked { key_id: key.id.clone() };
            self.publish(&key.tenant_id, identity_event::Kind::ApiKeyRevoked(revoked)).await;
        }
        Ok(RevokedApiKey { key: Some(key), changed: revoked_now })
    }

    async fn list_tenants(&self, request: ListTenantsRequest) -> ServiceResult<TenantList> {
        let status = request.status.as_deref().filter(|status| !status.is_empty());
        if let Some(status) = status {
            validated_status(status)?;
        }
        let tenants = self.store.tenants(status).await.map_err(store_failure)?;
        Ok(TenantList { tenants })
    }

    async fn set_tenant_status(&self, request: SetTenantStatusRequest) -> ServiceResult<TenantStatusChange> {
        validated_status(&request.status)?;
        let previous_status = self
            .store
            .set_tenant_status(&request.tenant_id, &request.status, &now_timestamp())
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("tenant_not_found", format!("tenant `{}` does not exist", request.tenant_id)))?;
        let changed = previous_status != request.status;
        if changed {
            tracing::info!(tenant_id = %request.tenant_id, from = %previous_status, status = %request.status, "tenant status changed");
            let event = events::TenantChanged { status: request.status.clone() };
            self.publish(&request.tenant_id, identity_event::Kind::TenantChanged(event)).await;
        }
        let tenant = self.tenant_or_not_found(&request.tenant_id).await?;
        Ok(TenantStatusChange { tenant: Some(tenant), changed, previous_status })
    }

    async fn create_invite_code(&self, request: CreateInviteCodeRequest) -> ServiceResult<InviteCode> {
        let code = request.code.trim();
        if code.is_empty() || code.chars().count() > MAX_NAME_CHARS {
            return Err(ServiceError::invalid("invalid_code", "code must be 1 to 128 characters"));
        }
        if request.max_uses == Some(0) {
            return Err(ServiceError::invalid("invalid_max_uses", "max_uses must be greater than 0 or null"));
        }
        let expires_at = match request.expires_at.as_deref() {
            None => None,
            Some(text) => {
                let instant = parse_timestamp(text).filter(|_| text.ends_with('Z'));
                let instant = instant.ok_or_else(|| {
                    ServiceError::invalid("invalid_expires_at", "expires_at must be a UTC date-time ending in Z, or null")
                })?;
                Some(format_timestamp(instant))
            }
        };
        let invite_code = InviteCode {
            id: uuid::Uuid::new_v4().to_string(),
            code: code.to_string(),
            max_uses: request.max_uses,
            uses: 0,
            expires_at,
            created_at: now_timestamp(),
        };
        if let Err(error) = self.store.insert_invite_code(&invite_code).await {
            return Err(if is_unique_violation(&error) {
                ServiceError::conflict("invite_code_exists", "an invite code with this code already exists")
            } else {
                store_failure(error)
            });
        }
        Ok(invite_code)
    }

    async fn list_invite_codes(&self, _request: ListInviteCodesRequest) -> ServiceResult<InviteCodeList> {
        let invite_codes = self.store.invite_codes().await.map_err(store_failure)?;
        Ok(InviteCodeList { invite_codes })
    }

    async fn delete_invite_code(&self, request: DeleteInviteCodeRequest) -> ServiceResult<DeleteInviteCodeResponse> {
        if !self.store.delete_invite_code(&request.id).await.map_err(store_failure)? {
            return Err(ServiceError::not_found("invite_code_not_found", format!("invite code `{}` does not exist", request.id)));
        }
        Ok(DeleteInviteCodeResponse { deleted: true })
    }

    async fn digest(&self, _request: DigestRequest) -> ServiceResult<PlatformDigest> {
        let now = Utc::now();
        let day_ago = format_timestamp(now - Duration::hours(24));
        let now_text = format_timestamp(now);
        let store = &self.store;
        let count = |sql: &'static str, parameters: Vec<String>| async move {
            let parameters: Vec<&str> = parameters.iter().map(String::as_str).collect();
            store.count(sql, &parameters).await.map_err(store_failure)
        };
        Ok(PlatformDigest {
            tenants_total: count("SELECT COUNT(*) FROM tenants", vec![]).await?,
            tenants_by_status: store.tenant_counts_by(TenantGrouping::Status).await.map_err(store_failure)?.into_iter().collect(),
            tenants_by_plan: store.tenant_counts_by(TenantGrouping::Plan).await.map_err(store_failure)?.into_iter().collect(),
            registrations_last_24h: count("SELECT COUNT(*) FROM tenants WHERE created_at >= $1", vec![day_ago]).await?,
            users_total: count("SELECT COUNT(*) FROM users", vec![]).await?,
            api_keys_active: count(
                "SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $1)",
                vec![now_text.clone()],
            )
            .await?,
            invite_codes_active: count(
                "SELECT COUNT(*) FROM invite_codes WHERE (max_uses IS NULL OR uses < max_uses) AND (expires_at IS NULL OR expires_at > $1)",
                vec![now_text.clone()],
            )
            .await?,
            generated_at: now_text,
        })
    }

    async fn set_tenant_plan(&self, request: SetTenantPlanRequest) -> ServiceResult<Tenant> {
        let plan = validated_plan(&request.plan)?;
        let mut transaction = self.store.begin().await.map_err(store_failure)?;
        let changed =
            IdentityStore::set_tenant_plan(&mut transaction, &request.tenant_id, plan, &now_timestamp()).await.map_err(store_failure)?;
        transaction.commit().await.map_err(store_failure)?;
        if !changed {
            // Unknown tenant (404) or already on this plan (nothing changed, nothing to evict).
            return self.tenant_or_not_found(&request.tenant_id).await;
        }
        tracing::info!(tenant_id = %request.tenant_id, plan, "tenant plan changed");
        self.publish_tenant_changed(&request.tenant_id).await
    }

    async fn start_email_verification(&self, request: StartEmailVerificationRequest) -> ServiceResult<EmailVerificationStarted> {
        let email = validated_email(&request.email)?;
        self.tenant_or_not_found(&request.tenant_id).await?;
        let now = Utc::now();
        let code = secrets::verification_code();
        let record = EmailVerificationRecord {
            tenant_id: request.tenant_id.clone(),
            code_hash: secrets::verification_code_digest(&request.tenant_id, &email, &code),
            email: email.clone(),
            attempts: 0,
            expires_at: format_timestamp(now + Duration::seconds(i64::from(VERIFICATION_CODE_SECONDS))),
            created_at: format_timestamp(now),
        };
        self.store.replace_email_verification(&record).await.map_err(store_failure)?;
        let mail = Mail {
            to: email.clone(),
            // Never the code in the subject: the outbox logs subjects.
            subject: "Verify your email address for Brainstorm".to_string(),
            body: format!(
                "Your Brainstorm verification code is {code}\n\nEnter it to verify this address and move your tenant to the standard plan. \
                 It expires in {} minutes (at {}) and works once.\n\nIf you did not ask for it, ignore this message.\n",
                VERIFICATION_CODE_SECONDS / 60,
                record.expires_at
            ),
        };
        // Unlike an invitation's link, the code exists nowhere else: without the mail there is nothing to confirm.
        if let Err(error) = self.options.outbox.deliver(&mail).await {
            tracing::error!(%error, tenant_id = %request.tenant_id, "verification mail not written");
            return Err(ServiceError::unavailable("mail_unavailable", "the verification mail could not be sent; retry shortly"));
        }
        tracing::info!(tenant_id = %request.tenant_id, "email verification started");
        Ok(EmailVerificationStarted {
            message: format!("a verification code was sent to {email}"),
            expires_in_seconds: VERIFICATION_CODE_SECONDS,
        })
    }

    async fn confirm_email_verification(&self, request: ConfirmEmailVerificationRequest) -> ServiceResult<Tenant> {
        let code = request.code.trim();
        if code.is_empty() {
            return Err(ServiceError::invalid("missing_field", "code is required"));
        }
        let now = now_timestamp();
        let mut transaction = self.store.begin().await.map_err(store_failure)?;
        // Count the attempt before comparing: the count is committed even when the code is wrong, and
        // holding the row lock makes concurrent guesses take turns.
        let counted = IdentityStore::count_verification_attempt(&mut transaction, &request.tenant_id, MAX_VERIFICATION_ATTEMPTS, &now)
            .await
            .map_err(store_failure)?;
        if !counted {
            let pending = IdentityStore::email_verification(&mut transaction, &request.tenant_id).await.map_err(store_failure)?;
            transaction.rollback().await.map_err(store_failure)?;
            return Err(self.refusal_without_attempt(&request.tenant_id, pending).await);
        }
        let pending = IdentityStore::email_verification(&mut transaction, &request.tenant_id)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::internal("a counted verification vanished inside its transaction"))?;
        let presented = secrets::verification_code_digest(&request.tenant_id, &pending.email, code);
        if !secrets::digests_match(&presented, &pending.code_hash) {
            transaction.commit().await.map_err(store_failure)?;
            let attempts_left = MAX_VERIFICATION_ATTEMPTS - pending.attempts;
            tracing::info!(tenant_id = %request.tenant_id, attempts_left, "wrong verification code");
            if attempts_left <= 0 {
                return Err(too_many_attempts());
            }
            let noun = if attempts_left == 1 { "attempt" } else { "attempts" };
            return Err(ServiceError::invalid("invalid_code", format!("the verification code is wrong ({attempts_left} {noun} left)")));
        }
        if !IdentityStore::consume_email_verification(&mut transaction, &request.tenant_id, &pending.code_hash)
            .await
            .map_err(store_failure)?
        {
            return Err(ServiceError::invalid("no_pending_verification", "the verification code was already used"));
        }
        if !IdentityStore::mark_email_verified(&mut transaction, &request.tenant_id, &pending.email, &now).await.map_err(store_failure)? {
            return Err(ServiceError::not_found("tenant_not_found", format!("tenant `{}` does not exist", request.tenant_id)));
        }
        IdentityStore::set_tenant_plan(&mut transaction, &request.tenant_id, STANDARD_PLAN, &now).await.map_err(store_failure)?;
        transaction.commit().await.map_err(store_failure)?;
        tracing::info!(tenant_id = %request.tenant_id, plan = STANDARD_PLAN, "email verified, tenant graduated");
        // The verified address changed the tenant even when it was already on `standard`.
        self.publish_tenant_changed(&request.tenant_id).await
    }

    async fn create_agent_profile(&self, request: CreateAgentProfileRequest) -> ServiceResult<AgentProfile> {
        let profile = agents::new_profile(&request, self.options.require_agent_owner)?;
        self.tenant_or_not_found(&request.tenant_id).await?;
        if !self.agents.insert(&profile).await.map_err(store_failure)? {
            return Err(ServiceError::conflict("agent_exists", format!("an agent profile `{}` already exists", profile.agent_id)));
        }
        tracing::info!(tenant_id = %profile.tenant_id, agent_id = %profile.agent_id, "agent profile created");
        self.publish_agent_changed(&profile, false).await;
        Ok(profile)
    }

    async fn get_agent_profile(&self, request: AgentProfileRef) -> ServiceResult<AgentProfile> {
        self.agent_or_not_found(&request.tenant_id, &request.agent_id).await
    }

    async fn list_agent_profiles(&self, request: TenantRef) -> ServiceResult<AgentProfileList> {
        Ok(AgentProfileList { profiles: self.agents.list(&request.tenant_id).await.map_err(store_failure)? })
    }

    async fn update_agent_profile(&self, request: UpdateAgentProfileRequest) -> ServiceResult<AgentProfile> {
        let current = self.agent_or_not_found(&request.tenant_id, &request.agent_id).await?;
        let state = current.lifecycle_state.clone();
        let updated = agents::updated_profile(current, &request, self.options.require_agent_owner)?;
        if !self.agents.update(&updated, &state).await.map_err(store_failure)? {
            return Err(ServiceError::conflict("concurrent_change", "the agent profile changed meanwhile; read it and try again"));
        }
        self.publish_agent_changed(&updated, false).await;
        Ok(updated)
    }

    async fn delete_agent_profile(&self, request: AgentProfileRef) -> ServiceResult<AgentProfile> {
        let profile = self.agent_or_not_found(&request.tenant_id, &request.agent_id).await?;
        if !self.agents.delete(&request.tenant_id, &request.agent_id).await.map_err(store_failure)? {
            return Err(ServiceError::not_found("agent_not_found", format!("no agent profile `{}`", request.agent_id)));
        }
        tracing::info!(tenant_id = %request.tenant_id, agent_id = %request.agent_id, "agent profile deleted");
        self.publish_agent_changed(&profile, true).await;
        Ok(profile)
    }

    async fn set_agent_lifecycle(&self, request: SetAgentLifecycleRequest) -> ServiceResult<AgentProfile> {
        let state = request.state.trim();
        if !agents::LIFECYCLE_STATES.contains(&state) {
            return Err(ServiceError::invalid("invalid_state", format!("state must be one of {}", agents::LIFECYCLE_STATES.join(", "))));
        }
        let mut profile = self.agent_or_not_found(&request.tenant_id, &request.agent_id).await?;
        let from = profile.lifecycle_state.clone();
        if !agents::may_move(&from, state) {
            return Err(ServiceError::conflict("invalid_transition", format!("an agent cannot move from {from} to {state}")));
        }
        profile.lifecycle_state = state.to_string();
        profile.updated_at = now_timestamp();
        // Guarded by the state read: of two concurrent moves from one state, one wins.
        if !self.agents.update(&profile, &from).await.map_err(store_failure)? {
            return Err(ServiceError::conflict("invalid_transition", format!("the agent left {from} meanwhile; read it and try again")));
        }
        tracing::info!(tenant_id = %request.tenant_id, agent_id = %request.agent_id, from = %from, to = state, "agent lifecycle moved");
        self.publish_agent_changed(&profile, false).await;
        Ok(profile)
    }

    async fn bootstrap_agent(&self, request: BootstrapAgentRequest) -> ServiceResult<BootstrappedAgent> {
        let signer = self.agent_tokens()?;
        let tenant = self.tenant_or_not_found(&request.tenant_id).await?;
        usable_tenant(&tenant)?;
        let agent_id = agents::validated_agent_id(request.agent_id.trim())?.to_string();
        let existing = self.agents.get(&request.tenant_id, &agent_id).await.map_err(store_failure)?;
        let (profile, created) = match existing {
            Some(existing) => (self.bootstrapped_again(existing, &request).await?, false),
            None => {
                let owner_id = request.owner_id.clone().filter(|owner| !owner.trim().is_empty()).or_else(|| request.key_owner_id.clone());
                let create = CreateAgentProfileRequest {
                    tenant_id: request.tenant_id.clone(),
                    agent_id: agent_id.clone(),
                    display_name: request.display_name.clone(),
                    owner_id,
                    cost_center: request.cost_center.clone(),
                    budget_daily_nanos: request.budget_daily_nanos,
                    budget_monthly_nanos: request.budget_monthly_nanos,
                    role: None,
                    metadata_json: request.metadata_json.clone(),
                };
                let mut profile = agents::new_profile(&create, self.options.require_agent_owner)?;
                // The agent bootstrapping is up: its profile starts active.
                profile.lifecycle_state = "active".to_string();
                if self.agents.insert(&profile).await.map_err(store_failure)? {
                    tracing::info!(tenant_id = %profile.tenant_id, agent_id = %profile.agent_id, "agent bootstrapped: profile created");
                    self.publish_agent_changed(&profile, false).await;
                    (profile, true)
                } else {
                    // Another bootstrap of the same agent won the insert: this one finds its profile.
                    let existing = self.agent_or_not_found(&request.tenant_id, &agent_id).await?;
                    (self.bootstrapped_again(existing, &request).await?, false)
                }
            }
        };
        let trust =
            request.xdr_risk.map(|xdr_risk| TrustClaims { xdr_risk, xdr_risk_source: request.xdr_risk_source.clone().unwrap_or_default() });
        let (token, token_expires_at) = token_for(signer, &profile, trust, Utc::now());
        Ok(BootstrappedAgent { profile: Some(profile), token, token_expires_at, created })
    }

    async fn delegate_agent(&self, request: DelegateAgentRequest) -> ServiceResult<DelegatedAgent> {
        let signer = self.agent_tokens()?;
        let child_id = agents::validated_agent_id(request.agent_id.trim())?.to_string();
        if request.allocation_nanos <= 0 {
            return Err(ServiceError::invalid("invalid_allocation", "budget_allocation_usd must be above zero"));
        }
        let role = request.role.clone().filter(|role| !role.trim().is_empty()).unwrap_or_else(|| "agent".to_string());
        if !agents::AGENT_ROLES.contains(&role.as_str()) {
            return Err(ServiceError::invalid("invalid_role", format!("requested_role must be one of {}", agents::AGENT_ROLES.join(", "))));
        }
        if let Some(ttl) = request.ttl_seconds
            && !(1..=MAX_CHILD_TTL_SECONDS).contains(&ttl)
        {
            return Err(ServiceError::invalid("invalid_ttl", format!("ttl_seconds must be 1 to {MAX_CHILD_TTL_SECONDS}")));
        }
        for _ in 0..DELEGATION_ATTEMPTS {
            let parent = self.agent_or_not_found(&request.tenant_id, &request.parent_agent_id).await?;
            if parent.id != request.parent_profile_id {
                return Err(ServiceError::unauthenticated("agent_token_revoked", "the agent this token was minted for no longer exists"));
            }
            may_delegate(&parent)?;
            if role_rank(&role) > role_rank(&parent.role) {
                return Err(ServiceError::permission_denied(
                    "role_exceeds_parent",
                    format!("a sub-agent's role may not exceed its parent's ({})", parent.role),
                ));
            }
            if let Some(existing) = self.agents.get(&request.tenant_id, &child_id).await.map_err(store_failure)? {
                let ours =
                    existing.parent_agent_id.as_deref() == Some(parent.agent_id.as_str()) && existing.lifecycle_state != "terminated";
                if !ours {
                    return Err(ServiceError::conflict(
                        "agent_exists",
                        format!("an agent `{child_id}` already exists: pick another agent_id"),
                    ));
                }
                usable_agent(&existing)?;
                let (token, token_expires_at) = token_for(signer, &existing, None, Utc::now());
                return Ok(DelegatedAgent { profile: Some(existing), parent: Some(parent), token, token_expires_at, created: false });
            }
            let available = parent.budget_daily_nanos.unwrap_or(0);
            let after = available.checked_sub(request.allocation_nanos).unwrap_or(i64::MIN);
            if parent.budget_daily_nanos.is_none() || after < MIN_PARENT_BUDGET_NANOS {
                return Err(ServiceError::new(
                    ErrorKind::ResourceExhausted,
                    "insufficient_budget",
                    format!(
                        "agent `{}` has USD {} of daily budget and must keep at least USD {} after delegating",
                        parent.agent_id,
                        Usd::from_nanos(available),
                        Usd::from_nanos(MIN_PARENT_BUDGET_NANOS)
                    ),
                ));
            }
            let now = Utc::now();
            let create = CreateAgentProfileRequest {
                tenant_id: request.tenant_id.clone(),
                agent_id: child_id.clone(),
                display_name: request.display_name.clone(),
                // The child answers to its parent's owner and cost center.
                owner_id: parent.owner_id.clone(),
                cost_center: parent.cost_center.clone(),
                budget_daily_nanos: Some(request.allocation_nanos),
                budget_monthly_nanos: None,
                role: Some(role.clone()),
                metadata_json: request.metadata_json.clone(),
            };
            let mut child = agents::new_profile(&create, false)?;
            child.lifecycle_state = "active".to_string();
            child.parent_agent_id = Some(parent.agent_id.clone());
            child.expires_at = request.ttl_seconds.map(|ttl| format_timestamp(now + Duration::seconds(i64::from(ttl))));
            match self.agents.delegate(&parent, after, &child).await.map_err(store_failure)? {
                Delegation::Done => {
                    tracing::info!(tenant_id = %child.tenant_id, parent = %parent.agent_id, child = %child.agent_id, "sub-agent delegated");
                    self.publish_agent_changed(&child, false).await;
                    let parent = AgentProfile { budget_daily_nanos: Some(after), updated_at: child.created_at.clone(), ..parent };
                    let (token, token_expires_at) = token_for(signer, &child, None, now);
                    return Ok(DelegatedAgent { profile: Some(child), parent: Some(parent), token, token_expires_at, created: true });
                }
                // Another delegation moved the parent's budget, or took the child's id: judge again.
                Delegation::ParentChanged | Delegation::ChildExists => continue,
            }
        }
        Err(ServiceError::conflict("concurrent_change", "the parent agent kept changing meanwhile; delegate again"))
    }

    async fn end_sub_agent(&self, request: EndSubAgentRequest) -> ServiceResult<EndedSubAgent> {
        for _ in 0..DELEGATION_ATTEMPTS {
            let parent = self.agent_or_not_found(&request.tenant_id, &request.parent_agent_id).await?;
            let child = self.agent_or_not_found(&request.tenant_id, &request.child_agent_id).await?;
            if child.parent_agent_id.as_deref() != Some(parent.agent_id.as_str()) {
                return Err(ServiceError::permission_denied(
                    "not_parent",
                    format!("agent `{}` is not a sub-agent of `{}`", child.agent_id, parent.agent_id),
                ));
            }
            if child.lifecycle_state == "terminated" {
                return Ok(EndedSubAgent { profile: Some(child), parent: Some(parent), already_terminated: true, refunded_nanos: 0 });
            }
            let refund = request.refund_nanos.clamp(0, child.budget_daily_nanos.unwrap_or(0));
            let now = now_timestamp();
            if self.agents.end_child(&parent, &child, refund, &now).await.map_err(store_failure)? {
                tracing::info!(tenant_id = %child.tenant_id, parent = %parent.agent_id, child = %child.agent_id, refund, "sub-agent ended");
                let parent_budget = Some(parent.budget_daily_nanos.unwrap_or(0) + refund);
                let parent = AgentProfile { budget_daily_nanos: parent_budget, updated_at: now.clone(), ..parent };
                let child = AgentProfile { lifecycle_state: "terminated".to_string(), updated_at: now, ..child };
                self.publish_agent_changed(&child, false).await;
                return Ok(EndedSubAgent { profile: Some(child), parent: Some(parent), already_terminated: false, refunded_nanos: refund });
            }
        }
        Err(ServiceError::conflict("concurrent_change", "the sub-agent kept changing meanwhile; try again"))
    }

    async fn create_oauth_app(&self, request: CreateOAuthAppRequest) -> ServiceResult<OAuthApp> {
        let name = validated_name("name", &request.name)?;
        if request.callback_urls.is_empty() || request.callback_urls.len() > oauth::MAX_CALLBACK_URLS {
            return Err(ServiceError::invalid(
                "invalid_callback_urls",
                format!("callback_urls holds 1 to {} URLs", oauth::MAX_CALLBACK_URLS),
            ));
        }
        if let Some(bad) = request.callback_urls.iter().find(|url| !oauth::valid_callback_url(url)) {
            return Err(ServiceError::invalid(
                "invalid_callback_urls",
                format!("callback URL `{bad}` must be https:// (or http:// to localhost), without a fragment or user part"),
            ));
        }
        let scopes = oauth::checked_scopes(&request.scopes, &oauth::DEFAULT_SCOPES)
            .map_err(|error| ServiceError::invalid("invalid_scope", error))?;
        self.tenant_or_not_found(&request.tenant_id).await?;
        let app = OAuthApp {
            client_id: format!("{}{}", oauth::CLIENT_ID_PREFIX, uuid::Uuid::new_v4().simple()),
            tenant_id: request.tenant_id.clone(),
            name,
            callback_urls: request.callback_urls.clone(),
            scopes,
            created_at: format_timestamp(Utc::now()),
        };
        self.store.insert_oauth_app(&app, &request.created_by).await.map_err(store_failure)?;
        Ok(app)
    }

    async fn list_oauth_apps(&self, request: TenantRef) -> ServiceResult<OAuthAppList> {
        Ok(OAuthAppList { apps: self.store.oauth_apps(&request.tenant_id).await.map_err(store_failure)? })
    }

    async fn delete_oauth_app(&self, request: OAuthAppRef) -> ServiceResult<OAuthApp> {
        let app = self
            .store
            .oauth_app(&request.client_id)
            .await
            .map_err(store_failure)?
            .filter(|app| app.tenant_id == request.tenant_id)
            .ok_or_else(|| ServiceError::not_found("oauth_app_not_found", format!("no OAuth app `{}`", request.client_id)))?;
        self.store.delete_oauth_app(&request.tenant_id, &request.client_id).await.map_err(store_failure)?;
        Ok(app)
    }

    async fn get_oauth_app(&self, request: OAuthClientRef) -> ServiceResult<OAuthApp> {
        self.store
            .oauth_app(&request.client_id)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("oauth_app_not_found", format!("no OAuth app `{}`", request.client_id)))
    }

    async fn issue_oauth_code(&self, request: IssueOAuthCodeRequest) -> ServiceResult<IssuedOAuthCode> {
        let app = self.get_oauth_app(OAuthClientRef { client_id: request.client_id.clone() }).await?;
        if !app.callback_urls.contains(&request.redirect_uri) {
            return Err(ServiceError::invalid("invalid_redirect_uri", "redirect_uri is not one of the app's callback URLs"));
        }
        if !oauth::valid_challenge(&request.code_challenge) {
            return Err(ServiceError::invalid(
                "invalid_code_challenge",
                "code_challenge must be an S256 challenge: 43 base64url characters",
            ));
        }
        let app_scopes: Vec<&str> = app.scopes.iter().map(String::as_str).collect();
        let scopes = oauth::checked_scopes(&request.scopes, &app_scopes).map_err(|error| ServiceError::invalid("invalid_scope", error))?;
        if let Some(beyond) = scopes.iter().find(|scope| !app.scopes.contains(scope)) {
            return Err(ServiceError::invalid("invalid_scope", format!("the app did not register scope `{beyond}`")));
        }
        if oauth::granted_permissions(&scopes, &request.authorizer_permissions).is_empty() {
            return Err(ServiceError::permission_denied(
                "insufficient_permissions",
                "the approving key holds none of the permissions these scopes grant",
            ));
        }
        let tenant = self.tenant_or_not_found(&request.tenant_id).await?;
        usable_tenant(&tenant)?;
        let code = secrets::mint(oauth::CODE_PREFIX);
        let now = Utc::now();
        let record = OAuthCodeRecord {
            code_hash: secrets::digest(&code),
            client_id: app.client_id.clone(),
            tenant_id: request.tenant_id.clone(),
            redirect_uri: request.redirect_uri.clone(),
            code_challenge: request.code_challenge.clone(),
            scopes: scopes.clone(),
            permissions: request.authorizer_permissions.clone(),
            authorized_by: request.authorized_by.clone(),
            created_at: format_timestamp(now),
            expires_at: format_timestamp(now + Duration::minutes(OAUTH_CODE_MINUTES)),
        };
        self.store.insert_oauth_code(&record).await.map_err(store_failure)?;
        Ok(IssuedOAuthCode { code, expires_at: record.expires_at, scopes })
    }

    async fn redeem_oauth_code(&self, request: RedeemOAuthCodeRequest) -> ServiceResult<OAuthToken> {
        let invalid_grant = |why: &str| ServiceError::invalid("invalid_grant", why.to_string());
        if !oauth::valid_verifier(&request.code_verifier) {
            return Err(ServiceError::invalid("invalid_request", "code_verifier must be 43 to 128 characters of A-Z a-z 0-9 - . _ ~"));
        }
        // Taken once, whatever follows: a code presented with a wrong verifier is spent (RFC 6749 10.5).
        let now = Utc::now();
        let record = self
            .store
            .redeem_oauth_code(&secrets::digest(request.code.trim()), &format_timestamp(now))
            .await
            .map_err(store_failure)?
            .ok_or_else(|| invalid_grant("the code is unknown, expired or already used"))?;
        if record.client_id != request.client_id || record.redirect_uri != request.redirect_uri {
            return Err(invalid_grant("client_id or redirect_uri is not the one the code was issued for"));
        }
        if !oauth::verifier_matches(&request.code_verifier, &record.code_challenge) {
            return Err(invalid_grant("code_verifier does not match the code_challenge"));
        }
        let app = self
            .get_oauth_app(OAuthClientRef { client_id: record.client_id.clone() })
            .await
            .map_err(|_| invalid_grant("the app was deleted"))?;
        let permissions = oauth::granted_permissions(&record.scopes, &record.permissions);
        if permissions.is_empty() {
            // An empty scope list would mean the role's permissions: never issue that.
            return Err(invalid_grant("the approval grants no permission"));
        }
        let expires_at = format_timestamp(now + Duration::days(OAUTH_KEY_DAYS));
        let created = self
            .create_api_key(CreateApiKeyRequest {
                tenant_id: record.tenant_id.clone(),
                name: format!("oauth: {}", app.name),
                role: "developer".to_string(),
                scopes: permissions,
                expires_at: Some(expires_at.clone()),
                created_by: format!("oauth:{}", app.client_id),
                creator_permissions: record.permissions.clone(),
                ..CreateApiKeyRequest::default()
            })
            .await?;
        let key_id = created.key.map(|key| key.id).unwrap_or_default();
        Ok(OAuthToken { key: created.plaintext, scopes: record.scopes, expires_at, key_id })
    }

    async fn redeem_claim(&self, request: RedeemClaimRequest) -> ServiceResult<IdpMembership> {
        let identity = checked_identity(request.identity)?;
        let now = format_timestamp(Utc::now());
        let mut transaction = self.store.begin().await.map_err(store_failure)?;
        let token = IdentityStore::claim_token(&mut transaction, &secrets::digest(request.token.trim()))
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("claim_not_found", "no claim token matches"))?;
        if token.expires_at <= now {
            return Err(ServiceError::invalid("expired", "the claim token has expired"));
        }
        if token.uses >= token.max_uses {
            return Err(ServiceError::invalid("fully_redeemed", "the claim token is fully redeemed"));
        }
        let tenant = self.tenant_or_not_found(&token.tenant_id).await?;
        let user_role = user_role_of_claim_role(&token.role)?;
        let email = identity_email(&identity);
        let user = match IdentityStore::user_by_email(&mut transaction, &tenant.id, &email).await.map_err(store_failure)? {
            // An invitation's user (or one made before): it is the claimant, active from now on.
            Some(mut user) => {
                if user.status == "invited" {
                    IdentityStore::activate_user(&mut transaction, &user.id).await.map_err(store_failure)?;
                    user.status = "active".to_string();
                }
                user
            }
            None => {
                let user = User {
                    id: uuid::Uuid::new_v4().to_string(),
                    tenant_id: tenant.id.clone(),
                    email: email.clone(),
                    role: user_role.to_string(),
                    status: "active".to_string(),
                    created_at: now.clone(),
                };
                IdentityStore::insert_user(&mut transaction, &user).await.map_err(store_failure)?;
                user
            }
        };
        let membership = MembershipRow {
            tenant_id: tenant.id.clone(),
            user_id: user.id.clone(),
            claim_role: token.role.clone(),
            email,
            claimed_at: now.clone(),
        };
        if !IdentityStore::insert_membership(&mut transaction, &identity.issuer, &identity.subject, &membership)
            .await
            .map_err(store_failure)?
        {
            return Err(ServiceError::conflict("already_claimed", "this identity has claimed this tenant already"));
        }
        if !IdentityStore::use_claim_token(&mut transaction, &token.id, &now).await.map_err(store_failure)? {
            return Err(ServiceError::invalid("fully_redeemed", "the claim token is fully redeemed"));
        }
        transaction.commit().await.map_err(store_failure)?;
        Ok(idp_membership(tenant, user, membership))
    }

    async fn list_idp_memberships(&self, request: IdpSubject) -> ServiceResult<IdpMembershipList> {
        let identity = checked_identity(Some(request))?;
        let rows = self.store.memberships(&identity.issuer, &identity.subject).await.map_err(store_failure)?;
        let mut memberships = Vec::with_capacity(rows.len());
        for row in rows {
            memberships.extend(self.membership_of(row).await?);
        }
        Ok(IdpMembershipList { memberships })
    }

    async fn provision_tenant(&self, request: ProvisionTenantRequest) -> ServiceResult<ProvisionedTenant> {
        let identity = checked_identity(request.identity)?;
        let email = identity_email(&identity);
        if let Some(found) = self.provisioned(&identity).await? {
            return Ok(found);
        }
        let name = if request.tenant_name.trim().is_empty() {
            email.chars().filter(|character| !character.is_control()).take(MAX_NAME_CHARS).collect()
        } else {
            validated_name("tenant_name", &request.tenant_name)?
        };
        let invite_code = request.invite_code.as_deref().map(str::trim).filter(|code| !code.is_empty());
        let status = self.registration_status(invite_code)?;
        let created_at = format_timestamp(Utc::now());
        let tenant = new_sandbox_tenant(uuid::Uuid::new_v4().to_string(), name, status, &created_at);
        let (key, plaintext_key) = new_admin_key(&tenant.id, "provision", &created_at);
        let user = User {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: tenant.id.clone(),
            email: email.clone(),
            role: "admin".to_string(),
            status: "active".to_string(),
            created_at: created_at.clone(),
        };
        let membership = MembershipRow {
            tenant_id: tenant.id.clone(),
            user_id: user.id.clone(),
            claim_role: "owner".to_string(),
            email,
            claimed_at: created_at.clone(),
        };
        let mut transaction = self.store.begin().await.map_err(store_failure)?;
        // First, so that of two concurrent first provisions one makes the tenant and the other finds it.
        if !IdentityStore::insert_provision(&mut transaction, &identity.issuer, &identity.subject, &tenant.id, &created_at)
            .await
            .map_err(store_failure)?
        {
            drop(transaction);
            return self.provisioned(&identity).await?.ok_or_else(|| ServiceError::internal("a provision vanished while read"));
        }
        insert_new_tenant(&mut transaction, invite_code, &tenant, &key, &plaintext_key).await?;
        IdentityStore::insert_user(&mut transaction, &user).await.map_err(store_failure)?;
        IdentityStore::insert_membership(&mut transaction, &identity.issuer, &identity.subject, &membership)
            .await
            .map_err(store_failure)?;
        transaction.commit().await.map_err(store_failure)?;
        tracing::info!(tenant_id = %tenant.id, status, "tenant provisioned for an identity provider's user");
        let tenant = Tenant { user_count: 1, ..tenant };
        Ok(ProvisionedTenant {
            membership: Some(idp_membership(tenant, user, membership)),
            api_key: Some(CreatedApiKey { key: Some(key), plaintext: plaintext_key }),
            created: true,
        })
    }

    async fn start_device_authorization(&self, request: StartDeviceAuthorizationRequest) -> ServiceResult<DeviceAuthorization> {
        let client_name = request.client_name.trim();
        if client_name.chars().count() > 64 {
            return Err(ServiceError::invalid("invalid_client_name", "client_name is at most 64 characters"));
        }
        let now = Utc::now();
        let expires_at = format_timestamp(now + Duration::seconds(DEVICE_CODE_SECONDS));
        for _ in 0..8 {
            let device_code = secrets::mint(DEVICE_CODE_PREFIX);
            let device = DeviceRow {
                device_code_hash: secrets::digest(&device_code),
                user_code: bridge::user_code(),
                client_name: if client_name.is_empty() { "device".to_string() } else { client_name.to_string() },
                status: "pending".to_string(),
                created_at: format_timestamp(now),
                expires_at: expires_at.clone(),
                ..DeviceRow::default()
            };
            if self.store.insert_device(&device).await.map_err(store_failure)? {
                return Ok(DeviceAuthorization {
                    device_code,
                    user_code: device.user_code,
                    interval: POLL_INTERVAL_SECONDS,
                    expires_in: DEVICE_CODE_SECONDS as u32,
                    expires_at,
                });
            }
        }
        Err(ServiceError::unavailable("user_codes_exhausted", "no free user code was found: try again"))
    }

    async fn confirm_device(&self, request: ConfirmDeviceRequest) -> ServiceResult<DeviceConfirmation> {
        let identity = checked_identity(request.identity)?;
        let unknown = || ServiceError::not_found("invalid_user_code", "no device is waiting for this code");
        let user_code = bridge::normalise_user_code(&request.user_code).ok_or_else(unknown)?;
        let device = self.store.device(Some(&user_code), None).await.map_err(store_failure)?.ok_or_else(unknown)?;
        let now = format_timestamp(Utc::now());
        if device.status != "pending" {
            return Err(ServiceError::conflict("already_confirmed", "this code was confirmed already"));
        }
        if device.expires_at <= now {
            return Err(ServiceError::invalid("expired_token", "this code has expired: start again on the device"));
        }
        let memberships = self.list_idp_memberships(identity.clone()).await?.memberships;
        let tenant_id = request.tenant_id.trim();
        let membership = match (tenant_id.is_empty(), memberships.len()) {
            (_, 0) => None,
            (true, 1) => memberships.into_iter().next(),
            (true, _) => {
                return Err(ServiceError::invalid(
                    "tenant_selection_required",
                    "this identity belongs to several tenants: name one with X-BR-Tenant-Id",
                ));
            }
            (false, _) => {
                memberships.into_iter().find(|membership| membership.tenant.as_ref().is_some_and(|tenant| tenant.id == tenant_id))
            }
        };
        let membership =
            membership.ok_or_else(|| ServiceError::permission_denied("not_a_member", "this identity has claimed no such tenant"))?;
        let tenant = membership.tenant.clone().unwrap_or_default();
        usable_tenant(&tenant)?;
        let confirmed = DeviceRow {
            tenant_id: Some(tenant.id.clone()),
            issuer: Some(identity.issuer),
            subject: Some(identity.subject),
            role: Some(membership.role.clone()),
            ..DeviceRow::default()
        };
        if !self.store.confirm_device(&user_code, &confirmed, &now).await.map_err(store_failure)? {
            return Err(ServiceError::conflict("already_confirmed", "this code was confirmed already or has expired"));
        }
        Ok(DeviceConfirmation {
            user_code,
            client_name: device.client_name,
            tenant: Some(tenant),
            role: membership.role,
            confirmed_at: now,
        })
    }

    async fn poll_device_token(&self, request: PollDeviceTokenRequest) -> ServiceResult<DeviceTokenResult> {
        let invalid =
            || ServiceError::invalid("invalid_device_code", "no device authorization has this device code, or its key was delivered");
        let hash = secrets::digest(request.device_code.trim());
        let device = self.store.device(None, Some(&hash)).await.map_err(store_failure)?.ok_or_else(invalid)?;
        let now = Utc::now();
        let now_text = format_timestamp(now);
        match device.status.as_str() {
            "delivered" => Err(invalid()),
            _ if device.expires_at <= now_text => Err(ServiceError::invalid("expired_token", "the device code has expired: start again")),
            "pending" => {
                self.store.note_device_poll(&hash, &now_text).await.map_err(store_failure)?;
                let too_soon = device
                    .last_polled_at
                    .as_deref()
                    .and_then(parse_timestamp)
                    .is_some_and(|last| now - last < Duration::seconds(i64::from(POLL_INTERVAL_SECONDS)));
                let (status, interval) =
                    if too_soon { ("slow_down", POLL_INTERVAL_SECONDS + 5) } else { ("authorization_pending", POLL_INTERVAL_SECONDS) };
                Ok(DeviceTokenResult { status: status.to_string(), interval, ..DeviceTokenResult::default() })
            }
            _ => {
                if !self.store.deliver_device(&hash).await.map_err(store_failure)? {
                    return Err(invalid());
                }
                let tenant_id = device.tenant_id.clone().unwrap_or_default();
                let role = device.role.clone().unwrap_or_else(|| "developer".to_string());
                let tenant = self.tenant_or_not_found(&tenant_id).await?;
                usable_tenant(&tenant)?;
                let expires_at = format_timestamp(now + Duration::days(DEVICE_KEY_DAYS));
                let created = self
                    .create_api_key(CreateApiKeyRequest {
                        tenant_id,
                        name: format!("device: {}", device.client_name),
                        role: role.clone(),
                        expires_at: Some(expires_at.clone()),
                        created_by: format!("device:{}", device.subject.unwrap_or_default()),
                        creator_permissions: role_permission_list(&role),
                        ..CreateApiKeyRequest::default()
                    })
                    .await?;
                Ok(DeviceTokenResult {
                    status: "linked".to_string(),
                    interval: POLL_INTERVAL_SECONDS,
                    tenant: Some(tenant),
                    key_id: created.key.map(|key| key.id).unwrap_or_default(),
                    key: created.plaintext,
                    role,
                    expires_at,
                })
            }
        }
    }

    async fn authenticate_agent(&self, request: AuthenticateAgentRequest) -> ServiceResult<AgentPrincipal> {
        let signer = self.agent_tokens()?;
        let claims = signer.verify(request.token.trim(), Utc::now()).map_err(|error| match error {
            TokenError::Expired => {
                ServiceError::unauthenticated("agent_token_expired", "the agent token has expired: bootstrap again for a fresh one")
            }
            TokenError::Malformed | TokenError::BadSignature => {
                ServiceError::unauthenticated("invalid_agent_token", "the agent token is not one this gateway issued")
            }
        })?;
        let expires_at = chrono::DateTime::from_timestamp(claims.exp, 0).map(format_timestamp).unwrap_or_default();
        let subject = AgentSubject { tenant_id: claims.tid, agent_id: claims.sub, profile_id: claims.pid };
        self.agent_principal(subject, expires_at, claims.jti).await
    }

    async fn issue_agent_certificate(&self, request: IssueAgentCertificateRequest) -> ServiceResult<IssuedAgentCertificate> {
        let authority = self.agent_ca()?;
        let subject = AgentSubject { tenant_id: request.tenant_id, agent_id: request.agent_id, profile_id: request.profile_id };
        // The agent as it stands now: a suspension between authentication and issuance still refuses.
        self.acting_agent(&subject).await?;
        let key = match request.csr_pem.as_deref() {
            Some(pem) => RequestedKey::Csr(pem),
            None => RequestedKey::Generate,
        };
        let key_source = if matches!(key, RequestedKey::Csr(_)) { "csr" } else { "generated" };
        let lifetime = request.lifetime_seconds.unwrap_or(agent_cert::DEFAULT_LIFETIME_SECONDS);
        let now = Utc::now();
        let issued = authority.issue(&subject, key, lifetime, now).map_err(|error| match error {
            CertError::BadCsr(_) => ServiceError::invalid("invalid_csr", error.to_string()),
            CertError::BadLifetime => ServiceError::invalid("invalid_ttl", format!("ttl_seconds: {error}")),
            CertError::NotIssuedHere | CertError::OutsideValidity | CertError::Signing(_) => {
                tracing::error!(%error, "the agent CA could not issue a certificate");
                ServiceError::internal("the agent CA could not issue a certificate")
            }
        })?;
        tracing::info!(
            tenant_id = %subject.tenant_id,
            agent_id = %subject.agent_id,
            serial = %issued.serial,
            not_after = %format_timestamp(issued.not_after),
            "issued an agent client certificate"
        );
        // Recorded before it is handed over: a certificate identity has no record of is refused.
        let record = AgentCertificate {
            serial: issued.serial.clone(),
            tenant_id: subject.tenant_id.clone(),
            agent_id: subject.agent_id.clone(),
            profile_id: subject.profile_id.clone(),
            fingerprint_sha256: issued.fingerprint_sha256.clone(),
            key_source: key_source.to_string(),
            not_before: format_timestamp(issued.not_before),
            not_after: format_timestamp(issued.not_after),
            issued_at: format_timestamp(now),
            revoked_at: None,
            revoked_reason: None,
            revoked_by: None,
            status: String::new(),
        };
        let prune_before = format_timestamp(now - Duration::days(certificates::RETENTION_DAYS));
        self.certificates.record(&record, &prune_before).await.map_err(store_failure)?;
        Ok(IssuedAgentCertificate {
            certificate_pem: issued.certificate_pem,
            ca_certificate_pem: issued.ca_certificate_pem,
            private_key_pem: issued.private_key_pem,
            serial: issued.serial,
            fingerprint_sha256: issued.fingerprint_sha256,
            spiffe_id: issued.spiffe_id,
            not_before: format_timestamp(issued.not_before),
            not_after: format_timestamp(issued.not_after),
        })
    }

    async fn authenticate_agent_certificate(&self, request: AuthenticateAgentCertificateRequest) -> ServiceResult<AgentPrincipal> {
        let authority = self.agent_ca()?;
        let verified = authority.verify(&request.certificate_der, Utc::now()).map_err(|error| match error {
            CertError::OutsideValidity => ServiceError::unauthenticated(
                "agent_certificate_expired",
                "the client certificate has expired or is not yet valid: exchange it for a fresh one at POST /v1/agent/auth/cert",
            ),
            _ => ServiceError::unauthenticated(
                "invalid_agent_certificate",
                "the client certificate is not one this gateway's agent CA issued",
            ),
        })?;
        // The CA vouches for it; the record says whether it still stands.
        let record = self.certificates.get(&verified.serial).await.map_err(store_failure)?;
        let record = record
            .filter(|record| {
                record.tenant_id == verified.subject.tenant_id
                    && record.agent_id == verified.subject.agent_id
                    && record.profile_id == verified.subject.profile_id
            })
            .ok_or_else(|| {
                ServiceError::unauthenticated(
                    "agent_certificate_unknown",
                    "the client certificate is not on this gateway's record of issued certificates: exchange it for a fresh one at POST /v1/agent/auth/cert",
                )
            })?;
        if record.revoked_at.is_some() {
            return Err(ServiceError::unauthenticated(
                "agent_certificate_revoked",
                "the client certificate was revoked: exchange the agent's JWT for a fresh one at POST /v1/agent/auth/cert",
            ));
        }
        self.agent_principal(verified.subject, format_timestamp(verified.not_after), format!("cert:{}", verified.serial)).await
    }

    async fn list_agent_certificates(&self, request: ListAgentCertificatesRequest) -> ServiceResult<AgentCertificateList> {
        let status = request.status.as_deref().map(str::trim).filter(|status| !status.is_empty());
        if let Some(status) = status
            && !certificates::STATUSES.contains(&status)
        {
            return Err(ServiceError::invalid("invalid_status", format!("status must be one of {}", certificates::STATUSES.join(", "))));
        }
        let limit = request.limit.unwrap_or(certificates::DEFAULT_LIST_LIMIT);
        if !(1..=certificates::MAX_LIST_LIMIT).contains(&limit) {
            return Err(ServiceError::invalid("invalid_limit", format!("limit must be 1 to {}", certificates::MAX_LIST_LIMIT)));
        }
        // One agent's: those of the profile that holds its id now (an earlier profile's are dead).
        let profile = match request.agent_id.as_deref() {
            Some(agent_id) => Some(self.agent_or_not_found(&request.tenant_id, agents::validated_agent_id(agent_id)?).await?),
            None => None,
        };
        let now = now_timestamp();
        let selection = Selection {
            tenant_id: &request.tenant_id,
            agent: profile.as_ref().map(|profile| (profile.agent_id.as_str(), profile.id.as_str())),
            status,
            limit,
            now: &now,
        };
        let listed = self.certificates.list(selection).await.map_err(store_failure)?;
        let certificates = listed.into_iter().map(|certificate| certificates::with_status(certificate, &now)).collect();
        Ok(AgentCertificateList { certificates })
    }

    async fn revoke_agent_certificate(&self, request: RevokeAgentCertificateRequest) -> ServiceResult<RevokedAgentCertificate> {
        let reason = certificates::validated_reason(request.reason.as_deref())?;
        let serial = request.serial.trim().to_ascii_lowercase();
        let not_found = || ServiceError::not_found("certificate_not_found", format!("no agent certificate with serial `{serial}`"));
        let theirs = |certificate: &AgentCertificate| {
            certificate.tenant_id == request.tenant_id
                && request.agent_id.as_deref().is_none_or(|agent_id| agent_id == certificate.agent_id)
        };
        // Serials are hex (the CA writes 32 digits): anything else was never issued.
        if serial.is_empty() || serial.len() > 64 || !serial.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return Err(not_found());
        }
        let certificate = self.certificates.get(&serial).await.map_err(store_failure)?.filter(theirs).ok_or_else(not_found)?;
        let now = now_timestamp();
        if certificate.revoked_at.is_some() {
            return Ok(RevokedAgentCertificate { certificate: Some(certificates::with_status(certificate, &now)), changed: false });
        }
        // Of two concurrent revocations one writes (`changed`); the other reads what it wrote.
        let changed = self.certificates.revoke(&serial, &now, reason.as_deref(), &request.revoked_by).await.map_err(store_failure)?;
        let certificate = self.certificates.get(&serial).await.map_err(store_failure)?.ok_or_else(not_found)?;
        if changed {
            tracing::info!(
                tenant_id = %certificate.tenant_id,
                agent_id = %certificate.agent_id,
                serial = %certificate.serial,
                revoked_by = %request.revoked_by,
                "revoked an agent client certificate"
            );
        }
        Ok(RevokedAgentCertificate { certificate: Some(certificates::with_status(certificate, &now)), changed })
    }
}

impl IdentityServiceImpl {
    /// The tenant and profile a verified credential names, when they still let the agent act: the
    /// profile must be the very one the credential was issued to, neither suspended, terminated
    /// nor expired.
    async fn acting_agent(&self, subject: &AgentSubject) -> ServiceResult<(Tenant, AgentProfile)> {
        let revoked = || ServiceError::unauthenticated("agent_token_revoked", "the agent this credential was issued to no longer exists");
        let tenant = self.store.tenant(&subject.tenant_id).await.map_err(store_failure)?.ok_or_else(revoked)?;
        usable_tenant(&tenant)?;
        let profile = self.agents.get(&subject.tenant_id, &subject.agent_id).await.map_err(store_failure)?;
        // A profile deleted and created again under the same agent id has another id: old credentials die with the old one.
        let profile = profile.filter(|profile| profile.id == subject.profile_id).ok_or_else(revoked)?;
        usable_agent(&profile)?;
        Ok((tenant, profile))
    }

    /// `acting_agent` as the principal of a credential that expires at `expires_at`.
    async fn agent_principal(&self, subject: AgentSubject, expires_at: String, credential_id: String) -> ServiceResult<AgentPrincipal> {
        let (tenant, profile) = self.acting_agent(&subject).await?;
        let owner_missing = self.options.require_agent_owner && profile.owner_id.is_none();
        Ok(AgentPrincipal {
            tenant: Some(tenant),
            profile: Some(profile),
            token_expires_at: expires_at,
            token_id: credential_id,
            owner_missing,
        })
    }

    fn agent_ca(&self) -> ServiceResult<&AgentCertificateAuthority> {
        self.options.agent_ca.as_deref().ok_or_else(|| {
            ServiceError::unavailable(
                "agent_certificates_unavailable",
                "agent certificates need the agent CA, derived from the master key: start identity with BR_MASTER_KEY",
            )
        })
    }
}

/// What a parent keeps of its daily budget after delegating: USD 0.01.
const MIN_PARENT_BUDGET_NANOS: i64 = 10_000_000;
/// The longest a delegated child may live: 30 days.
const MAX_CHILD_TTL_SECONDS: u32 = 30 * 24 * 3600;
/// Rounds a delegation makes when concurrent ones change the parent meanwhile.
const DELEGATION_ATTEMPTS: usize = 16;

/// A role's rank: a child's role may not exceed its parent's.
fn role_rank(role: &str) -> usize {
    agents::AGENT_ROLES.iter().position(|known| *known == role).unwrap_or(0)
}

/// Refuses a parent that may not delegate: not active, or without `metadata.can_delegate === true`.
fn may_delegate(parent: &AgentProfile) -> ServiceResult<()> {
    usable_agent(parent)?;
    if parent.lifecycle_state != "active" {
        return Err(ServiceError::permission_denied(
            "parent_not_active",
            format!("agent `{}` is {}: only an active agent may delegate", parent.agent_id, parent.lifecycle_state),
        ));
    }
    let metadata: serde_json::Value = serde_json::from_str(&parent.metadata_json).unwrap_or_default();
    if metadata.get("can_delegate") != Some(&serde_json::Value::Bool(true)) {
        return Err(ServiceError::permission_denied(
            "delegation_not_allowed",
            format!("agent `{}` may not delegate: its metadata must hold `can_delegate: true`", parent.agent_id),
        ));
    }
    Ok(())
}

/// A fresh agent JWT for `profile`, and when it expires (RFC 3339).
fn token_for(
    signer: &AgentTokenSigner,
    profile: &AgentProfile,
    trust: Option<TrustClaims>,
    now: chrono::DateTime<Utc>,
) -> (String, String) {
    let (token, expires_at) = signer.mint(&profile.tenant_id, &profile.agent_id, &profile.id, &profile.role, trust, now);
    (token, format_timestamp(expires_at))
}

/// Refuses a tenant whose registration was rejected or awaits approval.
fn usable_tenant(tenant: &Tenant) -> ServiceResult<()> {
    match tenant.status.as_str() {
        "rejected" => Err(ServiceError::permission_denied("tenant_rejected", "this tenant's registration was rejected")),
        "pending" => {
            Err(ServiceError::permission_denied("tenant_pending_approval", "this tenant awaits approval by a platform administrator"))
        }
        _ => Ok(()),
    }
}

/// Refuses an agent that may not act: suspended, terminated, or past its `expires_at`.
fn usable_agent(profile: &AgentProfile) -> ServiceResult<()> {
    let agent_id = &profile.agent_id;
    match profile.lifecycle_state.as_str() {
        "suspended" => {
            return Err(ServiceError::permission_denied(
                "agent_suspended",
                format!("agent `{agent_id}` is suspended: an operator must move it back to active"),
            ));
        }
        "terminated" => return Err(ServiceError::permission_denied("agent_terminated", format!("agent `{agent_id}` is terminated"))),
        _ => {}
    }
    let expired = profile.expires_at.as_deref().and_then(parse_timestamp).is_some_and(|expires_at| expires_at <= Utc::now());
    if expired {
        return Err(ServiceError::permission_denied("agent_expired", format!("agent `{agent_id}` has passed its expiry")));
    }
    Ok(())
}

fn too_many_attempts() -> ServiceError {
    ServiceError::invalid(
        "too_many_attempts",
        format!(
            "the verification code was entered wrongly {MAX_VERIFICATION_ATTEMPTS} times and is no longer valid: request a new one with verify-email"
        ),
    )
}

fn validated_plan(plan: &str) -> ServiceResult<&str> {
    PLANS
        .into_iter()
        .find(|known| *known == plan)
        .ok_or_else(|| ServiceError::invalid("invalid_plan", format!("plan must be one of {}", PLANS.join(", "))))
}

/// How long an authorization code is redeemable.
const OAUTH_CODE_MINUTES: i64 = 10;
/// How long a key issued for a code lives.
const OAUTH_KEY_DAYS: i64 = 90;

/// A new tenant on the sandbox plan, named `name`, with no users yet.
fn new_sandbox_tenant(id: String, name: String, status: &str, created_at: &str) -> Tenant {
    Tenant {
        id,
        slug: slug_of(&name),
        name,
        plan: SANDBOX_PLAN.to_string(),
        tier: tier_of_plan(SANDBOX_PLAN).to_string(),
        status: status.to_string(),
        user_count: 0,
        created_at: created_at.to_string(),
        updated_at: created_at.to_string(),
        email_verified_at: None,
        graduated_at: None,
    }
}

/// A new tenant's first key (role and scope admin), and its plaintext.
fn new_admin_key(tenant_id: &str, name: &str, created_at: &str) -> (ApiKey, String) {
    let plaintext = secrets::mint(LIVE_KEY_PREFIX);
    let key = ApiKey {
        id: uuid::Uuid::new_v4().to_string(),
        tenant_id: tenant_id.to_string(),
        name: name.to_string(),
        prefix: secrets::display_prefix(&plaintext),
        role: "admin".to_string(),
        scopes: vec!["admin".to_string()],
        created_at: created_at.to_string(),
        ..ApiKey::default()
    };
    (key, plaintext)
}

/// Writes a new tenant and its first key, consuming `invite_code` when given (400 when it cannot be).
async fn insert_new_tenant(
    transaction: &mut sqlx::Transaction<'static, sqlx::Any>,
    invite_code: Option<&str>,
    tenant: &Tenant,
    key: &ApiKey,
    plaintext_key: &str,
) -> ServiceResult<()> {
    if let Some(code) = invite_code {
        let consumed = IdentityStore::consume_invite_code(transaction, code, &tenant.created_at).await.map_err(store_failure)?;
        if !consumed {
            return Err(ServiceError::invalid("invalid_invite_code", "the invite code is unknown, expired or used up"));
        }
    }
    IdentityStore::insert_tenant(transaction, tenant).await.map_err(|error| {
        if is_unique_violation(&error) {
            ServiceError::conflict("tenant_exists", format!("tenant `{}` already exists", tenant.id))
        } else {
            store_failure(error)
        }
    })?;
    let key_hash = secrets::digest(plaintext_key);
    IdentityStore::insert_api_key(transaction, ApiKeyRecord { key, key_hash: &key_hash }).await.map_err(store_failure)?;
    Ok(())
}

fn validated_name(field: &str, name: &str) -> ServiceResult<String> {
    let trimmed = name.trim();
    if trimmed.is_empty() {
        return Err(ServiceError::invalid("invalid_name", format!("{field} must not be empty")));
    }
    if trimmed.chars().count() > MAX_NAME_CHARS || trimmed.chars().any(char::is_control) {
        return Err(ServiceError::invalid("invalid_name", format!("{field} must be at most {MAX_NAME_CHARS} printable characters")));
    }
    Ok(trimmed.to_string())
}

fn validated_email(email: &str) -> ServiceResult<String> {
    let email = email.trim().to_lowercase();
    let invalid = || ServiceError::invalid("invalid_email", "email must be an address such as ada@example.com");
    let (local, domain) = email.split_once('@').ok_or_else(invalid)?;
    let well_formed = !local.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !domain.contains('@')
        && email.len() <= 254
        && !email.chars().any(|character| character.is_whitespace() || character.is_control());
    if well_formed { Ok(email) } else { Err(invalid()) }
}

fn validated_status(status: &str) -> ServiceResult<()> {
    if TENANT_STATUSES.contains(&status) {
        Ok(())
    } else {
        Err(ServiceError::invalid("invalid_status", format!("status must be one of {}", TENANT_STATUSES.join(", "))))
    }
}

/// Claim role to user role: `owner` and `admin` become `admin`, `member` becomes `developer`.
/// The permissions of a role, as owned strings (none for an unknown role).
fn role_permission_list(role: &str) -> Vec<String> {
    rbac::role_permissions(role).unwrap_or_default().iter().map(|permission| permission.to_string()).collect()
}

/// An identity provider's user as a request names it: issuer and subject required.
/// What an identity is recorded under in a tenant: its email, or its subject when it has none.
fn identity_email(identity: &IdpSubject) -> String {
    if identity.email.is_empty() { identity.subject.clone() } else { identity.email.clone() }
}

/// A membership as the bridge shows it: the tenant, the identity's user there, the stored row.
fn idp_membership(tenant: Tenant, user: User, row: MembershipRow) -> IdpMembership {
    IdpMembership {
        tenant: Some(tenant),
        user_id: user.id,
        permissions: role_permission_list(&user.role),
        role: user.role,
        claim_role: row.claim_role,
        email: row.email,
        claimed_at: row.claimed_at,
    }
}

fn checked_identity(identity: Option<IdpSubject>) -> ServiceResult<IdpSubject> {
    let identity = identity.unwrap_or_default();
    if identity.issuer.trim().is_empty() || identity.subject.trim().is_empty() || identity.subject.len() > 255 {
        return Err(ServiceError::invalid("invalid_identity", "an identity needs its issuer and subject"));
    }
    Ok(identity)
}

fn user_role_of_claim_role(claim_role: &str) -> ServiceResult<&'static str> {
    match claim_role {
        "owner" | "admin" => Ok("admin"),
        "member" => Ok("developer"),
        _ => Err(ServiceError::invalid("invalid_role", format!("role must be one of {}", CLAIM_ROLES.join(", ")))),
    }
}

/// A URL-safe slug: the name's letters and digits, hyphenated, plus a random suffix for uniqueness.
fn slug_of(name: &str) -> String {
    let mut base = String::new();
    for character in name.chars().flat_map(char::to_lowercase) {
        if character.is_ascii_alphanumeric() {
            base.push(character);
        } else if !base.is_empty() && !base.ends_with('-') {
            base.push('-');
        }
    }
    let base: String = base.trim_end_matches('-').chars().take(40).collect();
    let base = base.trim_end_matches('-');
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..6];
    if base.is_empty() { format!("tenant-{suffix}") } else { format!("{base}-{suffix}") }
}

/// Maps a database failure of this service (see `brainstorm_common::store::store_failure`).
fn store_failure(error: sqlx::Error) -> ServiceError {
    brainstorm_common::store::store_failure("identity", error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_url_safe_and_unique() {
        let slug = slug_of("Acme Rockets, Inc.");
        assert!(slug.starts_with("acme-rockets-inc-"), "{slug}");
        assert_ne!(slug_of("Acme"), slug_of("Acme"));
        assert!(slug_of("日本").starts_with("tenant-"));
    }

    #[test]
    fn emails_are_checked_and_normalised() {
        assert_eq!(validated_email(" Ada@Example.com ").ok().as_deref(), Some("ada@example.com"));
        for bad in ["", "ada", "ada@", "@example.com", "ada@example", "a da@example.com", "ada@@example.com"] {
            assert!(validated_email(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn claim_roles_map_to_user_roles() {
        assert_eq!(user_role_of_claim_role("owner").ok(), Some("admin"));
        assert_eq!(user_role_of_claim_role("member").ok(), Some("developer"));
        assert!(user_role_of_claim_role("root").is_err());
    }
}
