//! `/v1/mcp/connect`: the gateway itself as an MCP server (streamable HTTP, JSON-RPC 2.0,
//! stateless: every POST is answered on its own, no session id), so an agent or an operator's MCP
//! client can read and steer its governance (the kill switch, budgets and the agent inventory) and
//! reach every tool of the tenant's registered MCP servers through one connection.
//!
//! The `br_*` tools run the REST handler of the same operation with the caller's key, so their
//! permissions and answers are the REST endpoint's; the path is exempt from the tenant's kill switch,
//! and every `br_*` tool is one the spec allows while it is active (deactivating it is one of
//! them). A registered server's tool is exposed as `<server>__<tool>` (the server's name with
//! characters outside letters, digits, `_` and `-` as `_`) and runs as a REST tool call does:
//! kill switches (the tenant's too, so it is blocked while the switch is active), the agent's
//! standing, allowed keys, governance and the audit trail.

use crate::extract::Query;
use axum::Json;
use axum::extract::State;
use axum::http::header::ACCEPT;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use brainstorm_policy_firewall::mcp_tool_allowed_during_activation;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::{JsonBody, JsonBytes};
use crate::routes::{budget, governance, guardian, mcp};
use brainstorm_proto::mcp::{TenantRef, Tool, call_tool_response};

/// Protocol versions this server speaks, newest first; a client asking for another gets the newest.
const PROTOCOL_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];
const SERVER_NAME: &str = "brainstorm";

/// One tool of the connect server.
struct ConnectTool {
    name: &'static str,
    description: &'static str,
    /// The permission the REST endpoint behind it requires (none: any key of the tenant).
    permission: Option<&'static str>,
    input_schema: fn() -> Value,
}

fn no_arguments() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

fn reason_argument() -> Value {
    json!({
        "type": "object",
        "properties": {"reason": {"type": "string", "description": "why the switch is activated (kept in its history)"}},
        "required": ["reason"],
        "additionalProperties": false,
    })
}

fn period_argument() -> Value {
    json!({
        "type": "object",
        "properties": {"period": {"type": "string", "enum": ["day", "week", "month"], "description": "the window (day by default)"}},
        "additionalProperties": false,
    })
}

const TOOLS: [ConnectTool; 6] = [
    ConnectTool {
        name: "br_activate_killswitch",
        description: "Activate the tenant's kill switch: every non-exempt /v1 request is refused until it is deactivated.",
        permission: Some("security.write"),
        input_schema: reason_argument,
    },
    ConnectTool {
        name: "br_deactivate_killswitch",
        description: "Deactivate the tenant's kill switch so routing resumes.",
        permission: Some("security.write"),
        input_schema: no_arguments,
    },
    ConnectTool {
        name: "br_get_killswitch_status",
        description: "The tenant's kill switch: whether it is active, since when, by whom, why, and its history.",
        permission: None,
        input_schema: no_arguments,
    },
    ConnectTool {
        name: "br_get_budget_status",
        description: "Today's and this month's spend against the tenant's limits, and the calling key's budget.",
        permission: Some("config.read"),
        input_schema: no_arguments,
    },
    ConnectTool {
        name: "br_get_budget_forecast",
        description: "The spend forecast: average daily spend, projected period spend, depletion date and trend.",
        permission: Some("config.read"),
        input_schema: no_arguments,
    },
    ConnectTool {
        name: "br_agent_inventory",
        description: "Which agents and keys sent requests in the window: registered, unregistered, untagged keys, and the shadow ratio.",
        permission: Some("governance.read"),
        input_schema: period_argument,
    },
];

fn may_use(caller: &Caller, tool: &ConnectTool) -> bool {
    tool.permission.is_none_or(|permission| caller.identity.permissions.contains(permission))
}

/// `GET /v1/mcp/connect`: the server's name, version, transport and tools with their permissions. A
/// client asking only for an event stream (the transport's server-to-client stream, which a
/// stateless server does not offer) gets 405, as the transport says.
pub async fn describe(caller: Caller, headers: HeaderMap) -> Response {
    let accept = headers.get(ACCEPT).and_then(|value| value.to_str().ok()).unwrap_or_default();
    if accept.contains("text/event-stream") && !accept.contains("application/json") {
        let mut response =
            ApiError::method_not_allowed("GET", "/v1/mcp/connect (no server-to-client stream: this server is stateless)").into_response();
        response.headers_mut().insert("allow", HeaderValue::from_static("GET, POST"));
        return response;
    }
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|tool| {
            json!({
                "name": tool.name,
                "description": tool.description,
                "permission": tool.permission,
                "allowed": may_use(&caller, tool),
                "allowed_during_kill_switch": mcp_tool_allowed_during_activation(tool.name),
                "inputSchema": (tool.input_schema)(),
            })
        })
        .collect();
    Json(json!({
        "name": SERVER_NAME,
        "version": env!("CARGO_PKG_VERSION"),
        "transport": "streamable-http",
        "protocol_versions": PROTOCOL_VERSIONS,
        "endpoint": "/v1/mcp/connect",
        "tools": tools,
    }))
    .into_response()
}

/// `POST /v1/mcp/connect`: one JSON-RPC message or a batch. Requests are answered with their
/// responses (200, JSON); a POST of notifications only is answered 202 with no body.
pub async fn connect(State(state): State<EdgeState>, caller: Caller, headers: HeaderMap, JsonBytes(bytes): JsonBytes) -> Response {
    let agent_id = headers.get("x-br-agent-id").and_then(|value| value.to_str().ok()).filter(|agent| !agent.is_empty());
    let session = Session { state: &state, caller: &caller, agent_id };
    let Ok(message) = serde_json::from_slice::<Value>(&bytes) else {
        return (StatusCode::BAD_REQUEST, Json(rpc_error(Value::Null, -32700, "parse error: the body is not JSON"))).into_response();
    };
    let answer = match message {
        Value::Array(batch) if batch.is_empty() => Some(rpc_error(Value::Null, -32600, "invalid request: an empty batch")),
        Value::Array(batch) => {
            let mut answers = Vec::new();
            for message in batch {
                answers.extend(handle(&session, message).await);
            }
            (!answers.is_empty()).then_some(Value::Array(answers))
        }
        message => handle(&session, message).await,
    };
    match answer {
        Some(answer) => Json(answer).into_response(),
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// `DELETE /v1/mcp/connect`: there are no sessions to end (405, as the transport allows).
pub async fn end_session() -> Response {
    let mut response = ApiError::method_not_allowed("DELETE", "/v1/mcp/connect").into_response();
    response.headers_mut().insert("allow", HeaderValue::from_static("GET, POST"));
    response
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn rpc_result(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// Who one POST speaks for.
struct Session<'a> {
    state: &'a EdgeState,
    caller: &'a Caller,
    /// `X-BR-Agent-Id`: proxied tool calls are attributed to it.
    agent_id: Option<&'a str>,
}

/// A registered server's tool as this server exposes it.
fn exposed_name(server_name: &str, tool: &str) -> String {
    let server: String = server_name
        .chars()
        .map(|character| if character.is_ascii_alphanumeric() || character == '-' || character == '_' { character } else { '_' })
        .collect();
    format!("{server}__{tool}")
}

/// The registered servers' saved tools, when the caller may call them (none without the
/// mcp-gateway service, or when it cannot be read: the `br_*` tools still work).
async fn registered_tools(session: &Session<'_>) -> Vec<Tool> {
    if !session.caller.identity.permissions.contains("router.write") {
        return Vec::new();
    }
    let (Some(client), Ok(tenant_id)) = (session.state.mcp.as_ref(), session.caller.tenant_id()) else { return Vec::new() };
    match client.list_tools(TenantRef { tenant_id: tenant_id.to_string() }).await {
        Ok(list) => list.tools,
        Err(error) => {
            tracing::warn!(%error, "cannot list the registered MCP tools for /v1/mcp/connect");
            Vec::new()
        }
    }
}

/// The answer to one message; None for notifications and responses (nothing to answer).
async fn handle(session: &Session<'_>, message: Value) -> Option<Value> {
    let (state, caller) = (session.state, session.caller);
    let Value::Object(mut message) = message else {
        return Some(rpc_error(Value::Null, -32600, "invalid request: a message is an object"));
    };
    let id = message.remove("id");
    let Some(Value::String(method)) = message.remove("method") else {
        // A response (to a request this server never sends) or garbage.
        return id.map(|id| rpc_error(id, -32600, "invalid request: no method"));
    };
    let id = id?;
    let params = message.remove("params").unwrap_or(Value::Null);
    Some(match method.as_str() {
        "initialize" => {
            let asked = params.get("protocolVersion").and_then(Value::as_str);
            let version = asked.filter(|asked| PROTOCOL_VERSIONS.contains(asked)).unwrap_or(PROTOCOL_VERSIONS[0]);
            rpc_result(
                id,
                json!({
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": false}},
                    "serverInfo": {"name": SERVER_NAME, "version": env!("CARGO_PKG_VERSION")},
                    "instructions": "Brainstorm gateway governance: kill switch, budgets and agent inventory of the calling key's tenant.",
                }),
            )
        }
        "ping" => rpc_result(id, json!({})),
        "tools/list" => {
            let mut tools: Vec<Value> = TOOLS
                .iter()
                .filter(|tool| may_use(caller, tool))
                .map(|tool| json!({"name": tool.name, "description": tool.description, "inputSchema": (tool.input_schema)()}))
                .collect();
            tools.extend(registered_tools(session).await.iter().map(|tool| {
                json!({
                    "name": exposed_name(&tool.server_name, &tool.name),
                    "description": format!("[{}] {}", tool.server_name, tool.description),
                    "inputSchema": serde_json::from_str::<Value>(&tool.input_schema_json).unwrap_or_else(|_| json!({"type": "object"})),
                })
            }));
            rpc_result(id, json!({"tools": tools}))
        }
        "tools/call" => {
            let Some(name) = params.get("name").and_then(Value::as_str) else {
                return Some(rpc_error(id, -32602, "invalid params: tools/call needs a tool `name`"));
            };
            let arguments = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
            if let Some(tool) = TOOLS.iter().find(|tool| tool.name == name) {
                return Some(rpc_result(id, tool_result(run(state, caller, tool, arguments).await)));
            }
            let registered = if name.contains("__") { registered_tools(session).await } else { Vec::new() };
            let Some(tool) = registered.into_iter().find(|tool| exposed_name(&tool.server_name, &tool.name) == name) else {
                return Some(rpc_error(id, -32602, &format!("unknown tool `{name}`: see tools/list")));
            };
            rpc_result(id, proxied(session, tool, arguments).await)
        }
        _ => rpc_error(id, -32601, &format!("method `{method}` not found")),
    })
}

/// A registered server's tool, called as `POST /v1/mcp/tools/{server}/{tool}` is: its result as the
/// server sent it; a call queued for approval, or refused, is an error result saying so.
async fn proxied(session: &Session<'_>, tool: Tool, arguments: Value) -> Value {
    if !arguments.is_object() {
        return tool_result(Err(ApiError::invalid_request("invalid_arguments", "arguments must be a JSON object")));
    }
    match mcp::call_governed(session.state, session.caller, session.agent_id, tool.server_id, tool.name, arguments).await {
        Ok(call_tool_response::Outcome::Result(result)) => {
            serde_json::from_str(&result.result_json).unwrap_or_else(|_| tool_result(Err(ApiError::internal())))
        }
        Ok(call_tool_response::Outcome::Queued(queued)) => {
            let queued = json!({"status": "queued", "approval_id": queued.approval_id, "message": queued.message});
            json!({"content": [{"type": "text", "text": queued.to_string()}], "structuredContent": queued, "isError": true})
        }
        Err(error) => tool_result(Err(error)),
    }
}

/// A `tools/call` result: the REST answer as text and structured content, or the refusal (the
/// error envelope, recovery included) with `isError`.
fn tool_result(outcome: Result<Value, ApiError>) -> Value {
    let (content, is_error) = match outcome {
        Ok(answer) => (answer, false),
        Err(error) => (error.body(), true),
    };
    json!({
        "content": [{"type": "text", "text": content.to_string()}],
        "structuredContent": content,
        "isError": is_error,
    })
}

async fn run(state: &EdgeState, caller: &Caller, tool: &ConnectTool, arguments: Value) -> Result<Value, ApiError> {
    let state = State(state.clone());
    let caller = caller.clone();
    let invalid = |error: serde_json::Error| ApiError::invalid_request("invalid_arguments", format!("{}: {error}", tool.name));
    let no_arguments = |arguments: &Value| match arguments {
        Value::Object(members) if members.is_empty() => Ok(()),
        Value::Null => Ok(()),
        _ => Err(ApiError::invalid_request("invalid_arguments", format!("{} takes no arguments", tool.name))),
    };
    let Json(answer) = match tool.name {
        "br_activate_killswitch" => {
            guardian::activate(state, caller, JsonBody(serde_json::from_value(arguments).map_err(invalid)?)).await?
        }
        "br_deactivate_killswitch" => {
            no_arguments(&arguments)?;
            guardian::deactivate(state, caller).await?
        }
        "br_get_killswitch_status" => {
            no_arguments(&arguments)?;
            guardian::status(state, caller).await?
        }
        "br_get_budget_status" => {
            no_arguments(&arguments)?;
            budget::status(state, caller).await?
        }
        "br_get_budget_forecast" => {
            no_arguments(&arguments)?;
            budget::forecast(state, caller).await?
        }
        "br_agent_inventory" => governance::inventory(state, caller, Query(serde_json::from_value(arguments).map_err(invalid)?)).await?,
        _ => return Err(ApiError::invalid_request("unknown_tool", format!("unknown tool `{}`", tool.name))),
    };
    Ok(answer)
}
