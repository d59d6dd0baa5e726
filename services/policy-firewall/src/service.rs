//! The policy-firewall service: the `PolicyFirewallService` contract over its store, the anomaly
//! detectors it holds in memory, external guardrail calls, and `policy.events` after every change.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use brainstorm_common::bus::EventBus;
use brainstorm_common::collections::HashMap;
use brainstorm_common::store::Database;
use brainstorm_common::time::{format_timestamp, parse_timestamp};
use brainstorm_proto::policy::*;
use brainstorm_proto::{ErrorKind, ServiceError, ServiceResult};
use brainstorm_providers::vault::{self, MasterKey, SealedSecret};
use chrono::{DateTime, Utc};
use prost::Message;
use serde_json::{Map, Value, json};

use crate::anomaly::{Detector, SeriesKey};
use crate::approvals::{ALLOWANCE_LIFETIME, APPROVED, ApprovalScope, DENIED, PENDING, is_high_risk_tool};
use crate::firewall::{CompiledFirewall, FirewallConfig, FirewallMode, ToolCall, ToolCaller};
use crate::guardian::{MAX_RISK_FIELD_CHARS, MAX_RISK_TTL_SECONDS};
use crate::guardrails::external::{self, ExternalProvider, Mapping};
use crate::guardrails::{
    self, BUILTIN_SCANNERS, CompiledGuardrails, GuardrailConfig, GuardrailMode, ProviderFailure, ScanMatch, ScanResult,
};
use crate::killswitch::{ScopeType, canonical_provider};
use crate::liaison::LiaisonKey;
use crate::liaison_service::LiaisonService;
use crate::policy::{CompiledRuleset, PRESETS, Rule, RuleAction, rules_from_proto};
use crate::store::{PolicyStore, ProviderRecord, SealedKey, StoredRuleset};

const SERVICE: &str = "policy-firewall";
/// Activations listed with the tenant switch.
pub const HISTORY_LIMIT: i64 = 50;
const DEFAULT_INTERCEPTIONS: u32 = 50;
const MAX_INTERCEPTIONS: u32 = 500;
const DEFAULT_ANOMALIES: u32 = 100;
const MAX_ANOMALIES: u32 = 1000;
const MAX_REASON_CHARS: usize = 1000;
const MAX_ID_CHARS: usize = 256;
const MAX_PROVIDER_ID_CHARS: usize = 64;
pub(crate) const MAX_OBSERVATIONS: usize = 1000;
/// Interceptions one `record_interceptions` call may carry.
const MAX_INTERCEPTION_BATCH: usize = 1000;
const MAX_SCAN_CHARS: usize = 1_000_000;
const MAX_TOOL_CALLS: usize = 128;

/// The service's notion of now; tests move it.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// What the service needs besides its store and bus.
#[derive(Clone)]
pub struct PolicyFirewallOptions {
    pub clock: Clock,
    /// Seals external guardrail providers' API keys; without it, providers cannot be given keys.
    pub master_key: Option<MasterKey>,
    /// Accept guardrail endpoints on private, loopback and link-local addresses (tests, embedded use).
    pub allow_private_endpoints: bool,
    /// Names this process in anomaly answers (`node`).
    pub node: String,
}

impl Default for PolicyFirewallOptions {
    fn default() -> Self {
        PolicyFirewallOptions { clock: Arc::new(Utc::now), master_key: None, allow_private_endpoints: false, node: "local".to_string() }
    }
}

/// The policy-firewall service.
#[derive(Clone)]
pub struct PolicyFirewallServiceImpl {
    store: PolicyStore,
    bus: Arc<dyn EventBus>,
    options: Arc<PolicyFirewallOptions>,
    http: reqwest::Client,
    detectors: Arc<Mutex<HashMap<String, Detector>>>,
    liaison: LiaisonService,
}

impl PolicyFirewallServiceImpl {
    /// An interception to store: validated, with an id and a time when the edge left them out.
    fn checked_interception(&self, request: Interception) -> ServiceResult<Interception> {
        required("tenant_id", &request.tenant_id)?;
        let mut interception = request;
        if crate::firewall::FirewallAction::parse(&interception.action).is_none() {
            return Err(ServiceError::invalid("invalid_interception", "action must be pass, warn, mask, substitute, downgrade or block"));
        }
        if !["high", "medium", "low"].contains(&interception.severity.as_str()) {
            return Err(ServiceError::invalid("invalid_interception", "severity must be high, medium or low"));
        }
        if interception.id.is_empty() {
            interception.id = uuid::Uuid::now_v7().to_string();
        }
        if interception.created_at.is_empty() {
            interception.created_at = self.now_text();
        }
        Ok(interception)
    }

    /// The service over a migrated database, publishing its changes on `bus`.
    pub fn new(database: Database, bus: Arc<dyn EventBus>, options: PolicyFirewallOptions) -> Self {
        let liaison_key = options.master_key.as_ref().map(|key| LiaisonKey::new(key.liaison_secret()));
        // Guardrail endpoints are tenants' URLs: redirects within one origin only, names resolving inward refused.
        let http = brainstorm_common::net::tenant_http_client(options.allow_private_endpoints).build().unwrap_or_default();
        PolicyFirewallServiceImpl {
            liaison: LiaisonService::new(database.clone(), liaison_key, options.clock.clone()),
            store: PolicyStore::new(database),
            bus,
            options: Arc::new(options),
            http,
            detectors: Arc::new(Mutex::new(HashMap::default())),
        }
    }

    /// The store (for tests and tools that inspect what is kept).
    pub fn store(&self) -> &PolicyStore {
        &self.store
    }

    fn now(&self) -> DateTime<Utc> {
        (self.options.clock)()
    }

    fn now_text(&self) -> String {
        format_timestamp(self.now())
    }

    fn detectors(&self) -> MutexGuard<'_, HashMap<String, Detector>> {
        self.detectors.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `observe` on the tenant's detector and logs the alerts it returns, as
    /// `record_observations` does: the in-process feed's way in, which hands the detector borrowed
    /// keys and timestamps already in normal form instead of a batch of owned observations.
    pub fn observe_in_process(&self, tenant_id: &str, observe: impl FnOnce(&mut Detector) -> Vec<AnomalyAlert>) -> usize {
        let alerts = {
            let mut detectors = self.detectors();
            let detector = match detectors.get_mut(tenant_id) {
                Some(detector) => detector,
                None => detectors.entry(tenant_id.to_string()).or_default(),
            };
            observe(detector)
        };
        log_alerts(tenant_id, &alerts);
        alerts.len()
    }

    /// Publishes a change for every edge; a lost event only delays the edges until their TTL, so a
    /// failure is logged rather than failing a change that already committed.
    async fn publish(&self, tenant_id: &str, kind: policy_event::Kind) {
        let event = PolicyEvent { tenant_id: tenant_id.to_string(), occurred_at: self.now_text(), kind: Some(kind) };
        if let Err(error) = self.bus.publish(POLICY_EVENTS_TOPIC, tenant_id, event.encode_to_vec().into()).await {
            tracing::warn!(%error, tenant_id, "could not publish policy event");
        }
    }

    async fn publish_snapshot(&self, tenant_id: &str) {
        match self.snapshot(tenant_id).await {
            Ok(snapshot) => self.publish(tenant_id, policy_event::Kind::KillSwitch(snapshot)).await,
            Err(error) => tracing::warn!(%error, tenant_id, "could not read the kill-switch snapshot to publish"),
        }
    }

    async fn publish_config_change(&self, tenant_id: &str, what: &str) {
        self.publish(tenant_id, policy_event::Kind::ConfigChanged(ConfigChanged { what: what.to_string() })).await;
    }

    // ------------------------------------------------------------ kill switches

    async fn snapshot(&self, tenant_id: &str) -> ServiceResult<KillSwitchSnapshot> {
        let row = self.store.kill_switch(tenant_id).await.map_err(store_failure)?.unwrap_or_default();
        let scopes = self.store.active_scopes(tenant_id).await.map_err(store_failure)?;
        Ok(KillSwitchSnapshot {
            tenant_id: tenant_id.to_string(),
            version: row.version,
            active: row.active,
            reason: row.reason.filter(|_| row.active),
            activated_at: row.activated_at.filter(|_| row.active),
            scopes,
        })
    }

    async fn kill_switch_status(&self, tenant_id: &str) -> ServiceResult<KillSwitchStatus> {
        let row = self.store.kill_switch(tenant_id).await.map_err(store_failure)?.unwrap_or_default();
        let history = self.store.kill_switch_history(tenant_id, HISTORY_LIMIT).await.map_err(store_failure)?;
        let scopes = self.store.active_scopes(tenant_id).await.map_err(store_failure)?;
        Ok(KillSwitchStatus {
            tenant_id: tenant_id.to_string(),
            active: row.active,
            activated_at: row.activated_at.filter(|_| row.active),
            activated_by: row.activated_by.filter(|_| row.active),
            reason: row.reason.filter(|_| row.active),
            deactivated_at: row.deactivated_at.filter(|_| !row.active),
            history,
            scopes,
        })
    }

    // ------------------------------------------------------------ guardrails

    async fn guardrail_config_of(&self, tenant_id: &str) -> ServiceResult<(GuardrailConfig, Option<String>)> {
        match self.store.guardrail_config(tenant_id).await.map_err(store_failure)? {
            Some(stored) => {
                let config = serde_json::from_str(&stored.json).map_err(|error| corrupt("guardrail configuration", &error))?;
                Ok((config, Some(stored.updated_at)))
            }
            None => Ok((GuardrailConfig::default(), None)),
        }
    }

    fn external_view(record: &ProviderRecord) -> ExternalGuardrailProvider {
        ExternalGuardrailProvider {
            id: record.provider_id.clone(),
            name: record.name.clone(),
            endpoint: record.endpoint.clone(),
            template: record.template.clone(),
            result_mapping: record.result_mapping_json.as_deref().and_then(mapping_from_json),
            has_api_key: record.sealed_key.is_some(),
            api_key_mask: record.api_key_mask.clone(),
            timeout_ms: u32::try_from(record.timeout_ms).unwrap_or(u32::MAX),
            created_at: record.created_at.clone(),
            updated_at: record.updated_at.clone(),
        }
    }

    /// Calls the configuration's enabled external providers (concurrently) on a text.
    async fn scan_external_providers(&self, tenant_id: &str, text: &str, config: &GuardrailConfig) -> ServiceResult<ScanResult> {
        let started = std::time::Instant::now();
        let wanted = config.enabled_external_ids();
        let mut result = ScanResult::assemble(Vec::new(), Vec::new(), 0.0, config);
        if wanted.is_empty() {
            return Ok(result);
        }
        let records = self.store.guardrail_providers(tenant_id).await.map_err(store_failure)?;
        let mut calls = Vec::new();
        for id in wanted {
            let Some(record) = records.iter().find(|record| record.provider_id == id) else {
                result.failed.push(ProviderFailure { id, error: "not registered".to_string() });
                continue;
            };
            match self.ready_provider(record) {
                Ok(provider) => calls.push(provider),
                Err(error) => result.failed.push(ProviderFailure { id, error }),
            }
        }
        let answers = futures::future::join_all(calls.iter().map(|provider| external::call(&self.http, provider, text))).await;
        let mut matches = Vec::new();
        for (provider, answer) in calls.iter().zip(answers) {
            result.scanners_run.push(provider.id.clone());
            match answer {
                Ok(verdict) => {
                    result.resolved.push(provider.id.clone());
                    if !verdict.safe {
                        matches.push(ScanMatch {
                            match_type: "external".to_string(),
                            subtype: verdict.reason.unwrap_or_else(|| provider.id.clone()),
                            scanner: provider.id.clone(),
                            confidence: verdict.confidence,
                        });
                    }
                }
                Err(error) => {
                    tracing::info!(tenant_id, provider = provider.id, %error, "external guardrail provider failed");
                    result.failed.push(ProviderFailure { id: provider.id.clone(), error });
                }
            }
        }
        let resolved = std::mem::take(&mut result.resolved);
        let failed = std::mem::take(&mut result.failed);
        let mut assembled = ScanResult::assemble(matches, result.scanners_run, started.elapsed().as_secs_f64() * 1000.0, config);
        assembled.resolved = resolved;
        assembled.failed = failed;
        Ok(assembled)
    }

    fn ready_provider(&self, record: &ProviderRecord) -> Result<ExternalProvider, String> {
        let mapping_json = record.result_mapping_json.as_deref().ok_or("no result mapping")?;
        let mapping = mapping_from_json(mapping_json).ok_or("unreadable result mapping")?;
        let mapping = Mapping::compile(&mapping)?;
        let api_key = match &record.sealed_key {
            None => None,
            Some(sealed) => {
                let master = self.options.master_key.as_ref().ok_or("the api key cannot be opened (no master key)")?;
                let sealed = SealedSecret {
                    ciphertext: sealed.ciphertext.clone(),
                    nonce: sealed.nonce.clone(),
                    wrapped_key: sealed.wrapped_key.clone(),
                    key_nonce: sealed.key_nonce.clone(),
                };
                let binding = key_binding(&record.tenant_id, &record.provider_id);
                Some(vault::open(master, &sealed, &binding).map_err(|_| "the api key cannot be opened".to_string())?)
            }
        };
        let timeout =
            Duration::from_millis(u64::try_from(record.timeout_ms).unwrap_or(0)).clamp(Duration::from_millis(1), external::MAX_TIMEOUT);
        Ok(ExternalProvider { id: record.provider_id.clone(), endpoint: record.endpoint.clone(), api_key, mapping, timeout })
    }

    // ------------------------------------------------------------ firewall and policies

    async fn firewall_config_of(&self, tenant_id: &str) -> ServiceResult<(FirewallConfig, Option<String>)> {
        match self.store.firewall_config(tenant_id).await.map_err(store_failure)? {
            Some(stored) => {
                let config = serde_json::from_str(&stored.json).map_err(|error| corrupt("firewall configuration", &error))?;
                Ok((config, Some(stored.updated_at)))
            }
            None => Ok((FirewallConfig::default(), None)),
        }
    }

    async fn ruleset_of(&self, tenant_id: &str) -> ServiceResult<Option<(StoredRuleset, Vec<Rule>)>> {
        let Some(stored) = self.store.ruleset(tenant_id).await.map_err(store_failure)? else { return Ok(None) };
        let rules: Vec<Rule> = serde_json::from_str(&stored.rules_json).map_err(|error| corrupt("ruleset", &error))?;
        Ok(Some((stored, rules)))
    }

    async fn compiled_ruleset(&self, tenant_id: &str) -> ServiceResult<Option<CompiledRuleset>> {
        let Some((stored, rules)) = self.ruleset_of(tenant_id).await? else { return Ok(None) };
        CompiledRuleset::compile(stored.version, &rules).map(Some).map_err(|error| {
            tracing::error!(%error, tenant_id, "stored ruleset does not compile");
            ServiceError::internal("stored ruleset does not compile")
        })
    }

    fn ruleset_proto(tenant_id: &str, stored: &StoredRuleset, rules: &[Rule]) -> Ruleset {
        Ruleset {
            tenant_id: tenant_id.to_string(),
            version: stored.version,
            rules: rules.iter().map(Rule::to_proto).collect(),
            updated_at: stored.updated_at.clone(),
            updated_by: stored.updated_by.clone(),
        }
    }

    // ------------------------------------------------------------ approvals

    async fn approval_or_not_found(&self, tenant_id: &str, id: &str) -> ServiceResult<Approval> {
        self.store
            .approval(tenant_id, id)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("approval_not_found", format!("approval `{id}` does not exist")))
    }

    async fn queue_pending(&self, request: &ResolveApprovalRequest, surface: &str) -> ServiceResult<Approval> {
        let now = self.now_text();
        for _ in 0..3 {
            if let Some(existing) =
                self.store.pending_approval(&request.tenant_id, &request.tool_name, &request.argument_hash).await.map_err(store_failure)?
            {
                self.store.count_attempt(&existing.id).await.map_err(store_failure)?;
                return self.approval_or_not_found(&request.tenant_id, &existing.id).await;
            }
            let mut keys = request.argument_keys.clone();
            keys.sort();
            keys.dedup();
            let approval = Approval {
                id: uuid::Uuid::now_v7().to_string(),
                tenant_id: request.tenant_id.clone(),
                tool_name: request.tool_name.clone(),
                surface: surface.to_string(),
                agent_id: request.agent_id.clone(),
                owner_id: request.owner_id.clone(),
                argument_keys: keys,
                argument_hash: request.argument_hash.clone(),
                rule_id: request.rule_id.clone(),
                status: PENDING.to_string(),
                created_at: now.clone(),
                request_id: request.request_id.clone(),
                attempts: 1,
                high_risk: is_high_risk_tool(&request.tool_name),
                ..Approval::default()
            };
            if self.store.insert_pending_approval(&approval).await.map_err(store_failure)? {
                tracing::info!(
                    tenant_id = request.tenant_id,
                    tool = request.tool_name,
                    approval_id = approval.id,
                    "tool call queued for approval"
                );
                return Ok(approval);
            }
            // Another request queued the same call between our read and insert: read it again.
        }
        Err(ServiceError::unavailable("approval_contention", "the approval queue is busy; retry shortly"))
    }

    async fn review(
        &self,
        tenant_id: &str,
        id: &str,
        status: &str,
        scope: Option<ApprovalScope>,
        note: Option<&str>,
        by: &str,
    ) -> ServiceResult<Approval> {
        let approval = self.approval_or_not_found(tenant_id, id).await?;
        if approval.status != PENDING {
            return Err(ServiceError::conflict("approval_not_pending", format!("approval `{id}` is already {}", approval.status)));
        }
        let now = self.now();
        let expires_at = (status == APPROVED).then(|| format_timestamp(now + ALLOWANCE_LIFETIME));
        let reviewed = self
            .store
            .review_approval(
                tenant_id,
                id,
                status,
                scope.map(ApprovalScope::as_str),
                note,
                by,
                &format_timestamp(now),
                expires_at.as_deref(),
            )
            .await
            .map_err(store_failure)?;
        if !reviewed {
            return Err(ServiceError::conflict("approval_not_pending", format!("approval `{id}` was reviewed meanwhile")));
        }
        self.approval_or_not_found(tenant_id, id).await
    }
}

#[async_trait]
impl PolicyFirewallService for PolicyFirewallServiceImpl {
    async fn get_kill_switch_status(&self, request: TenantRef) -> ServiceResult<KillSwitchStatus> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        self.kill_switch_status(tenant_id).await
    }

    async fn activate_kill_switch(&self, request: ActivateKillSwitchRequest) -> ServiceResult<KillSwitchStatus> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let reason = request.reason.trim();
        if reason.is_empty() {
            return Err(ServiceError::invalid("reason_required", "activating the kill switch needs a reason"));
        }
        if reason.chars().count() > MAX_REASON_CHARS {
            return Err(ServiceError::invalid("reason_too_long", format!("the reason is limited to {MAX_REASON_CHARS} characters")));
        }
        let activated_by = required("activated_by", &request.activated_by)?;
        if !self.store.activate_kill_switch(tenant_id, reason, activated_by, &self.now_text()).await.map_err(store_failure)? {
            return Err(ServiceError::conflict("already_active", "the kill switch is already active"));
        }
        tracing::warn!(tenant_id, activated_by, reason, "tenant kill switch activated");
        self.publish_snapshot(tenant_id).await;
        self.kill_switch_status(tenant_id).await
    }

    async fn deactivate_kill_switch(&self, request: DeactivateKillSwitchRequest) -> ServiceResult<KillSwitchStatus> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let deactivated_by = required("deactivated_by", &request.deactivated_by)?;
        if !self.store.deactivate_kill_switch(tenant_id, deactivated_by, &self.now_text()).await.map_err(store_failure)? {
            return Err(ServiceError::conflict("already_inactive", "the kill switch is not active"));
        }
        tracing::warn!(tenant_id, deactivated_by, "tenant kill switch deactivated");
        self.publish_snapshot(tenant_id).await;
        self.kill_switch_status(tenant_id).await
    }

    async fn activate_scope(&self, request: ActivateScopeRequest) -> ServiceResult<ScopedSwitch> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let (scope_type, scope_id) = scope_key(&request.r#type, &request.id)?;
        let reason = request.reason.as_deref().map(str::trim).unwrap_or_default();
        if reason.chars().count() > MAX_REASON_CHARS {
            return Err(ServiceError::invalid("reason_too_long", format!("the reason is limited to {MAX_REASON_CHARS} characters")));
        }
        let scope = ScopedSwitch {
            r#type: scope_type.as_str().to_string(),
            id: scope_id,
            reason: reason.to_string(),
            activated_by: required("activated_by", &request.activated_by)?.to_string(),
            activated_at: self.now_text(),
            active: true,
            deactivated_at: None,
        };
        self.store.activate_scope(tenant_id, &scope, &scope.activated_at).await.map_err(store_failure)?;
        tracing::warn!(tenant_id, scope_type = scope.r#type, scope_id = scope.id, "scoped kill switch activated");
        self.publish_snapshot(tenant_id).await;
        Ok(scope)
    }

    async fn deactivate_scope(&self, request: ScopeRef) -> ServiceResult<ScopedSwitch> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let not_found = || ServiceError::not_found("scope_not_found", format!("no active {} kill switch `{}`", request.r#type, request.id));
        let Ok((scope_type, scope_id)) = scope_key(&request.r#type, &request.id) else { return Err(not_found()) };
        let deactivated = self
            .store
            .deactivate_scope(tenant_id, scope_type.as_str(), &scope_id, "api", &self.now_text())
            .await
            .map_err(store_failure)?
            .ok_or_else(not_found)?;
        tracing::warn!(tenant_id, scope_type = deactivated.r#type, scope_id = deactivated.id, "scoped kill switch deactivated");
        self.publish_snapshot(tenant_id).await;
        Ok(deactivated)
    }

    async fn list_scopes(&self, request: TenantRef) -> ServiceResult<ScopeList> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        Ok(ScopeList { scopes: self.store.active_scopes(tenant_id).await.map_err(store_failure)? })
    }

    async fn get_kill_switch_snapshot(&self, request: TenantRef) -> ServiceResult<KillSwitchSnapshot> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        self.snapshot(tenant_id).await
    }

    async fn get_guardrail_config(&self, request: TenantRef) -> ServiceResult<brainstorm_proto::policy::GuardrailConfig> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let (config, updated_at) = self.guardrail_config_of(tenant_id).await?;
        Ok(config.to_proto(tenant_id, updated_at))
    }

    async fn put_guardrail_config(
        &self,
        request: brainstorm_proto::policy::GuardrailConfig,
    ) -> ServiceResult<brainstorm_proto::policy::GuardrailConfig> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        if !request.mode.is_empty() && GuardrailMode::parse(&request.mode).is_none() {
            return Err(ServiceError::invalid("invalid_guardrail_config", "mode must be block, warn or log"));
        }
        let config = GuardrailConfig::from_proto(&request);
        config.validate().map_err(|error| ServiceError::invalid("invalid_guardrail_config", error))?;
        let registered = self.store.guardrail_providers(tenant_id).await.map_err(store_failure)?;
        if let Some(unknown) =
            config.enabled_external_ids().into_iter().find(|id| !registered.iter().any(|record| record.provider_id == *id))
        {
            return Err(ServiceError::invalid(
                "invalid_guardrail_config",
                format!("provider `{unknown}` is neither a built-in scanner ({}) nor a registered provider", BUILTIN_SCANNERS.join(", ")),
            ));
        }
        let json = serde_json::to_string(&config).map_err(|error| corrupt("guardrail configuration", &error))?;
        let now = self.now_text();
        self.store.put_guardrail_config(tenant_id, &json, &now).await.map_err(store_failure)?;
        self.publish_config_change(tenant_id, "guardrails").await;
        Ok(config.to_proto(tenant_id, Some(now)))
    }

    async fn list_guardrail_providers(&self, request: TenantRef) -> ServiceResult<GuardrailProviderList> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let builtins = vec![
            BuiltinGuardrailScanner {
                id: guardrails::BUILTIN.to_string(),
                name: "Prompt injection and jailbreaks".to_string(),
                description: "instruction overrides, system prompt extraction, DAN and developer-mode jailbreaks, role-play overrides, base64-smuggled instructions".to_string(),
            },
            BuiltinGuardrailScanner {
                id: guardrails::PII.to_string(),
                name: "Personal data and secrets".to_string(),
                description: "emails, phone numbers, payment cards (Luhn), US SSNs, IBANs (mod 97), API keys, tokens and private keys".to_string(),
            },
            BuiltinGuardrailScanner {
                id: guardrails::TOPIC_RESTRICTION.to_string(),
                name: "Topic restriction".to_string(),
                description: "the configuration's denied topics, by keyword".to_string(),
            },
        ];
        let records = self.store.guardrail_providers(tenant_id).await.map_err(store_failure)?;
        Ok(GuardrailProviderList { builtins, external: records.iter().map(Self::external_view).collect() })
    }

    async fn list_guardrail_templates(&self, _request: ListGuardrailTemplatesRequest) -> ServiceResult<GuardrailTemplateList> {
        Ok(GuardrailTemplateList { templates: external::templates() })
    }

    async fn register_guardrail_provider(&self, request: RegisterGuardrailProviderRequest) -> ServiceResult<ExternalGuardrailProvider> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let invalid = |message: String| ServiceError::invalid("invalid_guardrail_provider", message);
        let id = request.id.trim();
        let id_ok = !id.is_empty()
            && id.len() <= MAX_PROVIDER_ID_CHARS
            && id
                .chars()
                .all(|character| character.is_ascii_lowercase() || character.is_ascii_digit() || character == '-' || character == '_');
        if !id_ok {
            return Err(invalid(format!("id must be 1 to {MAX_PROVIDER_ID_CHARS} lowercase letters, digits, `-` or `_`")));
        }
        if BUILTIN_SCANNERS.contains(&id) {
            return Err(invalid(format!("`{id}` is a built-in scanner id")));
        }
        external::validate_endpoint(request.endpoint.trim(), self.options.allow_private_endpoints).map_err(invalid)?;
        let template = match (request.template.trim(), &request.result_mapping) {
            ("", Some(_)) => external::CUSTOM_TEMPLATE,
            ("", None) => "generic",
            (template, _) => template,
        };
        let mapping = external::resolve_mapping(template, request.result_mapping.as_ref()).map_err(invalid)?;
        let timeout_ms = match request.timeout_ms {
            0 => external::DEFAULT_TIMEOUT.as_millis(),
            given => u128::from(given),
        };
        if timeout_ms > external::MAX_TIMEOUT.as_millis() {
            return Err(invalid(format!("timeout_ms is at most {}", external::MAX_TIMEOUT.as_millis())));
        }
        let api_key = request.api_key.as_deref().map(str::trim).filter(|key| !key.is_empty());
        let (sealed_key, api_key_mask) = match api_key {
            None => (None, None),
            Some(key) => {
                let master = self.options.master_key.as_ref().ok_or_else(|| {
                    ServiceError::unavailable("vault_unavailable", "this deployment has no master key to seal provider api keys")
                })?;
                let sealed = vault::seal(master, key, &key_binding(tenant_id, id))
                    .map_err(|_| ServiceError::internal("could not seal the api key"))?;
                let sealed = SealedKey {
                    ciphertext: sealed.ciphertext,
                    nonce: sealed.nonce,
                    wrapped_key: sealed.wrapped_key,
                    key_nonce: sealed.key_nonce,
                };
                (Some(sealed), Some(vault::mask(key)))
            }
        };
        let now = self.now_text();
        let existing = self.store.guardrail_providers(tenant_id).await.map_err(store_failure)?;
        let created_at =
            existing.iter().find(|record| record.provider_id == id).map_or_else(|| now.clone(), |record| record.created_at.clone());
        let name = request.name.trim();
        let record = ProviderRecord {
            tenant_id: tenant_id.to_string(),
            provider_id: id.to_string(),
            name: if name.is_empty() { id.to_string() } else { name.to_string() },
            endpoint: request.endpoint.trim().to_string(),
            template: template.to_string(),
            result_mapping_json: Some(mapping_to_json(&mapping)),
            timeout_ms: i64::try_from(timeout_ms).unwrap_or(i64::MAX),
            sealed_key,
            api_key_mask,
            created_at,
            updated_at: now,
        };
        self.store.upsert_guardrail_provider(&record).await.map_err(store_failure)?;
        self.publish_config_change(tenant_id, "guardrail_providers").await;
        Ok(Self::external_view(&record))
    }

    async fn delete_guardrail_provider(&self, request: GuardrailProviderRef) -> ServiceResult<DeleteGuardrailProviderResponse> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        if !self.store.delete_guardrail_provider(tenant_id, &request.id).await.map_err(store_failure)? {
            return Err(ServiceError::not_found(
                "guardrail_provider_not_found",
                format!("guardrail provider `{}` does not exist", request.id),
            ));
        }
        self.publish_config_change(tenant_id, "guardrail_providers").await;
        Ok(DeleteGuardrailProviderResponse { id: request.id, deleted: true })
    }

    async fn test_guardrails(&self, request: ScanTextRequest) -> ServiceResult<brainstorm_proto::policy::ScanResult> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        scan_size(&request.text)?;
        let (config, _) = self.guardrail_config_of(tenant_id).await?;
        let local =
            CompiledGuardrails::compile(config.clone()).map_err(|error| corrupt("guardrail configuration", &error))?.scan(&request.text);
        let external = self.scan_external_providers(tenant_id, &request.text, &config).await?;
        Ok(local.merge(external, &config).to_proto())
    }

    async fn scan_external(&self, request: ScanTextRequest) -> ServiceResult<brainstorm_proto::policy::ScanResult> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        scan_size(&request.text)?;
        let (config, _) = self.guardrail_config_of(tenant_id).await?;
        Ok(self.scan_external_providers(tenant_id, &request.text, &config).await?.to_proto())
    }

    async fn get_firewall_config(&self, request: TenantRef) -> ServiceResult<brainstorm_proto::policy::FirewallConfig> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let (config, updated_at) = self.firewall_config_of(tenant_id).await?;
        Ok(config.to_proto(tenant_id, updated_at))
    }

    async fn put_firewall_config(
        &self,
        request: brainstorm_proto::policy::FirewallConfig,
    ) -> ServiceResult<brainstorm_proto::policy::FirewallConfig> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let config = FirewallConfig::from_proto(&request).map_err(|error| ServiceError::invalid("invalid_firewall_config", error))?;
        config.validate().map_err(|error| ServiceError::invalid("invalid_firewall_config", error))?;
        let json = serde_json::to_string(&config).map_err(|error| corrupt("firewall configuration", &error))?;
        let now = self.now_text();
        self.store.put_firewall_config(tenant_id, &json, &now).await.map_err(store_failure)?;
        self.publish_config_change(tenant_id, "firewall").await;
        Ok(config.to_proto(tenant_id, Some(now)))
    }

    async fn inspect_tool_calls(&self, request: InspectToolCallsRequest) -> ServiceResult<brainstorm_proto::policy::FirewallOutcome> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        if request.calls.len() > MAX_TOOL_CALLS {
            return Err(ServiceError::invalid("too_many_tool_calls", format!("at most {MAX_TOOL_CALLS} tool calls per inspection")));
        }
        let requested_mode = match request.mode_override.as_deref() {
            None | Some("") => None,
            Some(mode) => Some(FirewallMode::parse(mode).ok_or_else(|| {
                ServiceError::invalid("invalid_firewall_mode", format!("x_firewall_mode `{mode}` is not enforce, monitor or off"))
            })?),
        };
        let (config, _) = self.firewall_config_of(tenant_id).await?;
        let firewall = CompiledFirewall::compile(config).map_err(|error| corrupt("firewall configuration", &error))?;
        let ruleset = self.compiled_ruleset(tenant_id).await?;
        let calls: Vec<ToolCall> = request.calls.iter().map(ToolCall::from_proto).collect();
        let caller = request.caller.as_ref().map(ToolCaller::from_proto).unwrap_or_default();
        let outcome = firewall.inspect(&calls, &caller, ruleset.as_ref(), requested_mode);
        let request_id = Some(request.request_id.as_str()).filter(|id| !id.is_empty());
        let interception = outcome.interception(tenant_id, &caller, request_id, &self.now_text());
        if let Some(interception) = &interception {
            self.store.insert_interception(interception).await.map_err(store_failure)?;
        }
        Ok(outcome.to_proto(interception))
    }

    async fn record_interception(&self, request: Interception) -> ServiceResult<Interception> {
        let interception = self.checked_interception(request)?;
        self.store.insert_interception(&interception).await.map_err(store_failure)?;
        Ok(interception)
    }

    async fn record_interceptions(&self, request: InterceptionBatch) -> ServiceResult<RecordedInterceptions> {
        if request.interceptions.len() > MAX_INTERCEPTION_BATCH {
            return Err(ServiceError::invalid(
                "too_many_interceptions",
                format!("at most {MAX_INTERCEPTION_BATCH} interceptions per call"),
            ));
        }
        let interceptions =
            request.interceptions.into_iter().map(|interception| self.checked_interception(interception)).collect::<Result<Vec<_>, _>>()?;
        self.store.insert_interceptions(&interceptions).await.map_err(store_failure)?;
        Ok(RecordedInterceptions { recorded: u32::try_from(interceptions.len()).unwrap_or(u32::MAX) })
    }

    async fn list_interceptions(&self, request: ListInterceptionsRequest) -> ServiceResult<InterceptionList> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let limit = match request.limit {
            0 => DEFAULT_INTERCEPTIONS,
            given => given.min(MAX_INTERCEPTIONS),
        };
        let (interceptions, total) =
            self.store.interceptions(tenant_id, i64::from(limit), i64::from(request.offset)).await.map_err(store_failure)?;
        Ok(InterceptionList { interceptions, total: u64::try_from(total).unwrap_or_default(), limit, offset: request.offset })
    }

    async fn get_policies(&self, request: TenantRef) -> ServiceResult<PolicyRulesetResponse> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let ruleset = self.ruleset_of(tenant_id).await?.map(|(stored, rules)| Self::ruleset_proto(tenant_id, &stored, &rules));
        Ok(PolicyRulesetResponse { ruleset })
    }

    async fn put_policies(&self, request: PutPoliciesRequest) -> ServiceResult<Ruleset> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let rules = rules_from_proto(&request.rules).map_err(|error| ServiceError::invalid("invalid_policy", error))?;
        crate::policy::validate_rules(&rules).map_err(|error| ServiceError::invalid("invalid_policy", error))?;
        let json = serde_json::to_string(&rules).map_err(|error| corrupt("ruleset", &error))?;
        let updated_by = if request.updated_by.is_empty() { "api" } else { request.updated_by.as_str() };
        let now = self.now_text();
        let version = self.store.put_ruleset(tenant_id, &json, updated_by, &now).await.map_err(store_failure)?;
        self.publish_config_change(tenant_id, "policies").await;
        let stored = StoredRuleset { version, rules_json: json, updated_at: now, updated_by: updated_by.to_string() };
        Ok(Self::ruleset_proto(tenant_id, &stored, &rules))
    }

    async fn test_policy(&self, request: TestPolicyRequest) -> ServiceResult<PolicyTestResult> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let context: Value = serde_json::from_str(if request.context_json.trim().is_empty() { "{}" } else { &request.context_json })
            .map_err(|_| ServiceError::invalid("invalid_context", "context must be a JSON object"))?;
        if !context.is_object() {
            return Err(ServiceError::invalid("invalid_context", "context must be a JSON object"));
        }
        let Some(ruleset) = self.compiled_ruleset(tenant_id).await? else {
            return Ok(PolicyTestResult { decision: RuleAction::Allow.as_str().to_string(), evaluated_count: 0, matched_rule: None });
        };
        let decision = ruleset.evaluate(&context);
        Ok(PolicyTestResult {
            decision: decision.decision.as_str().to_string(),
            evaluated_count: decision.evaluated_count,
            matched_rule: decision.matched_rule.map(|rule| rule.to_proto()),
        })
    }

    async fn list_policy_presets(&self, _request: ListPolicyPresetsRequest) -> ServiceResult<PolicyPresetList> {
        let presets = PRESETS
            .iter()
            .map(|preset| PolicyPreset {
                name: preset.name.to_string(),
                description: preset.description.to_string(),
                rules: (preset.rules)().iter().map(Rule::to_proto).collect(),
            })
            .collect();
        Ok(PolicyPresetList { presets })
    }

    async fn dry_run_policy(&self, request: DryRunPolicyRequest) -> ServiceResult<DryRunPolicyResult> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let action = required("action", &request.action)?;
        let mut context = Map::new();
        context.insert("action".to_string(), json!(action));
        let optional_fields = [
            ("actor.type", &request.actor_type),
            ("actor.id", &request.actor_id),
            ("target", &request.target),
            ("category", &request.category),
            ("agent.id", &request.agent_id),
            ("tool.name", &request.tool_name),
            ("model.name", &request.model_name),
        ];
        for (field, value) in optional_fields {
            if let Some(value) = value {
                context.insert(field.to_string(), json!(value));
            }
        }
        let Some(ruleset) = self.compiled_ruleset(tenant_id).await? else {
            return Ok(DryRunPolicyResult {
                decision: "allow".to_string(),
                matched_rule: None,
                rule_count: 0,
                mode: "dry_run".to_string(),
            });
        };
        let decision = ruleset.evaluate(&Value::Object(context));
        let verdict = match decision.decision {
            RuleAction::Allow => "allow",
            RuleAction::Deny | RuleAction::RequireApproval => "deny",
        };
        Ok(DryRunPolicyResult {
            decision: verdict.to_string(),
            matched_rule: decision.matched_rule.map(|rule| rule.to_proto()),
            rule_count: u32::try_from(ruleset.rule_count()).unwrap_or(u32::MAX),
            mode: "dry_run".to_string(),
        })
    }

    async fn get_security_status(&self, request: TenantRef) -> ServiceResult<SecurityStatus> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let ruleset = self.ruleset_of(tenant_id).await?;
        let policy = match &ruleset {
            Some((stored, rules)) => PolicySummary {
                version: stored.version,
                rule_count: u32::try_from(rules.len()).unwrap_or(u32::MAX),
                mode: "enforce".to_string(),
            },
            None => PolicySummary { version: 0, rule_count: 0, mode: "none".to_string() },
        };
        let since = format_timestamp(self.now() - chrono::Duration::hours(24));
        let detectors = self.detectors();
        let (metrics_tracked, recent_alerts) =
            detectors.get(tenant_id).map_or((0, 0), |detector| (detector.series_count(), detector.alerts_since(&since)));
        Ok(SecurityStatus {
            policy: Some(policy),
            anomaly: Some(AnomalySummary {
                metrics_tracked: u32::try_from(metrics_tracked).unwrap_or(u32::MAX),
                recent_alerts: u32::try_from(recent_alerts).unwrap_or(u32::MAX),
                scope: "node".to_string(),
            }),
        })
    }

    async fn record_observations(&self, request: ObservationBatch) -> ServiceResult<AnomalyAlertList> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        if request.observations.len() > MAX_OBSERVATIONS {
            return Err(ServiceError::invalid("too_many_observations", format!("at most {MAX_OBSERVATIONS} observations per call")));
        }
        for observation in &request.observations {
            if observation.entity_type.is_empty() || observation.entity_id.is_empty() || observation.metric.is_empty() {
                return Err(ServiceError::invalid("invalid_observation", "observations need entity_type, entity_id and metric"));
            }
            if !observation.value.is_finite() {
                return Err(ServiceError::invalid("invalid_observation", "observation values must be finite numbers"));
            }
        }
        let now = self.now();
        let mut detectors = self.detectors();
        let detector = detectors.entry(tenant_id.to_string()).or_default();
        // Timestamps are normalised, so recent-alert windows compare instants as text. A batch's
        // observations mostly share their instant (one settlement gives several): the last one's
        // normal form is reused while the text repeats.
        let mut normalised: Option<(String, String)> = None;
        let mut alerts = Vec::new();
        for observation in request.observations {
            let timestamp = match normalised.take() {
                Some((given, normal)) if given == observation.timestamp => (given, normal),
                _ => {
                    let normal = format_timestamp(parse_timestamp(&observation.timestamp).unwrap_or(now));
                    (observation.timestamp, normal)
                }
            };
            let key = SeriesKey { entity_type: observation.entity_type, entity_id: observation.entity_id, metric: observation.metric };
            alerts.extend(detector.observe(key, observation.value, &timestamp.1));
            normalised = Some(timestamp);
        }
        log_alerts(tenant_id, &alerts);
        Ok(AnomalyAlertList { alerts, node: self.options.node.clone() })
    }

    async fn list_anomalies(&self, request: ListAnomaliesRequest) -> ServiceResult<AnomalyAlertList> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let limit = match request.limit {
            0 => DEFAULT_ANOMALIES,
            given => given.min(MAX_ANOMALIES),
        };
        let alerts = self.detectors().get(tenant_id).map(|detector| detector.alerts(limit as usize)).unwrap_or_default();
        Ok(AnomalyAlertList { alerts, node: self.options.node.clone() })
    }

    async fn export_baselines(&self, request: TenantRef) -> ServiceResult<BaselineList> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let baselines = self.detectors().get(tenant_id).map(Detector::baselines).unwrap_or_default();
        Ok(BaselineList { baselines, node: self.options.node.clone() })
    }

    async fn import_baselines(&self, request: ImportBaselinesRequest) -> ServiceResult<ImportBaselinesResponse> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let mut detectors = self.detectors();
        let imported = detectors
            .entry(tenant_id.to_string())
            .or_default()
            .import(&request.baselines)
            .map_err(|error| ServiceError::invalid("invalid_baseline", error))?;
        Ok(ImportBaselinesResponse { imported: u32::try_from(imported).unwrap_or(u32::MAX) })
    }

    async fn get_anomaly_stats(&self, request: AnomalyStatsRef) -> ServiceResult<MetricStats> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let key = SeriesKey { entity_type: request.entity_type, entity_id: request.entity_id, metric: request.metric };
        self.detectors().get(tenant_id).and_then(|detector| detector.stats(&key)).ok_or_else(|| {
            ServiceError::not_found(
                "anomaly_stats_not_found",
                format!("no observations of {}/{}/{}", key.entity_type, key.entity_id, key.metric),
            )
        })
    }

    async fn resolve_approval(&self, request: ResolveApprovalRequest) -> ServiceResult<ApprovalResolution> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let tool_name = required("tool_name", &request.tool_name)?;
        let request_id = required("request_id", &request.request_id)?;
        if request.argument_hash.len() != 64 || !request.argument_hash.chars().all(|character| character.is_ascii_hexdigit()) {
            return Err(ServiceError::invalid("invalid_argument_hash", "argument_hash must be a SHA-256 hex digest"));
        }
        let surface = if request.surface.is_empty() { "chat_completions" } else { request.surface.as_str() };
        let now = self.now_text();
        let usable = self.store.usable_allowances(tenant_id, tool_name, &request.argument_hash, &now).await.map_err(store_failure)?;
        for id in usable {
            // Another request may consume the same allowance first: the conditional update decides.
            if self.store.consume_allowance(&id, request_id, &now).await.map_err(store_failure)? {
                tracing::info!(tenant_id, tool = tool_name, approval_id = id, request_id, "approval allowance consumed");
                let approval = self.approval_or_not_found(tenant_id, &id).await?;
                return Ok(ApprovalResolution { allowed: true, approval: Some(approval) });
            }
        }
        let approval = self.queue_pending(&request, surface).await?;
        Ok(ApprovalResolution { allowed: false, approval: Some(approval) })
    }

    async fn list_pending_approvals(&self, request: TenantRef) -> ServiceResult<ApprovalList> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        Ok(ApprovalList { approvals: self.store.pending_approvals(tenant_id).await.map_err(store_failure)? })
    }

    async fn approve_approval(&self, request: ApproveApprovalRequest) -> ServiceResult<Approval> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let reviewed_by = required("reviewed_by", &request.reviewed_by)?;
        let scope = ApprovalScope::parse(&request.scope)
            .ok_or_else(|| ServiceError::invalid("invalid_scope", format!("scope `{}` is not exact or tool", request.scope)))?;
        let note = request.review_note.as_deref().map(str::trim).filter(|note| !note.is_empty());
        let approval = self.approval_or_not_found(tenant_id, &request.id).await?;
        if approval.status == PENDING && is_high_risk_tool(&approval.tool_name) && note.is_none() {
            return Err(ServiceError::invalid(
                "review_note_required",
                format!("`{}` is a high-risk tool: approving it needs a review note", approval.tool_name),
            ));
        }
        if note.is_some_and(|note| note.chars().count() > MAX_REASON_CHARS) {
            return Err(ServiceError::invalid(
                "review_note_too_long",
                format!("the review note is limited to {MAX_REASON_CHARS} characters"),
            ));
        }
        let approved = self.review(tenant_id, &request.id, APPROVED, Some(scope), note, reviewed_by).await?;
        tracing::info!(tenant_id, approval_id = approved.id, reviewed_by, scope = scope.as_str(), "tool call approved");
        Ok(approved)
    }

    async fn deny_approval(&self, request: DenyApprovalRequest) -> ServiceResult<Approval> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let reviewed_by = required("reviewed_by", &request.reviewed_by)?;
        let note = request.review_note.as_deref().map(str::trim).filter(|note| !note.is_empty());
        self.review(tenant_id, &request.id, DENIED, None, note, reviewed_by).await
    }

    async fn get_approval(&self, request: ApprovalRef) -> ServiceResult<Approval> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        self.approval_or_not_found(tenant_id, &request.id).await
    }

    async fn get_guardian_config(&self, request: TenantRef) -> ServiceResult<GuardianConfig> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let (guardrails, guardrails_updated) = self.guardrail_config_of(tenant_id).await?;
        let (firewall, firewall_updated) = self.firewall_config_of(tenant_id).await?;
        let ruleset = self.ruleset_of(tenant_id).await?.map(|(stored, rules)| Self::ruleset_proto(tenant_id, &stored, &rules));
        let registered = self.store.guardrail_providers(tenant_id).await.map_err(store_failure)?;
        let external_providers =
            guardrails.enabled_external_ids().into_iter().filter(|id| registered.iter().any(|record| record.provider_id == *id)).collect();
        let agent_risks = self.store.agent_risks(tenant_id, &self.now_text()).await.map_err(store_failure)?;
        Ok(GuardianConfig {
            tenant_id: tenant_id.to_string(),
            guardrails: Some(guardrails.to_proto(tenant_id, guardrails_updated)),
            firewall: Some(firewall.to_proto(tenant_id, firewall_updated)),
            ruleset,
            external_providers,
            agent_risks,
        })
    }

    async fn set_agent_risk(&self, request: SetAgentRiskRequest) -> ServiceResult<AgentRisk> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let agent_id = required("agent_id", &request.agent_id)?;
        let source = required("source", request.source.trim())?;
        if agent_id.chars().count() > MAX_RISK_FIELD_CHARS || source.chars().count() > MAX_RISK_FIELD_CHARS {
            return Err(ServiceError::invalid(
                "invalid_risk",
                format!("agent_id and source are at most {MAX_RISK_FIELD_CHARS} characters"),
            ));
        }
        if !(0.0..=1.0).contains(&request.risk_score) {
            return Err(ServiceError::invalid("invalid_risk", "risk_score is a number from 0 to 1"));
        }
        if !(1..=MAX_RISK_TTL_SECONDS).contains(&request.ttl_seconds) {
            return Err(ServiceError::invalid("invalid_risk", format!("ttl_seconds is from 1 to {MAX_RISK_TTL_SECONDS}")));
        }
        let now = self.now();
        let ttl = chrono::Duration::seconds(i64::try_from(request.ttl_seconds).unwrap_or(i64::MAX));
        let risk = AgentRisk {
            tenant_id: tenant_id.to_string(),
            agent_id: agent_id.to_string(),
            risk_score: (request.risk_score * 1_000_000.0).round() / 1_000_000.0,
            source: source.to_string(),
            set_at: format_timestamp(now),
            expires_at: format_timestamp(now + ttl),
        };
        self.store.put_agent_risk(&risk).await.map_err(store_failure)?;
        self.publish_config_change(tenant_id, "agent_risks").await;
        Ok(risk)
    }

    async fn clear_agent_risk(&self, request: AgentRiskRef) -> ServiceResult<ClearAgentRiskResponse> {
        let tenant_id = required("tenant_id", &request.tenant_id)?;
        let agent_id = required("agent_id", &request.agent_id)?;
        let cleared = self.store.clear_agent_risk(tenant_id, agent_id, &self.now_text()).await.map_err(store_failure)?;
        if cleared {
            self.publish_config_change(tenant_id, "agent_risks").await;
        }
        Ok(ClearAgentRiskResponse { cleared })
    }

    async fn open_liaison(&self, request: OpenLiaisonRequest) -> ServiceResult<LiaisonSession> {
        self.liaison.open(request).await
    }

    async fn get_liaison(&self, request: LiaisonRef) -> ServiceResult<LiaisonSession> {
        self.liaison.get(request).await
    }

    async fn mint_plan(&self, request: MintPlanRequest) -> ServiceResult<LiaisonPlan> {
        self.liaison.mint(request).await
    }

    async fn get_plan(&self, request: PlanRef) -> ServiceResult<LiaisonPlan> {
        self.liaison.get_plan(request).await
    }

    async fn commit_plan(&self, request: CommitPlanRequest) -> ServiceResult<PlanCommit> {
        self.liaison.commit(request).await
    }

    async fn settle_plan(&self, request: SettlePlanRequest) -> ServiceResult<SettlePlanResponse> {
        self.liaison.settle(request).await
    }

    async fn list_liaison_events(&self, request: ListLiaisonEventsRequest) -> ServiceResult<LiaisonEventList> {
        self.liaison.events(request).await
    }

    async fn close_liaison(&self, request: LiaisonRef) -> ServiceResult<LiaisonSession> {
        self.liaison.close(request).await
    }
}

fn store_failure(error: sqlx::Error) -> ServiceError {
    brainstorm_common::store::store_failure(SERVICE, error)
}

fn corrupt(what: &str, error: &dyn std::fmt::Display) -> ServiceError {
    tracing::error!(%error, what, "unreadable policy data");
    ServiceError::internal(format!("unreadable {what}"))
}

/// One warning per anomaly alert.
fn log_alerts(tenant_id: &str, alerts: &[AnomalyAlert]) {
    for alert in alerts {
        tracing::warn!(
            tenant_id,
            entity_type = alert.entity_type,
            entity_id = alert.entity_id,
            metric = alert.metric,
            sigma = alert.sigma,
            "anomaly detected"
        );
    }
}

fn required<'a>(field: &str, value: &'a str) -> ServiceResult<&'a str> {
    let value = value.trim();
    if value.is_empty() {
        return Err(ServiceError::invalid("missing_field", format!("`{field}` is required")));
    }
    if value.chars().count() > MAX_ID_CHARS {
        return Err(ServiceError::invalid("field_too_long", format!("`{field}` is limited to {MAX_ID_CHARS} characters")));
    }
    Ok(value)
}

fn scan_size(text: &str) -> ServiceResult<()> {
    if text.len() > MAX_SCAN_CHARS {
        return Err(ServiceError::new(ErrorKind::InvalidArgument, "text_too_long", format!("texts are limited to {MAX_SCAN_CHARS} bytes")));
    }
    Ok(())
}

/// A scope's type and its id as stored: lowercase, provider ids canonical.
fn scope_key(scope_type: &str, id: &str) -> ServiceResult<(ScopeType, String)> {
    let scope_type = ScopeType::parse(scope_type.trim())
        .ok_or_else(|| ServiceError::invalid("invalid_scope_type", format!("scope type `{scope_type}` is not agent, tool or provider")))?;
    let id = id.trim();
    if id.is_empty() || id.chars().count() > MAX_ID_CHARS {
        return Err(ServiceError::invalid("invalid_scope_id", format!("the scope id must be 1 to {MAX_ID_CHARS} characters")));
    }
    let id = match scope_type {
        ScopeType::Provider => canonical_provider(id),
        ScopeType::Agent | ScopeType::Tool => id.to_ascii_lowercase(),
    };
    Ok((scope_type, id))
}

/// What a sealed provider key is bound to.
fn key_binding(tenant_id: &str, provider_id: &str) -> String {
    format!("policy-guardrail/{tenant_id}/{provider_id}")
}

fn mapping_to_json(mapping: &ResultMapping) -> String {
    json!({"safe": mapping.safe, "confidence": mapping.confidence, "reason": mapping.reason}).to_string()
}

fn mapping_from_json(text: &str) -> Option<ResultMapping> {
    let value: Value = serde_json::from_str(text).ok()?;
    let field = |name: &str| value.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
    Some(ResultMapping { safe: field("safe"), confidence: field("confidence"), reason: field("reason") })
}
