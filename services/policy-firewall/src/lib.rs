//! The policy firewall: the hot-path mechanism the edge calls per request (`Guardian`, with the
//! `KillSwitchGate`, the built-in guardrail scanners, the tool firewall and compiled security policies,
//! all in memory) and the policy-firewall service (kill switches, guardrail configuration and external
//! providers, firewall configuration and interceptions, rulesets, the approval queue and the anomaly
//! detector) over its store.

pub mod anomaly;
pub mod approvals;
pub mod consumer;
pub mod firewall;
pub mod gate;
pub mod glob;
pub mod guardian;
pub mod guardrails;
pub mod killswitch;
pub mod liaison;
mod liaison_service;
pub mod liaison_store;
pub mod policy;
pub mod recorder;
mod service;
pub mod store;

pub use approvals::{ApprovalScope, ArgumentFingerprint, approval_required_error, argument_fingerprint, is_high_risk_tool};
pub use consumer::{AnomalyConsumer, AnomalyFeed, Handled};
pub use firewall::{
    ApprovalNeeded, CompiledFirewall, FirewallAction, FirewallConfig, FirewallMode, FirewallOutcome, InspectedCall, ToolCall, ToolCaller,
    Verdict,
};
pub use gate::{GateOptions, GateView, KILL_SWITCH_TTL, KillSwitchGate, KillSwitchSource};
pub use glob::glob_matches;
pub use guardian::{
    ApprovalContext, Guardian, GuardianOptions, MAX_RISK_FIELD_CHARS, MAX_RISK_TTL_SECONDS, RESTRICTING_RISK, TenantGuardian,
};
pub use guardrails::{CompiledGuardrails, GuardrailConfig, GuardrailMode, ScanAction, ScanResult, scan};
pub use killswitch::{
    BlockScope, KillSwitchDecision, KillSwitchState, RequestFacts, check, is_exempt_path, mcp_tool_allowed_during_activation,
};
pub use liaison_service::summary_json as liaison_summary_json;
pub use policy::{CompiledRuleset, PolicyDecision, Rule, RuleAction};
pub use service::{Clock, PolicyFirewallOptions, PolicyFirewallServiceImpl};
