-- Identity: tenants, users, API keys, claim tokens and registration invite codes.
-- Timestamps are RFC 3339 UTC text with milliseconds (text order is time order); money is BIGINT nano-dollars.

CREATE TABLE tenants (
    id TEXT PRIMARY KEY,
    slug TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    plan TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants (id),
    email TEXT NOT NULL,
    role TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (tenant_id, email)
);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants (id),
    name TEXT NOT NULL,
    key_hash TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    role TEXT NOT NULL,
    scopes TEXT NOT NULL,
    budget_limit_nanos BIGINT,
    budget_period TEXT,
    rate_limit_rpm BIGINT,
    expires_at TEXT,
    allowed_models TEXT NOT NULL,
    created_at TEXT NOT NULL,
    revoked_at TEXT,
    created_by TEXT
);

CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id);

CREATE TABLE claim_tokens (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants (id),
    token_hash TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    max_uses BIGINT NOT NULL,
    uses BIGINT NOT NULL,
    purpose TEXT NOT NULL,
    email TEXT,
    expires_at TEXT NOT NULL,
    created_at TEXT NOT NULL,
    created_by TEXT
);

CREATE TABLE invite_codes (
    id TEXT PRIMARY KEY,
    code TEXT NOT NULL UNIQUE,
    max_uses BIGINT,
    uses BIGINT NOT NULL,
    expires_at TEXT,
    created_at TEXT NOT NULL
);
