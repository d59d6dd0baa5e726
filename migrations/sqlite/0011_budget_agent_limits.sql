-- Per-agent limits (`/v1/agent-limits`): one row per tenant holding the whole map as JSON text
-- (`{"<agent id>": {"max_budget_nanos": n, "max_requests_per_minute": n}}`), written by
-- compare-and-set on `version`, so two concurrent merges never lose each other's entries.

CREATE TABLE budget_agent_limits (
    tenant_id TEXT PRIMARY KEY,
    limits TEXT NOT NULL,
    version BIGINT NOT NULL,
    updated_at TEXT NOT NULL
);
