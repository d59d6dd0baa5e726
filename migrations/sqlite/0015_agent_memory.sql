-- Agent memory: facts in named blocks per tenant and memory key (archived: evicted from its block
-- to archival storage), and the audit trail of every operation on them.

CREATE TABLE memory_entries (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    memory_key TEXT NOT NULL,
    block TEXT NOT NULL,
    fact TEXT NOT NULL,
    pinned BIGINT NOT NULL,
    archived BIGINT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX memory_entries_key ON memory_entries (tenant_id, memory_key, block, archived, created_at);

CREATE TABLE memory_audit (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    memory_key TEXT NOT NULL,
    created_at TEXT NOT NULL,
    operation TEXT NOT NULL,
    block TEXT NOT NULL,
    entry_id TEXT NOT NULL,
    fact_after TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX memory_audit_key ON memory_audit (tenant_id, memory_key, created_at);
