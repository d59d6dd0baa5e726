//! `/v1/memory/*` and `/v1/governance/memory/*`, `/v1/governance/summary`: agent memory, kept by the
//! prompts-eval service. Memory is the tenant's, under a `memory_key` (query parameter; the tenant
//! id by default, e.g. an agent's id for its own memory). `init` has a model read documents and
//! extract facts, through the edge's own completion pipeline as the caller.
//!
//! Permissions: `memory.read` / `memory.write` (every role but auditor has them); `init` also
//! `router.write` (it runs a model); the governance views `governance.read`.

use std::time::Instant;

use crate::extract::{Path, Query};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use brainstorm_prompts_eval::memory::BLOCKS;
use brainstorm_proto::prompts::*;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::JsonBody;
use crate::routes::prompts::{client, complete_text};

type Answer = Result<Json<Value>, ApiError>;

/// `init` limits.
const MAX_DOCUMENTS: usize = 20;
const MAX_DOCUMENT_CHARS: usize = 100_000;
const MAX_FACTS_PER_DOCUMENT: usize = 50;

#[derive(Deserialize, Default)]
pub struct KeyQuery {
    memory_key: Option<String>,
    include_archival: Option<bool>,
}

fn key(caller: &Caller, memory_key: Option<String>) -> Result<MemoryKey, ApiError> {
    Ok(MemoryKey { tenant_id: caller.tenant_id()?.to_string(), memory_key: memory_key.unwrap_or_default() })
}

fn entry_view(entry: &MemoryEntry) -> Value {
    json!({
        "id": entry.id,
        "block": entry.block,
        "fact": entry.fact,
        "pinned": entry.pinned,
        "archived": entry.archived,
        "created_at": entry.created_at,
        "updated_at": entry.updated_at,
    })
}

fn block_view(block: &BlockSummary) -> Value {
    json!({"name": block.name, "count": block.count, "limit": block.limit, "pinned_count": block.pinned_count})
}

/// `GET /v1/memory/blocks` (memory.read).
pub async fn blocks(State(state): State<EdgeState>, caller: Caller, Query(query): Query<KeyQuery>) -> Answer {
    caller.require("memory.read")?;
    let view = client(&state)?.list_memory(MemoryQuery { key: Some(key(&caller, query.memory_key)?), ..MemoryQuery::default() }).await?;
    Ok(Json(json!({
        "blocks": view.blocks.iter().map(block_view).collect::<Vec<_>>(),
        "total_core_entries": view.total_core_entries,
        "total_archival_entries": view.total_archival_entries,
    })))
}

/// `GET /v1/memory/blocks/{block}` (memory.read): the block's core entries, oldest first.
pub async fn block(State(state): State<EdgeState>, caller: Caller, Path(block): Path<String>, Query(query): Query<KeyQuery>) -> Answer {
    caller.require("memory.read")?;
    let request = MemoryQuery {
        key: Some(key(&caller, query.memory_key)?),
        block: block.clone(),
        include_archival: query.include_archival.unwrap_or(false),
    };
    let view = client(&state)?.list_memory(request).await?;
    let summary = view.blocks.iter().find(|summary| summary.name == block).map(block_view);
    Ok(Json(json!({"block": summary, "entries": view.entries.iter().map(entry_view).collect::<Vec<_>>(), "count": view.entries.len()})))
}

/// `GET /v1/memory/entries?include_archival=true` (memory.read): every entry, oldest first.
pub async fn entries(State(state): State<EdgeState>, caller: Caller, Query(query): Query<KeyQuery>) -> Answer {
    caller.require("memory.read")?;
    let request = MemoryQuery {
        key: Some(key(&caller, query.memory_key)?),
        block: String::new(),
        include_archival: query.include_archival.unwrap_or(false),
    };
    let view = client(&state)?.list_memory(request).await?;
    Ok(Json(json!({"entries": view.entries.iter().map(entry_view).collect::<Vec<_>>(), "count": view.entries.len()})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntryBody {
    fact: Option<String>,
    block: Option<String>,
    pinned: Option<bool>,
}

/// `POST /v1/memory/entries` (memory.write): `{fact, block?, pinned?}`; 201 with the entry and what
/// a full block evicted to archival to make room (409 `memory_block_full` when all are pinned).
pub async fn add(
    State(state): State<EdgeState>,
    caller: Caller,
    Query(query): Query<KeyQuery>,
    JsonBody(body): JsonBody<EntryBody>,
) -> Result<Response, ApiError> {
    caller.require("memory.write")?;
    let request = AddMemoryRequest {
        key: Some(key(&caller, query.memory_key)?),
        fact: body.fact.ok_or_else(|| ApiError::invalid_request("missing_field", "fact is required"))?,
        block: body.block.unwrap_or_default(),
        pinned: body.pinned.unwrap_or(false),
        actor: caller.identity.key_id.clone(),
        reason: String::new(),
    };
    let added = client(&state)?.add_memory(request).await?;
    let mut view = added.entry.as_ref().map(entry_view).unwrap_or(Value::Null);
    view["evicted"] = added.evicted.iter().map(entry_view).collect();
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// `PUT /v1/memory/entries/{id}` (memory.write): `{fact?, pinned?}` (a `replace` and/or `pin` in the trail).
pub async fn update(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<KeyQuery>,
    JsonBody(body): JsonBody<EntryBody>,
) -> Answer {
    caller.require("memory.write")?;
    if body.block.is_some() {
        return Err(ApiError::invalid_request("invalid_fact", "an entry's block does not change: delete it and add it to the other block"));
    }
    let request = UpdateMemoryRequest {
        key: Some(key(&caller, query.memory_key)?),
        id,
        fact: body.fact,
        pinned: body.pinned,
        actor: caller.identity.key_id.clone(),
    };
    Ok(Json(entry_view(&client(&state)?.update_memory(request).await?)))
}

/// `DELETE /v1/memory/entries/{id}` (memory.write).
pub async fn delete(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>, Query(query): Query<KeyQuery>) -> Answer {
    caller.require("memory.write")?;
    let request = MemoryEntryRef { key: Some(key(&caller, query.memory_key)?), id, actor: caller.identity.key_id.clone() };
    let entry = client(&state)?.delete_memory(request).await?;
    Ok(Json(json!({"deleted": true, "id": entry.id})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitBody {
    documents: Option<Vec<Document>>,
    model: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    content: String,
    source: Option<String>,
}

/// The extraction instruction for one document.
fn extraction_prompt(content: &str) -> String {
    format!(
        "Extract the durable facts worth remembering from the document below. Answer with only a JSON array of objects \
         {{\"block\": \"human\" | \"project\" | \"system\" | \"general\", \"fact\": \"one short sentence\"}}: human for facts about the \
         people, project for the work, system for how the assistant should behave, general otherwise. At most {MAX_FACTS_PER_DOCUMENT} facts; \
         [] when there are none.\n\nDocument:\n{content}"
    )
}

/// The facts in a model's answer: the JSON array it holds (a Markdown fence or text around it
/// allowed), keeping objects with a known block and a non-empty fact.
pub(crate) fn extracted_facts(answer: &str) -> Option<Vec<(String, String)>> {
    let start = answer.find('[')?;
    let end = answer.rfind(']')?;
    let array: Vec<Value> = serde_json::from_str(answer.get(start..=end)?).ok()?;
    Some(
        array
            .iter()
            .filter_map(|item| {
                let block = item.get("block").and_then(Value::as_str).unwrap_or("general");
                let fact = item.get("fact").and_then(Value::as_str)?.trim();
                let block = if BLOCKS.iter().any(|(name, _)| *name == block) { block } else { "general" };
                (!fact.is_empty()).then(|| (block.to_string(), fact.to_string()))
            })
            .take(MAX_FACTS_PER_DOCUMENT)
            .collect(),
    )
}

/// `POST /v1/memory/init` (memory.write and router.write): `{documents[{content, source}], model}` →
/// `{status, summary, entries_after, entries[], duration_ms}`; `status` is `completed`, `partial`
/// (some documents failed: `failures` says why) or `no_facts`.
pub async fn init(
    State(state): State<EdgeState>,
    caller: Caller,
    Query(query): Query<KeyQuery>,
    JsonBody(body): JsonBody<InitBody>,
) -> Answer {
    caller.require("memory.write")?;
    caller.require("router.write")?;
    let started = Instant::now();
    let documents = body.documents.unwrap_or_default();
    if documents.is_empty()
        || documents.len() > MAX_DOCUMENTS
        || documents.iter().any(|document| document.content.trim().is_empty() || document.content.chars().count() > MAX_DOCUMENT_CHARS)
    {
        return Err(ApiError::invalid_request(
            "invalid_documents",
            format!("documents must hold 1 to {MAX_DOCUMENTS} documents, each with content of at most {MAX_DOCUMENT_CHARS} characters"),
        ));
    }
    let model = body
        .model
        .filter(|model| !model.trim().is_empty())
        .ok_or_else(|| ApiError::invalid_request("missing_field", "model is required: it extracts the facts"))?;
    let memory_key = key(&caller, query.memory_key)?;
    let prompts = client(&state)?;
    let mut added = Vec::new();
    let mut failures = Vec::new();
    for (index, document) in documents.iter().enumerate() {
        let source = document.source.clone().unwrap_or_else(|| format!("document {}", index + 1));
        let facts = match complete_text(&state, &caller, &model, &extraction_prompt(&document.content)).await {
            Ok(answer) => match extracted_facts(&answer) {
                Some(facts) => facts,
                None => {
                    failures.push(json!({"source": source, "error": "the model's answer held no JSON array of facts"}));
                    continue;
                }
            },
            Err(error) => {
                failures.push(json!({"source": source, "error": error}));
                continue;
            }
        };
        for (block, fact) in facts {
            let request = AddMemoryRequest {
                key: Some(memory_key.clone()),
                fact,
                block,
                pinned: false,
                actor: caller.identity.key_id.clone(),
                reason: format!("init: {source}"),
            };
            match prompts.add_memory(request).await {
                Ok(response) => added.extend(response.entry),
                Err(error) => failures.push(json!({"source": source, "error": error.message})),
            }
        }
    }
    let after = prompts.list_memory(MemoryQuery { key: Some(memory_key), ..MemoryQuery::default() }).await?;
    let status = match (added.is_empty(), failures.is_empty()) {
        (false, true) => "completed",
        (false, false) => "partial",
        (true, _) => "no_facts",
    };
    Ok(Json(json!({
        "status": status,
        "summary": format!("{} facts extracted from {} documents", added.len(), documents.len()),
        "entries_after": after.total_core_entries,
        "entries": added.iter().map(entry_view).collect::<Vec<_>>(),
        "failures": failures,
        "duration_ms": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })))
}

#[derive(Deserialize)]
pub struct AuditQuery {
    memory_key: Option<String>,
    limit: Option<u32>,
    since: Option<i64>,
    operation: Option<String>,
}

/// Milliseconds since the epoch as the stored timestamp form; 0 or absent: from the start.
fn since(milliseconds: Option<i64>) -> Result<String, ApiError> {
    match milliseconds {
        None | Some(0) => Ok(String::new()),
        Some(milliseconds) => chrono::DateTime::from_timestamp_millis(milliseconds)
            .map(brainstorm_common::time::format_timestamp)
            .ok_or_else(|| ApiError::invalid_request("invalid_since", "since is milliseconds since the epoch")),
    }
}

/// `GET /v1/governance/memory/audit` (governance.read): `memory_key` (the tenant id by default),
/// `limit` (100 by default, at most 500), `since` (ms epoch), `operation` → `{entries[], count}`, newest first.
pub async fn audit(State(state): State<EdgeState>, caller: Caller, Query(query): Query<AuditQuery>) -> Answer {
    caller.require("governance.read")?;
    let request = MemoryAuditQuery {
        key: Some(key(&caller, query.memory_key)?),
        limit: query.limit.unwrap_or(0),
        since: since(query.since)?,
        operation: query.operation.unwrap_or_default(),
    };
    let entries = client(&state)?.memory_audit(request).await?.entries;
    let views: Vec<Value> = entries
        .iter()
        .map(|entry| {
            json!({
                "id": entry.id,
                "timestamp": entry.timestamp,
                "operation": entry.operation,
                "block": entry.block,
                "entry_id": entry.entry_id,
                "fact_after": (!entry.fact_after.is_empty()).then_some(&entry.fact_after),
                "actor": entry.actor,
                "reason": entry.reason,
            })
        })
        .collect();
    Ok(Json(json!({"entries": views, "count": views.len()})))
}

fn counts(stats: &MemoryStats) -> Value {
    stats.counts.iter().map(|count| (count.operation.clone(), json!(count.count))).collect::<serde_json::Map<_, _>>().into()
}

/// `GET /v1/governance/memory/stats` (governance.read): operation counts by type, ever.
pub async fn stats(State(state): State<EdgeState>, caller: Caller, Query(query): Query<KeyQuery>) -> Answer {
    caller.require("governance.read")?;
    let stats =
        client(&state)?.memory_stats(MemoryStatsRequest { key: Some(key(&caller, query.memory_key)?), since: String::new() }).await?;
    let total: u64 = stats.counts.iter().map(|count| count.count).sum();
    Ok(Json(json!({"operations": counts(&stats), "total": total})))
}

fn violation_view(violation: &Violation) -> Value {
    json!({"entry_id": violation.entry_id, "block": violation.block, "fact_preview": violation.fact_preview, "issues": violation.issues})
}

/// `GET /v1/governance/memory/compliance` (governance.read): core entries that look like they hold
/// personal data or secrets, previews masked.
pub async fn compliance(State(state): State<EdgeState>, caller: Caller, Query(query): Query<KeyQuery>) -> Answer {
    caller.require("governance.read")?;
    let report = client(&state)?.memory_compliance(key(&caller, query.memory_key)?).await?;
    Ok(Json(json!({
        "total_entries": report.total_entries,
        "violations_found": report.violations.len(),
        "compliant": report.violations.is_empty(),
        "violations": report.violations.iter().map(violation_view).collect::<Vec<_>>(),
    })))
}

/// `GET /v1/governance/summary` (governance.read): the memory's blocks and their use, its compliance,
/// and the last 24 hours' appends, replacements and deletions.
pub async fn summary(State(state): State<EdgeState>, caller: Caller, Query(query): Query<KeyQuery>) -> Answer {
    caller.require("governance.read")?;
    let memory_key = key(&caller, query.memory_key)?;
    let prompts = client(&state)?;
    let view = prompts.list_memory(MemoryQuery { key: Some(memory_key.clone()), ..MemoryQuery::default() }).await?;
    let report = prompts.memory_compliance(memory_key.clone()).await?;
    let day_ago = brainstorm_common::time::format_timestamp(chrono::Utc::now() - chrono::Duration::hours(24));
    let stats = prompts.memory_stats(MemoryStatsRequest { key: Some(memory_key), since: day_ago }).await?;
    let recent = |operation: &str| stats.counts.iter().find(|count| count.operation == operation).map_or(0, |count| count.count);
    let blocks: Vec<Value> = view
        .blocks
        .iter()
        .map(|block| json!({"block": block.name, "entries": block.count, "limit": block.limit, "utilization": f64::from(block.count) / f64::from(block.limit.max(1))}))
        .collect();
    Ok(Json(json!({
        "memory": {
            "total_entries": view.total_core_entries,
            "pinned_entries": view.blocks.iter().map(|block| block.pinned_count).sum::<u32>(),
            "blocks": blocks,
            "pii_violations": report.violations.len(),
            "compliant": report.violations.is_empty(),
        },
        "activity_24h": {"append": recent("append"), "replace": recent("replace"), "delete": recent("delete")},
    })))
}

/// Share of a block's limit from which the sleep-time report flags it: its next appends evict.
const NEAR_CAPACITY: f64 = 0.8;

#[derive(Deserialize, Default)]
pub struct SleepTimeQuery {
    memory_key: Option<String>,
    since: Option<i64>,
}

/// `GET /v1/governance/sleep-time/report` (governance.read): what happened to a memory while its
/// agent was away, and what needs a look, since `since` (ms epoch; the last 24 hours when absent):
/// operation counts, who made them, the facts evicted to archival, each block's use (flagged from
/// 80% full, where the next appends evict), and the personal or secret data among the facts written
/// in the window (previews masked). Operation counts are exact; the actors, evictions and new
/// findings come from the window's newest 500 operations (`trail_complete` false beyond that).
pub async fn sleep_time_report(State(state): State<EdgeState>, caller: Caller, Query(query): Query<SleepTimeQuery>) -> Answer {
    caller.require("governance.read")?;
    let until = chrono::Utc::now();
    let since_ms = match query.since {
        Some(milliseconds) if milliseconds < 0 => {
            return Err(ApiError::invalid_request("invalid_since", "since is milliseconds since the epoch"));
        }
        Some(milliseconds) => milliseconds,
        None => (until - chrono::Duration::hours(24)).timestamp_millis(),
    };
    let window_start = since(Some(since_ms))?;
    let memory_key = key(&caller, query.memory_key)?;
    let prompts = client(&state)?;
    let stats = prompts.memory_stats(MemoryStatsRequest { key: Some(memory_key.clone()), since: window_start.clone() }).await?;
    let trail = prompts
        .memory_audit(MemoryAuditQuery { key: Some(memory_key.clone()), limit: u32::MAX, since: window_start, operation: String::new() })
        .await?
        .entries;
    let view = prompts.list_memory(MemoryQuery { key: Some(memory_key.clone()), ..MemoryQuery::default() }).await?;
    let report = prompts.memory_compliance(memory_key.clone()).await?;

    let total_operations: u64 = stats.counts.iter().map(|count| count.count).sum();
    let mut actors: Vec<(&str, u64)> = Vec::new();
    for entry in &trail {
        match actors.iter_mut().find(|(actor, _)| *actor == entry.actor) {
            Some((_, operations)) => *operations += 1,
            None => actors.push((&entry.actor, 1)),
        }
    }
    actors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let evictions: Vec<Value> = trail
        .iter()
        .filter(|entry| entry.operation == "evict")
        .map(|entry| {
            json!({
                "entry_id": entry.entry_id,
                "block": entry.block,
                "fact_preview": brainstorm_prompts_eval::memory::masked_preview(&entry.fact_after),
                "at": entry.timestamp,
                "reason": entry.reason,
            })
        })
        .collect();
    let written: std::collections::HashSet<&str> = trail
        .iter()
        .filter(|entry| entry.operation == "append" || entry.operation == "replace")
        .map(|entry| entry.entry_id.as_str())
        .collect();
    let new_violations: Vec<Value> =
        report.violations.iter().filter(|violation| written.contains(violation.entry_id.as_str())).map(violation_view).collect();
    let mut attention = Vec::new();
    let blocks: Vec<Value> = view
        .blocks
        .iter()
        .map(|block| {
            let utilization = f64::from(block.count) / f64::from(block.limit.max(1));
            let near_capacity = utilization >= NEAR_CAPACITY;
            if near_capacity {
                attention.push(json!({
                    "kind": "block_near_capacity",
                    "block": block.name,
                    "message": format!(
                        "block `{}` holds {} of {} facts: the next appends evict its oldest unpinned facts to archival",
                        block.name, block.count, block.limit
                    ),
                }));
            }
            json!({
                "block": block.name,
                "entries": block.count,
                "limit": block.limit,
                "pinned": block.pinned_count,
                "utilization": utilization,
                "near_capacity": near_capacity,
            })
        })
        .collect();
    if !new_violations.is_empty() {
        attention.push(json!({
            "kind": "personal_data_written",
            "count": new_violations.len(),
            "message": "facts written in this window look like they hold personal data or secrets: see new_violations",
        }));
    }
    Ok(Json(json!({
        "memory_key": if memory_key.memory_key.is_empty() { &memory_key.tenant_id } else { &memory_key.memory_key },
        "window": {"since": since_ms, "until": until.timestamp_millis()},
        "operations": counts(&stats),
        "total_operations": total_operations,
        "actors": actors.iter().map(|(actor, operations)| json!({"actor": actor, "operations": operations})).collect::<Vec<_>>(),
        "evictions": evictions,
        "blocks": blocks,
        "new_violations": new_violations,
        "attention": attention,
        "trail_complete": u64::try_from(trail.len()).unwrap_or(u64::MAX) >= total_operations,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_read_from_the_models_array() {
        let answer = "Here you go:\n```json\n[{\"block\": \"human\", \"fact\": \"Ada prefers tea\"}, {\"block\": \"weird\", \"fact\": \"x\"}, {\"fact\": \"  \"}, {\"block\": \"project\"}]\n```";
        assert_eq!(
            extracted_facts(answer),
            Some(vec![("human".to_string(), "Ada prefers tea".to_string()), ("general".to_string(), "x".to_string())])
        );
        assert_eq!(extracted_facts("[]"), Some(Vec::new()));
        assert_eq!(extracted_facts("mock openai reply to: Extract the durable facts"), None);
    }
}
