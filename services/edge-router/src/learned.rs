//! What each tenant's own traffic taught routing: the ledger's per-model figures of the last seven
//! days (the leaderboard's: the reward, a Beta posterior of success with the catalog's quality as the
//! prior, and the measured latency and throughput), kept in this edge's memory per tenant and
//! refreshed in the background, so a completion reads them without a round trip.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use brainstorm_proto::budget::{BudgetLedgerClient, ModelStatsRequest};
use brainstorm_providers::catalog::ModelCatalog;
use brainstorm_providers::routing::{Learned, LearnedModel};

use crate::routes::leaderboard;

/// One tenant's figures and when they were last asked for.
struct Entry {
    learned: Arc<Learned>,
    asked_at: Instant,
}

/// Every tenant's learned figures, in this edge's memory.
pub struct LearnedRouting {
    budget: BudgetLedgerClient,
    models: Arc<ModelCatalog>,
    refresh_after: Duration,
    tenants: RwLock<HashMap<String, Entry>>,
}

impl LearnedRouting {
    /// Figures older than `refresh_after` are fetched again (in the background).
    pub fn new(budget: BudgetLedgerClient, models: Arc<ModelCatalog>, refresh_after: Duration) -> Self {
        // At most ten fetches a second per tenant, whatever the configured interval.
        let refresh_after = refresh_after.max(Duration::from_millis(100));
        LearnedRouting { budget, models, refresh_after, tenants: RwLock::new(HashMap::new()) }
    }

    /// The tenant's figures as known now (none yet: empty, the catalog's figures apply); when they are
    /// missing or older than the refresh interval, one fetch starts in the background.
    pub fn get(self: &Arc<Self>, tenant_id: &str) -> Arc<Learned> {
        if let Ok(tenants) = self.tenants.read()
            && let Some(entry) = tenants.get(tenant_id)
            && entry.asked_at.elapsed() < self.refresh_after
        {
            return entry.learned.clone();
        }
        let Ok(mut tenants) = self.tenants.write() else { return Arc::default() };
        let mut ask = false;
        let entry = tenants.entry(tenant_id.to_string()).or_insert_with(|| {
            ask = true;
            Entry { learned: Arc::default(), asked_at: Instant::now() }
        });
        // Whoever finds it stale first asks; the others go on with what is there.
        if ask || entry.asked_at.elapsed() >= self.refresh_after {
            entry.asked_at = Instant::now();
            let this = self.clone();
            let tenant_id = tenant_id.to_string();
            tokio::spawn(async move { this.refresh(tenant_id).await });
        }
        entry.learned.clone()
    }

    async fn refresh(&self, tenant_id: String) {
        let stats = match self.budget.get_model_stats(ModelStatsRequest { tenant_id: tenant_id.clone(), since: None }).await {
            Ok(stats) => stats,
            Err(error) => {
                // The figures already known stay; the next request after the interval asks again.
                tracing::debug!(tenant_id, error = %error.message, "cannot read the model figures routing learns from");
                return;
            }
        };
        let learned: HashMap<String, LearnedModel> = stats
            .models
            .iter()
            .filter(|stats| stats.requests > 0)
            .filter_map(|stats| {
                let (provider, model) = stats.model.split_once('/')?;
                let model = self.models.find(provider, model)?;
                let observed = leaderboard::observed(stats);
                let figures = LearnedModel {
                    reward: leaderboard::reward(model, Some(stats)),
                    latency_ms: observed.latency_ms,
                    tokens_per_second: observed.tokens_per_second,
                };
                Some((stats.model.clone(), figures))
            })
            .collect();
        if let Ok(mut tenants) = self.tenants.write() {
            let asked_at = tenants.get(&tenant_id).map_or_else(Instant::now, |entry| entry.asked_at);
            tenants.insert(tenant_id, Entry { learned: Arc::new(Learned::new(learned)), asked_at });
        }
    }
}
