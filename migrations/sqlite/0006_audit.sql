-- Audit and lineage: each tenant's hash chain of audit records, its head, its retention checkpoint,
-- and captured prompt/completion text (kept apart so it can be redacted without breaking the chain).
-- Timestamps are RFC 3339 UTC text with milliseconds; numbers are BIGINT; no foreign keys.
-- Rows of audit_chain are only ever inserted (and pruned behind a checkpoint by retention).

CREATE TABLE audit_chain (
    tenant_id TEXT NOT NULL,
    sequence BIGINT NOT NULL,
    request_id TEXT NOT NULL,
    -- Copied from the payload for lookups; verification checks they agree with it.
    occurred_at TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    chain_schema_version BIGINT NOT NULL,
    -- The canonical payload; commitment = SHA-256(payload), hash = SHA-256(payload || prev_hash).
    payload TEXT NOT NULL,
    commitment TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    recorded_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, sequence),
    UNIQUE (tenant_id, request_id)
);

CREATE INDEX audit_chain_by_trace ON audit_chain (tenant_id, trace_id);
CREATE INDEX audit_chain_by_time ON audit_chain (tenant_id, occurred_at);

-- The last row of each chain, moved forward by compare-and-set inside the append transaction: two
-- writers can never both extend the same head, and a deleted tail no longer matches it.
CREATE TABLE audit_chain_heads (
    tenant_id TEXT PRIMARY KEY,
    sequence BIGINT NOT NULL,
    hash TEXT NOT NULL,
    first_occurred_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

-- Where verification starts after retention pruned the oldest rows.
CREATE TABLE audit_chain_checkpoints (
    tenant_id TEXT PRIMARY KEY,
    through_sequence BIGINT NOT NULL,
    through_hash TEXT NOT NULL,
    through_occurred_at TEXT NOT NULL,
    pruned_at TEXT NOT NULL
);

CREATE TABLE audit_captures (
    tenant_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    sequence BIGINT NOT NULL,
    digest TEXT NOT NULL,
    prompt TEXT,
    completion TEXT,
    redacted_at TEXT,
    PRIMARY KEY (tenant_id, request_id)
);

CREATE INDEX audit_captures_by_sequence ON audit_captures (tenant_id, sequence);
