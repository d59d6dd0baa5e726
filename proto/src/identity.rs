//! The identity service contract: tenants, users, API keys, RBAC and platform administration.

#[allow(clippy::all, missing_docs)]
mod v1 {
    tonic::include_proto!("brainstorm.identity.v1");
}

use v1::identity_service_client::IdentityServiceClient;
use v1::identity_service_server::IdentityServiceServer;
pub use v1::*;

crate::grpc::service_contract! {
    service IdentityService;
    client IdentityClient;
    generated_client IdentityServiceClient;
    generated_server IdentityServiceServer;
    generated_server_trait v1::identity_service_server::IdentityService;
    methods {
        /// Creates a tenant on plan `sandbox` with an admin key and an owner claim token.
        fn register(RegisterRequest) -> RegisterResponse;
        /// Resolves a presented API key to its principal; unknown, revoked or expired keys are unauthenticated.
        fn authenticate(AuthenticateRequest) -> Principal;
        /// Reads a tenant's profile.
        fn get_tenant(TenantRef) -> Tenant;
        /// Renames a tenant.
        fn update_tenant(UpdateTenantRequest) -> Tenant;
        /// Lists a tenant's users.
        fn list_users(TenantRef) -> UserList;
        /// Invites a user by mail with a claim link.
        fn invite_user(InviteUserRequest) -> Invitation;
        /// Removes a user from a tenant and returns it.
        fn delete_user(DeleteUserRequest) -> User;
        /// Mints a multi-use `brct_` claim token for a tenant.
        fn create_claim_link(CreateClaimLinkRequest) -> ClaimToken;
        /// Creates an API key; the plaintext is returned this once.
        fn create_api_key(CreateApiKeyRequest) -> CreatedApiKey;
        /// Lists a tenant's API keys, revoked ones included.
        fn list_api_keys(TenantRef) -> ApiKeyList;
        /// Revokes an API key; it authenticates no more.
        fn revoke_api_key(RevokeApiKeyRequest) -> RevokedApiKey;
        /// Lists every tenant, optionally of one status (platform administration).
        fn list_tenants(ListTenantsRequest) -> TenantList;
        /// Sets a tenant's status (`active` on approval, `rejected` on rejection), saying whether it moved and from what.
        fn set_tenant_status(SetTenantStatusRequest) -> TenantStatusChange;
        /// Creates a registration invite code.
        fn create_invite_code(CreateInviteCodeRequest) -> InviteCode;
        /// Lists invite codes with their usage counts.
        fn list_invite_codes(ListInviteCodesRequest) -> InviteCodeList;
        /// Deletes an invite code.
        fn delete_invite_code(DeleteInviteCodeRequest) -> DeleteInviteCodeResponse;
        /// Summarises the platform for its administrators.
        fn digest(DigestRequest) -> PlatformDigest;
        /// Sets a tenant's plan (`sandbox` or `standard`); the move to `standard` records `graduated_at`.
        fn set_tenant_plan(SetTenantPlanRequest) -> Tenant;
        /// Mails a 6-digit verification code valid 600 seconds, replacing the tenant's pending code.
        fn start_email_verification(StartEmailVerificationRequest) -> EmailVerificationStarted;
        /// Consumes a mailed code: records the verified address and graduates the tenant to `standard`.
        fn confirm_email_verification(ConfirmEmailVerificationRequest) -> Tenant;
        fn create_agent_profile(CreateAgentProfileRequest) -> AgentProfile;
        fn get_agent_profile(AgentProfileRef) -> AgentProfile;
        fn list_agent_profiles(TenantRef) -> AgentProfileList;
        fn update_agent_profile(UpdateAgentProfileRequest) -> AgentProfile;
        fn delete_agent_profile(AgentProfileRef) -> AgentProfile;
        fn set_agent_lifecycle(SetAgentLifecycleRequest) -> AgentProfile;
        /// Creates (active) or finds an agent's profile and mints an agent JWT; 503 without a signing secret.
        fn bootstrap_agent(BootstrapAgentRequest) -> BootstrappedAgent;
        /// Resolves an agent JWT to its tenant and profile; suspended and terminated agents are refused.
        fn authenticate_agent(AuthenticateAgentRequest) -> AgentPrincipal;
        /// Issues a short-lived client certificate from the agent CA; 503 without a master key.
        fn issue_agent_certificate(IssueAgentCertificateRequest) -> IssuedAgentCertificate;
        /// Resolves a presented client certificate as `authenticate_agent` does a JWT.
        fn authenticate_agent_certificate(AuthenticateAgentCertificateRequest) -> AgentPrincipal;
        /// The certificates issued to a tenant's agents (or one agent's), newest first.
        fn list_agent_certificates(ListAgentCertificatesRequest) -> AgentCertificateList;
        /// Revokes one issued certificate (refused at its next use); revoking it again changes nothing.
        fn revoke_agent_certificate(RevokeAgentCertificateRequest) -> RevokedAgentCertificate;
        /// Creates a sub-agent of an active parent allowed to delegate, moving budget to it; idempotent per child.
        fn delegate_agent(DelegateAgentRequest) -> DelegatedAgent;
        /// Terminates a parent's sub-agent and refunds its unspent budget; repeating changes nothing.
        fn end_sub_agent(EndSubAgentRequest) -> EndedSubAgent;
        /// Registers an OAuth app.
        fn create_oauth_app(CreateOAuthAppRequest) -> OAuthApp;
        /// The tenant's OAuth apps.
        fn list_oauth_apps(TenantRef) -> OAuthAppList;
        /// Deletes one of the tenant's OAuth apps.
        fn delete_oauth_app(OAuthAppRef) -> OAuthApp;
        /// An OAuth app by client id (for the consent view).
        fn get_oauth_app(OAuthClientRef) -> OAuthApp;
        /// A single-use authorization code for an approval.
        fn issue_oauth_code(IssueOAuthCodeRequest) -> IssuedOAuthCode;
        /// An API key for a code and its PKCE verifier.
        fn redeem_oauth_code(RedeemOAuthCodeRequest) -> OAuthToken;
        /// Redeems a claim token for an identity provider's user: a user and a membership.
        fn redeem_claim(RedeemClaimRequest) -> IdpMembership;
        /// The tenants an identity has claimed.
        fn list_idp_memberships(IdpSubject) -> IdpMembershipList;
        /// An identity's own tenant: made (with an admin key) at its first call, found after.
        fn provision_tenant(ProvisionTenantRequest) -> ProvisionedTenant;
        /// Starts a device authorization.
        fn start_device_authorization(StartDeviceAuthorizationRequest) -> DeviceAuthorization;
        /// Confirms a device's user code for one of the identity's tenants.
        fn confirm_device(ConfirmDeviceRequest) -> DeviceConfirmation;
        /// A device's poll: pending, slow down, or linked with a key.
        fn poll_device_token(PollDeviceTokenRequest) -> DeviceTokenResult;
    }
}
