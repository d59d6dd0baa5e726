//! The provider catalog, the BYOK vault, aliases and presets.

use std::collections::HashMap;

use crate::extract::Path;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use brainstorm_common::ApiError;
use brainstorm_proto::catalog::*;
use brainstorm_providers::catalog::{PROVIDERS, base_url};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::JsonBody;

type Answer = Result<Json<Value>, ApiError>;

/// `GET /v1/providers/catalog` (unauthenticated).
pub async fn catalog(State(state): State<EdgeState>) -> Json<Value> {
    let providers: Vec<Value> = PROVIDERS
        .iter()
        .map(|provider| {
            json!({
                "id": provider.id,
                "name": provider.name,
                "api": provider.format.as_str(),
                "base_url": base_url(provider, &state.base_urls),
                "env_key": provider.env_key,
                "discoverable": provider.discoverable,
                "auth": provider.auth.as_str(),
            })
        })
        .collect();
    Json(json!({"total": providers.len(), "providers": providers}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyBody {
    provider: Option<String>,
    api_key: Option<String>,
    name: Option<String>,
}

fn provider_and_key(body: KeyBody) -> Result<(String, String, Option<String>), ApiError> {
    let provider = body
        .provider
        .filter(|provider| !provider.trim().is_empty())
        .ok_or_else(|| ApiError::invalid_request("missing_field", "provider is required"))?;
    Ok((provider.trim().to_string(), body.api_key.unwrap_or_default(), body.name))
}

/// `POST /v1/providers/test` (unauthenticated): validates live, stores nothing.
pub async fn test_key(State(state): State<EdgeState>, JsonBody(body): JsonBody<KeyBody>) -> Answer {
    let (provider, api_key, _) = provider_and_key(body)?;
    let result = state.catalog.test_provider_key(TestProviderKeyRequest { provider, api_key }).await?;
    let mut answer = json!({"valid": result.valid, "provider": result.provider, "name": result.name, "status": result.status});
    if let (false, Some(object)) = (result.message.is_empty(), answer.as_object_mut()) {
        object.insert("message".to_string(), json!(result.message));
    }
    Ok(Json(answer))
}

fn key_view(key: &ProviderKey) -> Value {
    json!({
        "id": key.id,
        "provider": key.provider,
        "name": key.name,
        "masked_key": key.masked_key,
        "status": key.status,
        "created_at": key.created_at,
        "deactivated_at": key.deactivated_at,
    })
}

/// `POST /v1/providers` (config.write): validates live, encrypts, stores; rotates a previous key.
pub async fn register_key(
    State(state): State<EdgeState>,
    caller: Caller,
    JsonBody(body): JsonBody<KeyBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require("config.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let (provider, api_key, name) = provider_and_key(body)?;
    let key = state
        .catalog
        .register_provider_key(RegisterProviderKeyRequest {
            tenant_id: tenant_id.clone(),
            provider,
            api_key,
            name: name.unwrap_or_default(),
        })
        .await?;
    state.routing.evict(&tenant_id);
    Ok((StatusCode::CREATED, Json(key_view(&key))))
}

/// `GET /v1/providers` (config.read): masked keys only.
pub async fn list_keys(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let list = state.catalog.list_provider_keys(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    let keys: Vec<Value> = list.keys.iter().map(key_view).collect();
    Ok(Json(json!({"total": keys.len(), "providers": keys})))
}

/// `DELETE /v1/providers/{id}` (config.write): by key id or provider id; the record is kept.
pub async fn deactivate_key(State(state): State<EdgeState>, caller: Caller, Path(provider_or_key_id): Path<String>) -> Answer {
    caller.require("config.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let key =
        state.catalog.deactivate_provider_key(DeactivateProviderKeyRequest { tenant_id: tenant_id.clone(), provider_or_key_id }).await?;
    state.routing.evict(&tenant_id);
    Ok(Json(json!({"deactivated": true, "provider": key_view(&key)})))
}

/// `GET /v1/aliases` (config.read).
pub async fn get_aliases(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let aliases = state.catalog.get_aliases(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    Ok(Json(json!(aliases.aliases)))
}

/// `PUT /v1/aliases` (config.write): the body is a flat map of alias to model, replacing the old one.
pub async fn put_aliases(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<Value>) -> Answer {
    caller.require("config.write")?;
    let Value::Object(map) = body else {
        return Err(ApiError::invalid_request("invalid_aliases", "the body must be a flat JSON object mapping alias to model"));
    };
    let mut aliases = HashMap::new();
    for (alias, target) in map {
        let Value::String(target) = target else {
            return Err(ApiError::invalid_request(
                "invalid_aliases",
                format!("alias `{alias}` must map to a model id string (flat map, no nesting)"),
            ));
        };
        if alias.trim().is_empty() || target.trim().is_empty() {
            return Err(ApiError::invalid_request("empty_alias", "alias names and targets must not be empty"));
        }
        aliases.insert(alias, target);
    }
    let tenant_id = caller.tenant_id()?.to_string();
    let stored = state.catalog.put_aliases(PutAliasesRequest { tenant_id: tenant_id.clone(), aliases }).await?;
    state.routing.evict(&tenant_id);
    Ok(Json(json!(stored.aliases)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresetBody {
    slug: Option<String>,
    name: Option<String>,
    models: Option<Vec<String>>,
    strategy: Option<String>,
    options: Option<Value>,
}

fn preset_view(preset: &Preset) -> Value {
    json!({
        "slug": preset.slug,
        "name": preset.name,
        "reference": format!("@preset/{}", preset.slug),
        "models": preset.models,
        "strategy": preset.strategy,
        "options": serde_json::from_str::<Value>(&preset.options_json).unwrap_or_else(|_| json!({})),
        "created_at": preset.created_at,
        "updated_at": preset.updated_at,
    })
}

fn preset_of(tenant_id: &str, slug: String, body: PresetBody) -> Result<Preset, ApiError> {
    let options = body.options.unwrap_or_else(|| json!({}));
    crate::routing_cache::route_options(&options)
        .map_err(|message| ApiError::invalid_request("invalid_options", message.replace("route.", "options.")))?;
    Ok(Preset {
        tenant_id: tenant_id.to_string(),
        slug,
        name: body.name.unwrap_or_default(),
        models: body.models.unwrap_or_default(),
        strategy: body.strategy.unwrap_or_default(),
        options_json: options.to_string(),
        created_at: String::new(),
        updated_at: String::new(),
    })
}

/// `POST /v1/presets` (config.write).
pub async fn create_preset(
    State(state): State<EdgeState>,
    caller: Caller,
    JsonBody(mut body): JsonBody<PresetBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require("config.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let slug = body.slug.take().ok_or_else(|| ApiError::invalid_request("missing_field", "slug is required"))?;
    let preset = state.catalog.put_preset(PutPresetRequest { preset: Some(preset_of(&tenant_id, slug, body)?), replace: false }).await?;
    state.routing.evict(&tenant_id);
    Ok((StatusCode::CREATED, Json(json!({"preset": preset_view(&preset)}))))
}

/// `GET /v1/presets` (config.read).
pub async fn list_presets(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let list = state.catalog.list_presets(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    let presets: Vec<Value> = list.presets.iter().map(preset_view).collect();
    Ok(Json(json!({"total": presets.len(), "presets": presets})))
}

/// `GET /v1/presets/{slug}` (config.read).
pub async fn get_preset(State(state): State<EdgeState>, caller: Caller, Path(slug): Path<String>) -> Answer {
    caller.require("config.read")?;
    let preset = state.catalog.get_preset(PresetRef { tenant_id: caller.tenant_id()?.to_string(), slug }).await?;
    Ok(Json(json!({"preset": preset_view(&preset)})))
}

/// `PUT /v1/presets/{slug}` (config.write): replaces an existing preset.
pub async fn replace_preset(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(slug): Path<String>,
    JsonBody(body): JsonBody<PresetBody>,
) -> Answer {
    caller.require("config.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    if body.slug.as_ref().is_some_and(|body_slug| *body_slug != slug) {
        return Err(ApiError::invalid_request("slug_mismatch", "the body's slug differs from the path's"));
    }
    let preset = state.catalog.put_preset(PutPresetRequest { preset: Some(preset_of(&tenant_id, slug, body)?), replace: true }).await?;
    state.routing.evict(&tenant_id);
    Ok(Json(json!({"preset": preset_view(&preset)})))
}

/// `DELETE /v1/presets/{slug}` (config.write).
pub async fn delete_preset(State(state): State<EdgeState>, caller: Caller, Path(slug): Path<String>) -> Answer {
    caller.require("config.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let preset = state.catalog.delete_preset(PresetRef { tenant_id: tenant_id.clone(), slug }).await?;
    state.routing.evict(&tenant_id);
    Ok(Json(json!({"deleted": true, "preset": preset_view(&preset)})))
}
