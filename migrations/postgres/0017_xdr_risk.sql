-- Risk scores an XDR pushed for agents (`POST /v1/admin/xdr/risk-push`): one per tenant and agent,
-- the score in millionths, its source, and when it lapses (RFC 3339, compared as text).

CREATE TABLE policy_agent_risks (
    tenant_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    risk_micros BIGINT NOT NULL,
    source TEXT NOT NULL,
    set_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, agent_id)
);
