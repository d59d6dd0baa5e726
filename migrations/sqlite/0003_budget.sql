-- Budget ledger: settlements (the spend ledger), tenant limits, agent budgets and their exhaustion
-- events, alert configuration, alert history and per-period alert crossing state.
-- Timestamps are RFC 3339 UTC text with milliseconds; money is BIGINT nano-dollars; flags are BIGINT 0/1.
-- No foreign keys to identity's tables: the ledger may live in another database.

CREATE TABLE budget_settlements (
    request_id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    plan TEXT NOT NULL,
    key_id TEXT,
    agent_id TEXT,
    conversation_id TEXT,
    model TEXT NOT NULL,
    provider TEXT NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cost_nanos BIGINT NOT NULL,
    outcome TEXT NOT NULL,
    latency_ms BIGINT NOT NULL,
    day_key TEXT NOT NULL,
    month_key TEXT NOT NULL,
    occurred_at TEXT NOT NULL,
    recorded_at TEXT NOT NULL
);

CREATE INDEX budget_settlements_by_tenant_day ON budget_settlements (tenant_id, day_key);
CREATE INDEX budget_settlements_by_tenant_month ON budget_settlements (tenant_id, month_key);
CREATE INDEX budget_settlements_by_tenant_time ON budget_settlements (tenant_id, occurred_at);
CREATE INDEX budget_settlements_by_day ON budget_settlements (day_key);
CREATE INDEX budget_settlements_by_month ON budget_settlements (month_key);

CREATE TABLE budget_tenant_limits (
    tenant_id TEXT PRIMARY KEY,
    daily_limit_nanos BIGINT,
    monthly_limit_nanos BIGINT,
    updated_at TEXT NOT NULL
);

CREATE TABLE budget_agent_budgets (
    tenant_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    per_day_nanos BIGINT NOT NULL,
    exhaustion_action TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, agent_id)
);

CREATE TABLE budget_agent_exhaustions (
    event_id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    action TEXT NOT NULL,
    request_id TEXT,
    occurred_at TEXT NOT NULL
);

CREATE INDEX budget_agent_exhaustions_by_agent ON budget_agent_exhaustions (tenant_id, agent_id, occurred_at);

CREATE TABLE budget_alert_configs (
    tenant_id TEXT PRIMARY KEY,
    thresholds TEXT NOT NULL,
    webhook_url TEXT,
    enabled BIGINT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE budget_alerts (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    period_key TEXT NOT NULL,
    threshold BIGINT NOT NULL,
    ratio_basis_points BIGINT NOT NULL,
    projected_nanos BIGINT NOT NULL,
    limit_nanos BIGINT NOT NULL,
    delivery_status TEXT NOT NULL,
    delivery_attempts BIGINT NOT NULL,
    delivery_error TEXT,
    created_at TEXT NOT NULL
);

CREATE INDEX budget_alerts_by_tenant ON budget_alerts (tenant_id, created_at);

-- One row per threshold crossed in a period: an alert fires once per crossing and re-arms with the
-- next period (whose key differs).
CREATE TABLE budget_alert_crossings (
    tenant_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    period_key TEXT NOT NULL,
    threshold BIGINT NOT NULL,
    crossed_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, scope, period_key, threshold)
);
