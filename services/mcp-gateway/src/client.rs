//! A client of MCP servers: JSON-RPC 2.0 over the streamable HTTP transport (one POST per message,
//! answered with JSON or an event stream) or the legacy HTTP+SSE transport (an event stream that
//! names the endpoint messages are posted to, and carries the answers). Stateless: every operation
//! opens its own session (initialize, the initialized notification, the calls, and for streamable
//! HTTP a DELETE of the session when the server gave one).

use std::collections::VecDeque;
use std::time::Duration;

use brainstorm_providers::sse::{SseEvent, SseParser};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

/// The protocol version this client asks for; the server may answer with another it supports.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Most bytes one answer (or the event stream of a session) may carry.
const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;
/// Most pages of a tool listing followed.
const MAX_PAGES: usize = 50;
const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_HEADER: &str = "mcp-protocol-version";

/// Why talking to an MCP server failed.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("cannot reach the MCP server: {0}")]
    Unreachable(String),
    #[error("the MCP server answered HTTP {status}: {body}")]
    Http { status: u16, body: String },
    #[error("the MCP server broke the protocol: {0}")]
    Protocol(String),
    #[error("the MCP server answered error {code}: {message}")]
    Rpc { code: i64, message: String },
    #[error("the MCP server did not answer within {0:?}")]
    Timeout(Duration),
}

/// How to reach one server.
#[derive(Debug, Clone)]
pub struct ServerAccess {
    /// `streamable-http` or `sse`.
    pub transport: String,
    pub url: String,
    /// The credential's header and value (`authorization: Bearer ...` or `x-api-key: ...`).
    pub auth: Option<(HeaderName, HeaderValue)>,
}

/// A tool as a server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// Talks to MCP servers over one HTTP connection pool.
#[derive(Debug, Clone)]
pub struct McpClient {
    http: reqwest::Client,
    timeout: Duration,
}

impl McpClient {
    /// A client whose every operation (a whole session) ends within `timeout`; it follows redirects
    /// only within one origin and, unless `allow_private` (`BR_MCP_ALLOW_PRIVATE_URLS`), connects to no name that
    /// resolves only to private addresses (`common::net::tenant_http_client`).
    pub fn new(timeout: Duration, allow_private: bool) -> McpClient {
        let http = brainstorm_common::net::tenant_http_client(allow_private).build().unwrap_or_default();
        McpClient { http, timeout }
    }

    /// The server's tools (every page of `tools/list`).
    pub async fn list_tools(&self, server: &ServerAccess) -> Result<Vec<DiscoveredTool>, McpError> {
        self.within_timeout(async {
            let mut session = Session::open(&self.http, server).await?;
            let mut tools = Vec::new();
            let mut cursor: Option<String> = None;
            for _ in 0..MAX_PAGES {
                let params = match &cursor {
                    Some(cursor) => json!({"cursor": cursor}),
                    None => json!({}),
                };
                let page = session.request("tools/list", params).await?;
                let listed = page
                    .get("tools")
                    .and_then(Value::as_array)
                    .ok_or_else(|| McpError::Protocol("tools/list answered without `tools`".into()))?;
                for tool in listed {
                    tools.push(discovered_tool(tool)?);
                }
                cursor = page.get("nextCursor").and_then(Value::as_str).filter(|cursor| !cursor.is_empty()).map(str::to_string);
                if cursor.is_none() {
                    break;
                }
            }
            session.close().await;
            Ok(tools)
        })
        .await
    }

    /// Calls `name` with `arguments`; the `tools/call` result as the server sent it (a tool's own
    /// failure is a result with `isError: true`, not an error here).
    pub async fn call_tool(&self, server: &ServerAccess, name: &str, arguments: Value) -> Result<Value, McpError> {
        self.within_timeout(async {
            let mut session = Session::open(&self.http, server).await?;
            let result = session.request("tools/call", json!({"name": name, "arguments": arguments})).await?;
            session.close().await;
            if !result.is_object() {
                return Err(McpError::Protocol("tools/call answered with a result that is not an object".into()));
            }
            Ok(result)
        })
        .await
    }

    async fn within_timeout<T>(&self, operation: impl Future<Output = Result<T, McpError>>) -> Result<T, McpError> {
        tokio::time::timeout(self.timeout, operation).await.unwrap_or(Err(McpError::Timeout(self.timeout)))
    }
}

fn discovered_tool(tool: &Value) -> Result<DiscoveredTool, McpError> {
    let name = tool.get("name").and_then(Value::as_str).filter(|name| !name.is_empty());
    let name = name.ok_or_else(|| McpError::Protocol("a listed tool has no name".into()))?;
    Ok(DiscoveredTool {
        name: name.to_string(),
        description: tool.get("description").and_then(Value::as_str).unwrap_or_default().to_string(),
        input_schema: tool.get("inputSchema").cloned().unwrap_or_else(|| json!({"type": "object"})),
    })
}

/// One session with a server.
struct Session<'a> {
    http: &'a reqwest::Client,
    auth: Option<(HeaderName, HeaderValue)>,
    next_id: i64,
    protocol_version: Option<String>,
    kind: SessionKind,
}

enum SessionKind {
    /// Messages are POSTed to `url`; `session_id` once the server assigned one.
    Streamable { url: String, session_id: Option<String> },
    /// Messages are POSTed to `endpoint`; answers arrive on `events`.
    Legacy { endpoint: String, events: EventReader },
}

impl<'a> Session<'a> {
    /// Connects and initializes.
    async fn open(http: &'a reqwest::Client, server: &ServerAccess) -> Result<Session<'a>, McpError> {
        let kind = match server.transport.as_str() {
            "sse" => {
                let mut request = http.get(&server.url).header(ACCEPT, "text/event-stream");
                if let Some((name, value)) = &server.auth {
                    request = request.header(name, value);
                }
                let response = request.send().await.map_err(unreachable)?;
                let response = successful(response).await?;
                let base = response.url().clone();
                let mut events = EventReader::new(response.bytes_stream().boxed());
                let endpoint = loop {
                    let event = events
                        .next_event()
                        .await?
                        .ok_or_else(|| McpError::Protocol("the event stream ended before naming its endpoint".into()))?;
                    if event_name(&event) == "endpoint" {
                        break base
                            .join(event.data.trim())
                            .map_err(|error| McpError::Protocol(format!("the endpoint `{}` is not a URL: {error}", event.data)))?;
                    }
                };
                SessionKind::Legacy { endpoint: endpoint.to_string(), events }
            }
            _ => SessionKind::Streamable { url: server.url.clone(), session_id: None },
        };
        let mut session = Session { http, auth: server.auth.clone(), next_id: 1, protocol_version: None, kind };
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "brainstorm-mcp-gateway", "version": env!("CARGO_PKG_VERSION")},
        });
        let initialized = session.request("initialize", params).await?;
        session.protocol_version = initialized.get("protocolVersion").and_then(Value::as_str).map(str::to_string);
        session.notify("notifications/initialized").await?;
        Ok(session)
    }

    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
        if let Some((name, value)) = &self.auth {
            headers.insert(name.clone(), value.clone());
        }
        if let Some(version) = self.protocol_version.as_deref().and_then(|version| HeaderValue::from_str(version).ok()) {
            headers.insert(PROTOCOL_HEADER, version);
        }
        if let SessionKind::Streamable { session_id: Some(id), .. } = &self.kind
            && let Ok(id) = HeaderValue::from_str(id)
        {
            headers.insert(SESSION_HEADER, id);
        }
        headers
    }

    /// Sends a request and waits for its answer: the `result`, or the `error` as [`McpError::Rpc`].
    async fn request(&mut self, method: &str, params: Value) -> Result<Value, McpError> {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let headers = self.headers();
        let answer = match &mut self.kind {
            SessionKind::Streamable { url, session_id } => {
                let response = self.http.post(url.as_str()).headers(headers).json(&message).send().await.map_err(unreachable)?;
                let response = successful(response).await?;
                if let Some(assigned) = response.headers().get(SESSION_HEADER).and_then(|value| value.to_str().ok()) {
                    *session_id = Some(assigned.to_string());
                }
                let is_stream = response
                    .headers()
                    .get(CONTENT_TYPE)
                    .and_then(|value| value.to_str().ok())
                    .is_some_and(|value| value.starts_with("text/event-stream"));
                if is_stream {
                    let mut events = EventReader::new(response.bytes_stream().boxed());
                    answer_on(&mut events, id).await?
                } else {
                    let body = limited_body(response).await?;
                    let value: Value =
                        serde_json::from_slice(&body).map_err(|error| McpError::Protocol(format!("the answer is not JSON: {error}")))?;
                    answer_in(value, id).ok_or_else(|| McpError::Protocol(format!("the answer carries no response to request {id}")))?
                }
            }
            SessionKind::Legacy { endpoint, events } => {
                let response = self.http.post(endpoint.as_str()).headers(headers).json(&message).send().await.map_err(unreachable)?;
                successful(response).await?;
                answer_on(events, id).await?
            }
        };
        into_result(answer)
    }

    /// Sends a notification (no answer expected beyond the HTTP status).
    async fn notify(&mut self, method: &str) -> Result<(), McpError> {
        let message = json!({"jsonrpc": "2.0", "method": method});
        let url = match &self.kind {
            SessionKind::Streamable { url, .. } => url.clone(),
            SessionKind::Legacy { endpoint, .. } => endpoint.clone(),
        };
        let response = self.http.post(url).headers(self.headers()).json(&message).send().await.map_err(unreachable)?;
        successful(response).await.map(drop)
    }

    /// Ends the session on the server when it has one (best effort: the work is done).
    async fn close(self) {
        if let SessionKind::Streamable { url, session_id: Some(_) } = &self.kind {
            let headers = self.headers();
            if let Err(error) = self.http.delete(url.as_str()).headers(headers).send().await {
                tracing::debug!(%error, "cannot end the MCP session");
            }
        }
    }
}

fn unreachable(error: reqwest::Error) -> McpError {
    McpError::Unreachable(error.without_url().to_string())
}

/// The response when its status is a success, else its status and the start of its body.
async fn successful(response: reqwest::Response) -> Result<reqwest::Response, McpError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    Err(McpError::Http { status: status.as_u16(), body: body.chars().take(200).collect() })
}

async fn limited_body(response: reqwest::Response) -> Result<Bytes, McpError> {
    let mut stream = response.bytes_stream();
    let mut body = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        body.extend_from_slice(&chunk.map_err(unreachable)?);
        if body.len() > MAX_ANSWER_BYTES {
            return Err(McpError::Protocol(format!("the answer exceeds {MAX_ANSWER_BYTES} bytes")));
        }
    }
    Ok(body.freeze())
}

/// Reads events until the response to request `id` (server requests and notifications are skipped).
async fn answer_on(events: &mut EventReader, id: i64) -> Result<Value, McpError> {
    while let Some(event) = events.next_event().await? {
        if event_name(&event) != "message" || event.data.is_empty() {
            continue;
        }
        let Ok(value) = serde_json::from_str::<Value>(&event.data) else { continue };
        if let Some(answer) = answer_in(value, id) {
            return Ok(answer);
        }
    }
    Err(McpError::Protocol(format!("the event stream ended before the response to request {id}")))
}

/// The response to request `id` in a message or a batch of messages.
fn answer_in(value: Value, id: i64) -> Option<Value> {
    match value {
        Value::Array(messages) => messages.into_iter().find_map(|message| answer_in(message, id)),
        Value::Object(ref message) => {
            let is_answer =
                message.get("id").and_then(Value::as_i64) == Some(id) && (message.contains_key("result") || message.contains_key("error"));
            is_answer.then_some(value)
        }
        _ => None,
    }
}

/// A response's `result`, or its `error`.
fn into_result(mut answer: Value) -> Result<Value, McpError> {
    if let Some(error) = answer.get("error") {
        let code = error.get("code").and_then(Value::as_i64).unwrap_or_default();
        let message = error.get("message").and_then(Value::as_str).unwrap_or("no message").to_string();
        return Err(McpError::Rpc { code, message });
    }
    Ok(answer.get_mut("result").map(Value::take).unwrap_or(Value::Null))
}

/// Reads server-sent events from a byte stream (with the providers' SSE parser). An event the
/// stream does not finish with a blank line is dropped, as SSE says.
struct EventReader {
    stream: BoxStream<'static, reqwest::Result<Bytes>>,
    parser: SseParser,
    pending: VecDeque<SseEvent>,
    read: usize,
}

impl EventReader {
    fn new(stream: BoxStream<'static, reqwest::Result<Bytes>>) -> EventReader {
        EventReader { stream, parser: SseParser::default(), pending: VecDeque::new(), read: 0 }
    }

    /// The next event, or None when the stream ended.
    async fn next_event(&mut self) -> Result<Option<SseEvent>, McpError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            let Some(chunk) = self.stream.next().await else { return Ok(None) };
            let chunk = chunk.map_err(unreachable)?;
            self.read += chunk.len();
            if self.read > MAX_ANSWER_BYTES {
                return Err(McpError::Protocol(format!("the event stream exceeds {MAX_ANSWER_BYTES} bytes")));
            }
            self.pending.extend(self.parser.push(&chunk));
        }
    }
}

/// An event's name (`message` when it has none).
fn event_name(event: &SseEvent) -> &str {
    event.event.as_deref().unwrap_or("message")
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn events_of(chunks: &[&str]) -> Vec<(String, String)> {
        let chunks: Vec<reqwest::Result<Bytes>> = chunks.iter().map(|chunk| Ok(Bytes::from(chunk.to_string()))).collect();
        let mut reader = EventReader::new(futures::stream::iter(chunks).boxed());
        let mut events = Vec::new();
        while let Ok(Some(event)) = reader.next_event().await {
            events.push((event_name(&event).to_string(), event.data));
        }
        events
    }

    #[tokio::test]
    async fn events_are_cut_at_blank_lines_with_either_line_end() {
        let events = events_of(&[
            "event: endpoint\ndata: /messages?session=1\n\n: a comment\n\ndata: {\"a\":\r\ndata: 1}\r\n\r\nevent: message\ndata: x\n",
        ])
        .await;
        assert_eq!(
            events,
            vec![("endpoint".to_string(), "/messages?session=1".to_string()), ("message".to_string(), "{\"a\":\n1}".to_string())]
        );
    }

    #[tokio::test]
    async fn an_unfinished_event_waits_for_more_bytes() {
        let events = events_of(&["data: {\"jsonrpc\"", ":\"2.0\"}\n\n"]).await;
        assert_eq!(events, vec![("message".to_string(), "{\"jsonrpc\":\"2.0\"}".to_string())]);
    }

    #[test]
    fn the_answer_is_found_by_id_among_notifications_and_batches() {
        let notification = json!({"jsonrpc": "2.0", "method": "notifications/progress"});
        assert_eq!(answer_in(notification, 1), None);
        let batch = json!([{"jsonrpc": "2.0", "id": 1, "result": {}}, {"jsonrpc": "2.0", "id": 2, "result": {"tools": []}}]);
        assert_eq!(answer_in(batch, 2), Some(json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": []}})));
        let server_request = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
        assert_eq!(answer_in(server_request, 2), None);
    }

    #[test]
    fn an_error_answer_is_an_rpc_error() {
        let error = into_result(json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "no such method"}}));
        assert!(matches!(error, Err(McpError::Rpc { code: -32601, ref message }) if message == "no such method"));
        assert_eq!(into_result(json!({"id": 1, "result": {"ok": true}})).ok(), Some(json!({"ok": true})));
    }

    #[test]
    fn listed_tools_need_a_name_and_default_their_schema() {
        let tool = discovered_tool(&json!({"name": "add"})).ok();
        assert_eq!(tool, Some(DiscoveredTool { name: "add".into(), description: String::new(), input_schema: json!({"type": "object"}) }));
        assert!(discovered_tool(&json!({"description": "nameless"})).is_err());
    }
}
