//! `/v1/observability/*`: where a tenant's events go, kept by the observability-fanout service.
//! Observability destinations (`config.read` / `config.write`) and XDR connectors
//! (`security.read` / `security.write`) are separate lists; a destination is reached only through
//! its own kind's routes. Secret config members are never returned: a view names them in
//! `secrets_set`.

use crate::extract::Path;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use brainstorm_observability_fanout::formats;
use brainstorm_proto::observability::*;
use serde_json::{Map, Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::JsonBody;
use crate::views::json_text;

type Answer = Result<Json<Value>, ApiError>;

const OBSERVABILITY: &str = "observability";
const XDR: &str = "xdr";

fn client(state: &EdgeState) -> Result<&ObservabilityFanoutClient, ApiError> {
    state.observability.as_ref().ok_or_else(|| {
        ApiError::unavailable(
            "observability_fanout_unavailable",
            "this gateway runs without the observability-fanout service: set BR_OBSERVABILITY_FANOUT_URL on the edge",
        )
    })
}

fn permission(kind: &str, write: bool) -> &'static str {
    match (kind, write) {
        (XDR, false) => "security.read",
        (XDR, true) => "security.write",
        (_, false) => "config.read",
        (_, true) => "config.write",
    }
}

fn view(destination: &Destination) -> Value {
    let mut view = json!({
        "id": destination.id,
        "name": destination.name,
        "type": destination.r#type,
        "enabled": destination.enabled,
        "config": json_text(&destination.config_json),
        "secrets_set": destination.secrets_set,
        "filter_rules": json_text(&destination.filter_rules_json),
        "created_at": destination.created_at,
        "updated_at": destination.updated_at,
    });
    let last = (!destination.last_delivery_at.is_empty()).then_some(&destination.last_delivery_at);
    if destination.kind == XDR {
        view["sent"] = json!(destination.sent);
        view["failed"] = json!(destination.failed);
        view["dropped"] = json!(destination.dropped);
        view["last_delivery_at"] = json!(last);
    } else {
        view["event_types"] = json!(destination.event_types);
        view["batch"] = json!({"max_size": destination.batch_max_size, "flush_interval_ms": destination.batch_flush_interval_ms});
        view["stats"] =
            json!({"sent": destination.sent, "failed": destination.failed, "dropped": destination.dropped, "last_delivery_at": last});
    }
    view
}

fn object(body: Value, what: &str) -> Result<Map<String, Value>, ApiError> {
    match body {
        Value::Object(members) => Ok(members),
        _ => Err(ApiError::invalid_request("invalid_destination", format!("{what} must be an object"))),
    }
}

fn text(body: &Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(ApiError::invalid_request("invalid_destination", format!("{name} must be a string"))),
    }
}

fn event_types(value: &Value) -> Result<Vec<String>, ApiError> {
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Array(types) => types
            .iter()
            .map(|kind| {
                kind.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::invalid_request("invalid_destination", "event_types must be strings"))
            })
            .collect(),
        _ => Err(ApiError::invalid_request("invalid_destination", "event_types must be an array")),
    }
}

fn batch(value: Option<&Value>) -> Result<(Option<u32>, Option<u32>), ApiError> {
    let Some(value) = value.filter(|value| !value.is_null()) else { return Ok((None, None)) };
    let Value::Object(batch) = value else {
        return Err(ApiError::invalid_request("invalid_destination", "batch must be {max_size, flush_interval_ms}"));
    };
    let number = |name: &str| match batch.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .filter(|number| *number > 0)
            .and_then(|number| u32::try_from(number).ok())
            .map(Some)
            .ok_or_else(|| ApiError::invalid_request("invalid_destination", format!("batch.{name} must be a positive integer"))),
    };
    Ok((number("max_size")?, number("flush_interval_ms")?))
}

const MEMBERS: [&str; 7] = ["name", "type", "config", "event_types", "batch", "filter_rules", "enabled"];

fn members(body: Value) -> Result<Map<String, Value>, ApiError> {
    let body = object(body, "the body")?;
    if let Some(unknown) = body.keys().find(|name| !MEMBERS.contains(&name.as_str())) {
        return Err(ApiError::invalid_request("invalid_destination", format!("unknown member `{unknown}`")));
    }
    Ok(body)
}

async fn create(state: &EdgeState, caller: &Caller, kind: &str, body: Value) -> Result<Response, ApiError> {
    caller.require(permission(kind, true))?;
    let body = members(body)?;
    let missing = |name: &str| ApiError::invalid_request("missing_field", format!("{name} is required"));
    let config = body.get("config").cloned().ok_or_else(|| missing("config"))?;
    object(config.clone(), "config")?;
    let (batch_max_size, batch_flush_interval_ms) = batch(body.get("batch"))?;
    let request = CreateDestinationRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        kind: kind.to_string(),
        name: text(&body, "name")?.ok_or_else(|| missing("name"))?,
        r#type: text(&body, "type")?.ok_or_else(|| missing("type"))?,
        config_json: config.to_string(),
        event_types: body.get("event_types").map(event_types).transpose()?.unwrap_or_default(),
        batch_max_size: batch_max_size.unwrap_or(0),
        batch_flush_interval_ms: batch_flush_interval_ms.unwrap_or(0),
        filter_rules_json: body.get("filter_rules").map(Value::to_string).unwrap_or_default(),
    };
    let destination = client(state)?.create_destination(request).await?;
    Ok((StatusCode::CREATED, Json(view(&destination))).into_response())
}

async fn list(state: &EdgeState, caller: &Caller, kind: &str) -> Answer {
    caller.require(permission(kind, false))?;
    let list = client(state)?
        .list_destinations(ListDestinationsRequest { tenant_id: caller.tenant_id()?.to_string(), kind: kind.to_string() })
        .await?;
    let views: Vec<Value> = list.destinations.iter().map(view).collect();
    Ok(Json(json!({"destinations": views, "count": views.len()})))
}

async fn update(state: &EdgeState, caller: &Caller, kind: &str, id: String, body: Value) -> Answer {
    caller.require(permission(kind, true))?;
    let body = members(body)?;
    let (batch_max_size, batch_flush_interval_ms) = batch(body.get("batch"))?;
    let enabled = match body.get("enabled") {
        None => None,
        Some(Value::Bool(enabled)) => Some(*enabled),
        Some(_) => return Err(ApiError::invalid_request("invalid_destination", "enabled must be a boolean")),
    };
    let request = UpdateDestinationRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        kind: kind.to_string(),
        id,
        name: text(&body, "name")?,
        config_json: body.get("config").map(|config| object(config.clone(), "config").map(|_| config.to_string())).transpose()?,
        set_event_types: body.contains_key("event_types"),
        event_types: body.get("event_types").map(event_types).transpose()?.unwrap_or_default(),
        batch_max_size,
        batch_flush_interval_ms,
        // `filter_rules: null` removes the rules.
        filter_rules_json: body.get("filter_rules").map(Value::to_string),
        enabled,
        // A new type replaces the config with the one sent (or keeps the stored one if it suits).
        r#type: text(&body, "type")?,
    };
    Ok(Json(view(&client(state)?.update_destination(request).await?)))
}

async fn delete(state: &EdgeState, caller: &Caller, kind: &str, id: String) -> Answer {
    caller.require(permission(kind, true))?;
    let destination = client(state)?
        .delete_destination(DestinationRef { tenant_id: caller.tenant_id()?.to_string(), id, kind: kind.to_string() })
        .await?;
    Ok(Json(json!({"deleted": true, "id": destination.id})))
}

async fn test(state: &EdgeState, caller: &Caller, kind: &str, id: String) -> Answer {
    caller.require(permission(kind, true))?;
    let result =
        client(state)?.test_destination(DestinationRef { tenant_id: caller.tenant_id()?.to_string(), id, kind: kind.to_string() }).await?;
    Ok(Json(if result.delivered { json!({"delivered": true}) } else { json!({"delivered": false, "error": result.error}) }))
}

/// `GET /v1/observability/destinations` (config.read).
pub async fn list_destinations(State(state): State<EdgeState>, caller: Caller) -> Answer {
    list(&state, &caller, OBSERVABILITY).await
}

/// `POST /v1/observability/destinations` (config.write): `{name, type, config, event_types?, batch?,
/// filter_rules?}`; 201.
pub async fn create_destination(
    State(state): State<EdgeState>,
    caller: Caller,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    create(&state, &caller, OBSERVABILITY, body).await
}

/// `PUT /v1/observability/destinations/{id}` (config.write): the members sent change; `config`
/// members merge into the stored config (null removes one).
pub async fn update_destination(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Value>,
) -> Answer {
    update(&state, &caller, OBSERVABILITY, id, body).await
}

/// `DELETE /v1/observability/destinations/{id}` (config.write).
pub async fn delete_destination(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    delete(&state, &caller, OBSERVABILITY, id).await
}

/// `POST /v1/observability/test/{id}` (config.write): sends a synthetic usage event now.
pub async fn test_destination(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    test(&state, &caller, OBSERVABILITY, id).await
}

/// `GET /v1/observability/config` (config.read): `{enabled}`, on until switched off.
pub async fn get_config(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("config.read")?;
    let config = client(&state)?.get_config(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    Ok(Json(json!({"enabled": config.enabled})))
}

/// `PUT /v1/observability/config` (config.write): `{enabled: boolean}`, the switch of every
/// observability destination of the tenant (XDR connectors have their own).
pub async fn put_config(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<Value>) -> Answer {
    caller.require("config.write")?;
    let enabled = body
        .get("enabled")
        .and_then(Value::as_bool)
        .ok_or_else(|| ApiError::invalid_request("invalid_config", "the body is {enabled: boolean}"))?;
    let config = client(&state)?.put_config(FanoutConfig { tenant_id: caller.tenant_id()?.to_string(), enabled }).await?;
    Ok(Json(json!({"enabled": config.enabled})))
}

/// `GET /v1/observability/templates` (config.read): the five platforms' templates.
pub async fn templates(caller: Caller) -> Answer {
    caller.require("config.read")?;
    let templates = formats::templates();
    Ok(Json(json!({"templates": templates, "count": templates.len()})))
}

/// `GET /v1/observability/templates/{provider}` (config.read): `config_schema`,
/// `recommended_event_types` and `example_config`.
pub async fn template(caller: Caller, Path(provider): Path<String>) -> Answer {
    caller.require("config.read")?;
    formats::templates().into_iter().find(|template| template["provider"] == provider.as_str()).map(Json).ok_or_else(|| {
        ApiError::not_found("template_not_found", format!("no template for `{provider}`: see GET /v1/observability/templates"))
    })
}

/// `GET /v1/observability/xdr/destinations` (security.read).
pub async fn list_xdr(State(state): State<EdgeState>, caller: Caller) -> Answer {
    list(&state, &caller, XDR).await
}

/// `POST /v1/observability/xdr/destinations` (security.write): `{name, type, config, filter_rules}`; 201.
pub async fn create_xdr(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<Value>) -> Result<Response, ApiError> {
    create(&state, &caller, XDR, body).await
}

/// `PUT /v1/observability/xdr/destinations/{id}` (security.write): any subset; `filter_rules: null` removes the rules.
pub async fn update_xdr(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>, JsonBody(body): JsonBody<Value>) -> Answer {
    update(&state, &caller, XDR, id, body).await
}

/// `DELETE /v1/observability/xdr/destinations/{id}` (security.write).
pub async fn delete_xdr(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    delete(&state, &caller, XDR, id).await
}

/// `POST /v1/observability/xdr/destinations/{id}/test` (security.write): `{delivered: true}` or
/// `{delivered: false, error}`.
pub async fn test_xdr(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    test(&state, &caller, XDR, id).await
}

/// `GET /v1/observability/xdr/destinations/{id}/stats` (security.read): the last 24 hours.
pub async fn xdr_stats(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("security.read")?;
    let stats =
        client(&state)?.destination_stats(DestinationRef { tenant_id: caller.tenant_id()?.to_string(), id, kind: XDR.to_string() }).await?;
    Ok(Json(json!({
        "sent": stats.sent,
        "failed": stats.failed,
        "dropped": stats.dropped,
        "last_delivery_at": (!stats.last_delivery_at.is_empty()).then_some(&stats.last_delivery_at),
    })))
}

/// `POST /v1/observability/xdr/destinations/{id}/enable` (security.write): `{enabled: boolean}`.
pub async fn enable_xdr(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>, JsonBody(body): JsonBody<Value>) -> Answer {
    caller.require("security.write")?;
    let enabled = body
        .get("enabled")
        .and_then(Value::as_bool)
        .ok_or_else(|| ApiError::invalid_request("invalid_destination", "the body is {enabled: boolean}"))?;
    let request = SetEnabledRequest { tenant_id: caller.tenant_id()?.to_string(), kind: XDR.to_string(), id, enabled };
    let destination = client(&state)?.set_enabled(request).await?;
    Ok(Json(json!({"id": destination.id, "enabled": destination.enabled})))
}
