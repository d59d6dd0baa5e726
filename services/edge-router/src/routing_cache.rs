//! Each tenant's routing configuration (decrypted provider keys, aliases, presets), fetched from the
//! catalog once and kept in memory: the hot path makes no call per request. Changes made through this
//! edge evict at once; changes seen on the bus evict everywhere; entries expire after a TTL regardless.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use brainstorm_common::ApiError;
use brainstorm_common::bus::EventBus;
use brainstorm_common::collections::HashMap;
use brainstorm_common::money::Usd;
use brainstorm_proto::catalog::{CatalogClient, Preset, TenantRef};
use brainstorm_proto::events::{CATALOG_EVENTS_TOPIC, RoutingConfigChanged};
use brainstorm_providers::routing::{PresetSpec, RouteOptions, TenantRouting};
use serde_json::Value;

/// What the edge holds for one tenant.
pub struct TenantConfig {
    pub routing: TenantRouting,
    /// Plaintext provider keys by provider id; never logged, never returned.
    credentials: HashMap<String, String>,
}

impl TenantConfig {
    /// The tenant's key for a provider.
    pub fn credential(&self, provider: &str) -> Option<&str> {
        self.credentials.get(provider).map(String::as_str)
    }
}

impl std::fmt::Debug for TenantConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("TenantConfig").field("providers", &self.routing.providers).finish_non_exhaustive()
    }
}

struct Entry {
    config: Arc<TenantConfig>,
    fetched_at: Instant,
}

/// The cache.
pub struct RoutingCache {
    catalog: CatalogClient,
    ttl: Duration,
    entries: RwLock<HashMap<String, Entry>>,
}

impl RoutingCache {
    /// A cache in front of `catalog`.
    pub fn new(catalog: CatalogClient, ttl: Duration) -> Self {
        RoutingCache { catalog, ttl, entries: RwLock::new(HashMap::default()) }
    }

    /// The tenant's configuration, from memory when fresh.
    pub async fn get(&self, tenant_id: &str) -> Result<Arc<TenantConfig>, ApiError> {
        if let Some(config) = self.cached(tenant_id) {
            return Ok(config);
        }
        let fetched = self.catalog.get_routing_config(TenantRef { tenant_id: tenant_id.to_string() }).await?;
        let mut providers = Vec::new();
        let mut credentials = HashMap::default();
        for credential in fetched.credentials {
            providers.push(credential.provider.clone());
            credentials.insert(credential.provider, credential.api_key);
        }
        let routing = TenantRouting {
            providers,
            aliases: fetched.aliases.into_iter().collect::<BTreeMap<_, _>>(),
            presets: fetched.presets.iter().map(preset_spec).collect(),
        };
        let config = Arc::new(TenantConfig { routing, credentials });
        if let Ok(mut entries) = self.entries.write() {
            entries.insert(tenant_id.to_string(), Entry { config: config.clone(), fetched_at: Instant::now() });
        }
        Ok(config)
    }

    fn cached(&self, tenant_id: &str) -> Option<Arc<TenantConfig>> {
        let entries = self.entries.read().ok()?;
        let entry = entries.get(tenant_id)?;
        (entry.fetched_at.elapsed() < self.ttl).then(|| entry.config.clone())
    }

    /// Forgets a tenant's configuration.
    pub fn evict(&self, tenant_id: &str) {
        if let Ok(mut entries) = self.entries.write() {
            entries.remove(tenant_id);
        }
    }

    /// Applies catalog change events from the bus until it closes.
    pub async fn follow_catalog_events(self: Arc<Self>, bus: Arc<dyn EventBus>, group: String) {
        let mut subscription = match bus.subscribe(CATALOG_EVENTS_TOPIC, &group).await {
            Ok(subscription) => subscription,
            Err(error) => {
                tracing::error!(%error, "cannot follow catalog events: routing configuration expires by TTL only");
                return;
            }
        };
        while let Ok(delivery) = subscription.next().await {
            match delivery.message().decode::<RoutingConfigChanged>() {
                Ok(changed) => self.evict(&changed.tenant_id),
                Err(error) => tracing::warn!(%error, "skipping undecodable catalog event"),
            }
            delivery.ack();
        }
    }
}

/// A stored preset as the resolver wants it.
fn preset_spec(preset: &Preset) -> PresetSpec {
    let options: Value = serde_json::from_str(&preset.options_json).unwrap_or(Value::Null);
    PresetSpec {
        slug: preset.slug.clone(),
        models: preset.models.clone(),
        strategy: preset.strategy.clone(),
        options: route_options(&options).unwrap_or_default(),
    }
}

/// Reads a `route` object (`strategy`, `models`, `allowFallback`, `providerAllow`, `providerDeny`,
/// `maxCostPerRequest`); the error names the offending field.
pub fn route_options(route: &Value) -> Result<RouteOptions, String> {
    if route.is_null() {
        return Ok(RouteOptions::default());
    }
    if !route.is_object() {
        return Err("route must be an object".to_string());
    }
    let strings = |field: &str| -> Result<Vec<String>, String> {
        match route.get(field) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| item.as_str().map(str::to_string).ok_or_else(|| format!("route.{field} must hold strings")))
                .collect(),
            Some(_) => Err(format!("route.{field} must be an array of strings")),
        }
    };
    let strategy = match route.get("strategy") {
        None | Some(Value::Null) => None,
        Some(Value::String(strategy)) if brainstorm_providers::routing::STRATEGIES.contains(&strategy.as_str()) => Some(strategy.clone()),
        Some(_) => return Err(format!("route.strategy must be one of {}", brainstorm_providers::routing::STRATEGIES.join(", "))),
    };
    let allow_fallback = match route.get("allowFallback") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(allow)) => Some(*allow),
        Some(_) => return Err("route.allowFallback must be a boolean".to_string()),
    };
    let max_cost_per_request = match route.get("maxCostPerRequest") {
        None | Some(Value::Null) => None,
        Some(Value::Number(number)) => Some(Usd::from_json_number(number).map_err(|error| format!("route.maxCostPerRequest: {error}"))?),
        Some(_) => return Err("route.maxCostPerRequest must be a number (USD)".to_string()),
    };
    Ok(RouteOptions {
        strategy,
        models: strings("models")?,
        allow_fallback,
        provider_allow: strings("providerAllow")?,
        provider_deny: strings("providerDeny")?,
        max_cost_per_request,
    })
}
