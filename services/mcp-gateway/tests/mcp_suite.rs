//! The mcp-gateway suite (store and service), run against SQLite and PostgreSQL alike. A small axum
//! server on 127.0.0.1:0 stands for registered MCP servers: the streamable HTTP transport (JSON and
//! event-stream answers, a session id, paged tool listings, a bearer credential) and the legacy
//! HTTP+SSE transport.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use brainstorm_common::on_both_engines;
use brainstorm_common::store::Database;
use brainstorm_mcp_gateway::{McpGatewayOptions, McpGatewayServiceImpl};
use brainstorm_proto::ErrorKind;
use brainstorm_proto::mcp::*;
use brainstorm_providers::vault::MasterKey;
use serde_json::{Value, json};
use tokio::sync::mpsc;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const TOKEN: &str = "mcp-secret-token-0123";

/// The fake server's state: what it was asked, and the legacy transport's open event stream.
#[derive(Clone, Default)]
struct Fake {
    calls: Arc<Mutex<Vec<Value>>>,
    legacy: Arc<Mutex<Option<mpsc::UnboundedSender<String>>>>,
}

fn answer(message: &Value) -> Option<Value> {
    let id = message.get("id")?.clone();
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    let result = match message.get("method").and_then(Value::as_str)? {
        "initialize" => {
            json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}})
        }
        "tools/list" if params.get("cursor").is_none() => {
            json!({"tools": [{"name": "add", "description": "adds", "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}], "nextCursor": "page-2"})
        }
        "tools/list" => json!({"tools": [{"name": "echo", "description": "echoes", "inputSchema": {"type": "object"}}]}),
        "tools/call" => {
            let arguments = params.get("arguments").cloned().unwrap_or(Value::Null);
            match params.get("name").and_then(Value::as_str) {
                Some("add") => {
                    let sum = arguments["a"].as_f64().unwrap_or_default() + arguments["b"].as_f64().unwrap_or_default();
                    json!({"content": [{"type": "text", "text": sum.to_string()}], "isError": false})
                }
                Some("echo") => json!({"content": [{"type": "text", "text": arguments.to_string()}]}),
                _ => return Some(json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": "unknown tool"}})),
            }
        }
        _ => return Some(json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no such method"}})),
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

async fn streamable(State(fake): State<Fake>, headers: HeaderMap, body: String) -> Response {
    if headers.get("authorization").and_then(|value| value.to_str().ok()) != Some(&format!("Bearer {TOKEN}")) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Ok(message) = serde_json::from_str::<Value>(&body) else { return StatusCode::BAD_REQUEST.into_response() };
    let method = message.get("method").and_then(Value::as_str).unwrap_or_default().to_string();
    if method != "initialize" && headers.get("mcp-session-id").and_then(|value| value.to_str().ok()) != Some("session-1") {
        return StatusCode::NOT_FOUND.into_response();
    }
    fake.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(message.clone());
    let Some(reply) = answer(&message) else { return StatusCode::ACCEPTED.into_response() };
    if method == "tools/call" {
        // As an event stream, a progress notification first.
        let stream = format!(
            "event: message\ndata: {}\n\nevent: message\ndata: {}\n\n",
            json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}),
            reply
        );
        return ([("content-type", "text/event-stream")], stream).into_response();
    }
    ([("mcp-session-id", "session-1")], axum::Json(reply)).into_response()
}

async fn legacy_stream(State(fake): State<Fake>) -> Response {
    let (sender, receiver) = mpsc::unbounded_channel::<String>();
    let _ = sender.send("event: endpoint\ndata: /messages?session=7\n\n".to_string());
    *fake.legacy.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(sender);
    let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(receiver);
    let body = Body::from_stream(futures_stream(stream));
    ([("content-type", "text/event-stream")], body).into_response()
}

fn futures_stream(
    stream: tokio_stream::wrappers::UnboundedReceiverStream<String>,
) -> impl futures::Stream<Item = Result<String, std::convert::Infallible>> {
    use futures::StreamExt;
    stream.map(Ok)
}

async fn legacy_message(State(fake): State<Fake>, body: String) -> StatusCode {
    let Ok(message) = serde_json::from_str::<Value>(&body) else { return StatusCode::BAD_REQUEST };
    if let Some(reply) = answer(&message) {
        let sender = fake.legacy.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if let Some(sender) = sender {
            let _ = sender.send(format!("event: message\ndata: {reply}\n\n"));
        }
    }
    StatusCode::ACCEPTED
}

async fn fake_server() -> Result<(String, Fake), Box<dyn std::error::Error + Send + Sync>> {
    let fake = Fake::default();
    let router = Router::new()
        .route("/mcp", post(streamable).delete(|| async { StatusCode::OK }))
        .route("/sse", get(legacy_stream))
        .route("/messages", post(legacy_message))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((format!("http://{address}"), fake))
}

fn service(database: Database) -> Result<McpGatewayServiceImpl, Box<dyn std::error::Error + Send + Sync>> {
    let options = McpGatewayOptions {
        master_key: MasterKey::from_hex(&MasterKey::generate_hex())?,
        call_timeout: Duration::from_secs(5),
        allow_private_urls: true,
    };
    Ok(McpGatewayServiceImpl::new(database, options))
}

fn register(tenant_id: &str, name: &str, url: String) -> RegisterServerRequest {
    RegisterServerRequest {
        tenant_id: tenant_id.to_string(),
        name: name.to_string(),
        transport: "streamable-http".to_string(),
        url,
        auth: Some(ServerAuth { r#type: "bearer".to_string(), token: TOKEN.to_string(), header_name: String::new() }),
        allowed_key_ids: Vec::new(),
    }
}

fn call(tenant_id: &str, server: &str, tool: &str, arguments: Value, key: &str) -> CallToolRequest {
    CallToolRequest {
        tenant_id: tenant_id.to_string(),
        server: server.to_string(),
        tool: tool.to_string(),
        arguments_json: arguments.to_string(),
        api_key_id: key.to_string(),
        agent_id: String::new(),
    }
}

fn result_of(response: CallToolResponse) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    match response.outcome {
        Some(call_tool_response::Outcome::Result(result)) => Ok(serde_json::from_str(&result.result_json)?),
        other => Err(format!("expected a result, got {other:?}").into()),
    }
}

async fn servers_are_registered_discovered_and_called(database: Database) -> TestResult {
    let (base, fake) = fake_server().await?;
    let service = service(database)?;
    let server = service.register_server(register("t1", "math", format!("{base}/mcp"))).await?;
    assert_eq!(server.auth_type, "bearer");
    assert!(!server.auth_token_hint.contains("secret"), "the token is only hinted: {}", server.auth_token_hint);
    let again = service.register_server(register("t1", "math", format!("{base}/mcp"))).await;
    assert_eq!(again.err().map(|error| error.kind), Some(ErrorKind::Conflict));
    // Another tenant may use the name, and sees none of t1's servers.
    service.register_server(register("t2", "math", format!("{base}/mcp"))).await?;
    assert_eq!(service.list_servers(TenantRef { tenant_id: "t2".into() }).await?.servers.len(), 1);

    let discovered = service.discover_tools(ServerRef { tenant_id: "t1".into(), server: "math".into() }).await?;
    let names: Vec<&str> = discovered.tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(names, ["add", "echo"], "both pages of the listing");
    let listed = service.list_tools(TenantRef { tenant_id: "t1".into() }).await?;
    assert_eq!(listed.tools.len(), 2);
    assert_eq!(serde_json::from_str::<Value>(&listed.tools[0].input_schema_json)?["properties"]["a"]["type"], "number");
    let shown = service.get_server(ServerRef { tenant_id: "t1".into(), server: server.id.clone() }).await?;
    assert_eq!((shown.tool_count, shown.last_discovered_at.is_empty()), (2, false));

    let result = result_of(service.call_tool(call("t1", "math", "add", json!({"a": 2, "b": 3.5}), "key-1")).await?)?;
    assert_eq!(result["content"][0]["text"], "5.5");
    let calls = fake.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    assert!(calls.iter().any(|call| call["method"] == "notifications/initialized"), "the session was initialized");
    // A server's own error answers 503 with its reason, and lands in the audit trail.
    let failed = service.call_tool(call("t1", "math", "missing", json!({}), "key-1")).await;
    assert_eq!(failed.err().map(|error| error.reason), Some("mcp_server_error".to_string()));
    let audit = service.list_audit(AuditQuery { tenant_id: "t1".into(), limit: 0 }).await?.entries;
    let results: Vec<&str> = audit.iter().map(|entry| entry.result.as_str()).collect();
    assert_eq!(results, ["error", "success"], "newest first");
    assert_eq!(audit[1].api_key_id, "key-1");

    // A wrong credential is the server's 401, not a success.
    let updated = UpdateServerRequest {
        tenant_id: "t1".into(),
        server: "math".into(),
        auth: Some(ServerAuth { r#type: "bearer".into(), token: "wrong-token-000000".into(), header_name: String::new() }),
        ..UpdateServerRequest::default()
    };
    service.update_server(updated).await?;
    let refused = service.discover_tools(ServerRef { tenant_id: "t1".into(), server: "math".into() }).await;
    assert_eq!(refused.err().map(|error| error.kind), Some(ErrorKind::Unavailable));
    // Removing a server removes its tools.
    service.delete_server(ServerRef { tenant_id: "t1".into(), server: "math".into() }).await?;
    assert!(service.list_tools(TenantRef { tenant_id: "t1".into() }).await?.tools.is_empty());
    let gone = service.get_server(ServerRef { tenant_id: "t1".into(), server: "math".into() }).await;
    assert_eq!(gone.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    Ok(())
}

async fn the_legacy_sse_transport_works_too(database: Database) -> TestResult {
    let (base, _fake) = fake_server().await?;
    let service = service(database)?;
    let request = RegisterServerRequest { transport: "sse".into(), auth: None, ..register("t1", "legacy", format!("{base}/sse")) };
    service.register_server(request).await?;
    let discovered = service.discover_tools(ServerRef { tenant_id: "t1".into(), server: "legacy".into() }).await?;
    assert_eq!(discovered.tools.len(), 2);
    let result = result_of(service.call_tool(call("t1", "legacy", "echo", json!({"x": 1}), "key-1")).await?)?;
    assert_eq!(result["content"][0]["text"], "{\"x\":1}");
    Ok(())
}

async fn governance_denies_queues_and_approves(database: Database) -> TestResult {
    let (base, fake) = fake_server().await?;
    let service = service(database)?;
    service.register_server(register("t1", "math", format!("{base}/mcp"))).await?;
    assert!(!service.get_governance(TenantRef { tenant_id: "t1".into() }).await?.enabled);
    let put = |tool_name: &str, allowed: bool, requires_approval: bool| PutPolicyRequest {
        tenant_id: "t1".into(),
        policy: Some(ToolPolicy { tool_name: tool_name.into(), allowed, requires_approval, ..ToolPolicy::default() }),
    };
    service.put_policy(put("echo", false, false)).await?;
    let governance = service.put_policy(put("math/add", true, true)).await?;
    assert_eq!((governance.enabled, governance.policies.len()), (true, 2));

    let denied = service.call_tool(call("t1", "math", "echo", json!({}), "key-1")).await;
    assert_eq!(denied.err().map(|error| (error.kind, error.reason)), Some((ErrorKind::PermissionDenied, "tool_denied".to_string())));
    let calls_before = fake.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len();
    let queued = service.call_tool(call("t1", "math", "add", json!({"a": 1, "b": 1}), "key-1")).await?;
    let Some(call_tool_response::Outcome::Queued(queued)) = queued.outcome else { return Err("expected a queued call".into()) };
    // The same call again waits in the same approval; other arguments get their own.
    let again = service.call_tool(call("t1", "math", "add", json!({"b": 1, "a": 1}), "key-1")).await?;
    assert!(matches!(again.outcome, Some(call_tool_response::Outcome::Queued(ref same)) if same.approval_id == queued.approval_id));
    service.call_tool(call("t1", "math", "add", json!({"a": 2, "b": 2}), "key-1")).await?;
    assert_eq!(fake.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len(), calls_before, "nothing ran before approval");
    assert_eq!(service.get_governance(TenantRef { tenant_id: "t1".into() }).await?.pending_approvals, 2);

    let decide = |id: &str, approve: bool| DecideApprovalRequest {
        tenant_id: "t1".into(),
        approval_id: id.into(),
        approve,
        decided_by: "reviewer".into(),
    };
    let approved = service.decide_approval(decide(&queued.approval_id, true)).await?;
    assert_eq!(approved.status, "approved");
    assert_eq!(serde_json::from_str::<Value>(&approved.result_json)?["content"][0]["text"], "2");
    let twice = service.decide_approval(decide(&queued.approval_id, false)).await;
    assert_eq!(twice.err().map(|error| error.reason), Some("approval_already_decided".to_string()));
    let pending = service.list_approvals(ApprovalQuery { tenant_id: "t1".into(), status: "pending".into() }).await?.approvals;
    assert_eq!(pending.len(), 1);
    let denied = service.decide_approval(decide(&pending[0].id, false)).await?;
    assert_eq!((denied.status.as_str(), denied.result_json.as_str()), ("denied", ""));
    let other_tenant = service.decide_approval(DecideApprovalRequest { tenant_id: "t2".into(), ..decide(&pending[0].id, true) }).await;
    assert_eq!(other_tenant.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    let results: Vec<String> =
        service.list_audit(AuditQuery { tenant_id: "t1".into(), limit: 10 }).await?.entries.into_iter().map(|entry| entry.result).collect();
    assert_eq!(results, ["success", "pending_approval", "pending_approval", "denied"]);
    Ok(())
}

async fn allowed_keys_bind_a_server(database: Database) -> TestResult {
    let (base, _fake) = fake_server().await?;
    let service = service(database)?;
    let request = RegisterServerRequest { allowed_key_ids: vec!["key-2".into()], ..register("t1", "math", format!("{base}/mcp")) };
    service.register_server(request).await?;
    let refused = service.call_tool(call("t1", "math", "add", json!({"a": 1, "b": 1}), "key-1")).await;
    assert_eq!(refused.err().map(|error| error.reason), Some("mcp_key_not_allowed".to_string()));
    result_of(service.call_tool(call("t1", "math", "add", json!({"a": 1, "b": 1}), "key-2")).await?)?;
    let bad = service.call_tool(call("t1", "math", "add", json!([1, 2]), "key-2")).await;
    assert_eq!(bad.err().map(|error| error.kind), Some(ErrorKind::InvalidArgument));
    Ok(())
}

on_both_engines!(
    servers_are_registered_discovered_and_called,
    the_legacy_sse_transport_works_too,
    governance_denies_queues_and_approves,
    allowed_keys_bind_a_server,
);
