-- The agent client certificates identity issued (never the certificate or a key): what a presented
-- certificate is checked against on every use, so one can be revoked before it expires.

CREATE TABLE agent_certificates (
    serial TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    profile_id TEXT NOT NULL,
    fingerprint_sha256 TEXT NOT NULL,
    key_source TEXT NOT NULL,
    not_before TEXT NOT NULL,
    not_after TEXT NOT NULL,
    issued_at TEXT NOT NULL,
    revoked_at TEXT,
    revoked_reason TEXT,
    revoked_by TEXT
);

CREATE INDEX agent_certificates_by_agent ON agent_certificates (tenant_id, agent_id, issued_at);
