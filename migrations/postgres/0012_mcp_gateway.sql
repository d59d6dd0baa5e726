-- The MCP gateway: a tenant's registered MCP servers (the credential sealed like provider keys:
-- ciphertext, nonce, wrapped data key and its nonce; empty when the server needs none), the tools
-- discovered on them (the input schema as JSON text), per-tool policies (the cost cap in billionths
-- of a US dollar), the approval queue and the audit trail of every call.

CREATE TABLE mcp_servers (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    name TEXT NOT NULL,
    transport TEXT NOT NULL,
    url TEXT NOT NULL,
    auth_type TEXT NOT NULL,
    auth_header_name TEXT NOT NULL,
    auth_token_hint TEXT NOT NULL,
    ciphertext TEXT NOT NULL,
    nonce TEXT NOT NULL,
    wrapped_key TEXT NOT NULL,
    key_nonce TEXT NOT NULL,
    allowed_key_ids TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    last_discovered_at TEXT NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE mcp_tools (
    tenant_id TEXT NOT NULL,
    server_id TEXT NOT NULL,
    name TEXT NOT NULL,
    description TEXT NOT NULL,
    input_schema TEXT NOT NULL,
    PRIMARY KEY (server_id, name)
);
CREATE INDEX mcp_tools_tenant ON mcp_tools (tenant_id);

CREATE TABLE mcp_tool_policies (
    tenant_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    allowed BIGINT NOT NULL,
    requires_approval BIGINT NOT NULL,
    max_cost_nanos BIGINT,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, tool_name)
);

CREATE TABLE mcp_approvals (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    server_id TEXT NOT NULL,
    server_name TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    arguments_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    api_key_id TEXT NOT NULL,
    decided_at TEXT NOT NULL,
    decided_by TEXT NOT NULL,
    result TEXT NOT NULL,
    error TEXT NOT NULL
);
CREATE INDEX mcp_approvals_tenant_status ON mcp_approvals (tenant_id, status, created_at);

CREATE TABLE mcp_audit (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    server_id TEXT NOT NULL,
    server_name TEXT NOT NULL,
    tool TEXT NOT NULL,
    result TEXT NOT NULL,
    latency_ms BIGINT NOT NULL,
    api_key_id TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX mcp_audit_tenant_time ON mcp_audit (tenant_id, created_at);
