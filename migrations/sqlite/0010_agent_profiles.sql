-- Agent profiles: one row per agent of a tenant (its owner, cost center, budgets in billionths of
-- a US dollar, role, lifecycle state and free-form metadata as JSON text).

CREATE TABLE agent_profiles (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    display_name TEXT,
    owner_id TEXT,
    cost_center TEXT,
    budget_daily_nanos BIGINT,
    budget_monthly_nanos BIGINT,
    role TEXT NOT NULL,
    lifecycle_state TEXT NOT NULL,
    manifest_id TEXT,
    parent_agent_id TEXT,
    expires_at TEXT,
    metadata TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (tenant_id, agent_id)
);
