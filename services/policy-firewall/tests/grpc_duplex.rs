//! The policy-firewall contract over real tonic gRPC, on an in-memory duplex transport (no ports opened):
//! calls, optional fields, repeated messages and error kinds cross the hop intact, and the edge's
//! `Guardian` and kill-switch gate work over a remote client.

use std::sync::Arc;

use brainstorm_common::bus::{EventBus, InProcessBus};
use brainstorm_common::store::testing;
use brainstorm_policy_firewall::{
    FirewallAction, Guardian, GuardianOptions, KillSwitchDecision, PolicyFirewallOptions, PolicyFirewallServiceImpl, RequestFacts,
    ToolCall, ToolCaller, argument_fingerprint,
};
use brainstorm_proto::ErrorKind;
use brainstorm_proto::policy::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn remote_policy_firewall() -> Result<PolicyFirewallClient, Box<dyn std::error::Error>> {
    let database = testing::fresh_sqlite().await?;
    let bus: Arc<dyn EventBus> = Arc::new(InProcessBus::new());
    let local = PolicyFirewallClient::local(PolicyFirewallServiceImpl::new(database, bus, PolicyFirewallOptions::default()));

    Ok(local.over_grpc_duplex().await?)
}

#[tokio::test]
async fn calls_and_errors_cross_the_grpc_hop_intact() -> TestResult {
    let policy = remote_policy_firewall().await?;
    let tenant_id = uuid::Uuid::new_v4().to_string();
    let tenant = || TenantRef { tenant_id: tenant_id.clone() };

    let status = policy
        .activate_kill_switch(ActivateKillSwitchRequest {
            tenant_id: tenant_id.clone(),
            reason: "drill".to_string(),
            activated_by: "key-1".to_string(),
        })
        .await?;
    assert_eq!((status.active, status.reason.as_deref(), status.history.len()), (true, Some("drill"), 1));
    assert_eq!(status.history[0].deactivated_at, None, "an unset optional stays unset over the wire");
    let conflict = policy
        .activate_kill_switch(ActivateKillSwitchRequest {
            tenant_id: tenant_id.clone(),
            reason: "again".to_string(),
            activated_by: "key-1".to_string(),
        })
        .await
        .err()
        .ok_or("activated twice")?;
    assert_eq!((conflict.kind, conflict.reason.as_str()), (ErrorKind::Conflict, "already_active"));
    let scope = policy
        .activate_scope(ActivateScopeRequest {
            tenant_id: tenant_id.clone(),
            r#type: "tool".to_string(),
            id: "shell".to_string(),
            reason: None,
            activated_by: "key-1".to_string(),
        })
        .await?;
    assert_eq!((scope.r#type.as_str(), scope.id.as_str()), ("tool", "shell"));
    let snapshot = policy.get_kill_switch_snapshot(tenant()).await?;
    assert_eq!((snapshot.active, snapshot.scopes.len()), (true, 1));
    let missing = policy
        .deactivate_scope(ScopeRef { tenant_id: tenant_id.clone(), r#type: "agent".to_string(), id: "ghost".to_string() })
        .await
        .err()
        .ok_or("found a ghost")?;
    assert_eq!((missing.kind, missing.reason.as_str()), (ErrorKind::NotFound, "scope_not_found"));

    let config = policy.get_guardrail_config(tenant()).await?;
    assert_eq!((config.mode.as_str(), config.providers.len(), config.updated_at), ("block", 2, None));
    let scanned =
        policy.test_guardrails(ScanTextRequest { tenant_id: tenant_id.clone(), text: "my card: 4111 1111 1111 1111".to_string() }).await?;
    assert_eq!((scanned.safe, scanned.pii_warning.as_deref()), (false, Some("credit_card")));
    assert_eq!(scanned.providers.map(|providers| providers.failed.len()), Some(0));

    let ruleset = policy
        .put_policies(PutPoliciesRequest {
            tenant_id: tenant_id.clone(),
            rules: vec![PolicyRule {
                id: "hold-pay".to_string(),
                description: "payments wait for a human".to_string(),
                action: "require_approval".to_string(),
                conditions: vec![PolicyCondition {
                    field: "tool.name".to_string(),
                    op: "eq".to_string(),
                    value_json: "\"pay\"".to_string(),
                }],
                priority: 5,
                enabled: true,
            }],
            updated_by: "key-1".to_string(),
        })
        .await?;
    assert_eq!(ruleset.version, 1);
    let dry_run = policy
        .dry_run_policy(DryRunPolicyRequest {
            tenant_id: tenant_id.clone(),
            action: "tool.call".to_string(),
            tool_name: Some("pay".to_string()),
            ..Default::default()
        })
        .await?;
    assert_eq!((dry_run.decision.as_str(), dry_run.matched_rule.map(|rule| rule.id)), ("deny", Some("hold-pay".to_string())));

    let fingerprint = argument_fingerprint(r#"{"amount": 4}"#);
    let resolution = policy
        .resolve_approval(ResolveApprovalRequest {
            tenant_id: tenant_id.clone(),
            tool_name: "pay".to_string(),
            argument_hash: fingerprint.hash.clone(),
            argument_keys: fingerprint.keys.clone(),
            surface: "messages".to_string(),
            request_id: "req_1".to_string(),
            ..Default::default()
        })
        .await?;
    let approval = resolution.approval.ok_or("no approval")?;
    assert_eq!(
        (resolution.allowed, approval.surface.as_str(), approval.argument_keys.clone()),
        (false, "messages", vec!["amount".to_string()])
    );
    let unnoted = policy
        .approve_approval(ApproveApprovalRequest {
            tenant_id: tenant_id.clone(),
            id: approval.id.clone(),
            scope: "tool".to_string(),
            review_note: None,
            reviewed_by: "reviewer".to_string(),
        })
        .await?;
    assert_eq!((unnoted.status.as_str(), unnoted.scope.as_deref()), ("approved", Some("tool")));

    let observations = (0..12)
        .map(|index| Observation {
            entity_type: "tenant".to_string(),
            entity_id: tenant_id.clone(),
            metric: "tokens".to_string(),
            value: if index == 11 { 5000.0 } else { 100.0 + f64::from(index) },
            timestamp: String::new(),
        })
        .collect();
    let alerts = policy.record_observations(ObservationBatch { tenant_id: tenant_id.clone(), observations }).await?;
    assert_eq!((alerts.alerts.len(), alerts.node.as_str()), (1, "local"));

    let page = policy.list_interceptions(ListInterceptionsRequest { tenant_id: tenant_id.clone(), limit: 0, offset: 0 }).await?;
    assert_eq!((page.total, page.limit), (0, 50));
    Ok(())
}

#[tokio::test]
async fn the_edge_guardian_works_over_a_remote_client() -> TestResult {
    let policy = remote_policy_firewall().await?;
    let tenant_id = uuid::Uuid::new_v4().to_string();
    let guardian = Guardian::new(policy.clone(), GuardianOptions::default());
    let completions =
        RequestFacts { path: "/v1/chat/completions", method: "POST", model: Some("claude-3-haiku"), ..RequestFacts::default() };
    assert_eq!(guardian.kill_switch(&tenant_id, &completions).await, KillSwitchDecision::Allow);
    policy
        .activate_scope(ActivateScopeRequest {
            tenant_id: tenant_id.clone(),
            r#type: "provider".to_string(),
            id: "anthropic".to_string(),
            reason: Some("outage".to_string()),
            activated_by: "key-1".to_string(),
        })
        .await?;
    guardian.gate().evict(&tenant_id);
    assert!(guardian.kill_switch(&tenant_id, &completions).await.is_blocked(), "claude-* is Anthropic's");

    policy
        .put_firewall_config(FirewallConfig {
            tenant_id: tenant_id.clone(),
            mode: "monitor".to_string(),
            deny_list: vec!["drop_*".to_string()],
            ..Default::default()
        })
        .await?;
    let call = ToolCall { id: "c1".to_string(), name: "drop_table".to_string(), arguments: "{}".to_string() };
    let outcome = guardian.inspect_tool_calls(&tenant_id, std::slice::from_ref(&call), &ToolCaller::default(), None, None).await?;
    assert_eq!((outcome.action, outcome.enforced), (FirewallAction::Block, false), "monitor mode reports without enforcing");
    assert_eq!(outcome.calls[0].call, call);
    Ok(())
}
