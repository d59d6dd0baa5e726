//! The policy-firewall service contract: kill switches, guardrails, the tool firewall, security policies,
//! human approvals and anomaly detection; and the `policy.events` bus payload every edge follows.

#[allow(clippy::all, missing_docs)]
mod v1 {
    tonic::include_proto!("brainstorm.policy.v1");
}

use v1::policy_firewall_service_client::PolicyFirewallServiceClient;
use v1::policy_firewall_service_server::PolicyFirewallServiceServer;
pub use v1::*;

/// Topic of `PolicyEvent`s (kill-switch snapshots and configuration changes), keyed by tenant id.
pub const POLICY_EVENTS_TOPIC: &str = "policy.events";

crate::grpc::service_contract! {
    service PolicyFirewallService;
    client PolicyFirewallClient;
    generated_client PolicyFirewallServiceClient;
    generated_server PolicyFirewallServiceServer;
    generated_server_trait v1::policy_firewall_service_server::PolicyFirewallService;
    methods {
        /// The tenant switch, its last 50 activations and the active scoped switches.
        fn get_kill_switch_status(TenantRef) -> KillSwitchStatus;
        /// Activates the tenant switch; conflict `already_active`, invalid `reason_required`.
        fn activate_kill_switch(ActivateKillSwitchRequest) -> KillSwitchStatus;
        /// Deactivates the tenant switch; conflict `already_inactive`.
        fn deactivate_kill_switch(DeactivateKillSwitchRequest) -> KillSwitchStatus;
        /// Activates or refreshes a scoped switch (agent, tool, provider).
        fn activate_scope(ActivateScopeRequest) -> ScopedSwitch;
        /// Deactivates a scoped switch; not found `scope_not_found` when absent or already off.
        fn deactivate_scope(ScopeRef) -> ScopedSwitch;
        /// Active scoped switches.
        fn list_scopes(TenantRef) -> ScopeList;
        /// What the edge's kill-switch gate decides on.
        fn get_kill_switch_snapshot(TenantRef) -> KillSwitchSnapshot;
        /// The guardrail configuration (defaults when never configured).
        fn get_guardrail_config(TenantRef) -> GuardrailConfig;
        /// Replaces the guardrail configuration.
        fn put_guardrail_config(GuardrailConfig) -> GuardrailConfig;
        /// Built-in scanners and external providers.
        fn list_guardrail_providers(TenantRef) -> GuardrailProviderList;
        /// External provider templates.
        fn list_guardrail_templates(ListGuardrailTemplatesRequest) -> GuardrailTemplateList;
        /// Registers or replaces an external guardrail provider.
        fn register_guardrail_provider(RegisterGuardrailProviderRequest) -> ExternalGuardrailProvider;
        /// Removes an external guardrail provider.
        fn delete_guardrail_provider(GuardrailProviderRef) -> DeleteGuardrailProviderResponse;
        /// Scans a text with every scanner the configuration enables.
        fn test_guardrails(ScanTextRequest) -> ScanResult;
        /// Scans a text with the configured external providers only.
        fn scan_external(ScanTextRequest) -> ScanResult;
        /// The tool firewall configuration.
        fn get_firewall_config(TenantRef) -> FirewallConfig;
        /// Replaces the tool firewall configuration.
        fn put_firewall_config(FirewallConfig) -> FirewallConfig;
        /// Runs the firewall service-side and records an interception when not `pass`.
        fn inspect_tool_calls(InspectToolCallsRequest) -> FirewallOutcome;
        /// Stores an interception decided by the edge.
        fn record_interception(Interception) -> Interception;
        /// Stores a batch of interceptions decided by an edge in one write.
        fn record_interceptions(InterceptionBatch) -> RecordedInterceptions;
        /// Interceptions, newest first.
        fn list_interceptions(ListInterceptionsRequest) -> InterceptionList;
        /// The security policy ruleset, if any.
        fn get_policies(TenantRef) -> PolicyRulesetResponse;
        /// Replaces the ruleset, incrementing its version.
        fn put_policies(PutPoliciesRequest) -> Ruleset;
        /// Evaluates the ruleset against a context.
        fn test_policy(TestPolicyRequest) -> PolicyTestResult;
        /// Ruleset presets (`l3-baseline`).
        fn list_policy_presets(ListPolicyPresetsRequest) -> PolicyPresetList;
        /// Governance dry-run of an action against the ruleset.
        fn dry_run_policy(DryRunPolicyRequest) -> DryRunPolicyResult;
        /// Policy and anomaly status.
        fn get_security_status(TenantRef) -> SecurityStatus;
        /// Feeds the anomaly detector; returns the alerts raised.
        fn record_observations(ObservationBatch) -> AnomalyAlertList;
        /// Recent anomaly alerts.
        fn list_anomalies(ListAnomaliesRequest) -> AnomalyAlertList;
        /// The detector's baselines.
        fn export_baselines(TenantRef) -> BaselineList;
        /// Replaces baselines with imported ones.
        fn import_baselines(ImportBaselinesRequest) -> ImportBaselinesResponse;
        /// Statistics of one entity's metric.
        fn get_anomaly_stats(AnomalyStatsRef) -> MetricStats;
        /// Consumes an approval allowance for a tool call, or queues a pending approval.
        fn resolve_approval(ResolveApprovalRequest) -> ApprovalResolution;
        /// Pending approvals.
        fn list_pending_approvals(TenantRef) -> ApprovalList;
        /// Approves a pending approval.
        fn approve_approval(ApproveApprovalRequest) -> Approval;
        /// Denies a pending approval.
        fn deny_approval(DenyApprovalRequest) -> Approval;
        /// One approval.
        fn get_approval(ApprovalRef) -> Approval;
        /// Sets an agent's XDR risk score until its time to live lapses.
        fn set_agent_risk(SetAgentRiskRequest) -> AgentRisk;
        /// Clears an agent's XDR risk score.
        fn clear_agent_risk(AgentRiskRef) -> ClearAgentRiskResponse;
        /// Opens a liaison session; its id comes back signed.
        fn open_liaison(OpenLiaisonRequest) -> LiaisonSession;
        /// A liaison session by its signed id.
        fn get_liaison(LiaisonRef) -> LiaisonSession;
        /// Signs and stores a plan the edge priced.
        fn mint_plan(MintPlanRequest) -> LiaisonPlan;
        /// A plan, its signature verified, for a commit to be judged against.
        fn get_plan(PlanRef) -> LiaisonPlan;
        /// Judges a completion against its plan and claims the plan when it passes.
        fn commit_plan(CommitPlanRequest) -> PlanCommit;
        /// Settles a claimed plan: committed, or released when the completion failed.
        fn settle_plan(SettlePlanRequest) -> SettlePlanResponse;
        /// A session's events after a sequence number.
        fn list_liaison_events(ListLiaisonEventsRequest) -> LiaisonEventList;
        /// Closes a session: its cost summary and trace digest.
        fn close_liaison(LiaisonRef) -> LiaisonSession;
        /// Guardrail and firewall configuration and the ruleset, for the edge's cache.
        fn get_guardian_config(TenantRef) -> GuardianConfig;
    }
}
