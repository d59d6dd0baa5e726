//! One identity test suite, run against SQLite and PostgreSQL alike.

use std::path::PathBuf;
use std::sync::Arc;

use brainstorm_common::bus::{EventBus, InProcessBus, Subscription};
use brainstorm_common::config::RegistrationMode;
use brainstorm_common::outbox::MailOutbox;
use brainstorm_common::store::{Database, testing};
use brainstorm_identity::{AgentCertificateAuthority, AgentTokenSigner, IdentityOptions, IdentityServiceImpl};
use brainstorm_proto::events::{IDENTITY_EVENTS_TOPIC, IdentityEvent, identity_event};
use brainstorm_proto::identity::*;
use brainstorm_proto::{ErrorKind, ServiceError};
use sha2::Digest;
use sqlx::Row;

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Harness {
    identity: IdentityServiceImpl,
    bus: InProcessBus,
    outbox: PathBuf,
    database: Database,
}

fn harness(database: Database, registration_mode: RegistrationMode) -> Harness {
    let bus = InProcessBus::new();
    let outbox = std::env::temp_dir().join(format!("brainstorm-outbox-{}", uuid::Uuid::new_v4().simple()));
    let options = IdentityOptions {
        dashboard_url: "https://dash.example".to_string(),
        registration_mode,
        outbox: MailOutbox::new(&outbox),
        require_agent_owner: false,
        agent_tokens: Some(AgentTokenSigner::new([3; 32], std::time::Duration::from_secs(3600))),
        agent_ca: AgentCertificateAuthority::from_seed([4; 32]).ok().map(Arc::new),
    };
    let shared_bus: Arc<dyn EventBus> = Arc::new(bus.clone());
    Harness { identity: IdentityServiceImpl::new(database.clone(), shared_bus, options), bus, outbox, database }
}

async fn register(identity: &IdentityServiceImpl, name: &str) -> Result<RegisterResponse, ServiceError> {
    identity.register(RegisterRequest { tenant_name: name.to_string(), invite_code: None, tenant_id: None }).await
}

fn plaintext(response: &RegisterResponse) -> String {
    response.api_key.as_ref().map(|key| key.plaintext.clone()).unwrap_or_default()
}

fn tenant_id(response: &RegisterResponse) -> String {
    response.tenant.as_ref().map(|tenant| tenant.id.clone()).unwrap_or_default()
}

use brainstorm_common::on_both_engines;

on_both_engines!(
    registration_creates_a_sandbox_tenant_with_an_admin_key_and_claim,
    registration_with_a_chosen_id_happens_once,
    agent_profiles_are_stored_changed_and_moved,
    agents_bootstrap_once_and_authenticate_while_usable,
    agent_certificates_are_issued_and_resolved_while_the_agent_may_act,
    issued_certificates_are_listed_and_revoked_one_by_one,
    sub_agents_take_budget_from_their_parent_and_give_back_the_unspent,
    keys_are_stored_hashed_and_authenticate_until_revoked,
    expired_keys_and_malformed_keys_are_refused,
    keys_cannot_grant_more_than_their_creator,
    invitations_create_users_and_write_mail,
    tenants_are_isolated,
    administration_of_tenants_and_invite_codes,
    invite_only_registration_consumes_codes,
    approval_mode_holds_tenants_until_approved,
    an_identity_provisions_one_tenant_of_its_own,
    provisioning_follows_the_registration_mode,
    plan_changes_record_graduation_and_publish_tenant_changed,
    invalid_plans_emails_and_tenants_are_refused,
    email_verification_graduates_the_tenant_once,
    wrong_codes_count_and_the_fifth_invalidates_the_code,
    expired_codes_are_refused,
    starting_again_replaces_the_pending_code,
    concurrent_guesses_never_exceed_the_attempt_limit,
    the_database_never_holds_the_plaintext_code,
);

async fn registration_creates_a_sandbox_tenant_with_an_admin_key_and_claim(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let response = register(&harness.identity, "  Acme Rockets ").await?;
    let tenant = response.tenant.clone().ok_or("no tenant")?;
    assert_eq!(
        (tenant.name.as_str(), tenant.plan.as_str(), tenant.tier.as_str(), tenant.status.as_str()),
        ("Acme Rockets", "sandbox", "community", "active")
    );
    let key = response.api_key.clone().ok_or("no key")?;
    assert!(key.plaintext.starts_with("br_live_"));
    assert_eq!(key.key.ok_or("no record")?.scopes, vec!["admin".to_string()]);
    let claim = response.claim.clone().ok_or("no claim")?;
    assert!(claim.token.starts_with("brct_"));
    assert_eq!(claim.url, format!("https://dash.example/claim?token={}", claim.token));
    assert!(claim.expires_at > tenant.created_at);

    let empty = register(&harness.identity, "   ").await;
    assert_eq!(empty.err().map(|error| error.kind), Some(ErrorKind::InvalidArgument));
    let fetched = harness.identity.get_tenant(TenantRef { tenant_id: tenant.id.clone() }).await?;
    assert_eq!(fetched.slug, tenant.slug);
    let missing = harness.identity.get_tenant(TenantRef { tenant_id: "nope".to_string() }).await;
    assert_eq!(missing.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    Ok(())
}

async fn registration_with_a_chosen_id_happens_once(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let id = "0b7c4d2e-5f1a-4c3b-9d8e-7f6a5b4c3d2e";
    let request =
        |name: &str, id: &str| RegisterRequest { tenant_name: name.to_string(), invite_code: None, tenant_id: Some(id.to_string()) };
    let first = harness.identity.register(request("Declared", id)).await?;
    assert_eq!(tenant_id(&first), id);
    let again = harness.identity.register(request("Declared again", id)).await.err().ok_or("registered twice")?;
    assert_eq!((again.kind, again.reason.as_str()), (ErrorKind::Conflict, "tenant_exists"));
    assert_eq!(harness.identity.get_tenant(TenantRef { tenant_id: id.to_string() }).await?.name, "Declared");
    let principal = harness.identity.authenticate(AuthenticateRequest { api_key: plaintext(&first) }).await?;
    assert_eq!(principal.tenant.map(|tenant| tenant.id), Some(id.to_string()));
    let malformed = harness.identity.register(request("Bad id", "not-a-uuid")).await.err().ok_or("malformed id accepted")?;
    assert_eq!((malformed.kind, malformed.reason.as_str()), (ErrorKind::InvalidArgument, "invalid_tenant_id"));
    Ok(())
}

async fn agent_profiles_are_stored_changed_and_moved(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let tenant = tenant_id(&register(&harness.identity, "Agents").await?);
    let request = CreateAgentProfileRequest {
        tenant_id: tenant.clone(),
        agent_id: "crawler".to_string(),
        budget_daily_nanos: Some(5_250_000_000),
        metadata_json: Some("{\"team\": \"growth\"}".to_string()),
        ..CreateAgentProfileRequest::default()
    };
    let created = harness.identity.create_agent_profile(request.clone()).await?;
    assert_eq!(
        (created.lifecycle_state.as_str(), created.role.as_str(), created.metadata_json.as_str()),
        ("provisioned", "agent", "{\"team\":\"growth\"}")
    );
    let twice = harness.identity.create_agent_profile(request.clone()).await.err().ok_or("created twice")?;
    assert_eq!((twice.kind, twice.reason.as_str()), (ErrorKind::Conflict, "agent_exists"));
    let unknown_tenant = CreateAgentProfileRequest { tenant_id: "nope".to_string(), ..request };
    assert_eq!(harness.identity.create_agent_profile(unknown_tenant).await.err().map(|error| error.kind), Some(ErrorKind::NotFound));

    let reference = AgentProfileRef { tenant_id: tenant.clone(), agent_id: "crawler".to_string() };
    let update = UpdateAgentProfileRequest {
        tenant_id: tenant.clone(),
        agent_id: "crawler".to_string(),
        owner_id: Some("user_1".to_string()),
        cleared: vec!["budget_daily_nanos".to_string()],
        ..UpdateAgentProfileRequest::default()
    };
    let updated = harness.identity.update_agent_profile(update).await?;
    assert_eq!((updated.owner_id.as_deref(), updated.budget_daily_nanos), (Some("user_1"), None));
    assert_eq!(harness.identity.get_agent_profile(reference.clone()).await?, updated);

    let mv =
        |state: &str| SetAgentLifecycleRequest { tenant_id: tenant.clone(), agent_id: "crawler".to_string(), state: state.to_string() };
    assert_eq!(harness.identity.set_agent_lifecycle(mv("terminated")).await.err().map(|error| error.kind), Some(ErrorKind::Conflict));
    assert_eq!(harness.identity.set_agent_lifecycle(mv("active")).await?.lifecycle_state, "active");
    assert_eq!(harness.identity.set_agent_lifecycle(mv("dormant")).await.err().map(|error| error.kind), Some(ErrorKind::InvalidArgument));
    let listed = harness.identity.list_agent_profiles(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!(listed.profiles.iter().map(|profile| profile.lifecycle_state.as_str()).collect::<Vec<_>>(), vec!["active"]);
    harness.identity.delete_agent_profile(reference.clone()).await?;
    assert_eq!(harness.identity.get_agent_profile(reference).await.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    Ok(())
}

async fn agents_bootstrap_once_and_authenticate_while_usable(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let tenant = tenant_id(&register(&harness.identity, "Agents").await?);
    let bootstrap = BootstrapAgentRequest {
        tenant_id: tenant.clone(),
        agent_id: "planner".to_string(),
        budget_daily_nanos: Some(2_000_000_000),
        key_owner_id: Some("user_key_owner".to_string()),
        ..BootstrapAgentRequest::default()
    };
    let first = harness.identity.bootstrap_agent(bootstrap.clone()).await?;
    let profile = first.profile.clone().ok_or("no profile")?;
    assert!(first.created);
    assert_eq!(
        (profile.lifecycle_state.as_str(), profile.owner_id.as_deref(), profile.budget_daily_nanos),
        ("active", Some("user_key_owner"), Some(2_000_000_000))
    );
    let principal = harness.identity.authenticate_agent(AuthenticateAgentRequest { token: first.token.clone() }).await?;
    assert_eq!(principal.profile.as_ref(), Some(&profile));
    assert_eq!(principal.tenant.map(|tenant| tenant.id), Some(tenant.clone()));
    assert_eq!(principal.token_expires_at, first.token_expires_at);

    // Again: the same profile, not created, a fresh token; another owner is a conflict.
    let again = harness
        .identity
        .bootstrap_agent(BootstrapAgentRequest { key_owner_id: Some("someone_else".to_string()), ..bootstrap.clone() })
        .await?;
    assert_eq!((again.created, again.profile.as_ref()), (false, Some(&profile)));
    assert_ne!(again.token, first.token);
    let stolen = BootstrapAgentRequest { owner_id: Some("intruder".to_string()), ..bootstrap.clone() };
    let refused = harness.identity.bootstrap_agent(stolen).await.err().ok_or("another owner bootstrapped")?;
    assert_eq!((refused.kind, refused.reason.as_str()), (ErrorKind::Conflict, "agent_exists"));
    let invalid = BootstrapAgentRequest { agent_id: "Not Valid".to_string(), ..bootstrap.clone() };
    assert_eq!(harness.identity.bootstrap_agent(invalid).await.err().map(|error| error.kind), Some(ErrorKind::InvalidArgument));

    // A profile an operator created waits in `provisioned` until its agent bootstraps.
    let waiting =
        CreateAgentProfileRequest { tenant_id: tenant.clone(), agent_id: "waiting".to_string(), ..CreateAgentProfileRequest::default() };
    harness.identity.create_agent_profile(waiting).await?;
    let woken = harness.identity.bootstrap_agent(BootstrapAgentRequest { agent_id: "waiting".to_string(), ..bootstrap.clone() }).await?;
    assert_eq!((woken.created, woken.profile.map(|profile| profile.lifecycle_state)), (false, Some("active".to_string())));

    // Suspended: neither its tokens nor a new bootstrap work; back to active, the old token works again.
    let mv =
        |state: &str| SetAgentLifecycleRequest { tenant_id: tenant.clone(), agent_id: "planner".to_string(), state: state.to_string() };
    harness.identity.set_agent_lifecycle(mv("suspended")).await?;
    let reason = |error: Option<ServiceError>| error.map(|error| (error.kind, error.reason));
    let suspended = Some((ErrorKind::PermissionDenied, "agent_suspended".to_string()));
    assert_eq!(reason(harness.identity.authenticate_agent(AuthenticateAgentRequest { token: first.token.clone() }).await.err()), suspended);
    assert_eq!(reason(harness.identity.bootstrap_agent(bootstrap.clone()).await.err()), suspended);
    harness.identity.set_agent_lifecycle(mv("active")).await?;
    harness.identity.authenticate_agent(AuthenticateAgentRequest { token: first.token.clone() }).await?;

    // Deleted and created again under the same id: the old tokens belong to the old profile.
    harness.identity.delete_agent_profile(AgentProfileRef { tenant_id: tenant.clone(), agent_id: "planner".to_string() }).await?;
    let revoked = Some((ErrorKind::Unauthenticated, "agent_token_revoked".to_string()));
    assert_eq!(reason(harness.identity.authenticate_agent(AuthenticateAgentRequest { token: first.token.clone() }).await.err()), revoked);
    let reborn = harness.identity.bootstrap_agent(bootstrap).await?;
    assert!(reborn.created);
    assert_eq!(reason(harness.identity.authenticate_agent(AuthenticateAgentRequest { token: first.token.clone() }).await.err()), revoked);
    harness.identity.authenticate_agent(AuthenticateAgentRequest { token: reborn.token }).await?;

    // Tokens of another gateway's secret, edited tokens and API keys are not agent tokens.
    let foreign = AgentTokenSigner::new([4; 32], std::time::Duration::from_secs(3600));
    let (foreign_token, _) = foreign.mint(&tenant, "planner", "whatever", "agent", None, chrono::Utc::now());
    let invalid = Some((ErrorKind::Unauthenticated, "invalid_agent_token".to_string()));
    for token in [foreign_token, format!("{}x", first.token), "br_live_notatoken".to_string()] {
        assert_eq!(reason(harness.identity.authenticate_agent(AuthenticateAgentRequest { token }).await.err()), invalid);
    }
    Ok(())
}

async fn agent_certificates_are_issued_and_resolved_while_the_agent_may_act(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let tenant = tenant_id(&register(&harness.identity, "Certified").await?);
    let bootstrap = BootstrapAgentRequest { tenant_id: tenant.clone(), agent_id: "signer".to_string(), ..BootstrapAgentRequest::default() };
    let profile = harness.identity.bootstrap_agent(bootstrap.clone()).await?.profile.ok_or("no profile")?;
    let issue = |profile_id: &str, lifetime_seconds: Option<u32>| IssueAgentCertificateRequest {
        tenant_id: tenant.clone(),
        agent_id: "signer".to_string(),
        profile_id: profile_id.to_string(),
        csr_pem: None,
        lifetime_seconds,
    };
    let issued = harness.identity.issue_agent_certificate(issue(&profile.id, None)).await?;
    assert!(issued.private_key_pem.is_some(), "without a CSR the CA makes the key");
    let der = pem_contents(&issued.certificate_pem)?;
    let authenticate = |certificate_der: Vec<u8>| AuthenticateAgentCertificateRequest { certificate_der };
    let principal = harness.identity.authenticate_agent_certificate(authenticate(der.clone())).await?;
    assert_eq!(principal.profile.as_ref(), Some(&profile));
    assert_eq!(
        (principal.token_expires_at.as_str(), principal.token_id.as_str()),
        (issued.not_after.as_str(), format!("cert:{}", issued.serial).as_str())
    );

    let reason = |error: Option<ServiceError>| error.map(|error| (error.kind, error.reason));
    // Not for a profile the agent does not have, nor for a life out of bounds.
    assert_eq!(
        reason(harness.identity.issue_agent_certificate(issue("another-profile", None)).await.err()),
        Some((ErrorKind::Unauthenticated, "agent_token_revoked".to_string()))
    );
    assert_eq!(
        reason(harness.identity.issue_agent_certificate(issue(&profile.id, Some(60))).await.err()),
        Some((ErrorKind::InvalidArgument, "invalid_ttl".to_string()))
    );
    let bad_csr = IssueAgentCertificateRequest {
        csr_pem: Some("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".to_string()),
        ..issue(&profile.id, None)
    };
    assert_eq!(
        reason(harness.identity.issue_agent_certificate(bad_csr).await.err()),
        Some((ErrorKind::InvalidArgument, "invalid_csr".to_string()))
    );

    // Suspended: its certificates and new ones are refused; a deleted profile's are revoked.
    let mv = |state: &str| SetAgentLifecycleRequest { tenant_id: tenant.clone(), agent_id: "signer".to_string(), state: state.to_string() };
    harness.identity.set_agent_lifecycle(mv("suspended")).await?;
    let suspended = Some((ErrorKind::PermissionDenied, "agent_suspended".to_string()));
    assert_eq!(reason(harness.identity.authenticate_agent_certificate(authenticate(der.clone())).await.err()), suspended);
    assert_eq!(reason(harness.identity.issue_agent_certificate(issue(&profile.id, None)).await.err()), suspended);
    harness.identity.set_agent_lifecycle(mv("active")).await?;
    harness.identity.authenticate_agent_certificate(authenticate(der.clone())).await?;
    harness.identity.delete_agent_profile(AgentProfileRef { tenant_id: tenant.clone(), agent_id: "signer".to_string() }).await?;
    harness.identity.bootstrap_agent(bootstrap).await?;
    assert_eq!(
        reason(harness.identity.authenticate_agent_certificate(authenticate(der)).await.err()),
        Some((ErrorKind::Unauthenticated, "agent_token_revoked".to_string()))
    );
    // Another CA's certificate and garbage are not agent certificates.
    let foreign = AgentCertificateAuthority::from_seed([9; 32])?;
    let subject = brainstorm_identity::agent_cert::AgentSubject {
        tenant_id: tenant.clone(),
        agent_id: "signer".to_string(),
        profile_id: profile.id.clone(),
    };
    let forged = foreign.issue(&subject, brainstorm_identity::agent_cert::RequestedKey::Generate, 3600, chrono::Utc::now())?;
    let invalid = Some((ErrorKind::Unauthenticated, "invalid_agent_certificate".to_string()));
    for certificate_der in [pem_contents(&forged.certificate_pem)?, b"garbage".to_vec()] {
        assert_eq!(reason(harness.identity.authenticate_agent_certificate(authenticate(certificate_der)).await.err()), invalid);
    }
    Ok(())
}

async fn issued_certificates_are_listed_and_revoked_one_by_one(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let tenant = tenant_id(&register(&harness.identity, "Revokers").await?);
    let other_tenant = tenant_id(&register(&harness.identity, "Bystanders").await?);
    let bootstrap = |agent: &str| BootstrapAgentRequest { tenant_id: tenant.clone(), agent_id: agent.to_string(), ..Default::default() };
    let profile = harness.identity.bootstrap_agent(bootstrap("courier")).await?.profile.ok_or("no profile")?;
    let sibling = harness.identity.bootstrap_agent(bootstrap("sibling")).await?.profile.ok_or("no profile")?;
    let issue = |profile: &AgentProfile| IssueAgentCertificateRequest {
        tenant_id: tenant.clone(),
        agent_id: profile.agent_id.clone(),
        profile_id: profile.id.clone(),
        csr_pem: None,
        lifetime_seconds: Some(3600),
    };
    let first = harness.identity.issue_agent_certificate(issue(&profile)).await?;
    let second = harness.identity.issue_agent_certificate(issue(&profile)).await?;
    let theirs = harness.identity.issue_agent_certificate(issue(&sibling)).await?;
    let list = |agent_id: Option<&str>, status: Option<&str>, limit: Option<u32>| ListAgentCertificatesRequest {
        tenant_id: tenant.clone(),
        agent_id: agent_id.map(str::to_string),
        status: status.map(str::to_string),
        limit,
    };
    let serials = |list: AgentCertificateList| list.certificates.into_iter().map(|c| (c.serial, c.status)).collect::<Vec<_>>();
    let active = |serial: &str| (serial.to_string(), "active".to_string());
    // Newest first; one agent's, or the tenant's.
    assert_eq!(
        serials(harness.identity.list_agent_certificates(list(Some("courier"), None, None)).await?),
        vec![active(&second.serial), active(&first.serial)]
    );
    assert_eq!(serials(harness.identity.list_agent_certificates(list(None, None, None)).await?).len(), 3);
    assert_eq!(serials(harness.identity.list_agent_certificates(list(None, None, Some(1))).await?).len(), 1);
    let listed = harness.identity.list_agent_certificates(list(Some("courier"), None, Some(1))).await?.certificates;
    let record = listed.first().ok_or("no certificate")?;
    assert_eq!(
        (record.fingerprint_sha256.as_str(), record.key_source.as_str(), record.not_after.as_str(), record.profile_id.as_str()),
        (second.fingerprint_sha256.as_str(), "generated", second.not_after.as_str(), profile.id.as_str())
    );

    // Revoking one refuses it at its next use and leaves the agent's other certificate working.
    let revoke = |tenant_id: &str, serial: &str, agent_id: Option<&str>, reason: Option<&str>| RevokeAgentCertificateRequest {
        tenant_id: tenant_id.to_string(),
        serial: serial.to_string(),
        agent_id: agent_id.map(str::to_string),
        reason: reason.map(str::to_string),
        revoked_by: "key:k_admin".to_string(),
    };
    let reason = |error: Option<ServiceError>| error.map(|error| (error.kind, error.reason));
    let not_found = Some((ErrorKind::NotFound, "certificate_not_found".to_string()));
    // Not another tenant's, nor another agent's when an agent revokes its own, nor an unknown serial.
    assert_eq!(reason(harness.identity.revoke_agent_certificate(revoke(&other_tenant, &first.serial, None, None)).await.err()), not_found);
    assert_eq!(
        reason(harness.identity.revoke_agent_certificate(revoke(&tenant, &theirs.serial, Some("courier"), None)).await.err()),
        not_found
    );
    assert_eq!(reason(harness.identity.revoke_agent_certificate(revoke(&tenant, "00ff", None, None)).await.err()), not_found);
    assert_eq!(
        reason(harness.identity.revoke_agent_certificate(revoke(&tenant, &first.serial, None, Some("two\nlines"))).await.err()),
        Some((ErrorKind::InvalidArgument, "invalid_reason".to_string()))
    );
    // Two revocations at once: one changes the record, the other finds it revoked.
    let upper = first.serial.to_uppercase();
    let (one, other) = tokio::join!(
        harness.identity.revoke_agent_certificate(revoke(&tenant, &upper, Some("courier"), Some(" key leaked "))),
        harness.identity.revoke_agent_certificate(revoke(&tenant, &first.serial, None, Some("key leaked"))),
    );
    let (one, other) = (one?, other?);
    assert_eq!(u8::from(one.changed) + u8::from(other.changed), 1, "exactly one revocation writes");
    assert_eq!(one.certificate, other.certificate);
    let revoked = one.certificate.ok_or("no certificate")?;
    assert_eq!(
        (revoked.status.as_str(), revoked.revoked_reason.as_deref(), revoked.revoked_by.as_deref(), revoked.revoked_at.is_some()),
        ("revoked", Some("key leaked"), Some("key:k_admin"), true)
    );
    let again = harness.identity.revoke_agent_certificate(revoke(&tenant, &first.serial, None, Some("again"))).await?;
    assert_eq!((again.changed, again.certificate.as_ref()), (false, Some(&revoked)));
    let authenticate = |pem: &str| -> Result<AuthenticateAgentCertificateRequest, Box<dyn std::error::Error>> {
        Ok(AuthenticateAgentCertificateRequest { certificate_der: pem_contents(pem)? })
    };
    assert_eq!(
        reason(harness.identity.authenticate_agent_certificate(authenticate(&first.certificate_pem)?).await.err()),
        Some((ErrorKind::Unauthenticated, "agent_certificate_revoked".to_string()))
    );
    harness.identity.authenticate_agent_certificate(authenticate(&second.certificate_pem)?).await?;
    assert_eq!(
        serials(harness.identity.list_agent_certificates(list(Some("courier"), Some("revoked"), None)).await?),
        vec![(first.serial.clone(), "revoked".to_string())]
    );
    assert_eq!(serials(harness.identity.list_agent_certificates(list(None, Some("active"), None)).await?).len(), 2);
    assert!(serials(harness.identity.list_agent_certificates(list(None, Some("expired"), None)).await?).is_empty());

    // A certificate the CA signed but identity has no record of (one issued before the record
    // existed) is refused; so are bad listings.
    sqlx::query("DELETE FROM agent_certificates WHERE serial = $1").bind(&second.serial).execute(harness.database.pool()).await?;
    assert_eq!(
        reason(harness.identity.authenticate_agent_certificate(authenticate(&second.certificate_pem)?).await.err()),
        Some((ErrorKind::Unauthenticated, "agent_certificate_unknown".to_string()))
    );
    for (request, refused) in [
        (list(None, Some("valid"), None), "invalid_status"),
        (list(None, None, Some(0)), "invalid_limit"),
        (list(None, None, Some(1001)), "invalid_limit"),
        (list(Some("nobody"), None, None), "agent_not_found"),
    ] {
        assert_eq!(harness.identity.list_agent_certificates(request).await.err().map(|error| error.reason), Some(refused.to_string()));
    }
    // A profile made again under the same id does not list the old one's certificates.
    harness.identity.delete_agent_profile(AgentProfileRef { tenant_id: tenant.clone(), agent_id: "courier".to_string() }).await?;
    harness.identity.bootstrap_agent(bootstrap("courier")).await?;
    assert!(serials(harness.identity.list_agent_certificates(list(Some("courier"), None, None)).await?).is_empty());
    Ok(())
}

/// The DER inside one PEM block.
fn pem_contents(pem: &str) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    use base64::Engine;
    let body: String = pem.lines().filter(|line| !line.starts_with("-----")).collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(body)?)
}

async fn sub_agents_take_budget_from_their_parent_and_give_back_the_unspent(database: Database) -> TestResult {
    const USD: i64 = 1_000_000_000;
    let harness = harness(database, RegistrationMode::Open);
    let tenant = tenant_id(&register(&harness.identity, "Delegators").await?);
    let bootstrap = |agent: &str, budget: Option<i64>, metadata: &str| BootstrapAgentRequest {
        tenant_id: tenant.clone(),
        agent_id: agent.to_string(),
        budget_daily_nanos: budget,
        metadata_json: Some(metadata.to_string()),
        owner_id: Some("user_1".to_string()),
        ..BootstrapAgentRequest::default()
    };
    let lead =
        harness.identity.bootstrap_agent(bootstrap("lead", Some(USD), "{\"can_delegate\": true}")).await?.profile.ok_or("no lead")?;
    let plain = harness.identity.bootstrap_agent(bootstrap("plain", Some(USD), "{}")).await?.profile.ok_or("no plain")?;
    let delegate = |parent: &AgentProfile, child: &str, allocation: i64| DelegateAgentRequest {
        tenant_id: tenant.clone(),
        parent_agent_id: parent.agent_id.clone(),
        parent_profile_id: parent.id.clone(),
        agent_id: child.to_string(),
        allocation_nanos: allocation,
        ..DelegateAgentRequest::default()
    };
    let first = harness.identity.delegate_agent(delegate(&lead, "helper", 4 * USD / 10)).await?;
    let helper = first.profile.clone().ok_or("no child")?;
    assert!(first.created);
    assert_eq!(
        (helper.parent_agent_id.as_deref(), helper.budget_daily_nanos, helper.role.as_str(), helper.owner_id.as_deref()),
        (Some("lead"), Some(4 * USD / 10), "agent", Some("user_1"))
    );
    assert_eq!(first.parent.and_then(|parent| parent.budget_daily_nanos), Some(6 * USD / 10));
    harness.identity.authenticate_agent(AuthenticateAgentRequest { token: first.token.clone() }).await?;
    let again = harness.identity.delegate_agent(delegate(&lead, "helper", 4 * USD / 10)).await?;
    assert_eq!((again.created, again.profile.map(|profile| profile.id)), (false, Some(helper.id.clone())));
    let lead_now = |identity: &IdentityServiceImpl| {
        let reference = AgentProfileRef { tenant_id: tenant.clone(), agent_id: "lead".to_string() };
        let identity = identity.clone();
        async move { identity.get_agent_profile(reference).await.map(|profile| profile.budget_daily_nanos) }
    };
    assert_eq!(lead_now(&harness.identity).await?, Some(6 * USD / 10), "nothing moved the second time");

    let reason = |result: Result<DelegatedAgent, ServiceError>| result.err().map(|error| (error.kind, error.reason));
    let keeps_too_little = delegate(&lead, "greedy", 6 * USD / 10 - 5_000_000);
    assert_eq!(
        reason(harness.identity.delegate_agent(keeps_too_little).await),
        Some((ErrorKind::ResourceExhausted, "insufficient_budget".to_string()))
    );
    let too_high = DelegateAgentRequest { role: Some("operator".to_string()), ..delegate(&lead, "boss", USD / 10) };
    assert_eq!(
        reason(harness.identity.delegate_agent(too_high).await),
        Some((ErrorKind::PermissionDenied, "role_exceeds_parent".to_string()))
    );
    assert_eq!(
        reason(harness.identity.delegate_agent(delegate(&plain, "sidekick", USD / 10)).await),
        Some((ErrorKind::PermissionDenied, "delegation_not_allowed".to_string()))
    );
    assert_eq!(
        reason(harness.identity.delegate_agent(delegate(&lead, "plain", USD / 10)).await),
        Some((ErrorKind::Conflict, "agent_exists".to_string()))
    );
    let forever = DelegateAgentRequest { ttl_seconds: Some(31 * 24 * 3600), ..delegate(&lead, "eternal", USD / 10) };
    assert_eq!(reason(harness.identity.delegate_agent(forever).await), Some((ErrorKind::InvalidArgument, "invalid_ttl".to_string())));
    assert_eq!(
        reason(harness.identity.delegate_agent(delegate(&lead, "free", 0)).await),
        Some((ErrorKind::InvalidArgument, "invalid_allocation".to_string()))
    );

    // Concurrent delegations never give away more than the parent has: 0.6 - 0.01 kept leaves room for five of 0.1.
    let attempts = (0..8).map(|index| {
        let identity = harness.identity.clone();
        let request = delegate(&lead, &format!("worker-{index}"), USD / 10);
        async move { identity.delegate_agent(request).await }
    });
    let outcomes = futures::future::join_all(attempts).await;
    let created = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    assert_eq!(created, 5, "{outcomes:?}");
    assert!(outcomes.iter().filter_map(|outcome| outcome.as_ref().err()).all(|error| error.reason == "insufficient_budget"));
    assert_eq!(lead_now(&harness.identity).await?, Some(USD / 10));
    let workers: Vec<String> =
        outcomes.iter().filter_map(|outcome| outcome.as_ref().ok()?.profile.as_ref().map(|profile| profile.agent_id.clone())).collect();

    // Ending a child refunds what the edge says it left (at most its budget); again changes nothing.
    let end = |child: &str, refund: i64| EndSubAgentRequest {
        tenant_id: tenant.clone(),
        parent_agent_id: "lead".to_string(),
        child_agent_id: child.to_string(),
        refund_nanos: refund,
    };
    let ended = harness.identity.end_sub_agent(end("helper", USD / 4)).await?;
    assert_eq!((ended.already_terminated, ended.refunded_nanos), (false, USD / 4));
    assert_eq!(ended.profile.map(|profile| profile.lifecycle_state), Some("terminated".to_string()));
    assert_eq!(lead_now(&harness.identity).await?, Some(USD / 10 + USD / 4));
    let twice = harness.identity.end_sub_agent(end("helper", USD / 4)).await?;
    assert_eq!((twice.already_terminated, twice.refunded_nanos), (true, 0));
    let clamped = harness.identity.end_sub_agent(end(&workers[0], 100 * USD)).await?;
    assert_eq!(clamped.refunded_nanos, USD / 10, "never more than the child was given");
    let terminated = harness.identity.authenticate_agent(AuthenticateAgentRequest { token: first.token }).await.err();
    assert_eq!(terminated.map(|error| error.reason), Some("agent_terminated".to_string()));
    let stranger = EndSubAgentRequest { parent_agent_id: "plain".to_string(), ..end(&workers[1], 0) };
    assert_eq!(harness.identity.end_sub_agent(stranger).await.err().map(|error| error.reason), Some("not_parent".to_string()));
    Ok(())
}

async fn keys_are_stored_hashed_and_authenticate_until_revoked(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let mut edge_events = harness.bus.subscribe(IDENTITY_EVENTS_TOPIC, "test").await?;
    let response = register(&harness.identity, "Acme").await?;
    let key = plaintext(&response);

    let principal = harness.identity.authenticate(AuthenticateRequest { api_key: key.clone() }).await?;
    assert!(principal.permissions.contains(&"config.write".to_string()));
    assert!(!principal.permissions.iter().any(|permission| permission.starts_with("admin.")));

    // The plaintext is nowhere in the database.
    let stored: Vec<String> = sqlx::query_scalar("SELECT key_hash FROM api_keys").fetch_all(harness.database.pool()).await?;
    assert!(!stored.iter().any(|hash| hash.contains(&key) || key.contains(hash.as_str())));

    let created = harness
        .identity
        .create_api_key(CreateApiKeyRequest {
            tenant_id: tenant_id(&response),
            name: "ci".to_string(),
            role: "developer".to_string(),
            budget_limit_nanos: Some(5_000_000_000),
            rate_limit_rpm: Some(60),
            allowed_models: vec!["openai/gpt-4o-mini".to_string()],
            creator_permissions: principal.permissions.clone(),
            ..CreateApiKeyRequest::default()
        })
        .await?;
    let record = created.key.clone().ok_or("no record")?;
    assert_eq!(record.budget_period.as_deref(), Some("monthly"));
    let developer = harness.identity.authenticate(AuthenticateRequest { api_key: created.plaintext.clone() }).await?;
    assert!(developer.permissions.contains(&"router.write".to_string()));
    assert!(!developer.permissions.contains(&"config.write".to_string()));

    let listed = harness.identity.list_api_keys(TenantRef { tenant_id: tenant_id(&response) }).await?;
    assert_eq!(listed.keys.len(), 2);

    let revoke = || RevokeApiKeyRequest { tenant_id: tenant_id(&response), key_id: record.id.clone() };
    let revoked = harness.identity.revoke_api_key(revoke()).await?;
    assert!(revoked.changed && revoked.key.as_ref().is_some_and(|key| key.revoked_at.is_some()));
    // Again: the same record, unchanged.
    let repeated = harness.identity.revoke_api_key(revoke()).await?;
    assert_eq!((repeated.changed, repeated.key), (false, revoked.key.clone()));
    let refused = harness.identity.authenticate(AuthenticateRequest { api_key: created.plaintext.clone() }).await;
    let refused = refused.err().ok_or("revoked key authenticated")?;
    assert_eq!((refused.kind, refused.reason.as_str()), (ErrorKind::Unauthenticated, "revoked_api_key"));

    let delivery = tokio::time::timeout(std::time::Duration::from_secs(2), edge_events.next()).await??;
    let event = delivery.message().decode::<IdentityEvent>()?;
    delivery.ack();
    assert!(matches!(event.kind, Some(identity_event::Kind::ApiKeyRevoked(ref revoked)) if revoked.key_id == record.id));

    let again =
        harness.identity.revoke_api_key(RevokeApiKeyRequest { tenant_id: tenant_id(&response), key_id: "missing".to_string() }).await;
    assert_eq!(again.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    Ok(())
}

async fn expired_keys_and_malformed_keys_are_refused(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let response = register(&harness.identity, "Acme").await?;
    let admin = harness.identity.authenticate(AuthenticateRequest { api_key: plaintext(&response) }).await?;
    let past = harness
        .identity
        .create_api_key(CreateApiKeyRequest {
            tenant_id: tenant_id(&response),
            expires_at: Some("2020-01-01T00:00:00Z".to_string()),
            creator_permissions: admin.permissions.clone(),
            ..CreateApiKeyRequest::default()
        })
        .await;
    assert_eq!(past.err().map(|error| error.reason), Some("invalid_expires_at".to_string()));

    // Expire a key by moving its expiry into the past behind the service's back.
    let created = harness
        .identity
        .create_api_key(CreateApiKeyRequest {
            tenant_id: tenant_id(&response),
            expires_at: Some("2999-01-01T00:00:00Z".to_string()),
            creator_permissions: admin.permissions.clone(),
            ..CreateApiKeyRequest::default()
        })
        .await?;
    let key_id = created.key.as_ref().map(|key| key.id.clone()).unwrap_or_default();
    sqlx::query("UPDATE api_keys SET expires_at = $1 WHERE id = $2")
        .bind("2020-01-01T00:00:00.000Z")
        .bind(&key_id)
        .execute(harness.database.pool())
        .await?;
    let expired = harness.identity.authenticate(AuthenticateRequest { api_key: created.plaintext }).await.err();
    assert_eq!(expired.map(|error| error.reason), Some("expired_api_key".to_string()));

    for (candidate, reason) in [
        ("sk-not-ours", "malformed_api_key"),
        ("br_live_", "malformed_api_key"),
        ("br_live_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "invalid_api_key"),
    ] {
        let error = harness.identity.authenticate(AuthenticateRequest { api_key: candidate.to_string() }).await.err();
        assert_eq!(error.map(|error| error.reason), Some(reason.to_string()), "{candidate}");
    }
    Ok(())
}

async fn keys_cannot_grant_more_than_their_creator(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let response = register(&harness.identity, "Acme").await?;
    let admin = harness.identity.authenticate(AuthenticateRequest { api_key: plaintext(&response) }).await?;
    let operator = harness
        .identity
        .create_api_key(CreateApiKeyRequest {
            tenant_id: tenant_id(&response),
            role: "operator".to_string(),
            creator_permissions: admin.permissions.clone(),
            ..CreateApiKeyRequest::default()
        })
        .await?;
    let operator = harness.identity.authenticate(AuthenticateRequest { api_key: operator.plaintext }).await?;
    let escalation = harness
        .identity
        .create_api_key(CreateApiKeyRequest {
            tenant_id: tenant_id(&response),
            role: "admin".to_string(),
            creator_permissions: operator.permissions.clone(),
            ..CreateApiKeyRequest::default()
        })
        .await
        .err()
        .ok_or("operator minted an admin key")?;
    assert_eq!((escalation.kind, escalation.reason.as_str()), (ErrorKind::PermissionDenied, "privilege_escalation"));
    for (role, scopes, reason) in [("root", vec![], "invalid_role"), ("developer", vec!["platform.admin".to_string()], "invalid_scope")] {
        let error = harness
            .identity
            .create_api_key(CreateApiKeyRequest {
                tenant_id: tenant_id(&response),
                role: role.to_string(),
                scopes,
                creator_permissions: admin.permissions.clone(),
                ..CreateApiKeyRequest::default()
            })
            .await
            .err();
        assert_eq!(error.map(|error| error.reason), Some(reason.to_string()));
    }
    Ok(())
}

async fn invitations_create_users_and_write_mail(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let response = register(&harness.identity, "Acme").await?;
    let tenant = tenant_id(&response);
    let invitation = harness
        .identity
        .invite_user(InviteUserRequest {
            tenant_id: tenant.clone(),
            email: "Ada@Example.com".to_string(),
            role: "admin".to_string(),
            invited_by: "k".to_string(),
        })
        .await?;
    assert_eq!(invitation.email, "ada@example.com");
    assert!(invitation.claim_url.starts_with("https://dash.example/claim?token=brct_"));
    let duplicate = harness
        .identity
        .invite_user(InviteUserRequest { tenant_id: tenant.clone(), email: "ada@example.com".to_string(), ..InviteUserRequest::default() })
        .await;
    assert_eq!(duplicate.err().map(|error| error.kind), Some(ErrorKind::Conflict));
    let bad_role = harness
        .identity
        .invite_user(InviteUserRequest {
            tenant_id: tenant.clone(),
            email: "bob@example.com".to_string(),
            role: "root".to_string(),
            ..InviteUserRequest::default()
        })
        .await;
    assert_eq!(bad_role.err().map(|error| error.kind), Some(ErrorKind::InvalidArgument));

    let mut mails = std::fs::read_dir(&harness.outbox)?.filter_map(Result::ok).map(|entry| entry.path()).collect::<Vec<_>>();
    mails.retain(|path| path.extension().is_some_and(|extension| extension == "json"));
    assert_eq!(mails.len(), 1);
    let mail: serde_json::Value = serde_json::from_slice(&std::fs::read(&mails[0])?)?;
    assert_eq!(mail["to"], "ada@example.com");
    assert!(mail["body"].as_str().unwrap_or_default().contains(&invitation.claim_url));

    let users = harness.identity.list_users(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!(users.users.len(), 1);
    assert_eq!((users.users[0].role.as_str(), users.users[0].status.as_str()), ("admin", "invited"));
    assert_eq!(harness.identity.get_tenant(TenantRef { tenant_id: tenant.clone() }).await?.user_count, 1);
    let deleted =
        harness.identity.delete_user(DeleteUserRequest { tenant_id: tenant.clone(), user_id: invitation.user_id.clone() }).await?;
    assert_eq!(deleted.email, "ada@example.com");
    let again = harness.identity.delete_user(DeleteUserRequest { tenant_id: tenant, user_id: invitation.user_id }).await;
    assert_eq!(again.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    Ok(())
}

async fn tenants_are_isolated(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let first = register(&harness.identity, "First").await?;
    let second = register(&harness.identity, "Second").await?;
    let invitation = harness
        .identity
        .invite_user(InviteUserRequest { tenant_id: tenant_id(&first), email: "a@b.co".to_string(), ..InviteUserRequest::default() })
        .await?;
    let foreign_delete =
        harness.identity.delete_user(DeleteUserRequest { tenant_id: tenant_id(&second), user_id: invitation.user_id }).await;
    assert_eq!(foreign_delete.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    let first_key_id = first.api_key.as_ref().and_then(|key| key.key.as_ref()).map(|key| key.id.clone()).unwrap_or_default();
    let foreign_revoke = harness.identity.revoke_api_key(RevokeApiKeyRequest { tenant_id: tenant_id(&second), key_id: first_key_id }).await;
    assert_eq!(foreign_revoke.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    assert_eq!(harness.identity.list_api_keys(TenantRef { tenant_id: tenant_id(&second) }).await?.keys.len(), 1);
    assert!(harness.identity.authenticate(AuthenticateRequest { api_key: plaintext(&first) }).await.is_ok());
    Ok(())
}

async fn administration_of_tenants_and_invite_codes(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let first = register(&harness.identity, "First").await?;
    register(&harness.identity, "Second").await?;
    let reject =
        || harness.identity.set_tenant_status(SetTenantStatusRequest { tenant_id: tenant_id(&first), status: "rejected".to_string() });
    let (one, other) = tokio::join!(reject(), reject());
    let (one, other) = (one?, other?);
    assert_eq!(
        [one.changed, other.changed].iter().filter(|changed| **changed).count(),
        1,
        "of two concurrent rejections exactly one moves the tenant"
    );
    let rejected = if one.changed { one } else { other };
    assert_eq!(rejected.previous_status, "active");
    assert_eq!(rejected.tenant.as_ref().map(|tenant| tenant.status.as_str()), Some("rejected"));
    let again = reject().await?;
    assert!(!again.changed);
    assert_eq!(again.previous_status, "rejected");
    let missing = harness
        .identity
        .set_tenant_status(SetTenantStatusRequest { tenant_id: "no-such-tenant".to_string(), status: "active".to_string() })
        .await;
    assert_eq!(missing.err().map(|error| error.reason), Some("tenant_not_found".to_string()));
    let refused = harness.identity.authenticate(AuthenticateRequest { api_key: plaintext(&first) }).await.err();
    assert_eq!(refused.map(|error| error.reason), Some("tenant_rejected".to_string()));
    let only_rejected = harness.identity.list_tenants(ListTenantsRequest { status: Some("rejected".to_string()) }).await?;
    assert_eq!(only_rejected.tenants.len(), 1);
    assert_eq!(harness.identity.list_tenants(ListTenantsRequest { status: None }).await?.tenants.len(), 2);
    let bad_filter = harness.identity.list_tenants(ListTenantsRequest { status: Some("zombie".to_string()) }).await;
    assert_eq!(bad_filter.err().map(|error| error.kind), Some(ErrorKind::InvalidArgument));

    let code = harness
        .identity
        .create_invite_code(CreateInviteCodeRequest { code: "LAUNCH".to_string(), max_uses: Some(2), expires_at: None })
        .await?;
    let duplicate = harness
        .identity
        .create_invite_code(CreateInviteCodeRequest { code: "LAUNCH".to_string(), ..CreateInviteCodeRequest::default() })
        .await;
    assert_eq!(duplicate.err().map(|error| error.kind), Some(ErrorKind::Conflict));
    let not_utc = harness
        .identity
        .create_invite_code(CreateInviteCodeRequest {
            code: "X".to_string(),
            expires_at: Some("2030-01-01T00:00:00+02:00".to_string()),
            ..CreateInviteCodeRequest::default()
        })
        .await;
    assert_eq!(not_utc.err().map(|error| error.reason), Some("invalid_expires_at".to_string()));
    let digest = harness.identity.digest(DigestRequest {}).await?;
    assert_eq!(digest.tenants_total, 2);
    assert_eq!(digest.tenants_by_status.get("rejected"), Some(&1));
    assert_eq!(digest.tenants_by_plan.get("sandbox"), Some(&2));
    assert_eq!(digest.registrations_last_24h, 2);
    assert_eq!(digest.invite_codes_active, 1);
    assert!(harness.identity.delete_invite_code(DeleteInviteCodeRequest { id: code.id.clone() }).await?.deleted);
    let gone = harness.identity.delete_invite_code(DeleteInviteCodeRequest { id: code.id }).await;
    assert_eq!(gone.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    Ok(())
}

async fn invite_only_registration_consumes_codes(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Invite);
    let without = register(&harness.identity, "Acme").await;
    assert_eq!(without.err().map(|error| error.reason), Some("invite_code_required".to_string()));
    harness.identity.create_invite_code(CreateInviteCodeRequest { code: "ONCE".to_string(), max_uses: Some(1), expires_at: None }).await?;
    let with_code = |name: &'static str| {
        harness.identity.register(RegisterRequest { tenant_name: name.to_string(), invite_code: Some("ONCE".to_string()), tenant_id: None })
    };
    assert!(with_code("First").await.is_ok());
    assert_eq!(with_code("Second").await.err().map(|error| error.reason), Some("invalid_invite_code".to_string()));
    let codes = harness.identity.list_invite_codes(ListInviteCodesRequest {}).await?;
    assert_eq!(codes.invite_codes[0].uses, 1);
    // A refused registration leaves nothing behind.
    assert_eq!(harness.identity.list_tenants(ListTenantsRequest::default()).await?.tenants.len(), 1);
    Ok(())
}

async fn approval_mode_holds_tenants_until_approved(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Approval);
    let response = register(&harness.identity, "Acme").await?;
    assert_eq!(response.tenant.as_ref().map(|tenant| tenant.status.as_str()), Some("pending"));
    let pending = harness.identity.authenticate(AuthenticateRequest { api_key: plaintext(&response) }).await.err();
    assert_eq!(pending.map(|error| error.reason), Some("tenant_pending_approval".to_string()));
    harness.identity.set_tenant_status(SetTenantStatusRequest { tenant_id: tenant_id(&response), status: "active".to_string() }).await?;
    assert!(harness.identity.authenticate(AuthenticateRequest { api_key: plaintext(&response) }).await.is_ok());
    Ok(())
}

fn provision_request(subject: &str, tenant_name: &str, invite_code: Option<&str>) -> ProvisionTenantRequest {
    ProvisionTenantRequest {
        identity: Some(IdpSubject {
            issuer: "https://idp.example".into(),
            subject: subject.into(),
            email: format!("{subject}@example.com"),
        }),
        tenant_name: tenant_name.into(),
        invite_code: invite_code.map(str::to_string),
    }
}

async fn an_identity_provisions_one_tenant_of_its_own(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    // Eight concurrent first provisions of one identity make one tenant; one of them shows the key.
    let calls = (0..8).map(|_| harness.identity.provision_tenant(provision_request("ada", "Ada's lab", None)));
    let answers = futures::future::join_all(calls).await.into_iter().collect::<Result<Vec<_>, _>>()?;
    let made: Vec<&ProvisionedTenant> = answers.iter().filter(|answer| answer.created).collect();
    assert_eq!(made.len(), 1);
    let tenant_of = |answer: &ProvisionedTenant| {
        answer.membership.as_ref().and_then(|membership| membership.tenant.as_ref()).map(|tenant| tenant.id.clone())
    };
    assert!(answers.iter().all(|answer| tenant_of(answer) == tenant_of(made[0])));
    assert!(answers.iter().filter(|answer| !answer.created).all(|answer| answer.api_key.is_none()), "the key is shown once");
    assert_eq!(harness.identity.list_tenants(ListTenantsRequest::default()).await?.tenants.len(), 1);
    let membership = made[0].membership.clone().unwrap_or_default();
    assert_eq!(
        (membership.role.as_str(), membership.claim_role.as_str(), membership.email.as_str()),
        ("admin", "owner", "ada@example.com")
    );
    let tenant = membership.tenant.unwrap_or_default();
    assert_eq!(
        (tenant.name.as_str(), tenant.plan.as_str(), tenant.status.as_str(), tenant.user_count),
        ("Ada's lab", "sandbox", "active", 1)
    );
    // The key authenticates as the tenant's admin; the identity's memberships list the tenant.
    let key = made[0].api_key.clone().unwrap_or_default().plaintext;
    let principal = harness.identity.authenticate(AuthenticateRequest { api_key: key }).await?;
    assert_eq!(
        (principal.tenant.map(|tenant| tenant.id), principal.key.map(|key| key.role)),
        (Some(tenant.id.clone()), Some("admin".to_string()))
    );
    let subject = provision_request("ada", "", None).identity.unwrap_or_default();
    let listed = harness.identity.list_idp_memberships(subject).await?;
    assert_eq!(listed.memberships.len(), 1);
    // Another identity gets its own, named by its email when no name is given; bad input is refused.
    let bob = harness.identity.provision_tenant(provision_request("bob", "  ", None)).await?;
    assert_eq!(bob.membership.and_then(|membership| membership.tenant).map(|tenant| tenant.name), Some("bob@example.com".to_string()));
    let nameless = ProvisionTenantRequest { identity: None, ..provision_request("x", "", None) };
    assert_eq!(harness.identity.provision_tenant(nameless).await.err().map(|error| error.reason), Some("invalid_identity".to_string()));
    let control = harness.identity.provision_tenant(provision_request("carol", "bad\u{7}name", None)).await;
    assert_eq!(control.err().map(|error| error.reason), Some("invalid_name".to_string()));
    Ok(())
}

async fn provisioning_follows_the_registration_mode(database: Database) -> TestResult {
    let invite = harness(database.clone(), RegistrationMode::Invite);
    let refused = invite.identity.provision_tenant(provision_request("dan", "", None)).await;
    assert_eq!(refused.err().map(|error| error.reason), Some("invite_code_required".to_string()));
    invite
        .identity
        .create_invite_code(CreateInviteCodeRequest { code: "PROVISION".to_string(), max_uses: Some(1), expires_at: None })
        .await?;
    let spent = invite.identity.provision_tenant(provision_request("dan", "", Some("NOPE"))).await;
    assert_eq!(spent.err().map(|error| error.reason), Some("invalid_invite_code".to_string()));
    // The refused call wrote nothing: the identity can still provision, with a good code.
    let made = invite.identity.provision_tenant(provision_request("dan", "", Some("PROVISION"))).await?;
    assert!(made.created);
    let approval = harness(database, RegistrationMode::Approval);
    let pending = approval.identity.provision_tenant(provision_request("erin", "", None)).await?;
    assert_eq!(pending.membership.and_then(|membership| membership.tenant).map(|tenant| tenant.status), Some("pending".to_string()));
    Ok(())
}

/// The next identity event, which must arrive within two seconds.
async fn next_identity_event(subscription: &mut Box<dyn Subscription>) -> Result<IdentityEvent, Box<dyn std::error::Error>> {
    let delivery = tokio::time::timeout(std::time::Duration::from_secs(2), subscription.next()).await??;
    let event = delivery.message().decode::<IdentityEvent>()?;
    delivery.ack();
    Ok(Arc::unwrap_or_clone(event))
}

/// Fails if an identity event arrives within a short while.
async fn assert_no_identity_event(subscription: &mut Box<dyn Subscription>) -> TestResult {
    let arrived = tokio::time::timeout(std::time::Duration::from_millis(200), subscription.next()).await;
    assert!(arrived.is_err(), "unexpected identity event");
    Ok(())
}

fn assert_tenant_changed(event: &IdentityEvent, tenant_id: &str) {
    assert_eq!(event.tenant_id, tenant_id);
    assert!(matches!(event.kind, Some(identity_event::Kind::TenantChanged(ref changed)) if changed.status == "active"), "{event:?}");
}

/// Takes the only mail in the outbox (removing it, so the next call sees the next mail) and returns its
/// recipient and the 6-digit code in its body.
fn take_code_mail(outbox: &std::path::Path) -> Result<(String, String), Box<dyn std::error::Error>> {
    let mut mails = std::fs::read_dir(outbox)?.filter_map(Result::ok).map(|entry| entry.path()).collect::<Vec<_>>();
    mails.retain(|path| path.extension().is_some_and(|extension| extension == "json"));
    assert_eq!(mails.len(), 1, "{mails:?}");
    let mail: serde_json::Value = serde_json::from_slice(&std::fs::read(&mails[0])?)?;
    std::fs::remove_file(&mails[0])?;
    let subject = mail["subject"].as_str().unwrap_or_default();
    let body = mail["body"].as_str().unwrap_or_default();
    let code = body
        .split(|character: char| !character.is_ascii_digit())
        .find(|run| run.len() == 6)
        .ok_or_else(|| format!("no 6-digit code in the mail body: {body}"))?
        .to_string();
    assert!(!subject.contains(&code), "the code is in the subject, which the outbox logs");
    Ok((mail["to"].as_str().unwrap_or_default().to_string(), code))
}

/// A 6-digit code that is not `code`.
fn wrong_code(code: &str) -> Result<String, Box<dyn std::error::Error>> {
    Ok(format!("{:06}", (code.parse::<u32>()? + 1) % 1_000_000))
}

async fn start_verification(harness: &Harness, tenant: &str, email: &str) -> Result<String, Box<dyn std::error::Error>> {
    let started = harness
        .identity
        .start_email_verification(StartEmailVerificationRequest { tenant_id: tenant.to_string(), email: email.to_string() })
        .await?;
    assert_eq!(started.expires_in_seconds, 600);
    let (to, code) = take_code_mail(&harness.outbox)?;
    assert_eq!(to, email.trim().to_lowercase());
    Ok(code)
}

async fn confirm(harness: &Harness, tenant: &str, code: &str) -> Result<Tenant, ServiceError> {
    harness
        .identity
        .confirm_email_verification(ConfirmEmailVerificationRequest { tenant_id: tenant.to_string(), code: code.to_string() })
        .await
}

fn reason_of(result: Result<Tenant, ServiceError>) -> Option<(ErrorKind, String)> {
    result.err().map(|error| (error.kind, error.reason))
}

fn invalid(reason: &str) -> Option<(ErrorKind, String)> {
    Some((ErrorKind::InvalidArgument, reason.to_string()))
}

async fn plan_changes_record_graduation_and_publish_tenant_changed(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let mut edge_events = harness.bus.subscribe(IDENTITY_EVENTS_TOPIC, "test").await?;
    let response = register(&harness.identity, "Acme").await?;
    let tenant = tenant_id(&response);
    let registered = response.tenant.clone().ok_or("no tenant")?;
    assert_eq!((registered.graduated_at.as_deref(), registered.email_verified_at.as_deref()), (None, None));

    let set_plan =
        |plan: &str| harness.identity.set_tenant_plan(SetTenantPlanRequest { tenant_id: tenant.clone(), plan: plan.to_string() });
    let standard = set_plan("standard").await?;
    assert_eq!((standard.plan.as_str(), standard.tier.as_str()), ("standard", "standard"));
    let graduated_at = standard.graduated_at.clone().ok_or("no graduated_at")?;
    assert!(graduated_at >= registered.created_at && standard.updated_at == graduated_at);
    assert_eq!(standard.email_verified_at, None);
    assert_tenant_changed(&next_identity_event(&mut edge_events).await?, &tenant);
    // The edge re-authenticates after the event and sees the new plan on the principal's tenant.
    let principal = harness.identity.authenticate(AuthenticateRequest { api_key: plaintext(&response) }).await?;
    assert_eq!(
        principal.tenant.as_ref().map(|tenant| (tenant.plan.as_str(), tenant.graduated_at.as_deref())),
        Some(("standard", Some(graduated_at.as_str())))
    );

    // Setting the plan a tenant is on changes nothing: graduation keeps its instant, no event.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let again = set_plan("standard").await?;
    assert_eq!((again.graduated_at.as_deref(), again.updated_at.as_str()), (Some(graduated_at.as_str()), standard.updated_at.as_str()));
    assert_no_identity_event(&mut edge_events).await?;
    let digest = harness.identity.digest(DigestRequest {}).await?;
    assert_eq!(digest.tenants_by_plan.get("standard"), Some(&1));

    let sandbox = set_plan("sandbox").await?;
    assert_eq!((sandbox.plan.as_str(), sandbox.tier.as_str(), sandbox.graduated_at.as_deref()), ("sandbox", "community", None));
    assert_tenant_changed(&next_identity_event(&mut edge_events).await?, &tenant);

    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let regraduated = set_plan("standard").await?;
    assert!(regraduated.graduated_at.as_deref().is_some_and(|instant| instant > graduated_at.as_str()), "{regraduated:?}");
    assert_tenant_changed(&next_identity_event(&mut edge_events).await?, &tenant);
    assert_eq!(harness.identity.get_tenant(TenantRef { tenant_id: tenant.clone() }).await?, regraduated);
    Ok(())
}

async fn invalid_plans_emails_and_tenants_are_refused(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let mut edge_events = harness.bus.subscribe(IDENTITY_EVENTS_TOPIC, "test").await?;
    let tenant = tenant_id(&register(&harness.identity, "Acme").await?);
    for plan in ["premium", "", "Standard", " standard", "community"] {
        let refused = harness.identity.set_tenant_plan(SetTenantPlanRequest { tenant_id: tenant.clone(), plan: plan.to_string() }).await;
        assert_eq!(reason_of(refused), invalid("invalid_plan"), "{plan:?}");
    }
    assert_eq!(harness.identity.get_tenant(TenantRef { tenant_id: tenant.clone() }).await?.plan, "sandbox");
    let unknown =
        harness.identity.set_tenant_plan(SetTenantPlanRequest { tenant_id: "missing".to_string(), plan: "standard".to_string() }).await;
    assert_eq!(reason_of(unknown), Some((ErrorKind::NotFound, "tenant_not_found".to_string())));
    assert_no_identity_event(&mut edge_events).await?;

    for email in ["", "ada", "ada@example", "a da@example.com"] {
        let refused = harness
            .identity
            .start_email_verification(StartEmailVerificationRequest { tenant_id: tenant.clone(), email: email.to_string() })
            .await;
        assert_eq!(refused.err().map(|error| (error.kind, error.reason)), invalid("invalid_email"), "{email:?}");
    }
    let unknown = harness
        .identity
        .start_email_verification(StartEmailVerificationRequest { tenant_id: "missing".to_string(), email: "ada@example.com".to_string() })
        .await;
    assert_eq!(unknown.err().map(|error| (error.kind, error.reason)), Some((ErrorKind::NotFound, "tenant_not_found".to_string())));
    assert!(!harness.outbox.exists() || std::fs::read_dir(&harness.outbox)?.next().is_none(), "a refused start wrote mail");

    assert_eq!(reason_of(confirm(&harness, &tenant, "123456").await), invalid("no_pending_verification"));
    assert_eq!(reason_of(confirm(&harness, "missing", "123456").await), Some((ErrorKind::NotFound, "tenant_not_found".to_string())));
    for empty in ["", "   "] {
        assert_eq!(reason_of(confirm(&harness, &tenant, empty).await), invalid("missing_field"));
    }
    Ok(())
}

async fn email_verification_graduates_the_tenant_once(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let mut edge_events = harness.bus.subscribe(IDENTITY_EVENTS_TOPIC, "test").await?;
    let response = register(&harness.identity, "Acme").await?;
    let tenant = tenant_id(&response);
    let started = harness
        .identity
        .start_email_verification(StartEmailVerificationRequest { tenant_id: tenant.clone(), email: " Ada@Example.com ".to_string() })
        .await?;
    assert_eq!(started.expires_in_seconds, 600);
    assert!(started.message.contains("ada@example.com"), "{}", started.message);
    let (to, code) = take_code_mail(&harness.outbox)?;
    assert_eq!(to, "ada@example.com");

    // Stored with an expiry exactly 600 seconds after its creation; nothing changed on the tenant yet.
    let (created_at, expires_at, attempts): (String, String, i64) =
        sqlx::query_as("SELECT created_at, expires_at, attempts FROM email_verifications WHERE tenant_id = $1")
            .bind(&tenant)
            .fetch_one(harness.database.pool())
            .await?;
    let lifetime = chrono::DateTime::parse_from_rfc3339(&expires_at)? - chrono::DateTime::parse_from_rfc3339(&created_at)?;
    assert_eq!((lifetime, attempts), (chrono::Duration::seconds(600), 0));
    assert_no_identity_event(&mut edge_events).await?;
    assert_eq!(harness.identity.get_tenant(TenantRef { tenant_id: tenant.clone() }).await?.plan, "sandbox");

    let graduated = confirm(&harness, &tenant, &format!(" {code} ")).await?;
    assert_eq!((graduated.plan.as_str(), graduated.tier.as_str()), ("standard", "standard"));
    let verified_at = graduated.email_verified_at.clone().ok_or("no email_verified_at")?;
    assert_eq!(graduated.graduated_at.as_deref(), Some(verified_at.as_str()));
    assert!(verified_at >= created_at && verified_at < expires_at);
    let verified_email: Option<String> =
        sqlx::query_scalar("SELECT verified_email FROM tenants WHERE id = $1").bind(&tenant).fetch_one(harness.database.pool()).await?;
    assert_eq!(verified_email.as_deref(), Some("ada@example.com"));
    assert_tenant_changed(&next_identity_event(&mut edge_events).await?, &tenant);
    let principal = harness.identity.authenticate(AuthenticateRequest { api_key: plaintext(&response) }).await?;
    assert_eq!(
        principal.tenant.map(|tenant| (tenant.plan, tenant.email_verified_at)),
        Some(("standard".to_string(), Some(verified_at.clone())))
    );

    // Consumed: the same code never works twice, and nothing changes when it is tried.
    assert_eq!(reason_of(confirm(&harness, &tenant, &code).await), invalid("no_pending_verification"));
    let pending: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM email_verifications").fetch_one(harness.database.pool()).await?;
    assert_eq!(pending, 0);
    assert_no_identity_event(&mut edge_events).await?;

    // A tenant already on `standard` may verify another address: graduation keeps its instant.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let code = start_verification(&harness, &tenant, "billing@example.com").await?;
    let reverified = confirm(&harness, &tenant, &code).await?;
    assert!(reverified.email_verified_at.as_deref().is_some_and(|instant| instant > verified_at.as_str()));
    assert_eq!(reverified.graduated_at.as_deref(), Some(verified_at.as_str()));
    assert_tenant_changed(&next_identity_event(&mut edge_events).await?, &tenant);
    Ok(())
}

async fn wrong_codes_count_and_the_fifth_invalidates_the_code(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let tenant = tenant_id(&register(&harness.identity, "Acme").await?);
    let code = start_verification(&harness, &tenant, "ada@example.com").await?;
    let wrong = wrong_code(&code)?;
    for (attempt, guess) in [wrong.as_str(), "12345", "abcdef", &wrong].into_iter().enumerate() {
        let refused = confirm(&harness, &tenant, guess).await.err().ok_or("a wrong code was accepted")?;
        assert_eq!((refused.kind, refused.reason.as_str()), (ErrorKind::InvalidArgument, "invalid_code"), "{guess}");
        assert!(refused.message.contains(&format!("({} attempt", 4 - attempt)), "{}", refused.message);
    }
    assert_eq!(reason_of(confirm(&harness, &tenant, &wrong).await), invalid("too_many_attempts"));
    // Invalidated: the right code no longer works, and the tenant stayed on the sandbox.
    assert_eq!(reason_of(confirm(&harness, &tenant, &code).await), invalid("too_many_attempts"));
    let attempts: i64 = sqlx::query_scalar("SELECT attempts FROM email_verifications WHERE tenant_id = $1")
        .bind(&tenant)
        .fetch_one(harness.database.pool())
        .await?;
    assert_eq!(attempts, 5);
    let unchanged = harness.identity.get_tenant(TenantRef { tenant_id: tenant.clone() }).await?;
    assert_eq!((unchanged.plan.as_str(), unchanged.email_verified_at.as_deref()), ("sandbox", None));

    // Starting again issues a fresh code with a fresh attempt count.
    let fresh = start_verification(&harness, &tenant, "ada@example.com").await?;
    assert_eq!(reason_of(confirm(&harness, &tenant, &wrong_code(&fresh)?).await), invalid("invalid_code"));
    assert_eq!(confirm(&harness, &tenant, &fresh).await?.plan, "standard");
    Ok(())
}

async fn expired_codes_are_refused(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let tenant = tenant_id(&register(&harness.identity, "Acme").await?);
    let code = start_verification(&harness, &tenant, "ada@example.com").await?;
    // Expire the code behind the service's back.
    sqlx::query("UPDATE email_verifications SET expires_at = $1 WHERE tenant_id = $2")
        .bind("2020-01-01T00:00:00.000Z")
        .bind(&tenant)
        .execute(harness.database.pool())
        .await?;
    assert_eq!(reason_of(confirm(&harness, &tenant, &code).await), invalid("code_expired"));
    assert_eq!(reason_of(confirm(&harness, &tenant, &wrong_code(&code)?).await), invalid("code_expired"));
    // Refusals of an expired code count no attempts and change nothing.
    let attempts: i64 = sqlx::query_scalar("SELECT attempts FROM email_verifications WHERE tenant_id = $1")
        .bind(&tenant)
        .fetch_one(harness.database.pool())
        .await?;
    assert_eq!(attempts, 0);
    assert_eq!(harness.identity.get_tenant(TenantRef { tenant_id: tenant.clone() }).await?.plan, "sandbox");

    let fresh = start_verification(&harness, &tenant, "ada@example.com").await?;
    assert_eq!(confirm(&harness, &tenant, &fresh).await?.plan, "standard");
    Ok(())
}

async fn starting_again_replaces_the_pending_code(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let first_tenant = tenant_id(&register(&harness.identity, "First").await?);
    let second_tenant = tenant_id(&register(&harness.identity, "Second").await?);
    let mut first = start_verification(&harness, &first_tenant, "ada@example.com").await?;
    // Draw again until the codes differ (equal with probability one in a million).
    let mut second = start_verification(&harness, &first_tenant, "ada@example.com").await?;
    while second == first {
        first = second;
        second = start_verification(&harness, &first_tenant, "ada@example.com").await?;
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM email_verifications WHERE tenant_id = $1")
        .bind(&first_tenant)
        .fetch_one(harness.database.pool())
        .await?;
    assert_eq!(rows, 1);
    assert_eq!(reason_of(confirm(&harness, &first_tenant, &first).await), invalid("invalid_code"));

    // A code is bound to its tenant: another tenant's pending verification does not accept it.
    let mut other = start_verification(&harness, &second_tenant, "bob@example.com").await?;
    while other == second {
        other = start_verification(&harness, &second_tenant, "bob@example.com").await?;
    }
    assert_eq!(reason_of(confirm(&harness, &second_tenant, &second).await), invalid("invalid_code"));
    assert_eq!(confirm(&harness, &first_tenant, &second).await?.plan, "standard");
    assert_eq!(harness.identity.get_tenant(TenantRef { tenant_id: second_tenant.clone() }).await?.plan, "sandbox");
    assert_eq!(confirm(&harness, &second_tenant, &other).await?.plan, "standard");
    Ok(())
}

async fn concurrent_guesses_never_exceed_the_attempt_limit(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let tenant = tenant_id(&register(&harness.identity, "Acme").await?);
    let code = start_verification(&harness, &tenant, "ada@example.com").await?;
    let wrong = wrong_code(&code)?;
    let mut guesses = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let identity = harness.identity.clone();
        let request = ConfirmEmailVerificationRequest { tenant_id: tenant.clone(), code: wrong.clone() };
        guesses.spawn(async move { identity.confirm_email_verification(request).await });
    }
    let mut reasons = std::collections::BTreeMap::<String, usize>::new();
    while let Some(outcome) = guesses.join_next().await {
        let error = outcome?.err().ok_or("a wrong code was accepted")?;
        *reasons.entry(error.reason).or_default() += 1;
    }
    // Four wrong attempts are told how many remain; the fifth and every later one are refused outright.
    assert_eq!(reasons, [("invalid_code".to_string(), 4), ("too_many_attempts".to_string(), 8)].into_iter().collect());
    assert_eq!(reason_of(confirm(&harness, &tenant, &code).await), invalid("too_many_attempts"));
    Ok(())
}

/// Every text cell of a table (cells of other types are skipped).
async fn text_cells(database: &Database, table: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let rows = sqlx::query(&format!("SELECT * FROM {table}")).fetch_all(database.pool()).await?;
    Ok(rows
        .iter()
        .flat_map(|row| (0..row.columns().len()).filter_map(|index| row.try_get::<Option<String>, _>(index).ok().flatten()))
        .collect())
}

async fn the_database_never_holds_the_plaintext_code(database: Database) -> TestResult {
    let harness = harness(database, RegistrationMode::Open);
    let tenant = tenant_id(&register(&harness.identity, "Acme").await?);
    let code = start_verification(&harness, &tenant, "ada@example.com").await?;
    let tables = ["tenants", "users", "api_keys", "claim_tokens", "invite_codes", "email_verifications"];
    let mut scanned = 0;
    for table in tables {
        for cell in text_cells(&harness.database, table).await? {
            assert!(!cell.contains(&code), "{table} holds the code: {cell}");
            scanned += 1;
        }
    }
    assert!(scanned > 10, "only {scanned} text cells were read");

    // What is stored is a SHA-256 digest, and not the bare digest of the code: it is bound to the tenant.
    let code_hash: String = sqlx::query_scalar("SELECT code_hash FROM email_verifications WHERE tenant_id = $1")
        .bind(&tenant)
        .fetch_one(harness.database.pool())
        .await?;
    assert!(code_hash.len() == 64 && code_hash.bytes().all(|byte| byte.is_ascii_hexdigit()), "{code_hash}");
    assert_ne!(code_hash, hex::encode(sha2::Sha256::digest(code.as_bytes())));

    confirm(&harness, &tenant, &code).await?;
    for table in tables {
        assert!(!text_cells(&harness.database, table).await?.iter().any(|cell| cell.contains(&code)), "{table} holds the code");
    }
    Ok(())
}

#[tokio::test]
async fn store_helpers_reach_both_engines() -> TestResult {
    testing::fresh_sqlite().await?.ensure_migrated().await?;
    testing::fresh_postgres().await?.ensure_migrated().await?;
    Ok(())
}
