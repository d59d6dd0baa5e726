//! One identity test suite, run against SQLite and PostgreSQL alike.

use std::path::PathBuf;
use std::sync::Arc;

use brainstorm_common::bus::{EventBus, InProcessBus};
use brainstorm_common::config::RegistrationMode;
use brainstorm_common::outbox::MailOutbox;
use brainstorm_common::store::{Database, testing};
use brainstorm_identity::{IdentityOptions, IdentityServiceImpl};
use brainstorm_proto::events::{IDENTITY_EVENTS_TOPIC, IdentityEvent, identity_event};
use brainstorm_proto::identity::*;
use brainstorm_proto::{ErrorKind, ServiceError};
use prost::Message;

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
    let options =
        IdentityOptions { dashboard_url: "https://dash.example".to_string(), registration_mode, outbox: MailOutbox::new(&outbox) };
    let shared_bus: Arc<dyn EventBus> = Arc::new(bus.clone());
    Harness { identity: IdentityServiceImpl::new(database.clone(), shared_bus, options), bus, outbox, database }
}

async fn register(identity: &IdentityServiceImpl, name: &str) -> Result<RegisterResponse, ServiceError> {
    identity.register(RegisterRequest { tenant_name: name.to_string(), invite_code: None }).await
}

fn plaintext(response: &RegisterResponse) -> String {
    response.api_key.as_ref().map(|key| key.plaintext.clone()).unwrap_or_default()
}

fn tenant_id(response: &RegisterResponse) -> String {
    response.tenant.as_ref().map(|tenant| tenant.id.clone()).unwrap_or_default()
}

macro_rules! on_both_engines {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() -> super::TestResult {
                    super::$test(brainstorm_common::store::testing::fresh_sqlite().await?).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() -> super::TestResult {
                    super::$test(brainstorm_common::store::testing::fresh_postgres().await?).await
                }
            )*
        }
    };
}

on_both_engines!(
    registration_creates_a_sandbox_tenant_with_an_admin_key_and_claim,
    keys_are_stored_hashed_and_authenticate_until_revoked,
    expired_keys_and_malformed_keys_are_refused,
    keys_cannot_grant_more_than_their_creator,
    invitations_create_users_and_write_mail,
    tenants_are_isolated,
    administration_of_tenants_and_invite_codes,
    invite_only_registration_consumes_codes,
    approval_mode_holds_tenants_until_approved,
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

    let revoked =
        harness.identity.revoke_api_key(RevokeApiKeyRequest { tenant_id: tenant_id(&response), key_id: record.id.clone() }).await?;
    assert!(revoked.revoked_at.is_some());
    let refused = harness.identity.authenticate(AuthenticateRequest { api_key: created.plaintext.clone() }).await;
    let refused = refused.err().ok_or("revoked key authenticated")?;
    assert_eq!((refused.kind, refused.reason.as_str()), (ErrorKind::Unauthenticated, "revoked_api_key"));

    let delivery = tokio::time::timeout(std::time::Duration::from_secs(2), edge_events.next()).await??;
    let event = IdentityEvent::decode(delivery.message().payload.clone())?;
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
    let rejected =
        harness.identity.set_tenant_status(SetTenantStatusRequest { tenant_id: tenant_id(&first), status: "rejected".to_string() }).await?;
    assert_eq!(rejected.status, "rejected");
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
        harness.identity.register(RegisterRequest { tenant_name: name.to_string(), invite_code: Some("ONCE".to_string()) })
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

#[tokio::test]
async fn store_helpers_reach_both_engines() -> TestResult {
    testing::fresh_sqlite().await?.ensure_migrated().await?;
    testing::fresh_postgres().await?.ensure_migrated().await?;
    Ok(())
}
