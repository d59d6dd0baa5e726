//! `/v1/eval/datasets/*`: evaluation datasets, kept by the prompts-eval service. Items are
//! `{input (object), expected_output, metadata?}`; `import-from-logs` turns the tenant's recent
//! completion records (the audit trail's routing decisions: request metadata, never prompts, which
//! the gateway does not keep) into items. A prompt evaluation can take a dataset's items as its
//! cases (`POST /v1/prompts/{id}/evaluate` with `dataset_id`).
//!
//! Permissions, as for prompts: `router.read` to read, `router.write` to write.

use crate::extract::{Path, Query};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_prompts_eval::MAX_ITEMS_PER_BATCH;
use brainstorm_proto::audit::DecisionsRequest;
use brainstorm_proto::prompts::*;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::JsonBody;
use crate::routes::prompts::{ExportQuery, client, csv_field, csv_response};
use crate::views::json_text;

type Answer = Result<Json<Value>, ApiError>;

/// How far back `import-from-logs` reads the audit trail, and how many records at most.
const IMPORT_WINDOW_DAYS: i64 = 30;
const IMPORT_SCAN: u32 = 1_000;
const DEFAULT_IMPORT: u32 = 50;

fn dataset_view(dataset: &Dataset) -> Value {
    json!({
        "id": dataset.id,
        "name": dataset.name,
        "description": dataset.description,
        "item_count": dataset.item_count,
        "created_at": dataset.created_at,
        "updated_at": dataset.updated_at,
    })
}

fn item_view(item: &DatasetItem) -> Value {
    json!({
        "id": item.id,
        "input": json_text(&item.input_json),
        "expected_output": item.expected_output,
        "metadata": json_text(&item.metadata_json),
        "source_request_id": (!item.source_request_id.is_empty()).then_some(&item.source_request_id),
        "created_at": item.created_at,
    })
}

fn dataset_ref(caller: &Caller, dataset_id: String) -> Result<DatasetRef, ApiError> {
    Ok(DatasetRef { tenant_id: caller.tenant_id()?.to_string(), dataset_id })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetBody {
    name: Option<String>,
    description: Option<String>,
}

/// `POST /v1/eval/datasets` (router.write): `{name, description}`; 201.
pub async fn create(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<DatasetBody>) -> Result<Response, ApiError> {
    caller.require("router.write")?;
    let request = CreateDatasetRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        name: body.name.ok_or_else(|| ApiError::invalid_request("missing_field", "name is required"))?,
        description: body.description.unwrap_or_default(),
    };
    let dataset = client(&state)?.create_dataset(request).await?;
    Ok((StatusCode::CREATED, Json(dataset_view(&dataset))).into_response())
}

/// `GET /v1/eval/datasets` (router.read).
pub async fn list(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("router.read")?;
    let datasets = client(&state)?.list_datasets(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?.datasets;
    let views: Vec<Value> = datasets.iter().map(dataset_view).collect();
    Ok(Json(json!({"datasets": views, "count": views.len()})))
}

/// `GET /v1/eval/datasets/{id}` (router.read).
pub async fn get(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("router.read")?;
    Ok(Json(dataset_view(&client(&state)?.get_dataset(dataset_ref(&caller, id)?).await?)))
}

/// `PUT /v1/eval/datasets/{id}` (router.write): `{name?, description?}`.
pub async fn update(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<DatasetBody>,
) -> Answer {
    caller.require("router.write")?;
    let request =
        UpdateDatasetRequest { tenant_id: caller.tenant_id()?.to_string(), dataset_id: id, name: body.name, description: body.description };
    Ok(Json(dataset_view(&client(&state)?.update_dataset(request).await?)))
}

/// `DELETE /v1/eval/datasets/{id}` (router.write): the dataset and its items.
pub async fn delete(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("router.write")?;
    let dataset = client(&state)?.delete_dataset(dataset_ref(&caller, id)?).await?;
    Ok(Json(json!({"deleted": true, "id": dataset.id, "items_deleted": dataset.item_count})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsBody {
    items: Option<Vec<Value>>,
}

fn item(index: usize, item: Value) -> Result<DatasetItem, ApiError> {
    let invalid = |message: &str| ApiError::invalid_request("invalid_items", format!("items[{index}]: {message}"));
    let Value::Object(mut item) = item else { return Err(invalid("an item is {input, expected_output, metadata?}")) };
    let input = match item.remove("input") {
        Some(input @ Value::Object(_)) => input,
        _ => return Err(invalid("input (an object) is required")),
    };
    let expected_output = match item.remove("expected_output") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(expected)) => expected,
        Some(_) => return Err(invalid("expected_output must be a string")),
    };
    let metadata = match item.remove("metadata") {
        None | Some(Value::Null) => String::new(),
        Some(metadata @ Value::Object(_)) => metadata.to_string(),
        Some(_) => return Err(invalid("metadata must be an object")),
    };
    if let Some(unknown) = item.keys().next() {
        return Err(invalid(&format!("unknown member `{unknown}`")));
    }
    Ok(DatasetItem { input_json: input.to_string(), expected_output, metadata_json: metadata, ..DatasetItem::default() })
}

/// `POST /v1/eval/datasets/{id}/items` (router.write): `{items[{input, expected_output, metadata?}]}`,
/// at most 100 a call; 201 with the items added.
pub async fn add_items(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ItemsBody>,
) -> Result<Response, ApiError> {
    caller.require("router.write")?;
    let items = body.items.ok_or_else(|| ApiError::invalid_request("missing_field", "items is required"))?;
    if items.is_empty() || items.len() > MAX_ITEMS_PER_BATCH {
        return Err(ApiError::invalid_request("invalid_items", format!("items must hold 1 to {MAX_ITEMS_PER_BATCH} items")));
    }
    let items = items.into_iter().enumerate().map(|(index, value)| item(index, value)).collect::<Result<Vec<_>, _>>()?;
    let added = client(&state)?.add_items(AddItemsRequest { tenant_id: caller.tenant_id()?.to_string(), dataset_id: id, items }).await?;
    let views: Vec<Value> = added.items.iter().map(item_view).collect();
    Ok((StatusCode::CREATED, Json(json!({"items": views, "count": views.len()}))).into_response())
}

/// `GET /v1/eval/datasets/{id}/items` (router.read): in the order they were added.
pub async fn items(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("router.read")?;
    let items = client(&state)?.list_items(dataset_ref(&caller, id)?).await?.items;
    let views: Vec<Value> = items.iter().map(item_view).collect();
    Ok(Json(json!({"items": views, "count": views.len()})))
}

/// `DELETE /v1/eval/datasets/{id}/items/{item_id}` (router.write).
pub async fn delete_item(State(state): State<EdgeState>, caller: Caller, Path((id, item_id)): Path<(String, String)>) -> Answer {
    caller.require("router.write")?;
    let item = client(&state)?.delete_item(ItemRef { tenant_id: caller.tenant_id()?.to_string(), dataset_id: id, item_id }).await?;
    Ok(Json(json!({"deleted": true, "id": item.id})))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ImportBody {
    model: Option<String>,
    min_tokens: Option<u64>,
    limit: Option<u32>,
}

/// `POST /v1/eval/datasets/{id}/import-from-logs` (router.write): `{model?, min_tokens?, limit?}`
/// (50 by default, at most 100) → the newest completions of the last 30 days that match (the model as
/// requested or as `provider/model`; at least `min_tokens` input tokens), each as an item whose input
/// is the request's metadata; a request already imported into the dataset is skipped. 201 when items
/// were added, else 200.
pub async fn import_from_logs(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ImportBody>,
) -> Result<Response, ApiError> {
    caller.require("router.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let limit = body.limit.unwrap_or(DEFAULT_IMPORT);
    if limit == 0 || limit as usize > MAX_ITEMS_PER_BATCH {
        return Err(ApiError::invalid_request("invalid_import", format!("limit is 1 to {MAX_ITEMS_PER_BATCH}")));
    }
    let prompts = client(&state)?;
    // The dataset first: a missing one is a 404 before the audit trail is read.
    prompts.get_dataset(DatasetRef { tenant_id: tenant_id.clone(), dataset_id: id.clone() }).await?;
    let since = brainstorm_common::time::format_timestamp(chrono::Utc::now() - chrono::Duration::days(IMPORT_WINDOW_DAYS));
    let decisions = state
        .audit
        .list_decisions(DecisionsRequest { tenant_id: tenant_id.clone(), limit: Some(IMPORT_SCAN), since: Some(since) })
        .await?
        .decisions;
    let model = body.model.filter(|model| !model.trim().is_empty());
    let min_tokens = i64::try_from(body.min_tokens.unwrap_or(0)).unwrap_or(i64::MAX);
    let items: Vec<DatasetItem> = decisions
        .iter()
        .filter(|decision| {
            model.as_deref().is_none_or(|model| decision.model == model || format!("{}/{}", decision.provider, decision.model) == model)
        })
        .filter(|decision| decision.input_tokens >= min_tokens)
        .take(limit as usize)
        .map(|decision| DatasetItem {
            input_json: json!({
                "request_id": decision.request_id,
                "model": decision.model,
                "provider": decision.provider,
                "input_tokens": decision.input_tokens,
                "output_tokens": decision.output_tokens,
            })
            .to_string(),
            metadata_json: json!({
                "source": "audit",
                "timestamp": decision.timestamp,
                "strategy": decision.strategy,
                "latency_ms": decision.latency_ms,
                "cost_usd": Usd::from_nanos(decision.cost_nanos).to_json(),
            })
            .to_string(),
            source_request_id: decision.request_id.clone(),
            ..DatasetItem::default()
        })
        .collect();
    if items.is_empty() {
        return Ok((StatusCode::OK, Json(json!({"imported": 0, "skipped": 0, "items": []}))).into_response());
    }
    let added = prompts.add_items(AddItemsRequest { tenant_id, dataset_id: id, items }).await?;
    let views: Vec<Value> = added.items.iter().map(item_view).collect();
    // 201 when items were added; 200 when every match was already in the dataset.
    let status = if views.is_empty() { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(json!({"imported": views.len(), "skipped": added.skipped, "items": views}))).into_response())
}

/// `GET /v1/eval/datasets/{id}/export?format=json|csv` (router.read): CSV columns `input,
/// expected_output, metadata` (the objects as JSON text).
pub async fn export(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    caller.require("router.read")?;
    let csv_wanted = query.csv()?;
    let prompts = client(&state)?;
    let reference = dataset_ref(&caller, id)?;
    let dataset = prompts.get_dataset(reference.clone()).await?;
    let items = prompts.list_items(reference).await?.items;
    if !csv_wanted {
        let views: Vec<Value> = items.iter().map(item_view).collect();
        return Ok(Json(json!({"dataset": dataset_view(&dataset), "items": views})).into_response());
    }
    let mut csv = String::from("input,expected_output,metadata\r\n");
    for item in &items {
        let metadata = if item.metadata_json.is_empty() { "{}" } else { item.metadata_json.as_str() };
        csv.push_str(&[csv_field(&item.input_json), csv_field(&item.expected_output), csv_field(metadata)].join(","));
        csv.push_str("\r\n");
    }
    Ok(csv_response(csv, &format!("dataset-{}.csv", dataset.id)))
}
