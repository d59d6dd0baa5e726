-- Policy firewall: kill switches (tenant state, activation history, scoped switches), guardrail
-- configuration and external providers, tool firewall configuration and interceptions, security policy
-- rulesets, and the human approval queue.
-- Timestamps are RFC 3339 UTC text with milliseconds; flags are BIGINT 0/1; configurations whose shape
-- the service validates are JSON text. No foreign keys to identity's tables: this may live elsewhere.

-- One row per tenant that ever touched its switch. `version` grows with every tenant or scoped change,
-- so caches can tell a newer snapshot from an older one.
CREATE TABLE policy_kill_switches (
    tenant_id TEXT PRIMARY KEY,
    active BIGINT NOT NULL,
    activated_at TEXT,
    activated_by TEXT,
    reason TEXT,
    deactivated_at TEXT,
    version BIGINT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE policy_kill_switch_history (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    activated_at TEXT NOT NULL,
    deactivated_at TEXT,
    activated_by TEXT NOT NULL,
    deactivated_by TEXT,
    reason TEXT NOT NULL
);

CREATE INDEX policy_kill_switch_history_by_tenant ON policy_kill_switch_history (tenant_id, activated_at);

CREATE TABLE policy_kill_switch_scopes (
    tenant_id TEXT NOT NULL,
    scope_type TEXT NOT NULL,
    scope_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    activated_by TEXT NOT NULL,
    activated_at TEXT NOT NULL,
    active BIGINT NOT NULL,
    deactivated_at TEXT,
    deactivated_by TEXT,
    PRIMARY KEY (tenant_id, scope_type, scope_id)
);

CREATE TABLE policy_guardrail_configs (
    tenant_id TEXT PRIMARY KEY,
    config_json TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

-- The API key is sealed (envelope encryption under the master key, bound to tenant and provider id);
-- only its mask is readable.
CREATE TABLE policy_guardrail_providers (
    tenant_id TEXT NOT NULL,
    provider_id TEXT NOT NULL,
    name TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    template TEXT NOT NULL,
    result_mapping_json TEXT,
    timeout_ms BIGINT NOT NULL,
    api_key_ciphertext TEXT,
    api_key_nonce TEXT,
    api_key_wrapped_key TEXT,
    api_key_key_nonce TEXT,
    api_key_mask TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, provider_id)
);

CREATE TABLE policy_firewall_configs (
    tenant_id TEXT PRIMARY KEY,
    config_json TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE policy_interceptions (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    severity TEXT NOT NULL,
    actor_id TEXT NOT NULL,
    actor_type TEXT NOT NULL,
    resource TEXT NOT NULL,
    action TEXT NOT NULL,
    verdicts_json TEXT NOT NULL,
    request_id TEXT,
    created_at TEXT NOT NULL
);

CREATE INDEX policy_interceptions_by_tenant ON policy_interceptions (tenant_id, created_at);

CREATE TABLE policy_rulesets (
    tenant_id TEXT PRIMARY KEY,
    version BIGINT NOT NULL,
    rules_json TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    updated_by TEXT NOT NULL
);

-- Argument values are never stored: only their hash and top-level keys.
CREATE TABLE policy_approvals (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    surface TEXT NOT NULL,
    agent_id TEXT,
    owner_id TEXT,
    argument_keys_json TEXT NOT NULL,
    argument_hash TEXT NOT NULL,
    rule_id TEXT,
    status TEXT NOT NULL,
    scope TEXT,
    review_note TEXT,
    reviewed_by TEXT,
    created_at TEXT NOT NULL,
    reviewed_at TEXT,
    expires_at TEXT,
    consumed_at TEXT,
    consumed_by_request_id TEXT,
    request_id TEXT NOT NULL,
    attempts BIGINT NOT NULL
);

-- Retries before approval land on the same pending record.
CREATE UNIQUE INDEX policy_approvals_one_pending ON policy_approvals (tenant_id, tool_name, argument_hash) WHERE status = 'pending';
CREATE INDEX policy_approvals_by_tenant_tool ON policy_approvals (tenant_id, tool_name, status);
