//! Audit and lineage reads: chain verification, explain, lineage, signed artifacts, the agents
//! inventory and routing replays. Most answers are the audit-lineage messages as they are (money in
//! nano-dollar fields, scores in millionths); replays speak the spec's USD and field names.

use crate::extract::{Path, Query};
use axum::Json;
use axum::extract::State;
use brainstorm_audit_lineage::price_table;
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_proto::audit::*;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::JsonBody;

type Answer = Result<Json<Value>, ApiError>;

fn json<T: serde::Serialize>(message: &T) -> Answer {
    serde_json::to_value(message).map(Json).map_err(|error| {
        tracing::error!(%error, "cannot render a governance answer");
        ApiError::internal()
    })
}

/// `GET /v1/governance/audit/chain/verify` (governance.read): the tenant's chain; for the platform
/// administrator, the platform chain (refusals that belong to no tenant, such as unknown keys).
pub async fn verify_chain(State(state): State<EdgeState>, caller: Caller) -> Answer {
    let tenant_id = match &caller.identity.tenant_id {
        Some(tenant_id) => {
            caller.require("governance.read")?;
            tenant_id.clone()
        }
        None => {
            caller.require("platform.admin")?;
            crate::pipeline::PLATFORM_CHAIN.to_string()
        }
    };
    let report = state.audit.verify_chain(VerifyChainRequest { tenant_id, max_provenance_checks: None }).await?;
    // The spec's shape (`provenanceChecks[]`, `anchor{}`, `head{}`), as `brainstorm audit verify` prints it.
    json(&brainstorm_audit_lineage::chain::Report::from_proto(&report))
}

/// `GET /v1/explain/{request_id}` (router.read): the decision path of one request: the selected
/// model with its `score` (0-1) and `cost_usd`, and the priced alternatives (`estimated_cost_usd`,
/// `score`), beside the record's exact integers (`*_nanos`, `score_micros`).
pub async fn explain(State(state): State<EdgeState>, caller: Caller, Path(request_id): Path<String>) -> Answer {
    caller.require("router.read")?;
    let explanation = state.audit.explain(RequestRef { tenant_id: caller.tenant_id()?.to_string(), request_id }).await?;
    let Json(mut answer) = json(&explanation)?;
    answer["score"] = json!(explanation.score_micros as f64 / 1e6);
    answer["cost_usd"] = Usd::from_nanos(explanation.cost_nanos).to_json();
    if let Some(alternatives) = answer["alternatives"].as_array_mut() {
        for (view, alternative) in alternatives.iter_mut().zip(&explanation.alternatives) {
            view["score"] = json!(alternative.score_micros as f64 / 1e6);
            view["estimated_cost_usd"] = alternative.estimated_cost_nanos.map_or(Value::Null, |nanos| Usd::from_nanos(nanos).to_json());
        }
    }
    Ok(Json(answer))
}

/// `GET /v1/governance/lineage/{request_id}` (governance.read).
pub async fn lineage(State(state): State<EdgeState>, caller: Caller, Path(request_id): Path<String>) -> Answer {
    caller.require("governance.read")?;
    json(&state.audit.get_lineage(RequestRef { tenant_id: caller.tenant_id()?.to_string(), request_id }).await?)
}

#[derive(Deserialize)]
pub struct EpisodeQuery {
    trace_id: Option<String>,
    request_id: Option<String>,
}

/// `GET /v1/governance/lineage?trace_id=|request_id=` (governance.read): the causal episode.
pub async fn episode(State(state): State<EdgeState>, caller: Caller, Query(query): Query<EpisodeQuery>) -> Answer {
    caller.require("governance.read")?;
    if query.trace_id.is_none() && query.request_id.is_none() {
        return Err(ApiError::invalid_request("missing_field", "give trace_id or request_id"));
    }
    let request = EpisodeRequest { tenant_id: caller.tenant_id()?.to_string(), trace_id: query.trace_id, request_id: query.request_id };
    json(&state.audit.get_episode(request).await?)
}

/// `GET /v1/governance/artifacts/{request_id}` (governance.read): the signed evidence artifact
/// (`canonical`, the exact signed text, and `signature`), with its `accountability` as a member of
/// the answer too, as the spec shows it (omitted when no owner is known).
pub async fn artifact(State(state): State<EdgeState>, caller: Caller, Path(request_id): Path<String>) -> Answer {
    caller.require("governance.read")?;
    let artifact =
        state.audit.get_artifact(ArtifactRequest { tenant_id: caller.tenant_id()?.to_string(), request_id, registry: None }).await?;
    let Json(mut answer) = json(&artifact)?;
    let signed: Value = serde_json::from_str(&artifact.canonical).unwrap_or(Value::Null);
    if let (Some(accountability), Some(answer)) = (signed.get("accountability"), answer.as_object_mut()) {
        answer.insert("accountability".to_string(), accountability.clone());
    }
    Ok(Json(answer))
}

/// `GET /v1/governance/artifact-key` (governance.read): the key that verifies this tenant's artifacts.
pub async fn artifact_key(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("governance.read")?;
    json(&state.audit.get_verification_key(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?)
}

#[derive(Deserialize)]
pub struct PeriodQuery {
    period: Option<String>,
}

/// `GET /v1/governance/agents/inventory?period=day|week|month` (governance.read).
pub async fn inventory(State(state): State<EdgeState>, caller: Caller, Query(query): Query<PeriodQuery>) -> Answer {
    caller.require("governance.read")?;
    let request = InventoryRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        period: query.period.unwrap_or_else(|| "day".to_string()),
        registry: None,
    };
    let inventory = state.audit.get_agent_inventory(request).await?;
    let Json(mut answer) = json(&inventory)?;
    // The spec's `asserted[]` is the list itself (null, with a note, when it could not be read).
    answer["asserted"] = match inventory.asserted {
        Some(list) => json(&list.agents)?.0,
        None => Value::Null,
    };
    Ok(Json(answer))
}

#[derive(Deserialize)]
pub struct DecisionsQuery {
    limit: Option<u32>,
    since: Option<String>,
}

/// `GET /v1/replays/decisions` (router.read).
pub async fn decisions(State(state): State<EdgeState>, caller: Caller, Query(query): Query<DecisionsQuery>) -> Answer {
    caller.require("router.read")?;
    let list = state
        .audit
        .list_decisions(DecisionsRequest { tenant_id: caller.tenant_id()?.to_string(), limit: query.limit, since: query.since })
        .await?;
    let decisions: Vec<Value> = list
        .decisions
        .iter()
        .map(|decision| {
            json!({
                "requestId": decision.request_id,
                "timestamp": decision.timestamp,
                "model": decision.model,
                "provider": decision.provider,
                "endpointId": decision.endpoint_id,
                "strategy": decision.strategy,
                "inputTokens": decision.input_tokens,
                "outputTokens": decision.output_tokens,
                "latencyMs": decision.latency_ms,
                "costUsd": usd(decision.cost_nanos),
            })
        })
        .collect();
    Ok(Json(json!({"decisions": decisions, "count": list.count})))
}

/// Nano-dollars as the spec's USD numbers.
fn usd(nanos: i64) -> Value {
    Usd::from_nanos(nanos).to_json()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulateBody {
    strategy: Option<String>,
    since: Option<String>,
    until: Option<String>,
}

/// `POST /v1/replays/simulate` (router.read): re-prices recorded requests under another strategy.
pub async fn simulate(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<SimulateBody>) -> Answer {
    caller.require("router.read")?;
    let strategy = body.strategy.ok_or_else(|| ApiError::invalid_request("missing_field", "strategy is required"))?;
    let request = SimulateRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        strategy,
        since: body.since,
        until: body.until,
        prices: price_table(&state.models),
    };
    let simulation = state.audit.simulate_replay(request).await?;
    let period = simulation.period.unwrap_or_default();
    let actual = simulation.actual.unwrap_or_default();
    let simulated = simulation.simulated.unwrap_or_default();
    Ok(Json(json!({
        "period": {"since": period.since, "until": period.until},
        "actual": {"total_requests": actual.total_requests, "total_cost_usd": usd(actual.total_cost_nanos), "avg_latency_ms": actual.avg_latency_ms},
        "simulated": {
            "strategy": simulated.strategy,
            "total_requests": simulated.total_requests,
            "total_cost_usd": usd(simulated.total_cost_nanos),
            "avg_latency_ms": simulated.avg_latency_ms,
            "cost_savings_vs_actual": usd(simulated.cost_savings_vs_actual_nanos),
            "cost_savings_pct": simulated.cost_savings_pct,
        },
    })))
}

#[derive(Deserialize)]
pub struct SinceQuery {
    since: Option<String>,
}

/// `GET /v1/replays/compare` (router.read).
pub async fn compare(State(state): State<EdgeState>, caller: Caller, Query(query): Query<SinceQuery>) -> Answer {
    caller.require("router.read")?;
    let comparison =
        state.audit.compare_strategies(CompareRequest { tenant_id: caller.tenant_id()?.to_string(), since: query.since }).await?;
    let strategies: Vec<Value> = comparison
        .strategies
        .iter()
        .map(|stats| {
            json!({
                "strategy": stats.strategy,
                "request_count": stats.request_count,
                "total_cost_usd": usd(stats.total_cost_nanos),
                "avg_cost_per_request": usd(stats.avg_cost_per_request_nanos),
                "avg_latency_ms": stats.avg_latency_ms,
                "p95_latency_ms": stats.p95_latency_ms,
                "total_output_tokens": stats.total_output_tokens,
            })
        })
        .collect();
    Ok(Json(json!({"since": comparison.since, "strategies": strategies})))
}

/// `GET /v1/governance/audit/chain/export` (governance.read): the tenant's chain as JSON lines (a
/// header line, then one line per record), streamed page by page; `brainstorm audit verify FILE`
/// checks it offline.
pub async fn export_chain(State(state): State<EdgeState>, caller: Caller) -> Result<axum::response::Response, ApiError> {
    caller.require("governance.read")?;
    let tenant_id = caller.tenant_id()?.to_string();
    // The first page is read before answering, so an unreachable service is an error, not a cut stream.
    let first = state.audit.export_chain(ExportChainRequest { tenant_id: tenant_id.clone(), after_sequence: None, limit: None }).await?;
    let pages = futures::stream::unfold(Some(first), move |page| {
        let (audit, tenant_id) = (state.audit.clone(), tenant_id.clone());
        async move {
            let page = page?;
            let mut text = page.lines.join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            let next = match page.next_after_sequence {
                None => None,
                Some(after) => {
                    let request = ExportChainRequest { tenant_id, after_sequence: Some(after), limit: None };
                    match audit.export_chain(request).await {
                        Ok(next) => Some(next),
                        Err(error) => {
                            tracing::error!(%error, "the chain export stopped part way");
                            return Some((Err(std::io::Error::other(error.to_string())), None));
                        }
                    }
                }
            };
            Some((Ok::<_, std::io::Error>(axum::body::Bytes::from(text)), next))
        }
    });
    let headers = [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")];
    Ok(axum::response::IntoResponse::into_response((headers, axum::body::Body::from_stream(pages))))
}
