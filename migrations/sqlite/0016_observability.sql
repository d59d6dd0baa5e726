-- Observability fan-out: a tenant's destinations (observability ones and XDR connectors), their
-- public config as JSON text and their secret members sealed like provider keys (empty when none),
-- filters, batching and delivery counters; the tenant's fan-out switch; hourly delivery counts.

CREATE TABLE obs_destinations (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    type TEXT NOT NULL,
    config TEXT NOT NULL,
    secret_names TEXT NOT NULL,
    ciphertext TEXT NOT NULL,
    nonce TEXT NOT NULL,
    wrapped_key TEXT NOT NULL,
    key_nonce TEXT NOT NULL,
    event_types TEXT NOT NULL,
    batch_max_size BIGINT NOT NULL,
    batch_flush_interval_ms BIGINT NOT NULL,
    filter_rules TEXT NOT NULL,
    enabled BIGINT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    sent BIGINT NOT NULL,
    failed BIGINT NOT NULL,
    dropped BIGINT NOT NULL,
    last_delivery_at TEXT NOT NULL
);
CREATE INDEX obs_destinations_tenant ON obs_destinations (tenant_id, kind);

CREATE TABLE obs_config (
    tenant_id TEXT PRIMARY KEY,
    enabled BIGINT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE obs_delivery_hours (
    destination_id TEXT NOT NULL,
    hour TEXT NOT NULL,
    sent BIGINT NOT NULL,
    failed BIGINT NOT NULL,
    dropped BIGINT NOT NULL,
    PRIMARY KEY (destination_id, hour)
);
