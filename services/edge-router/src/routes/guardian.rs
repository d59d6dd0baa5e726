//! The guardian's control surface: kill switches (tenant and scoped), guardrails and their providers,
//! the tool firewall, security policies, anomalies and the approval queue.

use crate::extract::Path;
use axum::Json;
use axum::extract::State;
use brainstorm_common::ApiError;
use brainstorm_policy_firewall::{FirewallConfig, GuardrailConfig, ScanResult};
use brainstorm_proto::ErrorKind;
use brainstorm_proto::policy::*;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::extract::{JsonBody, OptionalJsonBody};
use crate::{EdgeState, activity};

type Answer = Result<Json<Value>, ApiError>;

/// A configuration PUT: the body's members replace the current configuration's, absent ones keep
/// their value; `code` names a body that does not make a valid configuration.
fn merged<T: serde::Serialize + serde::de::DeserializeOwned>(current: &T, body: Value, code: &str) -> Result<T, ApiError> {
    let mut merged = serde_json::to_value(current).map_err(|_| ApiError::internal())?;
    let Value::Object(changes) = body else { return Err(ApiError::invalid_request("invalid_body", "the body must be a JSON object")) };
    if let Some(object) = merged.as_object_mut() {
        object.extend(changes);
    }
    serde_json::from_value(merged).map_err(|error| ApiError::invalid_request(code, error.to_string()))
}

/// After a kill-switch change through this edge, its own gate takes the new state at once (other
/// edges learn from `policy.events`, or within the 500 ms TTL).
async fn refresh_gate(state: &EdgeState, tenant_id: &str) {
    match state.policy.get_kill_switch_snapshot(TenantRef { tenant_id: tenant_id.to_string() }).await {
        Ok(snapshot) => state.guardian.gate().apply_snapshot(&snapshot),
        Err(error) => tracing::warn!(%error, tenant_id, "cannot refresh the kill-switch gate; it refreshes within its TTL"),
    }
}

fn render<T: serde::Serialize>(message: &T) -> Answer {
    serde_json::to_value(message).map(Json).map_err(|error| {
        tracing::error!(%error, "cannot render a guardian answer");
        ApiError::internal()
    })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ActivateBody {
    reason: Option<String>,
}

/// `POST /v1/killswitch/activate` (security.write): `{reason}`; 409 when already active.
pub async fn activate(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<ActivateBody>) -> Answer {
    caller.require("security.write")?;
    let reason = body
        .reason
        .filter(|reason| !reason.trim().is_empty())
        .ok_or_else(|| ApiError::invalid_request("missing_field", "reason is required"))?;
    let tenant_id = caller.tenant_id()?.to_string();
    let status = state
        .policy
        .activate_kill_switch(ActivateKillSwitchRequest {
            tenant_id: tenant_id.clone(),
            reason,
            activated_by: caller.identity.key_id.clone(),
        })
        .await?;
    refresh_gate(&state, &tenant_id).await;
    let mut event = activity::activity(&tenant_id, "kill_switch.activated", activity::key_actor(&caller), &tenant_id, 5);
    event.reason = status.reason.clone().unwrap_or_default();
    activity::announce(&state, event);
    Ok(Json(
        json!({"ok": true, "active": status.active, "activated_at": status.activated_at, "activated_by": status.activated_by, "reason": status.reason}),
    ))
}

/// `POST /v1/killswitch/deactivate` (security.write); 409 when inactive.
pub async fn deactivate(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let status = state
        .policy
        .deactivate_kill_switch(DeactivateKillSwitchRequest {
            tenant_id: tenant_id.clone(),
            deactivated_by: caller.identity.key_id.clone(),
        })
        .await?;
    refresh_gate(&state, &tenant_id).await;
    activity::announce(&state, activity::activity(&tenant_id, "kill_switch.deactivated", activity::key_actor(&caller), &tenant_id, 3));
    Ok(Json(json!({"ok": true, "active": false, "deactivated_at": status.deactivated_at})))
}

/// `GET /v1/killswitch/status`: state, history (last 50) and active scopes.
pub async fn status(State(state): State<EdgeState>, caller: Caller) -> Answer {
    let status = state.policy.get_kill_switch_status(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    render(&status)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeBody {
    #[serde(rename = "type")]
    kind: Option<String>,
    id: Option<String>,
    reason: Option<String>,
}

/// `POST /v1/killswitch/scope` (security.write): `{type: agent|tool|provider, id, reason?}`.
pub async fn activate_scope(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<ScopeBody>) -> Answer {
    caller.require("security.write")?;
    let kind = body.kind.ok_or_else(|| ApiError::invalid_request("missing_field", "type is required (agent, tool or provider)"))?;
    let id = body.id.filter(|id| !id.is_empty()).ok_or_else(|| ApiError::invalid_request("missing_field", "id is required"))?;
    let request = ActivateScopeRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        r#type: kind,
        id,
        reason: body.reason,
        activated_by: caller.identity.key_id.clone(),
    };
    let tenant_id = request.tenant_id.clone();
    let scope = state.policy.activate_scope(request).await?;
    refresh_gate(&state, &tenant_id).await;
    let subject = format!("{}:{}", scope.r#type, scope.id);
    let mut event = activity::activity(&tenant_id, "kill_switch.scope_activated", activity::key_actor(&caller), &subject, 4);
    event.reason = scope.reason.clone();
    activity::announce(&state, event);
    Ok(Json(json!({"ok": true, "type": scope.r#type, "id": scope.id, "reason": scope.reason})))
}

/// `GET /v1/killswitch/scopes`.
pub async fn scopes(State(state): State<EdgeState>, caller: Caller) -> Answer {
    let list = state.policy.list_scopes(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    let scopes = serde_json::to_value(&list.scopes).map_err(|_| ApiError::internal())?;
    Ok(Json(json!({"count": list.scopes.len(), "scopes": scopes})))
}

/// `DELETE /v1/killswitch/scope/{type}/{id}` (security.write): 404 when absent.
pub async fn deactivate_scope(State(state): State<EdgeState>, caller: Caller, Path((kind, id)): Path<(String, String)>) -> Answer {
    caller.require("security.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let scope = state.policy.deactivate_scope(ScopeRef { tenant_id: tenant_id.clone(), r#type: kind, id }).await?;
    refresh_gate(&state, &tenant_id).await;
    let subject = format!("{}:{}", scope.r#type, scope.id);
    activity::announce(&state, activity::activity(&tenant_id, "kill_switch.scope_deactivated", activity::key_actor(&caller), &subject, 3));
    Ok(Json(json!({"ok": true, "type": scope.r#type, "id": scope.id})))
}

/// `GET /v1/guardrails/config` (security.read).
pub async fn guardrails_config(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    let config = state.policy.get_guardrail_config(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    render(&GuardrailConfig::from_proto(&config))
}

/// `PUT /v1/guardrails/config` (security.write): `{enabled, mode, confidenceThreshold, providers}`;
/// absent fields keep their value.
pub async fn put_guardrails_config(
    State(state): State<EdgeState>,
    caller: Caller,
    OptionalJsonBody(body): OptionalJsonBody<Value>,
) -> Answer {
    caller.require("security.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let current = GuardrailConfig::from_proto(&state.policy.get_guardrail_config(TenantRef { tenant_id: tenant_id.clone() }).await?);
    let config: GuardrailConfig = merged(&current, body, "invalid_guardrail_config")?;
    let stored = state.policy.put_guardrail_config(config.to_proto(&tenant_id, None)).await?;
    state.guardian.evict(&tenant_id);
    render(&GuardrailConfig::from_proto(&stored))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestBody {
    text: Option<String>,
}

/// `POST /v1/guardrails/test` (security.read): scans a text with the tenant's configuration.
pub async fn test_guardrails(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<TestBody>) -> Answer {
    caller.require("security.read")?;
    let text = body.text.ok_or_else(|| ApiError::invalid_request("missing_field", "text is required"))?;
    let result = state.policy.test_guardrails(ScanTextRequest { tenant_id: caller.tenant_id()?.to_string(), text }).await?;
    Ok(Json(ScanResult::from_proto(&result).test_response_json()))
}

fn ruleset_view(ruleset: &Ruleset) -> Value {
    let rules: Vec<Value> = ruleset
        .rules
        .iter()
        .filter_map(|rule| brainstorm_policy_firewall::Rule::from_proto(rule).ok())
        .filter_map(|rule| serde_json::to_value(rule).ok())
        .collect();
    json!({"version": ruleset.version, "rules": rules, "updated_at": ruleset.updated_at})
}

/// `GET /v1/security/policies` (security.read): the ruleset, or `{ruleset: null}`.
pub async fn get_policies(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    let response = state.policy.get_policies(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    Ok(Json(match response.ruleset {
        Some(ruleset) => json!({"ruleset": ruleset_view(&ruleset)}),
        None => json!({"ruleset": null}),
    }))
}

#[derive(Deserialize)]
pub struct RulesetBody {
    rules: Option<Vec<brainstorm_policy_firewall::Rule>>,
}

/// `PUT /v1/security/policies` (security.write): replaces the rules; the version goes up by one.
pub async fn put_policies(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<RulesetBody>) -> Answer {
    caller.require("security.write")?;
    let rules = body.rules.ok_or_else(|| ApiError::invalid_request("missing_field", "rules is required"))?;
    let tenant_id = caller.tenant_id()?.to_string();
    let request = PutPoliciesRequest {
        tenant_id: tenant_id.clone(),
        rules: rules.iter().map(|rule| rule.to_proto()).collect(),
        updated_by: caller.identity.key_id.clone(),
    };
    let ruleset = state.policy.put_policies(request).await?;
    state.guardian.evict(&tenant_id);
    Ok(Json(json!({"ruleset": ruleset_view(&ruleset), "version": ruleset.version, "status": "updated"})))
}

#[derive(Deserialize)]
pub struct PolicyTestBody {
    context: Option<Value>,
}

/// `POST /v1/security/policies/test` (security.read): `{context: {"tool.name", "agent.role", action, ...}}`.
pub async fn test_policy(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<PolicyTestBody>) -> Answer {
    caller.require("security.read")?;
    let context = body
        .context
        .filter(Value::is_object)
        .ok_or_else(|| ApiError::invalid_request("missing_field", "context (an object) is required"))?;
    let result = state
        .policy
        .test_policy(TestPolicyRequest { tenant_id: caller.tenant_id()?.to_string(), context_json: context.to_string() })
        .await?;
    render(&result)
}

/// `GET /v1/security/policies/presets` (security.read).
pub async fn policy_presets(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    let list = state.policy.list_policy_presets(ListPolicyPresetsRequest {}).await?;
    let mut presets = serde_json::Map::new();
    for preset in &list.presets {
        let rules: Vec<Value> = preset
            .rules
            .iter()
            .filter_map(|rule| brainstorm_policy_firewall::Rule::from_proto(rule).ok())
            .filter_map(|rule| serde_json::to_value(rule).ok())
            .collect();
        presets.insert(preset.name.clone(), json!({"description": preset.description, "rules": rules}));
    }
    Ok(Json(json!({"presets": presets})))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DryRunBody {
    action: Option<String>,
    actor: Option<Value>,
    target: Option<String>,
    category: Option<String>,
    agent_id: Option<String>,
    tool_name: Option<String>,
    model_name: Option<String>,
}

/// `POST /v1/governance/policy/dry-run` (security.read): what the ruleset would decide.
pub async fn dry_run(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<DryRunBody>) -> Answer {
    caller.require("security.read")?;
    let action =
        body.action.filter(|action| !action.is_empty()).ok_or_else(|| ApiError::invalid_request("missing_field", "action is required"))?;
    let actor = body.actor.unwrap_or(Value::Null);
    let request = DryRunPolicyRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        action,
        actor_type: actor.get("type").and_then(Value::as_str).map(str::to_string),
        actor_id: actor.get("id").and_then(Value::as_str).map(str::to_string),
        target: body.target,
        category: body.category,
        agent_id: body.agent_id,
        tool_name: body.tool_name,
        model_name: body.model_name,
    };
    render(&state.policy.dry_run_policy(request).await?)
}

/// `GET /v1/security/status` (security.read).
pub async fn security_status(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    render(&state.policy.get_security_status(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?)
}

#[derive(Deserialize)]
pub struct PageQuery {
    limit: Option<u32>,
    offset: Option<u32>,
}

/// `GET /v1/firewall/interceptions?limit=&offset=` (security.read): default limit 50, offset 0.
pub async fn interceptions(
    State(state): State<EdgeState>,
    caller: Caller,
    crate::extract::Query(query): crate::extract::Query<PageQuery>,
) -> Answer {
    caller.require("security.read")?;
    let request = ListInterceptionsRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        limit: query.limit.unwrap_or(50),
        offset: query.offset.unwrap_or(0),
    };
    let list = state.policy.list_interceptions(request).await?;
    let interceptions: Vec<Value> = list.interceptions.iter().map(interception_view).collect();
    Ok(Json(json!({"interceptions": interceptions, "total": list.total, "limit": list.limit, "offset": list.offset})))
}

/// `GET /v1/security/anomalies` (security.read).
pub async fn anomalies(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    render(&state.policy.list_anomalies(ListAnomaliesRequest { tenant_id: caller.tenant_id()?.to_string(), limit: 100 }).await?)
}

/// `GET /v1/firewall/interceptions` body shape: `details{action, verdicts[]}` as the spec lays it out.
fn interception_view(interception: &Interception) -> Value {
    json!({
        "id": interception.id,
        "severity": interception.severity,
        "actorId": interception.actor_id,
        "actorType": interception.actor_type,
        "resource": interception.resource,
        "details": {"action": interception.action, "verdicts": interception.verdicts, "requestId": interception.request_id},
        "createdAt": interception.created_at,
    })
}

/// `GET /v1/firewall/config` (security.read): the tool firewall's configuration.
pub async fn firewall_config(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    let config = state.policy.get_firewall_config(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    render(&FirewallConfig::from_proto(&config).map_err(|error| {
        tracing::error!(%error, "a stored firewall configuration does not read back");
        ApiError::internal()
    })?)
}

/// `PUT /v1/firewall/config` (security.write): `{mode, denyList, maskPatterns, substitutions,
/// downgradeOnTools}`; absent fields keep their value.
pub async fn put_firewall_config(
    State(state): State<EdgeState>,
    caller: Caller,
    OptionalJsonBody(body): OptionalJsonBody<Value>,
) -> Answer {
    caller.require("security.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let stored = state.policy.get_firewall_config(TenantRef { tenant_id: tenant_id.clone() }).await?;
    let current = FirewallConfig::from_proto(&stored).map_err(|_| ApiError::internal())?;
    let config: FirewallConfig = merged(&current, body, "invalid_firewall_config")?;
    config.validate().map_err(|error| ApiError::invalid_request("invalid_firewall_config", error))?;
    let stored = state.policy.put_firewall_config(config.to_proto(&tenant_id, None)).await?;
    state.guardian.evict(&tenant_id);
    render(&FirewallConfig::from_proto(&stored).map_err(|_| ApiError::internal())?)
}

/// `GET /v1/guardrails/providers` (security.read): the built-in scanners and the external providers.
pub async fn guardrail_providers(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    render(&state.policy.list_guardrail_providers(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?)
}

/// `GET /v1/guardrails/templates` (security.read): the external provider templates.
pub async fn guardrail_templates(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    render(&state.policy.list_guardrail_templates(ListGuardrailTemplatesRequest {}).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultMappingBody {
    safe: Option<String>,
    confidence: Option<String>,
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderBody {
    id: Option<String>,
    name: Option<String>,
    endpoint: Option<String>,
    #[serde(alias = "apiKey")]
    api_key: Option<String>,
    template: Option<String>,
    #[serde(alias = "resultMapping")]
    result_mapping: Option<ResultMappingBody>,
    #[serde(alias = "timeoutMs")]
    timeout_ms: Option<u32>,
}

/// `POST /v1/guardrails/providers` (security.write): registers (or replaces) an external provider;
/// its key is sealed and never returned.
pub async fn register_guardrail_provider(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<ProviderBody>) -> Answer {
    caller.require("security.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let id = body.id.filter(|id| !id.is_empty()).ok_or_else(|| ApiError::invalid_request("missing_field", "id is required"))?;
    let endpoint = body.endpoint.ok_or_else(|| ApiError::invalid_request("missing_field", "endpoint is required"))?;
    let request = RegisterGuardrailProviderRequest {
        tenant_id: tenant_id.clone(),
        name: body.name.unwrap_or_else(|| id.clone()),
        id,
        endpoint,
        api_key: body.api_key.filter(|key| !key.is_empty()),
        template: body.template.unwrap_or_else(|| "generic".to_string()),
        result_mapping: body.result_mapping.map(|mapping| ResultMapping {
            safe: mapping.safe.unwrap_or_default(),
            confidence: mapping.confidence.unwrap_or_default(),
            reason: mapping.reason.unwrap_or_default(),
        }),
        timeout_ms: body.timeout_ms.unwrap_or(0),
    };
    let provider = state.policy.register_guardrail_provider(request).await?;
    state.guardian.evict(&tenant_id);
    render(&provider)
}

/// `DELETE /v1/guardrails/providers/{id}` (security.write).
pub async fn delete_guardrail_provider(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("security.write")?;
    let tenant_id = caller.tenant_id()?.to_string();
    let deleted = state.policy.delete_guardrail_provider(GuardrailProviderRef { tenant_id: tenant_id.clone(), id }).await?;
    state.guardian.evict(&tenant_id);
    render(&deleted)
}

/// `GET /v1/security/anomalies/baselines` (security.read): `{baselines, node}`.
pub async fn export_baselines(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    render(&state.policy.export_baselines(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineBody {
    #[serde(alias = "entityType")]
    entity_type: String,
    #[serde(alias = "entityId")]
    entity_id: String,
    metric: String,
    count: u64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
}

#[derive(Deserialize)]
pub struct ImportBody {
    baselines: Option<Vec<BaselineBody>>,
}

/// `POST /v1/security/anomalies/baselines` (security.write): `{baselines[]}` → `{imported}`.
pub async fn import_baselines(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<ImportBody>) -> Answer {
    caller.require("security.write")?;
    let baselines = body.baselines.ok_or_else(|| ApiError::invalid_request("missing_field", "baselines (an array) is required"))?;
    let request = ImportBaselinesRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        baselines: baselines
            .into_iter()
            .map(|baseline| Baseline {
                entity_type: baseline.entity_type,
                entity_id: baseline.entity_id,
                metric: baseline.metric,
                count: baseline.count,
                mean: baseline.mean,
                m2: baseline.m2,
                min: baseline.min,
                max: baseline.max,
            })
            .collect(),
    };
    let imported = state.policy.import_baselines(request).await?;
    Ok(Json(json!({"imported": imported.imported})))
}

/// `GET /v1/security/anomalies/stats/{entity_type}/{entity_id}/{metric}` (security.read): `{stats}`.
pub async fn anomaly_stats(
    State(state): State<EdgeState>,
    caller: Caller,
    Path((entity_type, entity_id, metric)): Path<(String, String, String)>,
) -> Answer {
    caller.require("security.read")?;
    let request = AnomalyStatsRef { tenant_id: caller.tenant_id()?.to_string(), entity_type, entity_id, metric };
    let stats = state.policy.get_anomaly_stats(request).await?;
    Ok(Json(json!({"stats": serde_json::to_value(stats).map_err(|_| ApiError::internal())?})))
}

/// `GET /v1/approvals/pending` (security.read): the durable queue, argument keys but never values:
/// the completion path's approvals, then the MCP path's (`surface: mcp`).
pub async fn pending_approvals(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    let tenant_id = caller.tenant_id()?;
    let list = state.policy.list_pending_approvals(TenantRef { tenant_id: tenant_id.to_string() }).await?;
    let Value::Array(mut approvals) = serde_json::to_value(&list.approvals).map_err(|_| ApiError::internal())? else {
        return Err(ApiError::internal());
    };
    approvals.extend(crate::routes::mcp::pending_in_queue(&state, tenant_id).await?);
    Ok(Json(json!({"count": approvals.len(), "approvals": approvals})))
}

/// `GET /v1/approvals/{id}` (security.read): one approval, whatever its state.
pub async fn get_approval(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("security.read")?;
    render(&state.policy.get_approval(ApprovalRef { tenant_id: caller.tenant_id()?.to_string(), id }).await?)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ReviewBody {
    scope: Option<String>,
    #[serde(alias = "review_note", alias = "reviewNote")]
    note: Option<String>,
}

/// `POST /v1/approvals/{id}/approve` (approvals.write): `{scope: exact|tool, note}`; high-risk tools
/// need a note. The allowance is single use and lapses 15 minutes after approval.
pub async fn approve(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJsonBody(body): OptionalJsonBody<ReviewBody>,
) -> Answer {
    caller.require("approvals.write")?;
    let request = ApproveApprovalRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        id: id.clone(),
        scope: body.scope.unwrap_or_default(),
        review_note: body.note.filter(|note| !note.trim().is_empty()),
        reviewed_by: caller.identity.key_id.clone(),
    };
    match state.policy.approve_approval(request).await {
        // Not the completion path's: an MCP tool call's approval, which this endpoint decides too.
        Err(error) if error.kind == ErrorKind::NotFound && state.mcp.is_some() => {
            crate::routes::mcp::decide_from_queue(&state, &caller, id, true).await
        }
        approved => render(&approved?),
    }
}

/// `POST /v1/approvals/{id}/deny` (approvals.write): `{note}`; a denied call allows nothing.
pub async fn deny(
    State(state): State<EdgeState>,
    caller: Caller,
    Path(id): Path<String>,
    OptionalJsonBody(body): OptionalJsonBody<ReviewBody>,
) -> Answer {
    caller.require("approvals.write")?;
    if body.scope.is_some() {
        return Err(ApiError::invalid_request("invalid_body", "a denial takes no scope"));
    }
    let request = DenyApprovalRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        id: id.clone(),
        review_note: body.note.filter(|note| !note.trim().is_empty()),
        reviewed_by: caller.identity.key_id.clone(),
    };
    match state.policy.deny_approval(request).await {
        Err(error) if error.kind == ErrorKind::NotFound && state.mcp.is_some() => {
            crate::routes::mcp::decide_from_queue(&state, &caller, id, false).await
        }
        denied => render(&denied?),
    }
}
