//! `GET /v1/self`'s one-call view: who the caller is and what it may do (fresh), the tenant's health,
//! budget, memory and configuration (kept 30 s per tenant, as the spec says), the caller's recent
//! errors, and the suggestions these add up to.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brainstorm_common::ApiError;
use brainstorm_proto::budget::GetStatusRequest;
use brainstorm_proto::policy::TenantRef as PolicyTenantRef;
use brainstorm_proto::prompts::{MemoryKey, MemoryQuery};
use serde_json::{Map, Value, json};

use crate::EdgeState;
use crate::circuits::CircuitState;
use crate::routes::budget::{optional_usd, usd};
use crate::sentinel::{Probe, providers_among};

/// How long a tenant's part of the view is reused.
const TENANT_VIEW_TTL: Duration = Duration::from_secs(30);
/// Most tenants whose view is kept; past it the cache starts over.
const MAX_TENANT_VIEWS: usize = 10_000;
/// Errors kept per caller, newest first.
const RECENT_ERRORS: usize = 10;
/// Most callers whose errors are kept; past it the oldest half is forgotten.
const MAX_CALLERS: usize = 10_000;
/// The roles there are, most powerful first (`auditor` reads what `operator` reads, writes nothing).
const ROLE_HIERARCHY: [&str; 5] = ["admin", "operator", "developer", "agent", "auditor"];
/// What the gateway keeps of requests: the audit trail holds metadata and digests; prompt and
/// completion text are never stored.
pub const PRIVACY_MODE: &str = "metadata_only";
/// A period with less than this share of its limit left suggests raising it.
const LOW_BUDGET_SHARE: f64 = 0.10;

/// Who is asking, as the view shows it.
pub struct Principal<'a> {
    pub tenant_id: &'a str,
    /// `api_key` or `agent_jwt`.
    pub auth_method: &'static str,
    pub key_id: Option<&'a str>,
    pub agent_id: Option<&'a str>,
    pub roles: Vec<String>,
    pub scopes: Vec<String>,
    pub permissions: Vec<String>,
}

/// The self view's name of a memory block: the spec names the view's blocks semantic, episodic,
/// procedural and system, and the stored ones human, project, system and general; `system` is both,
/// and the other three pair in the spec's order (facts about the people served, what happened in the
/// work, general know-how). Each view block also names its stored block.
fn self_view_name(block: &str) -> Option<&'static str> {
    match block {
        "human" => Some("semantic"),
        "project" => Some("episodic"),
        "general" => Some("procedural"),
        "system" => Some("system"),
        _ => None,
    }
}

/// The last errors answered to each caller (an API key or an agent), newest first, in memory.
#[derive(Default)]
pub struct RecentErrors {
    inner: Mutex<ErrorLog>,
}

#[derive(Default)]
struct ErrorLog {
    /// Bumped by every error: a caller's stamp says how recently it had one.
    stamp: u64,
    callers: HashMap<String, (u64, VecDeque<Value>)>,
}

impl RecentErrors {
    /// Notes an error answered to `caller`.
    pub fn record(&self, caller: &str, error: Value) {
        let mut log = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if log.callers.len() >= MAX_CALLERS && !log.callers.contains_key(caller) {
            // Forget the half of the callers whose last error is oldest (rare: one pass per 5,000 new callers).
            let mut stamps: Vec<u64> = log.callers.values().map(|(stamp, _)| *stamp).collect();
            stamps.sort_unstable();
            let cut = stamps[stamps.len() / 2];
            log.callers.retain(|_, (stamp, _)| *stamp > cut);
        }
        log.stamp += 1;
        let stamp = log.stamp;
        let entry = log.callers.entry(caller.to_string()).or_default();
        entry.0 = stamp;
        entry.1.push_front(error);
        entry.1.truncate(RECENT_ERRORS);
    }

    /// The caller's recent errors, newest first.
    pub fn of(&self, caller: &str) -> Vec<Value> {
        let log = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        log.callers.get(caller).map(|(_, errors)| errors.iter().cloned().collect()).unwrap_or_default()
    }
}

/// What the view keeps per tenant.
#[derive(Default)]
pub struct TenantViews {
    views: Mutex<HashMap<String, (Instant, Arc<TenantView>)>>,
}

/// A tenant's part of the view.
struct TenantView {
    health: Value,
    budget: Value,
    memory: Value,
    configuration: Value,
    models_available: usize,
    /// Facts the suggestions read.
    has_provider_keys: bool,
    guardrails_enabled: bool,
    has_agents: bool,
    memory_empty: bool,
    circuits_open: usize,
    kill_switch_active: bool,
    low_budget: bool,
    has_aliases: bool,
}

impl TenantViews {
    async fn get(&self, state: &EdgeState, tenant_id: &str) -> Result<Arc<TenantView>, ApiError> {
        let cached = self
            .views
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(tenant_id)
            .filter(|(at, _)| at.elapsed() < TENANT_VIEW_TTL)
            .map(|(_, view)| view.clone());
        if let Some(view) = cached {
            return Ok(view);
        }
        let view = Arc::new(tenant_view(state, tenant_id).await?);
        let mut views = self.views.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if views.len() >= MAX_TENANT_VIEWS {
            views.clear();
        }
        views.insert(tenant_id.to_string(), (Instant::now(), view.clone()));
        Ok(view)
    }
}

/// `{spent_usd, limit_usd, remaining_usd}` of a period, and whether less than a tenth is left.
fn period_view(status: Option<&brainstorm_proto::budget::PeriodStatus>) -> (Value, bool) {
    let Some(status) = status else { return (Value::Null, false) };
    let low = match (status.limit_nanos, status.remaining_nanos) {
        (Some(limit), Some(remaining)) if limit > 0 => (remaining as f64) < (limit as f64) * LOW_BUDGET_SHARE,
        _ => false,
    };
    let view = json!({
        "spent_usd": usd(status.spent_nanos),
        "limit_usd": optional_usd(status.limit_nanos),
        "remaining_usd": optional_usd(status.remaining_nanos),
    });
    (view, low)
}

async fn tenant_view(state: &EdgeState, tenant_id: &str) -> Result<TenantView, ApiError> {
    let config = state.routing.get(tenant_id).await?;
    let keyed = providers_among(&config.routing.providers);
    state.sentinel.watch(&keyed).await;

    // Health: the keyed providers' probes and their models' circuits.
    let mut providers = Map::new();
    for provider in &keyed {
        providers.insert(provider.id.to_string(), Probe::view(state.sentinel.last(provider.id).as_ref()));
    }
    let models: Vec<String> =
        state.models.models().iter().filter(|model| config.routing.providers.contains(&model.provider)).map(|model| model.id()).collect();
    let circuits_open = models.iter().filter(|model| state.circuits.state(model).0 == CircuitState::Open).count();
    let health = json!({
        "providers": providers,
        "circuit_breakers": {"total": models.len(), "open": circuits_open, "closed": models.len() - circuits_open},
    });
    let models_available = if keyed.is_empty() { 1 } else { models.len() - circuits_open };

    let budget_request = GetStatusRequest { tenant_id: tenant_id.to_string(), ..GetStatusRequest::default() };
    let status = state.budget.get_status(budget_request).await?;
    let (daily, daily_low) = period_view(status.daily.as_ref());
    let (monthly, monthly_low) = period_view(status.monthly.as_ref());
    let budget = json!({"daily": daily, "monthly": monthly});

    // Memory: the tenant's default memory (no memory key), when prompts-eval is reachable from here.
    let memory = match &state.prompts {
        Some(prompts) => {
            let key = MemoryKey { tenant_id: tenant_id.to_string(), memory_key: String::new() };
            let view = prompts.list_memory(MemoryQuery { key: Some(key), ..MemoryQuery::default() }).await?;
            let blocks: Map<String, Value> = view
                .blocks
                .iter()
                .map(|block| {
                    let name = self_view_name(&block.name).unwrap_or(&block.name).to_string();
                    (name, json!({"block": block.name, "count": block.count, "limit": block.limit, "pinned": block.pinned_count}))
                })
                .collect();
            let pinned: u32 = view.blocks.iter().map(|block| block.pinned_count).sum();
            json!({"total_entries": view.total_core_entries + view.total_archival_entries, "blocks": blocks, "pinned": pinned})
        }
        None => Value::Null,
    };
    let memory_empty = memory["total_entries"].as_u64() == Some(0);

    let guardian = state.guardian.config(tenant_id).await?;
    let guardrails = guardian.guardrails.config();
    let switch = state.policy.get_kill_switch_status(PolicyTenantRef { tenant_id: tenant_id.to_string() }).await?;
    let configuration = json!({
        "guardrails": {"enabled": guardrails.enabled, "mode": guardrails.mode.as_str()},
        "guardian": {"mode": guardian.firewall.config().mode.as_str()},
        "kill_switch": {"active": switch.active, "reason": switch.reason},
        "privacy_mode": PRIVACY_MODE,
    });
    let agents = state.identity.list_agent_profiles(brainstorm_proto::identity::TenantRef { tenant_id: tenant_id.to_string() }).await?;
    Ok(TenantView {
        health,
        budget,
        memory,
        configuration,
        models_available,
        has_provider_keys: !keyed.is_empty(),
        guardrails_enabled: guardrails.enabled,
        has_agents: !agents.profiles.is_empty(),
        memory_empty,
        circuits_open,
        kill_switch_active: switch.active,
        low_budget: daily_low || monthly_low,
        has_aliases: !config.routing.aliases.is_empty(),
    })
}

fn suggestion(action: &str, reason: &str, endpoint: &str) -> Value {
    json!({"action": action, "reason": reason, "endpoint": endpoint})
}

/// The spec's suggestions, in its order, for what the view found.
fn suggestions(view: &TenantView, is_agent: bool) -> Vec<Value> {
    let mut suggestions = Vec::new();
    if !view.has_provider_keys {
        suggestions.push(suggestion("register_provider", "no provider key is registered: only the sandbox model answers", "/v1/providers"));
    }
    if !view.guardrails_enabled {
        suggestions.push(suggestion("enable_guardrails", "guardrails are off: prompts are not screened", "/v1/guardrails/config"));
    }
    if !is_agent && !view.has_agents {
        suggestions.push(suggestion("bootstrap_agent", "no agent identity exists for this tenant", "/v1/agent/bootstrap"));
    }
    if view.memory_empty {
        suggestions.push(suggestion("store_memory", "agent memory is empty", "/v1/memory/entries"));
    }
    if view.circuits_open > 0 {
        suggestions.push(suggestion("check_health", "some models' circuits are open after provider failures", "/v1/health/providers"));
    }
    if view.kill_switch_active {
        suggestions.push(suggestion(
            "deactivate_killswitch",
            "the kill switch is active: completions are refused",
            "/v1/killswitch/deactivate",
        ));
    }
    if view.low_budget {
        suggestions.push(suggestion("increase_budget", "less than 10% of a budget limit remains", "/v1/budget/limits"));
    }
    if !view.has_aliases {
        suggestions.push(suggestion("configure_aliases", "no model aliases are configured", "/v1/aliases"));
    }
    suggestions
}

/// The whole view for `principal`.
pub async fn render(state: &EdgeState, principal: Principal<'_>) -> Result<Value, ApiError> {
    let view = state.tenant_views.get(state, principal.tenant_id).await?;
    let caller = principal.agent_id.or(principal.key_id).unwrap_or_default();
    Ok(json!({
        "identity": {
            "tenant_id": principal.tenant_id,
            "auth_method": principal.auth_method,
            "key_id": principal.key_id,
            "agent_id": principal.agent_id,
            "roles": principal.roles,
            "scopes": principal.scopes,
        },
        "capabilities": {"granted": principal.permissions, "role_hierarchy": ROLE_HIERARCHY},
        "health": view.health,
        "budget": view.budget,
        "memory": view.memory,
        "configuration": view.configuration,
        "suggestions": suggestions(&view, principal.agent_id.is_some()),
        "recent_errors": state.recent_errors.of(caller),
        "models_available": view.models_available,
        "endpoints": {
            "chat_completions": "/v1/chat/completions",
            "messages": "/v1/messages",
            "models": "/v1/models",
            "runnable": "/v1/catalog/runnable",
            "health": "/v1/health/providers",
            "budget": "/v1/budget/status",
            "memory": "/v1/memory",
            "killswitch": "/v1/killswitch/status",
            "explain": "/v1/explain/{request_id}",
            "self": "/v1/self",
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_errors_keep_the_newest_ten_per_caller() {
        let errors = RecentErrors::default();
        for index in 0..12 {
            errors.record("key_a", json!({"n": index}));
        }
        errors.record("key_b", json!({"n": 100}));
        let of_a = errors.of("key_a");
        assert_eq!(of_a.len(), RECENT_ERRORS);
        assert_eq!((of_a[0]["n"].as_u64(), of_a[9]["n"].as_u64()), (Some(11), Some(2)));
        assert_eq!(errors.of("key_b").len(), 1);
        assert!(errors.of("key_c").is_empty());
    }

    #[test]
    fn a_limit_with_under_a_tenth_left_is_low() {
        let status = |limit, remaining| brainstorm_proto::budget::PeriodStatus {
            spent_nanos: 0,
            limit_nanos: limit,
            remaining_nanos: remaining,
            ..Default::default()
        };
        assert!(period_view(Some(&status(Some(1_000), Some(99)))).1);
        assert!(!period_view(Some(&status(Some(1_000), Some(100)))).1);
        assert!(!period_view(Some(&status(None, None))).1);
        assert_eq!(period_view(None), (Value::Null, false));
    }
}
