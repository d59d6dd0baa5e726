//! `/v1/agent-limits`: a tenant's per-agent limits, a map from `agent:<agent id>` to
//! `{maxBudgetUsd, maxRequestsPerMinute}`, replaced (PUT) or merged (PATCH, null deletes) as a
//! whole and versioned. Budget-ledger stores it; the edge enforces it on every completion
//! attributed to the agent (`X-BR-Agent-Id`).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_proto::budget::{AgentLimit, AgentLimits, TenantRef, WriteAgentLimitsRequest};
use serde_json::{Map, Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::JsonBody;

type Answer = Result<Json<Value>, ApiError>;

/// Who may read and write the map: the roles that manage agents (admin, operator).
pub(crate) const MANAGE: &str = "agent.lifecycle.manage";
/// The prefix every key of the map carries.
const KEY_PREFIX: &str = "agent:";

/// The REST view: `{agentLimits: {"agent:<id>": {maxBudgetUsd, maxRequestsPerMinute}}, version}`.
fn view(limits: &AgentLimits) -> Value {
    let map: Map<String, Value> = limits
        .limits
        .iter()
        .map(|(agent_id, limit)| {
            let entry = json!({
                "maxBudgetUsd": limit.max_budget_nanos.map(|nanos| Usd::from_nanos(nanos).to_json()),
                "maxRequestsPerMinute": limit.max_requests_per_minute,
            });
            ([KEY_PREFIX, agent_id].concat(), entry)
        })
        .collect();
    json!({"agentLimits": map, "version": limits.version, "updatedAt": limits.updated_at})
}

/// The map a body carries: the body itself, or its `agentLimits` member.
fn body_map(body: Value) -> Result<Map<String, Value>, ApiError> {
    let Value::Object(mut body) = body else {
        return Err(ApiError::invalid_request("invalid_agent_limits", "the body must be an object mapping `agent:<id>` to limits"));
    };
    match body.remove("agentLimits") {
        None => Ok(body),
        Some(Value::Object(map)) if body.is_empty() => Ok(map),
        Some(_) => Err(ApiError::invalid_request(
            "invalid_agent_limits",
            "agentLimits must be the body's only member, an object mapping `agent:<id>` to limits",
        )),
    }
}

fn agent_id(key: &str) -> Result<String, ApiError> {
    key.strip_prefix(KEY_PREFIX)
        .filter(|id| !id.is_empty())
        .map(str::to_string)
        .ok_or_else(|| ApiError::invalid_request("invalid_agent_limit_key", format!("`{key}`: keys must be `agent:<agent id>`")))
}

/// One entry's value: `{maxBudgetUsd?, maxRequestsPerMinute?}` (a member set to null is absent).
fn limit(key: &str, value: &Value) -> Result<AgentLimit, ApiError> {
    let invalid = |message: String| ApiError::invalid_request("invalid_agent_limit", format!("`{key}`: {message}"));
    let Value::Object(members) = value else {
        return Err(invalid("the limits must be an object {maxBudgetUsd, maxRequestsPerMinute}".to_string()));
    };
    let mut limit = AgentLimit::default();
    for (name, member) in members {
        match (name.as_str(), member) {
            (_, Value::Null) if name == "maxBudgetUsd" || name == "maxRequestsPerMinute" => {}
            ("maxBudgetUsd", Value::Number(amount)) => {
                let amount = Usd::from_json_number(amount).map_err(|error| invalid(format!("maxBudgetUsd: {error}")))?;
                limit.max_budget_nanos = Some(amount.nanos());
            }
            ("maxRequestsPerMinute", Value::Number(rpm)) => {
                let rpm = rpm.as_u64().and_then(|rpm| u32::try_from(rpm).ok());
                limit.max_requests_per_minute =
                    Some(rpm.ok_or_else(|| invalid("maxRequestsPerMinute must be a positive integer".to_string()))?);
            }
            ("maxBudgetUsd" | "maxRequestsPerMinute", _) => return Err(invalid(format!("{name} must be a number or null"))),
            _ => return Err(invalid(format!("unknown member `{name}` (expected maxBudgetUsd, maxRequestsPerMinute)"))),
        }
    }
    Ok(limit)
}

async fn write(state: &EdgeState, caller: &Caller, merge: bool, body: Value) -> Answer {
    caller.require(MANAGE)?;
    let tenant_id = caller.tenant_id()?.to_string();
    let mut set = BTreeMap::new();
    let mut removed = Vec::new();
    for (key, value) in body_map(body)? {
        let agent_id = agent_id(&key)?;
        match value {
            Value::Null if merge => removed.push(agent_id),
            Value::Null => {
                return Err(ApiError::invalid_request("invalid_agent_limit", format!("`{key}`: null deletes an entry only in a PATCH")));
            }
            value => {
                set.insert(agent_id, limit(&key, &value)?);
            }
        }
    }
    let written = state.budget.write_agent_limits(WriteAgentLimitsRequest { tenant_id: tenant_id.clone(), merge, set, removed }).await?;
    state.budget_settings.evict(&tenant_id);
    Ok(Json(view(&written)))
}

/// `GET /v1/agent-limits` (admin, operator): `{agentLimits, version}`.
pub async fn get(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require(MANAGE)?;
    let limits = state.budget.get_agent_limits(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    Ok(Json(view(&limits)))
}

/// `PUT /v1/agent-limits` (admin, operator): replaces the whole map.
pub async fn put(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<Value>) -> Answer {
    write(&state, &caller, false, body).await
}

/// `PATCH /v1/agent-limits` (admin, operator): merges entries; a null value deletes its key.
pub async fn patch(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<Value>) -> Answer {
    write(&state, &caller, true, body).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_strictly() {
        let read = |value: Value| limit("agent:x", &value).map_err(|error| error.code.clone().unwrap_or_default());
        assert_eq!(
            read(json!({"maxBudgetUsd": 2.5, "maxRequestsPerMinute": 60})),
            Ok(AgentLimit { max_budget_nanos: Some(2_500_000_000), max_requests_per_minute: Some(60) })
        );
        assert_eq!(
            read(json!({"maxBudgetUsd": null, "maxRequestsPerMinute": 5})),
            Ok(AgentLimit { max_budget_nanos: None, max_requests_per_minute: Some(5) })
        );
        for bad in [
            json!({"maxRequestsPerMinute": 1.5}),
            json!({"maxRequestsPerMinute": -1}),
            json!({"maxBudgetUsd": "5"}),
            json!({"colour": 1}),
            json!(7),
        ] {
            assert_eq!(read(bad.clone()), Err("invalid_agent_limit".to_string()), "{bad}");
        }
        assert!(agent_id("agent:planner").is_ok_and(|id| id == "planner"));
        assert!(agent_id("planner").is_err() && agent_id("agent:").is_err());
    }

    #[test]
    fn the_map_is_the_body_or_its_agent_limits_member() {
        let map = |body: Value| body_map(body).map(|map| map.keys().cloned().collect::<Vec<_>>()).ok();
        assert_eq!(map(json!({"agent:a": {}})), Some(vec!["agent:a".to_string()]));
        assert_eq!(map(json!({"agentLimits": {"agent:b": {}}})), Some(vec!["agent:b".to_string()]));
        assert_eq!(map(json!({"agentLimits": 3})), None);
        assert_eq!(map(json!([1])), None);
    }
}
