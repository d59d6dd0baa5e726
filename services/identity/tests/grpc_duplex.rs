//! The identity contract over real tonic gRPC, on an in-memory duplex transport (no ports opened).

use std::sync::Arc;

use brainstorm_common::bus::InProcessBus;
use brainstorm_common::config::RegistrationMode;
use brainstorm_common::outbox::MailOutbox;
use brainstorm_common::store::testing;
use brainstorm_identity::{IdentityOptions, IdentityServiceImpl};
use brainstorm_proto::ErrorKind;
use brainstorm_proto::identity::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn remote_identity() -> Result<IdentityClient, Box<dyn std::error::Error>> {
    let database = testing::fresh_sqlite().await?;
    let outbox = MailOutbox::new(std::env::temp_dir().join(format!("brainstorm-outbox-{}", uuid::Uuid::new_v4().simple())));
    let options = IdentityOptions {
        dashboard_url: "https://dash.example".to_string(),
        registration_mode: RegistrationMode::Open,
        outbox,
        require_agent_owner: false,
        agent_tokens: None,
        agent_ca: None,
    };
    let local = IdentityClient::local(IdentityServiceImpl::new(database, Arc::new(InProcessBus::new()), options));

    Ok(local.over_grpc_duplex().await?)
}

#[tokio::test]
async fn calls_and_errors_cross_the_grpc_hop_intact() -> TestResult {
    let identity = remote_identity().await?;
    let registered =
        identity.register(RegisterRequest { tenant_name: "Over the wire".to_string(), invite_code: None, tenant_id: None }).await?;
    let plaintext = registered.api_key.as_ref().map(|key| key.plaintext.clone()).unwrap_or_default();
    let principal = identity.authenticate(AuthenticateRequest { api_key: plaintext }).await?;
    assert_eq!(principal.tenant.as_ref().map(|tenant| tenant.name.as_str()), Some("Over the wire"));
    assert!(principal.permissions.contains(&"router.write".to_string()));

    let unknown = identity
        .authenticate(AuthenticateRequest { api_key: "br_live_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".to_string() })
        .await
        .err()
        .ok_or("unknown key accepted")?;
    assert_eq!((unknown.kind, unknown.reason.as_str()), (ErrorKind::Unauthenticated, "invalid_api_key"));
    let missing = identity.get_tenant(TenantRef { tenant_id: "missing".to_string() }).await.err().ok_or("missing tenant found")?;
    assert_eq!((missing.kind, missing.reason.as_str()), (ErrorKind::NotFound, "tenant_not_found"));
    let invalid = identity
        .register(RegisterRequest { tenant_name: String::new(), invite_code: None, tenant_id: None })
        .await
        .err()
        .ok_or("empty name accepted")?;
    assert_eq!((invalid.kind, invalid.reason.as_str()), (ErrorKind::InvalidArgument, "invalid_name"));

    let tenant_id = registered.tenant.as_ref().map(|tenant| tenant.id.clone()).unwrap_or_default();
    let graduated = identity.set_tenant_plan(SetTenantPlanRequest { tenant_id: tenant_id.clone(), plan: "standard".to_string() }).await?;
    assert_eq!((graduated.plan.as_str(), graduated.tier.as_str()), ("standard", "standard"));
    assert!(graduated.graduated_at.is_some() && graduated.email_verified_at.is_none());
    let bad_plan = identity
        .set_tenant_plan(SetTenantPlanRequest { tenant_id, plan: "gold".to_string() })
        .await
        .err()
        .ok_or("unknown plan accepted")?;
    assert_eq!((bad_plan.kind, bad_plan.reason.as_str()), (ErrorKind::InvalidArgument, "invalid_plan"));
    Ok(())
}
