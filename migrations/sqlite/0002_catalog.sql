-- Catalog: the BYOK vault (provider keys, envelope-encrypted), model aliases and routing presets.

CREATE TABLE provider_keys (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    name TEXT NOT NULL,
    masked_key TEXT NOT NULL,
    ciphertext TEXT NOT NULL,
    nonce TEXT NOT NULL,
    wrapped_key TEXT NOT NULL,
    key_nonce TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    deactivated_at TEXT
);

CREATE INDEX provider_keys_by_tenant ON provider_keys (tenant_id);
CREATE UNIQUE INDEX provider_keys_one_active ON provider_keys (tenant_id, provider) WHERE status = 'active';

CREATE TABLE model_aliases (
    tenant_id TEXT NOT NULL,
    alias TEXT NOT NULL,
    target TEXT NOT NULL,
    PRIMARY KEY (tenant_id, alias)
);

CREATE TABLE routing_presets (
    tenant_id TEXT NOT NULL,
    slug TEXT NOT NULL,
    name TEXT NOT NULL,
    models TEXT NOT NULL,
    strategy TEXT NOT NULL,
    options TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, slug)
);
