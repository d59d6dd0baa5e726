//! The catalog service's rules over its store.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use brainstorm_common::bus::EventBus;
use brainstorm_common::store::{Database, is_unique_violation};
use brainstorm_common::time::now_timestamp;
use brainstorm_proto::catalog::*;
use brainstorm_proto::events::{CATALOG_EVENTS_TOPIC, RoutingConfigChanged};
use brainstorm_proto::{ServiceError, ServiceResult};
use brainstorm_providers::catalog::{base_url, provider_by_id};
use brainstorm_providers::routing::STRATEGIES;
use brainstorm_providers::upstream::{UpstreamClient, UpstreamError};
use brainstorm_providers::vault::{self, MasterKey};
use prost::Message;

use crate::store::{CatalogStore, StoredKey};

const MAX_ALIASES: usize = 500;
const MAX_PRESET_MODELS: usize = 20;

/// What the catalog needs besides its store.
#[derive(Debug, Clone)]
pub struct CatalogOptions {
    pub master_key: MasterKey,
    /// `BR_PROVIDER_<ID>_BASE_URL` overrides, by provider id.
    pub base_urls: BTreeMap<String, String>,
}

/// The catalog service.
#[derive(Clone)]
pub struct CatalogServiceImpl {
    store: CatalogStore,
    bus: Arc<dyn EventBus>,
    upstream: UpstreamClient,
    options: Arc<CatalogOptions>,
}

impl CatalogServiceImpl {
    /// The service over a migrated database.
    pub fn new(database: Database, bus: Arc<dyn EventBus>, upstream: UpstreamClient, options: CatalogOptions) -> Self {
        CatalogServiceImpl { store: CatalogStore::new(database), bus, upstream, options: Arc::new(options) }
    }

    async fn changed(&self, tenant_id: &str) {
        let event = RoutingConfigChanged { tenant_id: tenant_id.to_string(), occurred_at: now_timestamp() };
        if let Err(error) = self.bus.publish(CATALOG_EVENTS_TOPIC, tenant_id, event.encode_to_vec().into()).await {
            tracing::warn!(%error, tenant_id, "could not publish a routing configuration change");
        }
    }

    async fn validate(&self, provider_id: &str, api_key: &str) -> ServiceResult<Result<(), UpstreamError>> {
        let provider = provider_by_id(provider_id).ok_or_else(|| {
            ServiceError::invalid("unknown_provider", format!("unknown provider `{provider_id}`: see GET /v1/providers/catalog"))
        })?;
        if api_key.trim().is_empty() && provider.auth != brainstorm_providers::catalog::AuthStyle::None {
            return Err(ServiceError::invalid("missing_field", "api_key is required"));
        }
        Ok(self.upstream.validate_key(provider, base_url(provider, &self.options.base_urls), api_key.trim()).await)
    }
}

fn binding(tenant_id: &str, provider: &str, key_id: &str) -> String {
    format!("{tenant_id}/{provider}/{key_id}")
}

#[async_trait]
impl CatalogService for CatalogServiceImpl {
    async fn test_provider_key(&self, request: TestProviderKeyRequest) -> ServiceResult<TestProviderKeyResponse> {
        let outcome = self.validate(&request.provider, &request.api_key).await?;
        let name = provider_by_id(&request.provider).map(|provider| provider.name).unwrap_or_default().to_string();
        let (valid, status, message) = match outcome {
            Ok(()) => (true, "valid", String::new()),
            Err(UpstreamError::Status { status: 401 | 403, message }) => (false, "invalid", message),
            Err(error) => (false, "unreachable", error.to_string()),
        };
        Ok(TestProviderKeyResponse { valid, provider: request.provider, name, status: status.to_string(), message })
    }

    async fn register_provider_key(&self, request: RegisterProviderKeyRequest) -> ServiceResult<ProviderKey> {
        match self.validate(&request.provider, &request.api_key).await? {
            Ok(()) => {}
            Err(UpstreamError::Status { status: status @ (401 | 403), message }) => {
                return Err(ServiceError::invalid(
                    "invalid_provider_key",
                    format!("{} refused the key ({status}): {message}", request.provider),
                ));
            }
            Err(error) => {
                return Err(ServiceError::unavailable(
                    "provider_unreachable",
                    format!("could not validate the key with {}: {error}", request.provider),
                ));
            }
        }
        let api_key = request.api_key.trim();
        let id = uuid::Uuid::new_v4().to_string();
        let now = now_timestamp();
        let sealed = vault::seal(&self.options.master_key, api_key, &binding(&request.tenant_id, &request.provider, &id))
            .map_err(|error| ServiceError::internal(error.to_string()))?;
        let name = if request.name.trim().is_empty() { request.provider.clone() } else { request.name.trim().chars().take(128).collect() };
        let key = ProviderKey {
            id,
            tenant_id: request.tenant_id.clone(),
            provider: request.provider.clone(),
            name,
            masked_key: vault::mask(api_key),
            status: "active".to_string(),
            created_at: now.clone(),
            deactivated_at: None,
        };
        let stored = StoredKey { key: key.clone(), sealed };
        if let Err(error) = self.store.insert_rotating(&stored, &now).await {
            return Err(if is_unique_violation(&error) {
                ServiceError::conflict("concurrent_registration", "another key for this provider was registered at the same moment; retry")
            } else {
                store_failure(error)
            });
        }
        tracing::info!(tenant_id = %key.tenant_id, provider = %key.provider, key_id = %key.id, "provider key registered");
        self.changed(&request.tenant_id).await;
        Ok(key)
    }

    async fn list_provider_keys(&self, request: TenantRef) -> ServiceResult<ProviderKeyList> {
        let keys = self.store.keys(&request.tenant_id).await.map_err(store_failure)?;
        Ok(ProviderKeyList { keys: keys.into_iter().map(|stored| stored.key).collect() })
    }

    async fn deactivate_provider_key(&self, request: DeactivateProviderKeyRequest) -> ServiceResult<ProviderKey> {
        let key = self
            .store
            .deactivate(&request.tenant_id, &request.provider_or_key_id, &now_timestamp())
            .await
            .map_err(store_failure)?
            .ok_or_else(|| {
                ServiceError::not_found("provider_key_not_found", format!("no active key `{}` for this tenant", request.provider_or_key_id))
            })?;
        tracing::info!(tenant_id = %key.tenant_id, provider = %key.provider, key_id = %key.id, "provider key deactivated");
        self.changed(&request.tenant_id).await;
        Ok(key)
    }

    async fn get_routing_config(&self, request: TenantRef) -> ServiceResult<RoutingConfig> {
        let mut credentials = Vec::new();
        for stored in self.store.keys(&request.tenant_id).await.map_err(store_failure)? {
            if stored.key.status != "active" {
                continue;
            }
            let api_key = vault::open(
                &self.options.master_key,
                &stored.sealed,
                &binding(&stored.key.tenant_id, &stored.key.provider, &stored.key.id),
            )
            .map_err(|error| ServiceError::internal(format!("provider key {} cannot be opened: {error}", stored.key.id)))?;
            credentials.push(Credential {
                key_id: stored.key.id,
                provider: stored.key.provider,
                api_key,
                created_at: stored.key.created_at,
            });
        }
        let aliases = self.store.aliases(&request.tenant_id).await.map_err(store_failure)?.into_iter().collect();
        let presets = self.store.presets(&request.tenant_id).await.map_err(store_failure)?;
        Ok(RoutingConfig { credentials, aliases, presets })
    }

    async fn get_aliases(&self, request: TenantRef) -> ServiceResult<AliasMap> {
        Ok(AliasMap { aliases: self.store.aliases(&request.tenant_id).await.map_err(store_failure)?.into_iter().collect() })
    }

    async fn put_aliases(&self, request: PutAliasesRequest) -> ServiceResult<AliasMap> {
        let mut aliases = BTreeMap::new();
        if request.aliases.len() > MAX_ALIASES {
            return Err(ServiceError::invalid("too_many_aliases", format!("at most {MAX_ALIASES} aliases")));
        }
        for (alias, target) in &request.aliases {
            let (alias, target) = (alias.trim(), target.trim());
            if alias.is_empty() || target.is_empty() {
                return Err(ServiceError::invalid("empty_alias", "alias names and targets must not be empty"));
            }
            if alias.chars().any(char::is_whitespace) || alias.len() > 128 || target.len() > 256 {
                return Err(ServiceError::invalid(
                    "invalid_alias",
                    format!("alias `{alias}` must be at most 128 characters without spaces"),
                ));
            }
            if alias == "auto" || alias.starts_with('@') {
                return Err(ServiceError::invalid("reserved_alias", format!("`{alias}` is reserved")));
            }
            aliases.insert(alias.to_string(), target.to_string());
        }
        if let Some((alias, target)) = aliases.iter().find(|(_, target)| aliases.contains_key(target.as_str())) {
            return Err(ServiceError::invalid(
                "alias_chain",
                format!("alias `{alias}` points at another alias `{target}`: point it at a model"),
            ));
        }
        self.store.replace_aliases(&request.tenant_id, &aliases).await.map_err(store_failure)?;
        self.changed(&request.tenant_id).await;
        Ok(AliasMap { aliases: aliases.into_iter().collect() })
    }

    async fn list_presets(&self, request: TenantRef) -> ServiceResult<PresetList> {
        Ok(PresetList { presets: self.store.presets(&request.tenant_id).await.map_err(store_failure)? })
    }

    async fn get_preset(&self, request: PresetRef) -> ServiceResult<Preset> {
        self.store.preset(&request.tenant_id, &request.slug).await.map_err(store_failure)?.ok_or_else(|| preset_not_found(&request.slug))
    }

    async fn put_preset(&self, request: PutPresetRequest) -> ServiceResult<Preset> {
        let mut preset = request.preset.ok_or_else(|| ServiceError::invalid("missing_field", "preset is required"))?;
        validate_preset(&mut preset)?;
        let now = now_timestamp();
        preset.updated_at = now.clone();
        if request.replace {
            let existing = self
                .store
                .preset(&preset.tenant_id, &preset.slug)
                .await
                .map_err(store_failure)?
                .ok_or_else(|| preset_not_found(&preset.slug))?;
            preset.created_at = existing.created_at;
            self.store.update_preset(&preset).await.map_err(store_failure)?;
        } else {
            preset.created_at = now;
            if let Err(error) = self.store.insert_preset(&preset).await {
                return Err(if is_unique_violation(&error) {
                    ServiceError::conflict(
                        "preset_exists",
                        format!("preset `{}` already exists: PUT /v1/presets/{} replaces it", preset.slug, preset.slug),
                    )
                } else {
                    store_failure(error)
                });
            }
        }
        self.changed(&preset.tenant_id).await;
        Ok(preset)
    }

    async fn delete_preset(&self, request: PresetRef) -> ServiceResult<Preset> {
        let preset = self
            .store
            .preset(&request.tenant_id, &request.slug)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| preset_not_found(&request.slug))?;
        self.store.delete_preset(&request.tenant_id, &request.slug).await.map_err(store_failure)?;
        self.changed(&request.tenant_id).await;
        Ok(preset)
    }
}

fn preset_not_found(slug: &str) -> ServiceError {
    ServiceError::not_found("preset_not_found", format!("preset `{slug}` does not exist"))
}

fn validate_preset(preset: &mut Preset) -> ServiceResult<()> {
    let slug_ok = !preset.slug.is_empty()
        && preset.slug.len() <= 64
        && preset.slug.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
        && !preset.slug.starts_with('-');
    if !slug_ok {
        return Err(ServiceError::invalid("invalid_slug", "slug must be 1-64 lowercase letters, digits and hyphens"));
    }
    preset.models = preset.models.iter().map(|model| model.trim().to_string()).collect();
    if preset.models.is_empty() || preset.models.len() > MAX_PRESET_MODELS || preset.models.iter().any(String::is_empty) {
        return Err(ServiceError::invalid("invalid_models", format!("models must list 1 to {MAX_PRESET_MODELS} model ids")));
    }
    if preset.models.iter().any(|model| model.starts_with("@preset/")) {
        return Err(ServiceError::invalid("invalid_models", "a preset cannot name another preset"));
    }
    if preset.strategy.is_empty() {
        preset.strategy = "cascade".to_string();
    }
    if !STRATEGIES.contains(&preset.strategy.as_str()) {
        return Err(ServiceError::invalid("invalid_strategy", format!("strategy must be one of {}", STRATEGIES.join(", "))));
    }
    if preset.options_json.trim().is_empty() {
        preset.options_json = "{}".to_string();
    }
    match serde_json::from_str::<serde_json::Value>(&preset.options_json) {
        Ok(serde_json::Value::Object(_)) => {}
        _ => return Err(ServiceError::invalid("invalid_options", "options must be a JSON object")),
    }
    if preset.name.trim().is_empty() {
        preset.name = preset.slug.clone();
    }
    Ok(())
}

/// Maps a database failure of this service (see `brainstorm_common::store::store_failure`).
fn store_failure(error: sqlx::Error) -> ServiceError {
    brainstorm_common::store::store_failure("catalog", error)
}
