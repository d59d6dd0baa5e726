//! Audit and lineage reads: chain verification, explain, lineage, signed artifacts, the agents
//! inventory and routing replays. Answers are the audit-lineage messages as they are (money in
//! nano-dollar fields, scores in millionths).

use axum::Json;
use axum::extract::{Path, Query, State};
use brainstorm_audit_lineage::price_table;
use brainstorm_common::ApiError;
use brainstorm_proto::audit::*;
use serde::Deserialize;
use serde_json::Value;

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

/// `GET /v1/governance/audit/chain/verify` (governance.read).
pub async fn verify_chain(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("governance.read")?;
    let report =
        state.audit.verify_chain(VerifyChainRequest { tenant_id: caller.tenant_id()?.to_string(), max_provenance_checks: None }).await?;
    json(&report)
}

/// `GET /v1/explain/{request_id}` (router.read): the decision path of one request.
pub async fn explain(State(state): State<EdgeState>, caller: Caller, Path(request_id): Path<String>) -> Answer {
    caller.require("router.read")?;
    json(&state.audit.explain(RequestRef { tenant_id: caller.tenant_id()?.to_string(), request_id }).await?)
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

/// `GET /v1/governance/artifacts/{request_id}` (governance.read): the signed evidence artifact.
pub async fn artifact(State(state): State<EdgeState>, caller: Caller, Path(request_id): Path<String>) -> Answer {
    caller.require("governance.read")?;
    json(&state.audit.get_artifact(ArtifactRequest { tenant_id: caller.tenant_id()?.to_string(), request_id, registry: None }).await?)
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
    json(&state.audit.get_agent_inventory(request).await?)
}

#[derive(Deserialize)]
pub struct DecisionsQuery {
    limit: Option<u32>,
    since: Option<String>,
}

/// `GET /v1/replays/decisions` (router.read).
pub async fn decisions(State(state): State<EdgeState>, caller: Caller, Query(query): Query<DecisionsQuery>) -> Answer {
    caller.require("router.read")?;
    json(
        &state
            .audit
            .list_decisions(DecisionsRequest { tenant_id: caller.tenant_id()?.to_string(), limit: query.limit, since: query.since })
            .await?,
    )
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
    json(&state.audit.simulate_replay(request).await?)
}

#[derive(Deserialize)]
pub struct SinceQuery {
    since: Option<String>,
}

/// `GET /v1/replays/compare` (router.read).
pub async fn compare(State(state): State<EdgeState>, caller: Caller, Query(query): Query<SinceQuery>) -> Answer {
    caller.require("router.read")?;
    json(&state.audit.compare_strategies(CompareRequest { tenant_id: caller.tenant_id()?.to_string(), since: query.since }).await?)
}
