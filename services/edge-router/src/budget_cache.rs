//! Tenant budget limits, agent budgets and per-agent limits, fetched from budget-ledger once and kept
//! in memory, so a completion reserves against in-memory (or Redis) counters without a database
//! round trip. Writes through this edge evict at once; entries expire after a TTL regardless.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use brainstorm_common::ApiError;
use brainstorm_common::collections::HashMap;
use brainstorm_proto::ErrorKind;
use brainstorm_proto::budget::{AgentBudget, AgentLimit, AgentLimits, AgentRef, BudgetLedgerClient, TenantLimits, TenantRef};

struct Entry<T> {
    value: T,
    fetched_at: Instant,
}

/// Agent budgets by (tenant id, agent id); None caches "no budget configured".
type AgentBudgets = HashMap<(String, String), Entry<Option<AgentBudget>>>;

/// The cache.
pub struct BudgetSettingsCache {
    ledger: BudgetLedgerClient,
    ttl: Duration,
    limits: RwLock<HashMap<String, Entry<TenantLimits>>>,
    agents: RwLock<AgentBudgets>,
    agent_limits: RwLock<HashMap<String, Entry<Arc<AgentLimits>>>>,
}

fn fresh<K: std::hash::Hash + Eq, T: Clone>(map: &RwLock<HashMap<K, Entry<T>>>, key: &K, ttl: Duration) -> Option<T> {
    let map = map.read().ok()?;
    let entry = map.get(key)?;
    (entry.fetched_at.elapsed() < ttl).then(|| entry.value.clone())
}

fn store<K: std::hash::Hash + Eq, T>(map: &RwLock<HashMap<K, Entry<T>>>, key: K, value: T) {
    if let Ok(mut map) = map.write() {
        map.insert(key, Entry { value, fetched_at: Instant::now() });
    }
}

impl BudgetSettingsCache {
    /// A cache in front of budget-ledger.
    pub fn new(ledger: BudgetLedgerClient, ttl: Duration) -> Self {
        BudgetSettingsCache {
            ledger,
            ttl,
            limits: RwLock::new(HashMap::default()),
            agents: RwLock::new(HashMap::default()),
            agent_limits: RwLock::new(HashMap::default()),
        }
    }

    /// The tenant's own limits.
    pub async fn limits(&self, tenant_id: &str) -> Result<TenantLimits, ApiError> {
        if let Some(limits) = fresh(&self.limits, &tenant_id.to_string(), self.ttl) {
            return Ok(limits);
        }
        let limits = self.ledger.get_limits(TenantRef { tenant_id: tenant_id.to_string() }).await?;
        store(&self.limits, tenant_id.to_string(), limits.clone());
        Ok(limits)
    }

    /// An agent's budget, if one is configured.
    pub async fn agent(&self, tenant_id: &str, agent_id: &str) -> Result<Option<AgentBudget>, ApiError> {
        let key = (tenant_id.to_string(), agent_id.to_string());
        if let Some(budget) = fresh(&self.agents, &key, self.ttl) {
            return Ok(budget);
        }
        let budget = match self.ledger.get_agent_budget(AgentRef { tenant_id: key.0.clone(), agent_id: key.1.clone() }).await {
            Ok(budget) => Some(budget),
            Err(error) if error.kind == ErrorKind::NotFound => None,
            Err(error) => return Err(error.into()),
        };
        store(&self.agents, key, budget.clone());
        Ok(budget)
    }

    /// The tenant's per-agent limits (`/v1/agent-limits`), all of them.
    pub async fn agent_limits(&self, tenant_id: &str) -> Result<Arc<AgentLimits>, ApiError> {
        if let Ok(map) = self.agent_limits.read()
            && let Some(entry) = map.get(tenant_id)
            && entry.fetched_at.elapsed() < self.ttl
        {
            return Ok(entry.value.clone());
        }
        let limits = Arc::new(self.ledger.get_agent_limits(TenantRef { tenant_id: tenant_id.to_string() }).await?);
        store(&self.agent_limits, tenant_id.to_string(), limits.clone());
        Ok(limits)
    }

    /// One agent's entry of the tenant's per-agent limits, if it has one.
    pub async fn agent_limit(&self, tenant_id: &str, agent_id: &str) -> Result<Option<AgentLimit>, ApiError> {
        Ok(self.agent_limits(tenant_id).await?.limits.get(agent_id).copied())
    }

    /// Forgets a tenant's limits and agent budgets.
    pub fn evict(&self, tenant_id: &str) {
        if let Ok(mut limits) = self.limits.write() {
            limits.remove(tenant_id);
        }
        if let Ok(mut agents) = self.agents.write() {
            agents.retain(|(tenant, _), _| tenant != tenant_id);
        }
        if let Ok(mut agent_limits) = self.agent_limits.write() {
            agent_limits.remove(tenant_id);
        }
    }
}
