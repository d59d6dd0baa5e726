//! `Guardian`: everything the edge asks the policy firewall per request, answered from memory.
//!
//! It holds the kill-switch gate (500 ms TTL) and each tenant's compiled guardrail configuration,
//! firewall configuration and ruleset (30 s TTL by default). `policy.events` keeps both fresh at once:
//! kill-switch snapshots replace the gate's entry, configuration changes evict the tenant's entry. Only
//! three things leave the process: a tenant's first read (and one read per TTL), external guardrail
//! providers (when a tenant enabled some), and approvals (only when a policy requires one).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use brainstorm_common::bus::{DEFAULT_WRITE_LINGER, EventBus};
use brainstorm_common::collections::HashMap;
use brainstorm_proto::policy::{
    self as proto, ApprovalResolution, POLICY_EVENTS_TOPIC, PolicyEvent, PolicyFirewallClient, ResolveApprovalRequest, ScanTextRequest,
    TenantRef, policy_event,
};
use brainstorm_proto::{ServiceError, ServiceResult};
use tokio::time::Instant;

use crate::firewall::{ApprovalNeeded, CompiledFirewall, FirewallConfig, FirewallMode, FirewallOutcome, ToolCall, ToolCaller};
use crate::gate::{GateOptions, KillSwitchGate};
use crate::guardrails::{CompiledGuardrails, GuardrailConfig, ScanResult};
use crate::killswitch::{KillSwitchDecision, RequestFacts};
use crate::policy::{CompiledRuleset, rules_from_proto};
use crate::recorder::InterceptionRecorder;

/// How long a tenant's configuration is trusted without an event.
pub const DEFAULT_CONFIG_TTL: Duration = Duration::from_secs(30);

/// The guardian's timing.
#[derive(Debug, Clone, Copy)]
pub struct GuardianOptions {
    pub kill_switch: GateOptions,
    pub config_ttl: Duration,
    /// How long the interception log gathers a batch after its first interception.
    pub interception_linger: Duration,
}

impl Default for GuardianOptions {
    fn default() -> Self {
        GuardianOptions { kill_switch: GateOptions::default(), config_ttl: DEFAULT_CONFIG_TTL, interception_linger: DEFAULT_WRITE_LINGER }
    }
}

/// One tenant's compiled configuration.
#[derive(Debug)]
pub struct TenantGuardian {
    pub guardrails: CompiledGuardrails,
    pub firewall: CompiledFirewall,
    pub ruleset: Option<CompiledRuleset>,
    /// External guardrail providers registered and enabled in the configuration.
    pub external_providers: Vec<String>,
    /// XDR risk scores in force when read, by agent id.
    agent_risks: HashMap<String, proto::AgentRisk>,
}

/// A risk score at or above this restricts the agent's routing.
pub const RESTRICTING_RISK: f64 = 0.7;
/// Longest agent id and source of a risk score.
pub const MAX_RISK_FIELD_CHARS: usize = 128;
/// Longest life of a risk score: 30 days.
pub const MAX_RISK_TTL_SECONDS: u64 = 2_592_000;

impl TenantGuardian {
    /// Compiles the service's snapshot.
    pub fn compile(config: &proto::GuardianConfig) -> Result<Self, String> {
        let guardrails = config.guardrails.as_ref().map(GuardrailConfig::from_proto).unwrap_or_default();
        let firewall = config.firewall.as_ref().map(FirewallConfig::from_proto).transpose()?.unwrap_or_default();
        let ruleset = match &config.ruleset {
            Some(ruleset) => Some(CompiledRuleset::compile(ruleset.version, &rules_from_proto(&ruleset.rules)?)?),
            None => None,
        };
        Ok(TenantGuardian {
            guardrails: CompiledGuardrails::compile(guardrails)?,
            firewall: CompiledFirewall::compile(firewall)?,
            ruleset,
            external_providers: config.external_providers.clone(),
            agent_risks: config.agent_risks.iter().map(|risk| (risk.agent_id.clone(), risk.clone())).collect(),
        })
    }

    /// The agent's XDR risk score, unless it lapsed (the copy may be older than the lapse).
    pub fn agent_risk(&self, agent_id: &str) -> Option<&proto::AgentRisk> {
        if self.agent_risks.is_empty() {
            return None;
        }
        let now = brainstorm_common::time::now_timestamp();
        self.agent_risks.get(agent_id).filter(|risk| risk.expires_at > now)
    }
}

struct ConfigEntry {
    guardian: Arc<TenantGuardian>,
    fetched_at: Instant,
}

/// Where a held tool call came from, for the approval record reviewers see.
#[derive(Debug, Clone, Default)]
pub struct ApprovalContext {
    /// `chat_completions` or `messages`.
    pub surface: String,
    pub agent_id: Option<String>,
    pub owner_id: Option<String>,
    pub request_id: String,
}

/// The edge's policy-firewall facade.
pub struct Guardian {
    client: PolicyFirewallClient,
    interceptions: InterceptionRecorder,
    gate: KillSwitchGate,
    config_ttl: Duration,
    configs: RwLock<HashMap<String, ConfigEntry>>,
    /// Bumped by every eviction: a read that started before one does not cache what it read.
    evictions: AtomicU64,
}

impl Guardian {
    /// A guardian over the policy-firewall client (local or gRPC); starts its interception recorder
    /// on the current runtime.
    pub fn new(client: PolicyFirewallClient, options: GuardianOptions) -> Self {
        Guardian {
            gate: KillSwitchGate::new(Arc::new(client.clone()), options.kill_switch),
            interceptions: InterceptionRecorder::spawn(client.clone(), options.interception_linger),
            client,
            config_ttl: options.config_ttl,
            configs: RwLock::new(HashMap::default()),
            evictions: AtomicU64::new(0),
        }
    }

    /// The kill-switch gate.
    pub fn gate(&self) -> &KillSwitchGate {
        &self.gate
    }

    /// The kill-switch decision for a request (see `killswitch::check`); never fails (outages follow
    /// the gate's rules).
    pub async fn kill_switch(&self, tenant_id: &str, request: &RequestFacts<'_>) -> KillSwitchDecision {
        self.gate.check(tenant_id, request).await
    }

    /// The tenant's compiled configuration: cached, read again after the TTL or an event. When the
    /// service cannot be read, a stale copy is used if there is one; otherwise the error is returned
    /// and the edge decides (503 is the safe answer).
    pub async fn config(&self, tenant_id: &str) -> ServiceResult<Arc<TenantGuardian>> {
        let cached =
            self.configs.read().ok().and_then(|configs| {
                configs.get(tenant_id).map(|entry| (entry.guardian.clone(), entry.fetched_at.elapsed() < self.config_ttl))
            });
        if let Some((guardian, true)) = &cached {
            return Ok(guardian.clone());
        }
        let evictions_before = self.evictions.load(Ordering::SeqCst);
        let fetched = self.client.get_guardian_config(TenantRef { tenant_id: tenant_id.to_string() }).await;
        let snapshot = match fetched {
            Ok(snapshot) => snapshot,
            Err(error) => {
                return match cached {
                    Some((stale, _)) => {
                        tracing::warn!(%error, tenant_id, "policy configuration unreadable: using the cached copy");
                        Ok(stale)
                    }
                    None => Err(error),
                };
            }
        };
        let guardian = Arc::new(TenantGuardian::compile(&snapshot).map_err(|error| {
            tracing::error!(%error, tenant_id, "policy configuration does not compile");
            ServiceError::internal("policy configuration does not compile")
        })?);
        if self.evictions.load(Ordering::SeqCst) == evictions_before
            && let Ok(mut configs) = self.configs.write()
        {
            configs.insert(tenant_id.to_string(), ConfigEntry { guardian: guardian.clone(), fetched_at: Instant::now() });
        }
        Ok(guardian)
    }

    /// Scans completion input with the tenant's guardrails; None when guardrails are disabled. External
    /// providers, when enabled, are asked through the service and merged in.
    pub async fn scan_input(&self, tenant_id: &str, text: &str) -> ServiceResult<Option<ScanResult>> {
        let guardian = self.config(tenant_id).await?;
        if !guardian.guardrails.config().enabled {
            return Ok(None);
        }
        self.scan_with(tenant_id, &guardian, text).await.map(Some)
    }

    /// Scans completion output; None unless guardrails are enabled with `scanOutput`.
    pub async fn scan_output(&self, tenant_id: &str, text: &str) -> ServiceResult<Option<ScanResult>> {
        let guardian = self.config(tenant_id).await?;
        let config = guardian.guardrails.config();
        if !config.enabled || !config.scan_output {
            return Ok(None);
        }
        self.scan_with(tenant_id, &guardian, text).await.map(Some)
    }

    async fn scan_with(&self, tenant_id: &str, guardian: &TenantGuardian, text: &str) -> ServiceResult<ScanResult> {
        let local = guardian.guardrails.scan(text);
        if guardian.external_providers.is_empty() {
            return Ok(local);
        }
        let external = self.client.scan_external(ScanTextRequest { tenant_id: tenant_id.to_string(), text: text.to_string() }).await?;
        Ok(local.merge(ScanResult::from_proto(&external), guardian.guardrails.config()))
    }

    /// Runs the tool firewall with the tenant's configuration and ruleset. When the outcome is not
    /// `pass`, its interception is recorded in the background.
    pub async fn inspect_tool_calls(
        &self,
        tenant_id: &str,
        calls: &[ToolCall],
        caller: &ToolCaller,
        requested_mode: Option<FirewallMode>,
        request_id: Option<&str>,
    ) -> ServiceResult<FirewallOutcome> {
        let guardian = self.config(tenant_id).await?;
        let outcome = guardian.firewall.inspect(calls, caller, guardian.ruleset.as_ref(), requested_mode);
        if let Some(interception) = outcome.interception(tenant_id, caller, request_id, &brainstorm_common::time::now_timestamp()) {
            self.record_interception(interception);
        }
        Ok(outcome)
    }

    /// Stores an interception without holding up the request (batched; a failure is logged).
    pub fn record_interception(&self, interception: proto::Interception) {
        self.interceptions.record(interception);
    }

    /// Waits until the interceptions recorded so far are stored (at shutdown; see `InterceptionRecorder::flushed`).
    pub async fn interceptions_flushed(&self) {
        self.interceptions.flushed().await;
    }

    /// Resolves a held call: consumes an approved allowance (`allowed`), or queues (deduplicated) a
    /// pending approval; answer `approvals::approval_required_error(&resolution.approval)` then.
    pub async fn resolve_approval(
        &self,
        tenant_id: &str,
        needed: &ApprovalNeeded,
        context: &ApprovalContext,
    ) -> ServiceResult<ApprovalResolution> {
        self.client
            .resolve_approval(ResolveApprovalRequest {
                tenant_id: tenant_id.to_string(),
                tool_name: needed.tool_name.clone(),
                argument_hash: needed.argument_hash.clone(),
                argument_keys: needed.argument_keys.clone(),
                surface: context.surface.clone(),
                agent_id: context.agent_id.clone(),
                owner_id: context.owner_id.clone(),
                rule_id: Some(needed.rule_id.clone()),
                request_id: context.request_id.clone(),
            })
            .await
    }

    /// Forgets a tenant's configuration (its next request reads it again).
    pub fn evict(&self, tenant_id: &str) {
        self.evictions.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut configs) = self.configs.write() {
            configs.remove(tenant_id);
        }
    }

    /// Applies one `policy.events` payload.
    pub fn apply_event(&self, event: &PolicyEvent) {
        match &event.kind {
            Some(policy_event::Kind::KillSwitch(snapshot)) => self.gate.apply_snapshot(snapshot),
            Some(policy_event::Kind::ConfigChanged(_)) => self.evict(&event.tenant_id),
            None => {}
        }
    }

    /// Follows `policy.events` until the bus closes. Every edge process must see every event, so
    /// `group` must be unique to the process (for example `edge-router-<instance id>`).
    pub async fn follow_events(self: Arc<Self>, bus: Arc<dyn EventBus>, group: String) {
        let mut subscription = match bus.subscribe(POLICY_EVENTS_TOPIC, &group).await {
            Ok(subscription) => subscription,
            Err(error) => {
                tracing::error!(%error, "cannot follow policy events: kill switches and configurations refresh by TTL only");
                return;
            }
        };
        while let Ok(delivery) = subscription.next().await {
            match delivery.message().decode::<PolicyEvent>() {
                Ok(event) => self.apply_event(&event),
                Err(error) => tracing::warn!(%error, "skipping undecodable policy event"),
            }
            delivery.ack();
        }
    }
}
