-- Liaison binding contracts (`/v1/liaison/...`): sessions, the signed plans minted in them (each
-- committed at most once, by a completion carrying its headers) and each session's events, numbered
-- from the session row's counter so concurrent writers never reuse a number.

CREATE TABLE liaison_sessions (
    tenant_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    label TEXT NOT NULL,
    metadata_json TEXT NOT NULL,
    status TEXT NOT NULL,
    opened_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    closed_at TEXT,
    event_seq BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, session_id)
);

CREATE TABLE liaison_plans (
    tenant_id TEXT NOT NULL,
    plan_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    envelope_json TEXT NOT NULL,
    signature TEXT NOT NULL,
    expires_epoch BIGINT NOT NULL,
    state TEXT NOT NULL,
    claimed_by TEXT,
    committed_request_id TEXT,
    committed_at TEXT,
    cost_nanos BIGINT NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    audit_commitment TEXT,
    denials BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, plan_id)
);
CREATE INDEX liaison_plans_by_session ON liaison_plans (tenant_id, session_id);

CREATE TABLE liaison_events (
    tenant_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    data_json TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, session_id, seq)
);
