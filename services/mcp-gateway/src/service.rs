//! The MCP gateway's rules over its store: registration and its validation, sealing credentials,
//! discovery, governed calls, approvals and the audit trail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use brainstorm_common::net::UrlRefusal;
use brainstorm_common::store::{Database, is_unique_violation};
use brainstorm_common::time::now_timestamp;
use brainstorm_proto::mcp::*;
use brainstorm_proto::{ServiceError, ServiceResult};
use brainstorm_providers::vault::{self, MasterKey, SealedSecret};
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::client::{McpClient, McpError, ServerAccess};
use crate::store::{McpStore, StoredServer};

/// The transports a server may use.
pub const TRANSPORTS: [&str; 2] = ["streamable-http", "sse"];
/// The header an `api-key` credential goes in unless the registration names another.
const DEFAULT_API_KEY_HEADER: &str = "X-API-Key";
const MAX_NAME_CHARS: usize = 100;
const MAX_ALLOWED_KEYS: usize = 100;
/// The policy that applies to every tool without one of its own.
pub const DEFAULT_POLICY: &str = "*";
/// Most audit entries one read returns, and the default.
const MAX_AUDIT: u32 = 500;
const DEFAULT_AUDIT: u32 = 50;

/// What the MCP gateway needs besides its store.
#[derive(Debug, Clone)]
pub struct McpGatewayOptions {
    /// Seals the servers' credentials.
    pub master_key: MasterKey,
    /// How long one operation on a server (a whole session) may take.
    pub call_timeout: Duration,
    /// Whether servers may live at private, loopback or link-local addresses (a tenant must not
    /// make the gateway call into its own network unless the operator allows it).
    pub allow_private_urls: bool,
}

/// The mcp-gateway service.
#[derive(Clone)]
pub struct McpGatewayServiceImpl {
    store: McpStore,
    client: McpClient,
    master_key: Arc<MasterKey>,
    allow_private_urls: bool,
}

impl McpGatewayServiceImpl {
    /// The service over a migrated database.
    pub fn new(database: Database, options: McpGatewayOptions) -> McpGatewayServiceImpl {
        McpGatewayServiceImpl {
            store: McpStore::new(database),
            client: McpClient::new(options.call_timeout, options.allow_private_urls),
            master_key: Arc::new(options.master_key),
            allow_private_urls: options.allow_private_urls,
        }
    }

    async fn stored(&self, tenant_id: &str, server: &str) -> ServiceResult<StoredServer> {
        self.store
            .server(tenant_id, server)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("mcp_server_not_found", format!("no MCP server `{server}`: see GET /v1/mcp/servers")))
    }

    /// How to reach a stored server, its credential opened.
    fn access(&self, stored: &StoredServer) -> ServiceResult<ServerAccess> {
        let server = &stored.server;
        let auth = if server.auth_type.is_empty() {
            None
        } else {
            let token = vault::open(&self.master_key, &stored.sealed, &binding(&server.tenant_id, &server.id))
                .map_err(|error| ServiceError::internal(format!("the credential of MCP server {} cannot be opened: {error}", server.id)))?;
            Some(auth_header(&server.auth_type, &server.auth_header_name, &token)?)
        };
        Ok(ServerAccess { transport: server.transport.clone(), url: server.url.clone(), auth })
    }

    /// Runs a call against a server and records it in the audit trail.
    async fn run_call(&self, stored: &StoredServer, tool: &str, arguments: Value, api_key_id: &str) -> ServiceResult<CallResult> {
        let access = self.access(stored)?;
        let started = Instant::now();
        let called = self.client.call_tool(&access, tool, arguments).await;
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (result, detail) = match &called {
            Ok(answer) if answer.get("isError").and_then(Value::as_bool) == Some(true) => ("tool_error", String::new()),
            Ok(_) => ("success", String::new()),
            Err(error) => ("error", error.to_string()),
        };
        self.audit(&stored.server, tool, result, latency_ms, api_key_id, detail).await;
        let answer = called.map_err(|error| upstream_failure(&stored.server, error))?;
        Ok(CallResult { result_json: answer.to_string(), server_id: stored.server.id.clone(), tool: tool.to_string(), latency_ms })
    }

    /// Appends to the audit trail (a failure to record is logged: the call already happened).
    async fn audit(&self, server: &McpServer, tool: &str, result: &str, latency_ms: u64, api_key_id: &str, detail: String) {
        let entry = AuditEntry {
            id: uuid::Uuid::now_v7().to_string(),
            timestamp: now_timestamp(),
            server_id: server.id.clone(),
            server_name: server.name.clone(),
            tool: tool.to_string(),
            result: result.to_string(),
            latency_ms,
            api_key_id: api_key_id.to_string(),
            detail,
        };
        if let Err(error) = self.store.insert_audit(&server.tenant_id, &entry).await {
            tracing::error!(%error, server_id = %server.id, tool, "cannot record an MCP call in the audit trail");
        }
    }

    async fn governance(&self, tenant_id: &str) -> ServiceResult<Governance> {
        let policies = self.store.policies(tenant_id).await.map_err(store_failure)?;
        let pending_approvals = self.store.pending_count(tenant_id).await.map_err(store_failure)?;
        Ok(Governance { enabled: !policies.is_empty(), policies, pending_approvals })
    }
}

/// What a credential is bound to when sealed: its tenant and server.
fn binding(tenant_id: &str, server_id: &str) -> String {
    format!("{tenant_id}/mcp/{server_id}")
}

fn store_failure(error: sqlx::Error) -> ServiceError {
    ServiceError::internal(format!("the MCP store failed: {error}"))
}

fn upstream_failure(server: &McpServer, error: McpError) -> ServiceError {
    let reason = match error {
        McpError::Timeout(_) => "mcp_server_timeout",
        McpError::Rpc { .. } => "mcp_server_error",
        _ => "mcp_server_unreachable",
    };
    ServiceError::unavailable(reason, format!("MCP server `{}`: {error}", server.name))
}

/// The header a credential travels in.
fn auth_header(auth_type: &str, header_name: &str, token: &str) -> ServiceResult<(HeaderName, HeaderValue)> {
    let invalid = || ServiceError::invalid("invalid_mcp_server", "auth.token must be printable ASCII without line breaks");
    match auth_type {
        "bearer" => Ok((AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| invalid())?)),
        _ => {
            let name = HeaderName::from_bytes(header_name.as_bytes()).map_err(|_| {
                ServiceError::invalid("invalid_mcp_server", format!("auth.headerName `{header_name}` is not a header name"))
            })?;
            let mut value = HeaderValue::from_str(token).map_err(|_| invalid())?;
            value.set_sensitive(true);
            Ok((name, value))
        }
    }
}

fn invalid(message: impl Into<String>) -> ServiceError {
    ServiceError::invalid("invalid_mcp_server", message)
}

fn validate_name(name: &str) -> ServiceResult<String> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(invalid(format!("name is required, at most {MAX_NAME_CHARS} characters")));
    }
    Ok(name.to_string())
}

fn validate_transport(transport: &str) -> ServiceResult<String> {
    if TRANSPORTS.contains(&transport) {
        Ok(transport.to_string())
    } else {
        Err(invalid(format!("transport `{transport}` is not one of {}", TRANSPORTS.join(", "))))
    }
}

fn validate_url(url: &str, allow_private: bool) -> ServiceResult<String> {
    match brainstorm_common::net::tenant_url(url.trim(), allow_private) {
        Ok(parsed) => Ok(parsed.to_string()),
        Err(UrlRefusal::Private(_)) => Err(invalid(format!(
            "url `{url}` is a private, loopback or link-local address; the operator allows those with BR_MCP_ALLOW_PRIVATE_URLS"
        ))),
        Err(_) => Err(invalid(format!("url `{url}` is not an http(s) URL"))),
    }
}

fn validate_allowed_keys(keys: Vec<String>) -> ServiceResult<Vec<String>> {
    if keys.len() > MAX_ALLOWED_KEYS || keys.iter().any(|key| key.trim().is_empty()) {
        return Err(invalid(format!("allowed_key_ids holds at most {MAX_ALLOWED_KEYS} non-empty key ids")));
    }
    let mut keys: Vec<String> = keys.into_iter().map(|key| key.trim().to_string()).collect();
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// Seals a credential into `server` (type, header, hint) and returns the sealed form.
fn seal_auth(master_key: &MasterKey, server: &mut McpServer, auth: Option<ServerAuth>) -> ServiceResult<SealedSecret> {
    let empty = SealedSecret { ciphertext: String::new(), nonce: String::new(), wrapped_key: String::new(), key_nonce: String::new() };
    let Some(auth) = auth else {
        server.auth_type.clear();
        server.auth_header_name.clear();
        server.auth_token_hint.clear();
        return Ok(empty);
    };
    let header_name = match auth.r#type.as_str() {
        "bearer" => String::new(),
        "api-key" if auth.header_name.trim().is_empty() => DEFAULT_API_KEY_HEADER.to_string(),
        "api-key" => auth.header_name.trim().to_string(),
        other => return Err(invalid(format!("auth.type `{other}` is not one of bearer, api-key"))),
    };
    let token = auth.token.trim();
    if token.is_empty() {
        return Err(invalid("auth.token is required with auth"));
    }
    auth_header(&auth.r#type, &header_name, token)?;
    server.auth_type = auth.r#type;
    server.auth_header_name = header_name;
    server.auth_token_hint = vault::mask(token);
    vault::seal(master_key, token, &binding(&server.tenant_id, &server.id))
        .map_err(|error| ServiceError::internal(format!("cannot seal the credential: {error}")))
}

/// The hash an approval's arguments are deduplicated by (canonical: serde_json keeps object keys sorted).
fn arguments_hash(arguments: &Value) -> String {
    hex::encode(Sha256::digest(arguments.to_string().as_bytes()))
}

/// The policy that governs `tool` on `server`: its own (`server/tool`, then `tool`), else the default.
fn policy_for<'a>(policies: &'a [ToolPolicy], server: &str, tool: &str) -> Option<&'a ToolPolicy> {
    let qualified = format!("{server}/{tool}");
    [qualified.as_str(), tool, DEFAULT_POLICY].into_iter().find_map(|name| policies.iter().find(|policy| policy.tool_name == name))
}

#[async_trait]
impl McpGatewayService for McpGatewayServiceImpl {
    async fn register_server(&self, request: RegisterServerRequest) -> ServiceResult<McpServer> {
        let now = now_timestamp();
        let mut server = McpServer {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: request.tenant_id,
            name: validate_name(&request.name)?,
            transport: validate_transport(&request.transport)?,
            url: validate_url(&request.url, self.allow_private_urls)?,
            allowed_key_ids: validate_allowed_keys(request.allowed_key_ids)?,
            created_at: now.clone(),
            updated_at: now,
            ..McpServer::default()
        };
        let sealed = seal_auth(&self.master_key, &mut server, request.auth)?;
        let stored = StoredServer { server, sealed };
        match self.store.insert_server(&stored).await {
            Ok(()) => Ok(stored.server),
            Err(error) if is_unique_violation(&error) => Err(ServiceError::conflict(
                "mcp_server_exists",
                format!("an MCP server named `{}` is already registered", stored.server.name),
            )),
            Err(error) => Err(store_failure(error)),
        }
    }

    async fn list_servers(&self, request: TenantRef) -> ServiceResult<McpServerList> {
        let servers = self.store.servers(&request.tenant_id).await.map_err(store_failure)?;
        Ok(McpServerList { servers: servers.into_iter().map(|stored| stored.server).collect() })
    }

    async fn get_server(&self, request: ServerRef) -> ServiceResult<McpServer> {
        Ok(self.stored(&request.tenant_id, &request.server).await?.server)
    }

    async fn update_server(&self, request: UpdateServerRequest) -> ServiceResult<McpServer> {
        let mut stored = self.stored(&request.tenant_id, &request.server).await?;
        let server = &mut stored.server;
        if let Some(name) = &request.name {
            server.name = validate_name(name)?;
        }
        if let Some(transport) = &request.transport {
            server.transport = validate_transport(transport)?;
        }
        if let Some(url) = &request.url {
            server.url = validate_url(url, self.allow_private_urls)?;
        }
        if request.set_allowed_key_ids {
            server.allowed_key_ids = validate_allowed_keys(request.allowed_key_ids)?;
        }
        if request.remove_auth || request.auth.is_some() {
            stored.sealed = seal_auth(&self.master_key, &mut stored.server, request.auth)?;
        }
        stored.server.updated_at = now_timestamp();
        match self.store.update_server(&stored).await {
            Ok(()) => Ok(stored.server),
            Err(error) if is_unique_violation(&error) => Err(ServiceError::conflict(
                "mcp_server_exists",
                format!("an MCP server named `{}` is already registered", stored.server.name),
            )),
            Err(error) => Err(store_failure(error)),
        }
    }

    async fn delete_server(&self, request: ServerRef) -> ServiceResult<McpServer> {
        let stored = self.stored(&request.tenant_id, &request.server).await?;
        self.store.delete_server(&request.tenant_id, &stored.server.id).await.map_err(store_failure)?;
        Ok(stored.server)
    }

    async fn discover_tools(&self, request: ServerRef) -> ServiceResult<ToolList> {
        let stored = self.stored(&request.tenant_id, &request.server).await?;
        let access = self.access(&stored)?;
        let discovered = self.client.list_tools(&access).await.map_err(|error| upstream_failure(&stored.server, error))?;
        let mut tools: Vec<Tool> = discovered
            .into_iter()
            .map(|tool| Tool {
                server_id: stored.server.id.clone(),
                server_name: stored.server.name.clone(),
                name: tool.name,
                description: tool.description,
                input_schema_json: tool.input_schema.to_string(),
            })
            .collect();
        // A server listing a name twice keeps its first description.
        let mut seen = std::collections::BTreeSet::new();
        tools.retain(|tool| seen.insert(tool.name.clone()));
        self.store.replace_tools(&request.tenant_id, &stored.server.id, &tools, &now_timestamp()).await.map_err(store_failure)?;
        Ok(ToolList { tools })
    }

    async fn list_tools(&self, request: TenantRef) -> ServiceResult<ToolList> {
        Ok(ToolList { tools: self.store.tools(&request.tenant_id).await.map_err(store_failure)? })
    }

    async fn call_tool(&self, request: CallToolRequest) -> ServiceResult<CallToolResponse> {
        let stored = self.stored(&request.tenant_id, &request.server).await?;
        let server = &stored.server;
        if !server.allowed_key_ids.is_empty() && !server.allowed_key_ids.contains(&request.api_key_id) {
            return Err(ServiceError::permission_denied(
                "mcp_key_not_allowed",
                format!("this API key may not call the tools of MCP server `{}` (see its allowed_key_ids)", server.name),
            ));
        }
        let arguments: Value = serde_json::from_str(if request.arguments_json.is_empty() { "{}" } else { &request.arguments_json })
            .map_err(|_| ServiceError::invalid("invalid_arguments", "arguments must be a JSON object"))?;
        if !arguments.is_object() {
            return Err(ServiceError::invalid("invalid_arguments", "arguments must be a JSON object"));
        }
        let policies = self.store.policies(&request.tenant_id).await.map_err(store_failure)?;
        if let Some(policy) = policy_for(&policies, &server.name, &request.tool) {
            if !policy.allowed {
                self.audit(server, &request.tool, "denied", 0, &request.api_key_id, format!("policy `{}`", policy.tool_name)).await;
                return Err(ServiceError::permission_denied(
                    "tool_denied",
                    format!("tool `{}` is denied by the tenant's MCP governance (policy `{}`)", request.tool, policy.tool_name),
                ));
            }
            if policy.requires_approval {
                let approval = Approval {
                    id: uuid::Uuid::new_v4().to_string(),
                    timestamp: now_timestamp(),
                    server_id: server.id.clone(),
                    server_name: server.name.clone(),
                    tool: request.tool.clone(),
                    arguments_json: arguments.to_string(),
                    status: "pending".to_string(),
                    api_key_id: request.api_key_id.clone(),
                    ..Approval::default()
                };
                let (approval, new) =
                    self.store.queue_approval(&request.tenant_id, &approval, &arguments_hash(&arguments)).await.map_err(store_failure)?;
                if new {
                    self.audit(server, &request.tool, "pending_approval", 0, &request.api_key_id, format!("approval {}", approval.id))
                        .await;
                }
                let message = format!(
                    "tool `{}` requires approval: a reviewer with security.write approves it at POST /v1/mcp/approvals/{}/approve, which runs the call",
                    request.tool, approval.id
                );
                return Ok(CallToolResponse {
                    outcome: Some(call_tool_response::Outcome::Queued(Queued { approval_id: approval.id, message })),
                });
            }
        }
        let result = self.run_call(&stored, &request.tool, arguments, &request.api_key_id).await?;
        Ok(CallToolResponse { outcome: Some(call_tool_response::Outcome::Result(result)) })
    }

    async fn list_audit(&self, request: AuditQuery) -> ServiceResult<AuditList> {
        let limit = match request.limit {
            0 => DEFAULT_AUDIT,
            limit => limit.min(MAX_AUDIT),
        };
        Ok(AuditList { entries: self.store.audit(&request.tenant_id, limit).await.map_err(store_failure)? })
    }

    async fn get_governance(&self, request: TenantRef) -> ServiceResult<Governance> {
        self.governance(&request.tenant_id).await
    }

    async fn put_policy(&self, request: PutPolicyRequest) -> ServiceResult<Governance> {
        let mut policy = request.policy.ok_or_else(|| ServiceError::invalid("invalid_tool_policy", "a policy is required"))?;
        policy.tool_name = policy.tool_name.trim().to_string();
        if policy.tool_name.is_empty() || policy.tool_name.chars().count() > 2 * MAX_NAME_CHARS {
            return Err(ServiceError::invalid(
                "invalid_tool_policy",
                "tool_name is required (a tool, `server/tool`, or `*` for every tool)",
            ));
        }
        if policy.max_cost_nanos.is_some_and(|nanos| nanos < 0) {
            return Err(ServiceError::invalid("invalid_tool_policy", "max_cost_usd must not be negative"));
        }
        policy.updated_at = now_timestamp();
        self.store.put_policy(&request.tenant_id, &policy).await.map_err(store_failure)?;
        self.governance(&request.tenant_id).await
    }

    async fn list_approvals(&self, request: ApprovalQuery) -> ServiceResult<ApprovalList> {
        if !matches!(request.status.as_str(), "" | "pending" | "approved" | "denied") {
            return Err(ServiceError::invalid("invalid_status", "status is one of pending, approved, denied"));
        }
        Ok(ApprovalList { approvals: self.store.approvals(&request.tenant_id, &request.status).await.map_err(store_failure)? })
    }

    async fn decide_approval(&self, request: DecideApprovalRequest) -> ServiceResult<Approval> {
        let tenant_id = &request.tenant_id;
        let not_found = || ServiceError::not_found("approval_not_found", format!("no MCP approval `{}`", request.approval_id));
        let approval = self.store.approval(tenant_id, &request.approval_id).await.map_err(store_failure)?.ok_or_else(not_found)?;
        let status = if request.approve { "approved" } else { "denied" };
        let now = now_timestamp();
        if !self.store.decide(tenant_id, &approval.id, status, &request.decided_by, &now).await.map_err(store_failure)? {
            let decided = self.store.approval(tenant_id, &approval.id).await.map_err(store_failure)?.ok_or_else(not_found)?;
            return Err(ServiceError::conflict(
                "approval_already_decided",
                format!("approval `{}` is already {}", decided.id, decided.status),
            ));
        }
        let mut decided = Approval { status: status.to_string(), decided_at: now, decided_by: request.decided_by.clone(), ..approval };
        if !request.approve {
            return Ok(decided);
        }
        // Approved: the queued call runs now, with the arguments the reviewer saw.
        let outcome = match self.store.server(tenant_id, &decided.server_id).await.map_err(store_failure)? {
            None => Err(format!("MCP server {} was removed before the approval", decided.server_id)),
            Some(stored) => {
                let arguments = serde_json::from_str(&decided.arguments_json).unwrap_or_else(|_| Value::Object(Default::default()));
                self.run_call(&stored, &decided.tool, arguments, &decided.api_key_id).await.map_err(|error| error.message)
            }
        };
        match outcome {
            Ok(result) => decided.result_json = result.result_json,
            Err(error) => decided.error = error,
        }
        self.store.record_outcome(tenant_id, &decided.id, &decided.result_json, &decided.error).await.map_err(store_failure)?;
        Ok(decided)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(tool_name: &str, allowed: bool) -> ToolPolicy {
        ToolPolicy { tool_name: tool_name.to_string(), allowed, ..ToolPolicy::default() }
    }

    #[test]
    fn the_most_specific_policy_governs_a_tool() {
        let policies = [policy("*", false), policy("add", true), policy("math/add", false)];
        assert_eq!(policy_for(&policies, "math", "add").map(|policy| policy.tool_name.as_str()), Some("math/add"));
        assert_eq!(policy_for(&policies, "other", "add").map(|policy| policy.tool_name.as_str()), Some("add"));
        assert_eq!(policy_for(&policies, "other", "echo").map(|policy| policy.tool_name.as_str()), Some("*"));
        assert_eq!(policy_for(&policies[1..], "other", "echo"), None);
    }

    #[test]
    fn arguments_hash_alike_whatever_their_members_order() {
        let first: Value = serde_json::from_str(r#"{"b": 1, "a": [1, 2]}"#).unwrap_or_default();
        let second: Value = serde_json::from_str(r#"{"a": [1, 2], "b": 1}"#).unwrap_or_default();
        assert_eq!(arguments_hash(&first), arguments_hash(&second));
        assert_ne!(arguments_hash(&first), arguments_hash(&serde_json::json!({"a": [2, 1], "b": 1})));
    }

    #[test]
    fn registrations_are_validated() {
        assert!(validate_transport("websocket").is_err());
        assert!(validate_url("ftp://example.com", true).is_err());
        assert!(validate_url("not a url", true).is_err());
        assert_eq!(validate_url("http://127.0.0.1:9000/mcp", true).ok().as_deref(), Some("http://127.0.0.1:9000/mcp"));
        for private in [
            "http://127.0.0.1:9000/mcp",
            "http://localhost/mcp",
            "http://10.1.2.3/",
            "http://169.254.169.254/",
            "http://[::1]/",
            "http://[::ffff:10.0.0.1]/",
        ] {
            assert!(validate_url(private, false).is_err(), "{private}");
        }
        assert!(validate_url("https://mcp.example.com/mcp", false).is_ok());
        assert!(validate_name("  ").is_err());
        assert_eq!(validate_allowed_keys(vec!["b".into(), "a".into(), "b".into()]).ok(), Some(vec!["a".to_string(), "b".to_string()]));
        assert!(validate_allowed_keys(vec![" ".into()]).is_err());
    }

    #[test]
    fn credentials_are_sealed_and_only_hinted() {
        let master_key = MasterKey::from_hex(&MasterKey::generate_hex()).unwrap_or_else(|_| unreachable!());
        let mut server = McpServer { id: "s1".into(), tenant_id: "t1".into(), ..McpServer::default() };
        let auth = ServerAuth { r#type: "api-key".into(), token: "secret-token-1234".into(), header_name: String::new() };
        let sealed = seal_auth(&master_key, &mut server, Some(auth)).unwrap_or_else(|error| unreachable!("{error}"));
        assert_eq!((server.auth_type.as_str(), server.auth_header_name.as_str()), ("api-key", DEFAULT_API_KEY_HEADER));
        assert!(!server.auth_token_hint.contains("secret-token"), "{}", server.auth_token_hint);
        assert!(!sealed.ciphertext.contains("secret"));
        assert_eq!(vault::open(&master_key, &sealed, "t1/mcp/s1").ok().as_deref(), Some("secret-token-1234"));
        assert!(vault::open(&master_key, &sealed, "t2/mcp/s1").is_err(), "bound to its tenant and server");
        let bad = ServerAuth { r#type: "basic".into(), token: "x".into(), header_name: String::new() };
        assert!(seal_auth(&master_key, &mut server, Some(bad)).is_err());
    }
}
