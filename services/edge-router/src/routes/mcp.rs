//! `/v1/mcp/*`: the MCP gateway's REST surface. The mcp-gateway service keeps the servers, tools,
//! policies, approvals and audit trail; the edge authenticates, checks permissions, applies the
//! tenant's kill switches (whole tenant, or the tool's scope) and an agent's standing before a tool
//! runs, and renders the answers.
//!
//! Permissions (the spec states them for governance and approvals only; the rest are this
//! gateway's choice): registering, changing, removing and discovering servers need `config.write`;
//! listing servers and tools `router.read`; calling a tool `router.write`; the audit trail
//! `audit.read`; governance and approvals `security.read` / `security.write`.

use crate::extract::{Path, Query};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_policy_firewall::RequestFacts;
use brainstorm_proto::mcp::*;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::{JsonBody, OptionalJsonBody};
use crate::views::json_text;

type Answer = Result<Json<Value>, ApiError>;

/// The mcp-gateway client, or 503 when this edge was started without one.
pub(crate) fn client(state: &EdgeState) -> Result<&McpGatewayClient, ApiError> {
    state.mcp.as_ref().ok_or_else(|| {
        ApiError::unavailable(
            "mcp_gateway_unavailable",
            "this gateway runs without the mcp-gateway service: set BR_MCP_GATEWAY_URL on the edge",
        )
    })
}

fn server_view(server: &McpServer) -> Value {
    let auth = (!server.auth_type.is_empty()).then(|| {
        let mut auth = json!({"type": server.auth_type, "token_hint": server.auth_token_hint});
        if !server.auth_header_name.is_empty() {
            auth["headerName"] = json!(server.auth_header_name);
        }
        auth
    });
    json!({
        "id": server.id,
        "name": server.name,
        "transport": server.transport,
        "url": server.url,
        "auth": auth,
        "allowed_key_ids": server.allowed_key_ids,
        "tool_count": server.tool_count,
        "created_at": server.created_at,
        "updated_at": server.updated_at,
        "last_discovered_at": (!server.last_discovered_at.is_empty()).then_some(&server.last_discovered_at),
    })
}

fn tools_view(tools: &[Tool]) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|tool| {
            json!({
                "server_id": tool.server_id,
                "server_name": tool.server_name,
                "name": tool.name,
                "description": tool.description,
                "inputSchema": json_text(&tool.input_schema_json),
            })
        })
        .collect();
    json!({"tools": tools, "count": tools.len()})
}

/// A JSON object's member, told apart from an absent one.
fn member<'a>(body: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    body.get(name)
}

fn text(body: &Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
    match member(body, name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(ApiError::invalid_request("invalid_mcp_server", format!("{name} must be a string"))),
    }
}

/// The `auth` member (null: none). Both of its members are optional, as the spec has them: `type`
/// defaults to `bearer`, and an object without a `token` carries no credential (as `auth: null`).
fn auth(value: &Value) -> Result<Option<ServerAuth>, ApiError> {
    if value.is_null() {
        return Ok(None);
    }
    let invalid = |message: &str| ApiError::invalid_request("invalid_mcp_server", message.to_string());
    let Value::Object(auth) = value else { return Err(invalid("auth must be an object {type, token, headerName}")) };
    for name in auth.keys() {
        if !matches!(name.as_str(), "type" | "token" | "headerName" | "header_name") {
            return Err(invalid(&format!("auth has no member `{name}` (type, token, headerName)")));
        }
    }
    let field = |name: &str| -> Result<Option<String>, ApiError> {
        match auth.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(invalid(&format!("auth.{name} must be a string"))),
        }
    };
    let Some(token) = field("token")?.filter(|token| !token.trim().is_empty()) else { return Ok(None) };
    Ok(Some(ServerAuth {
        r#type: field("type")?.unwrap_or_else(|| "bearer".to_string()),
        token,
        header_name: field("headerName")?.or(field("header_name")?).unwrap_or_default(),
    }))
}

fn allowed_key_ids(value: &Value) -> Result<Vec<String>, ApiError> {
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Array(ids) => ids
            .iter()
            .map(|id| {
                id.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::invalid_request("invalid_mcp_server", "allowed_key_ids must be strings"))
            })
            .collect(),
        _ => Err(ApiError::invalid_request("invalid_mcp_server", "allowed_key_ids must be an array of key ids")),
    }
}

const SERVER_MEMBERS: [&str; 5] = ["name", "transport", "url", "auth", "allowed_key_ids"];

fn server_body(body: Value) -> Result<Map<String, Value>, ApiError> {
    let Value::Object(body) = body else {
        return Err(ApiError::invalid_request(
            "invalid_mcp_server",
            "the body must be an object {name, transport, url, auth, allowed_key_ids}",
        ));
    };
    if let Some(unknown) = body.keys().find(|name| !SERVER_MEMBERS.contains(&name.as_str())) {
        return Err(ApiError::invalid_request(
            "invalid_mcp_server",
            format!("unknown member `{unknown}` (name, transport, url, auth, allowed_key_ids)"),
        ));
    }
    Ok(body)
}

/// `POST /v1/mcp/servers` (config.write): `{name, transport, url, auth?, allowed_key_ids?}`; 201.
pub async fn register(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<Value>) -> Result<Response, ApiError> {
    caller.require("config.write")?;
    let body = server_body(body)?;
    let required = |name: &str| -> Result<String, ApiError> {
        text(&body, name)?.ok_or_else(|| ApiError::invalid_request("missing_field", format!("{name} is required")))
    };
    let request = RegisterServerRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        name: required("name")?,
        transport: required("transport")?,
        url: required("url")?,
        auth: member(&body, "auth").map(auth).transpose()?.flatten(),
        allowed_key_ids: member(&body, "allowed_key_ids").map(allowed_key_ids).transpose()?.unwrap_or_default(),
    };
    let server = client(&state)?.register_server(request).await?;
    Ok((StatusCode::CREATED, Json(server_view(&server))).into_response())
}

/// `GET /v1/mcp/servers` (router.read).
pub async fn list(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("router.read")?;
    let servers = client(&state)?.list_servers(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?.servers;
    let views: Vec<Value> = servers.iter().map(server_view).collect();
    Ok(Json(json!({"servers": views, "count": views.len()})))
}

fn server_ref(caller: &Caller, server: String) -> Result<ServerRef, ApiError> {
    Ok(ServerRef { tenant_id: caller.tenant_id()?.to_string(), server })
}

/// `GET /v1/mcp/servers/{id}` (router.read): by id or name.
pub async fn get(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("router.read")?;
    Ok(Json(server_view(&client(&state)?.get_server(server_ref(&caller, id)?).await?)))
}

/// `PUT /v1/mcp/servers/{id}` (config.write): the members sent change; `auth: null` (or an `auth`
/// without a token) removes the credential, an absent `auth` keeps it.
pub async fn update(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>, JsonBody(body): JsonBody<Value>) -> Answer {
    caller.require("config.write")?;
    let body = server_body(body)?;
    let auth_member = member(&body, "auth").map(auth).transpose()?;
    let request = UpdateServerRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        server: id,
        name: text(&body, "name")?,
        transport: text(&body, "transport")?,
        url: text(&body, "url")?,
        remove_auth: matches!(auth_member, Some(None)),
        auth: auth_member.flatten(),
        set_allowed_key_ids: member(&body, "allowed_key_ids").is_some(),
        allowed_key_ids: member(&body, "allowed_key_ids").map(allowed_key_ids).transpose()?.unwrap_or_default(),
    };
    Ok(Json(server_view(&client(&state)?.update_server(request).await?)))
}

/// `DELETE /v1/mcp/servers/{id}` (config.write): the server and its tools; its audit trail stays.
pub async fn delete(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("config.write")?;
    let server = client(&state)?.delete_server(server_ref(&caller, id)?).await?;
    Ok(Json(json!({"deleted": true, "id": server.id, "name": server.name})))
}

/// `POST /v1/mcp/servers/{id}/discover` (config.write): lists the server's tools live and saves them.
pub async fn discover(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("config.write")?;
    Ok(Json(tools_view(&client(&state)?.discover_tools(server_ref(&caller, id)?).await?.tools)))
}

/// `GET /v1/mcp/tools` (router.read): every discovered tool of the tenant's servers.
pub async fn tools(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("router.read")?;
    Ok(Json(tools_view(&client(&state)?.list_tools(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?.tools)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CallBody {
    arguments: Option<Value>,
}

/// `POST /v1/mcp/tools/{server}/{tool}` (router.write): `{arguments}` → `{result, metadata}`; 202
/// `{status: queued, approval_id, message}` when the tool needs approval; 403 when denied, when the
/// tenant's kill switch or the tool's scope is active, or when the attributed agent may not act.
pub async fn call(
    State(state): State<EdgeState>,
    caller: Caller,
    headers: HeaderMap,
    Path((server, tool)): Path<(String, String)>,
    OptionalJsonBody(body): OptionalJsonBody<CallBody>,
) -> Result<Response, ApiError> {
    let arguments = match body.arguments {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(arguments @ Value::Object(_)) => arguments,
        Some(_) => return Err(ApiError::invalid_request("invalid_arguments", "arguments must be a JSON object")),
    };
    let agent_id = headers.get("x-br-agent-id").and_then(|value| value.to_str().ok()).filter(|agent| !agent.is_empty());
    match call_governed(&state, &caller, agent_id, server, tool, arguments).await? {
        call_tool_response::Outcome::Result(result) => Ok(Json(json!({
            "result": json_text(&result.result_json),
            "metadata": {"server_id": result.server_id, "tool": result.tool, "latency_ms": result.latency_ms},
        }))
        .into_response()),
        call_tool_response::Outcome::Queued(queued) => {
            Ok((StatusCode::ACCEPTED, Json(json!({"status": "queued", "approval_id": queued.approval_id, "message": queued.message})))
                .into_response())
        }
    }
}

/// A tool call through the gateway, by REST or through `/v1/mcp/connect`: `router.write`, the
/// scoped kill switches (the tool's, the agent's), the attributed agent's standing, then the
/// service (allowed keys, governance, the call and its audit entry). The tenant switch was already
/// applied when the caller was admitted on a guarded path; it is applied again here for the
/// connect server, whose path is exempt.
pub(crate) async fn call_governed(
    state: &EdgeState,
    caller: &Caller,
    agent_id: Option<&str>,
    server: String,
    tool: String,
    arguments: Value,
) -> Result<call_tool_response::Outcome, ApiError> {
    caller.require("router.write")?;
    let tenant_id = caller.tenant_id()?;
    let tool_names = [tool.as_str()];
    let facts = RequestFacts { path: "/v1/mcp/tools", method: "POST", agent_id, tool_names: &tool_names, model: None };
    if let Some(error) = state.guardian.kill_switch(tenant_id, &facts).await.api_error() {
        return Err(error);
    }
    if let Some(agent_id) = agent_id {
        state.authenticator.admit_agent(tenant_id, agent_id).await?;
    }
    let request = CallToolRequest {
        tenant_id: tenant_id.to_string(),
        server,
        tool,
        arguments_json: arguments.to_string(),
        api_key_id: caller.identity.key_id.clone(),
        agent_id: agent_id.unwrap_or_default().to_string(),
    };
    client(state)?.call_tool(request).await?.outcome.ok_or_else(ApiError::internal)
}

#[derive(Deserialize)]
pub struct LimitQuery {
    limit: Option<String>,
}

/// `GET /v1/mcp/audit?limit=N` (audit.read): the newest calls first (50 by default, at most 500).
pub async fn audit(State(state): State<EdgeState>, caller: Caller, Query(query): Query<LimitQuery>) -> Answer {
    caller.require("audit.read")?;
    let limit = match query.limit.as_deref() {
        None => 0,
        Some(limit) => limit
            .parse::<u32>()
            .ok()
            .filter(|limit| *limit > 0)
            .ok_or_else(|| ApiError::invalid_request("invalid_limit", "limit must be a positive integer (at most 500)"))?,
    };
    let entries = client(&state)?.list_audit(AuditQuery { tenant_id: caller.tenant_id()?.to_string(), limit }).await?.entries;
    let views: Vec<Value> = entries
        .iter()
        .map(|entry| {
            let mut view = json!({
                "id": entry.id,
                "timestamp": entry.timestamp,
                "server_id": entry.server_id,
                "server_name": entry.server_name,
                "tool": entry.tool,
                "result": entry.result,
                "latency_ms": entry.latency_ms,
                "api_key_id": entry.api_key_id,
            });
            if !entry.detail.is_empty() {
                view["detail"] = json!(entry.detail);
            }
            view
        })
        .collect();
    Ok(Json(json!({"entries": views, "count": views.len()})))
}

fn governance_view(governance: &Governance) -> Value {
    if !governance.enabled {
        return json!({
            "enabled": false,
            "message": "no tool policies are configured: every tool of a registered server may be called; PUT /v1/mcp/governance/policy adds one",
            "pending_approvals": governance.pending_approvals,
        });
    }
    let policies: Vec<Value> = governance
        .policies
        .iter()
        .map(|policy| {
            json!({
                "tool_name": policy.tool_name,
                "allowed": policy.allowed,
                "requires_approval": policy.requires_approval,
                "max_cost_usd": policy.max_cost_nanos.map(|nanos| Usd::from_nanos(nanos).to_json()),
                "updated_at": policy.updated_at,
            })
        })
        .collect();
    json!({"enabled": true, "policies": policies, "pending_approvals": governance.pending_approvals})
}

/// `GET /v1/mcp/governance` (security.read).
pub async fn governance(State(state): State<EdgeState>, caller: Caller) -> Answer {
    caller.require("security.read")?;
    Ok(Json(governance_view(&client(&state)?.get_governance(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyBody {
    tool_name: Option<String>,
    allowed: Option<bool>,
    requires_approval: Option<bool>,
    max_cost_usd: Option<serde_json::Number>,
}

/// `PUT /v1/mcp/governance/policy` (security.write): `{tool_name, allowed, requires_approval?,
/// max_cost_usd?}`; `tool_name` is a tool, `server/tool`, or `*` for every tool without its own.
pub async fn put_policy(State(state): State<EdgeState>, caller: Caller, JsonBody(body): JsonBody<PolicyBody>) -> Answer {
    caller.require("security.write")?;
    let missing = |name: &str| ApiError::invalid_request("missing_field", format!("{name} is required"));
    let max_cost_nanos = body
        .max_cost_usd
        .map(|amount| Usd::from_json_number(&amount).map(Usd::nanos))
        .transpose()
        .map_err(|error| ApiError::invalid_request("invalid_tool_policy", format!("max_cost_usd: {error}")))?;
    let policy = ToolPolicy {
        tool_name: body.tool_name.ok_or_else(|| missing("tool_name"))?,
        allowed: body.allowed.ok_or_else(|| missing("allowed"))?,
        requires_approval: body.requires_approval.unwrap_or(false),
        max_cost_nanos,
        updated_at: String::new(),
    };
    let request = PutPolicyRequest { tenant_id: caller.tenant_id()?.to_string(), policy: Some(policy) };
    Ok(Json(governance_view(&client(&state)?.put_policy(request).await?)))
}

fn approval_view(approval: &Approval) -> Value {
    let mut view = json!({
        "id": approval.id,
        "timestamp": approval.timestamp,
        "server_id": approval.server_id,
        "server_name": approval.server_name,
        "tool": approval.tool,
        "arguments": json_text(&approval.arguments_json),
        "status": approval.status,
        "api_key_id": approval.api_key_id,
    });
    if !approval.decided_at.is_empty() {
        view["decided_at"] = json!(approval.decided_at);
        view["decided_by"] = json!(approval.decided_by);
    }
    view
}

#[derive(Deserialize)]
pub struct StatusQuery {
    status: Option<String>,
}

/// `GET /v1/mcp/approvals?status=pending|approved|denied` (security.read): newest first.
pub async fn approvals(State(state): State<EdgeState>, caller: Caller, Query(query): Query<StatusQuery>) -> Answer {
    caller.require("security.read")?;
    let request = ApprovalQuery { tenant_id: caller.tenant_id()?.to_string(), status: query.status.unwrap_or_default() };
    let approvals = client(&state)?.list_approvals(request).await?.approvals;
    let views: Vec<Value> = approvals.iter().map(approval_view).collect();
    Ok(Json(json!({"approvals": views, "count": views.len()})))
}

/// `POST /v1/mcp/approvals/{id}/approve` (security.write): runs the queued call → `{id, status:
/// approved, result}` (with `error` instead when the call failed); 409 when already decided.
pub async fn approve(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("security.write")?;
    decide_from_queue(&state, &caller, id, true).await
}

/// `POST /v1/mcp/approvals/{id}/deny` (security.write) → `{id, status: denied}`.
pub async fn deny(State(state): State<EdgeState>, caller: Caller, Path(id): Path<String>) -> Answer {
    caller.require("security.write")?;
    decide_from_queue(&state, &caller, id, false).await
}

/// The tenant's pending MCP approvals as the shared queue (`GET /v1/approvals/pending`) shows them:
/// surface `mcp`, the tool, its server and the argument keys, never their values.
pub(crate) async fn pending_in_queue(state: &EdgeState, tenant_id: &str) -> Result<Vec<Value>, ApiError> {
    let Some(client) = state.mcp.as_ref() else { return Ok(Vec::new()) };
    let approvals =
        client.list_approvals(ApprovalQuery { tenant_id: tenant_id.to_string(), status: "pending".to_string() }).await?.approvals;
    Ok(approvals
        .iter()
        .map(|approval| {
            let arguments = json_text(&approval.arguments_json);
            let argument_keys: Vec<&String> = arguments.as_object().map(|members| members.keys().collect()).unwrap_or_default();
            json!({
                "id": approval.id,
                "tool_name": approval.tool,
                "surface": "mcp",
                "server_id": approval.server_id,
                "server_name": approval.server_name,
                "argument_keys": argument_keys,
                "status": approval.status,
                "created_at": approval.timestamp,
                "api_key_id": approval.api_key_id,
            })
        })
        .collect())
}

/// `POST /v1/approvals/{id}/approve|deny` for an approval of the MCP path (the spec lets either
/// endpoint decide it): the answer of `/v1/mcp/approvals/{id}/...`.
pub(crate) async fn decide_from_queue(state: &EdgeState, caller: &Caller, id: String, approve: bool) -> Answer {
    let request = DecideApprovalRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        approval_id: id,
        approve,
        decided_by: caller.identity.key_id.clone(),
    };
    Ok(Json(decision_view(&client(state)?.decide_approval(request).await?)))
}

fn decision_view(approval: &Approval) -> Value {
    if approval.status != "approved" {
        return json!({"id": approval.id, "status": approval.status});
    }
    let mut answer = json!({
        "id": approval.id,
        "status": approval.status,
        "result": json_text(&approval.result_json),
    });
    if !approval.error.is_empty() {
        answer["error"] = json!(approval.error);
    }
    answer
}
