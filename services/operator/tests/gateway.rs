//! The gateway half of the operator over real identity and policy-firewall services on a fresh
//! SQLite store: idempotent registration under the resource's uid, convergence of name, plan,
//! status and the admin key, and kill switches that are lifted only by whoever set them.

use std::sync::Arc;

use brainstorm_common::bus::{EventBus, InProcessBus};
use brainstorm_common::config::RegistrationMode;
use brainstorm_common::outbox::MailOutbox;
use brainstorm_common::store::testing;
use brainstorm_identity::{IdentityOptions, IdentityServiceImpl};
use brainstorm_operator::Gateway;
use brainstorm_operator::crd::{AppliedSwitch, Plan, Scope, TenantSpec};
use brainstorm_operator::gateway::DesiredSwitch;
use brainstorm_policy_firewall::{PolicyFirewallOptions, PolicyFirewallServiceImpl};
use brainstorm_proto::identity::{AuthenticateRequest, IdentityClient, RevokeApiKeyRequest};
use brainstorm_proto::policy::{ActivateKillSwitchRequest, PolicyFirewallClient, TenantRef};
use brainstorm_proto::{ErrorKind, ServiceError};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const UID: &str = "6f1d2c3b-4a59-4e87-9d6c-5b4a3f2e1d0c";
const ACTOR: &str = "kubernetes:team-a/acme";

async fn gateway(registration_mode: RegistrationMode) -> Result<Gateway, Box<dyn std::error::Error>> {
    let database = testing::fresh_sqlite().await?;
    let bus: Arc<dyn EventBus> = Arc::new(InProcessBus::new());
    let outbox = std::env::temp_dir().join(format!("brainstorm-operator-outbox-{}", uuid_suffix()));
    let options = IdentityOptions {
        dashboard_url: "https://dash.example".to_string(),
        registration_mode,
        outbox: MailOutbox::new(&outbox),
        require_agent_owner: false,
        agent_tokens: None,
        agent_ca: None,
    };
    let identity = IdentityClient::local(IdentityServiceImpl::new(database.clone(), bus.clone(), options));
    let policy = PolicyFirewallClient::local(PolicyFirewallServiceImpl::new(database, bus, PolicyFirewallOptions::default()));
    Ok(Gateway { identity, policy, observability: None })
}

fn uuid_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|elapsed| elapsed.as_nanos()).unwrap_or_default()
    )
}

fn spec(name: &str) -> TenantSpec {
    TenantSpec { display_name: name.to_string(), plan: None, suspended: false, secret_name: None, deletion_policy: Default::default() }
}

async fn authenticates(gateway: &Gateway, key: &str) -> Result<bool, ServiceError> {
    match gateway.identity.authenticate(AuthenticateRequest { api_key: key.to_string() }).await {
        Ok(_) => Ok(true),
        Err(error) if matches!(error.kind, ErrorKind::Unauthenticated | ErrorKind::PermissionDenied) => Ok(false),
        Err(error) => Err(error),
    }
}

#[tokio::test]
async fn a_tenant_is_registered_once_under_its_uid_and_kept_as_declared() -> TestResult {
    // Approval mode: a declared tenant is approved by its resource.
    let gateway = gateway(RegistrationMode::Approval).await?;
    let first = gateway.converge_tenant(UID, &spec(" Acme "), None, ACTOR).await?;
    assert_eq!((first.tenant.id.as_str(), first.tenant.name.as_str(), first.tenant.status.as_str()), (UID, "Acme", "active"));
    let key = first.minted.ok_or("no key minted on registration")?;
    assert!(key.plaintext.starts_with("br_live_") && !format!("{key:?}").contains(&key.plaintext), "the key never shows in Debug");
    assert!(authenticates(&gateway, &key.plaintext).await?);

    // Again with the key held: nothing minted, nothing registered twice.
    let again = gateway.converge_tenant(UID, &spec("Acme"), Some(&key.id), ACTOR).await?;
    assert!(again.minted.is_none());
    assert_eq!(again.tenant.id, UID);

    // Name, plan and suspension follow the spec; the key the Secret holds keeps working until suspended.
    let declared = TenantSpec { plan: Some(Plan::Standard), suspended: true, ..spec("Acme Robotics") };
    let changed = gateway.converge_tenant(UID, &declared, Some(&key.id), ACTOR).await?;
    assert_eq!(
        (changed.tenant.name.as_str(), changed.tenant.plan.as_str(), changed.tenant.status.as_str()),
        ("Acme Robotics", "standard", "rejected")
    );
    assert!(!authenticates(&gateway, &key.plaintext).await?);
    let resumed = gateway.converge_tenant(UID, &TenantSpec { suspended: false, ..declared }, Some(&key.id), ACTOR).await?;
    assert_eq!(resumed.tenant.status, "active");
    assert!(authenticates(&gateway, &key.plaintext).await?);

    // A key revoked by hand, or no key held at all: a new admin key is minted.
    gateway.identity.revoke_api_key(RevokeApiKeyRequest { tenant_id: UID.to_string(), key_id: key.id.clone() }).await?;
    let rekeyed = gateway.converge_tenant(UID, &spec("Acme Robotics"), Some(&key.id), ACTOR).await?;
    let fresh = rekeyed.minted.ok_or("no key minted after revocation")?;
    assert_ne!(fresh.id, key.id);
    assert!(authenticates(&gateway, &fresh.plaintext).await?);
    gateway.revoke_key(UID, &fresh.id, ACTOR).await?;
    gateway.revoke_key(UID, &fresh.id, ACTOR).await?;
    assert!(!authenticates(&gateway, &fresh.plaintext).await?);

    // A crash between minting and writing the Secret, twice: each retry names the keys nobody holds
    // (the registration key, the operator's earlier keys) for revocation once its own is stored.
    let other = "3f1d2c3b-4a59-4e87-9d6c-5b4a3f2e1d0c";
    let registered = gateway.converge_tenant(other, &spec("Crashy"), None, ACTOR).await?;
    assert!(registered.registered && registered.superseded.is_empty());
    let registration_key = registered.minted.ok_or("no key")?;
    let first_retry = gateway.converge_tenant(other, &spec("Crashy"), None, ACTOR).await?;
    assert!(!first_retry.registered);
    assert_eq!(first_retry.superseded, vec![registration_key.id.clone()]);
    let lost = first_retry.minted.ok_or("no key minted on retry")?;
    let second_retry = gateway.converge_tenant(other, &spec("Crashy"), None, ACTOR).await?;
    let mut expected = vec![registration_key.id.clone(), lost.id.clone()];
    expected.sort();
    let mut superseded = second_retry.superseded.clone();
    superseded.sort();
    assert_eq!(superseded, expected);
    // Held and live: nothing minted, nothing superseded.
    let kept = second_retry.minted.ok_or("no key")?;
    let settled = gateway.converge_tenant(other, &spec("Crashy"), Some(&kept.id), ACTOR).await?;
    assert!(settled.minted.is_none() && settled.superseded.is_empty());

    // A spec the gateway refuses is an error, not a silent skip.
    let refused = gateway.converge_tenant("1f1d2c3b-4a59-4e87-9d6c-5b4a3f2e1d0c", &spec("   "), None, ACTOR).await;
    assert_eq!(refused.err().map(|error| error.kind), Some(ErrorKind::InvalidArgument));
    gateway.suspend_tenant(UID, ACTOR).await?;
    gateway.suspend_tenant("2f1d2c3b-4a59-4e87-9d6c-5b4a3f2e1d0c", ACTOR).await?;
    assert!(gateway.tenant_exists(UID).await? && !gateway.tenant_exists("2f1d2c3b-4a59-4e87-9d6c-5b4a3f2e1d0c").await?);
    Ok(())
}

fn desired(scope: Scope, target: Option<&str>, active: bool) -> DesiredSwitch {
    DesiredSwitch {
        switch: AppliedSwitch { tenant_id: UID.to_string(), scope, target: target.map(str::to_string) },
        active,
        reason: "runaway".to_string(),
    }
}

#[tokio::test]
async fn switches_are_set_and_lifted_only_by_their_holder() -> TestResult {
    let gateway = gateway(RegistrationMode::Open).await?;
    gateway.converge_tenant(UID, &spec("Acme"), None, ACTOR).await?;
    let tenant_switch = desired(Scope::Tenant, None, true);

    let on = gateway.converge_switch(Some(&tenant_switch), None, ACTOR).await?;
    assert!(on.active);
    assert_eq!((on.activated_by.as_deref(), on.applied.as_ref()), (Some(ACTOR), Some(&tenant_switch.switch)));
    // Converging again changes nothing.
    assert_eq!(gateway.converge_switch(Some(&tenant_switch), on.applied.as_ref(), ACTOR).await?, on);

    // Switched off in the resource: lifted.
    let off = gateway.converge_switch(Some(&desired(Scope::Tenant, None, false)), on.applied.as_ref(), ACTOR).await?;
    assert!(!off.active && off.applied.is_none());
    assert!(!gateway.policy.get_kill_switch_status(TenantRef { tenant_id: UID.to_string() }).await?.active);

    // Set by somebody else: reported, never lifted, by an inactive spec or a deletion.
    let by_hand =
        ActivateKillSwitchRequest { tenant_id: UID.to_string(), reason: "on-call".to_string(), activated_by: "key_oncall".to_string() };
    gateway.policy.activate_kill_switch(by_hand).await?;
    let held = gateway.converge_switch(Some(&desired(Scope::Tenant, None, false)), Some(&tenant_switch.switch), ACTOR).await?;
    assert_eq!((held.active, held.activated_by.as_deref(), held.applied.as_ref()), (true, Some("key_oncall"), None));
    gateway.converge_switch(None, Some(&tenant_switch.switch), ACTOR).await?;
    assert!(gateway.policy.get_kill_switch_status(TenantRef { tenant_id: UID.to_string() }).await?.active);
    // Wanted on while somebody else holds it: on, and not ours.
    let shared = gateway.converge_switch(Some(&tenant_switch), None, ACTOR).await?;
    assert_eq!((shared.active, shared.applied.as_ref()), (true, None));

    // Scoped: a changed target lifts the old one and sets the new one; deletion lifts what is left.
    let crawler = desired(Scope::Agent, Some("crawler"), true);
    let first = gateway.converge_switch(Some(&crawler), None, ACTOR).await?;
    assert_eq!(first.applied.as_ref(), Some(&crawler.switch));
    let writer = desired(Scope::Agent, Some("writer"), true);
    let second = gateway.converge_switch(Some(&writer), first.applied.as_ref(), ACTOR).await?;
    assert_eq!(second.applied.as_ref(), Some(&writer.switch));
    let scopes = gateway.policy.list_scopes(TenantRef { tenant_id: UID.to_string() }).await?.scopes;
    let active: Vec<&str> = scopes.iter().filter(|scope| scope.active).map(|scope| scope.id.as_str()).collect();
    assert_eq!(active, vec!["writer"]);
    assert_eq!(gateway.converge_switch(None, second.applied.as_ref(), ACTOR).await?, Default::default());
    let scopes = gateway.policy.list_scopes(TenantRef { tenant_id: UID.to_string() }).await?.scopes;
    assert!(scopes.iter().all(|scope| !scope.active), "{scopes:?}");
    Ok(())
}
