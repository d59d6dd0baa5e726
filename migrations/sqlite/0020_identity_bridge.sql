-- The identity bridge: an identity provider's users and the tenants they claimed (one user row in
-- each), and device authorizations (RFC 8628) linking a device to a tenant once a member confirms
-- its user code. Device codes are kept as digests, never in the clear.

CREATE TABLE idp_memberships (
    issuer TEXT NOT NULL,
    subject TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    claim_role TEXT NOT NULL,
    email TEXT NOT NULL,
    claimed_at TEXT NOT NULL,
    PRIMARY KEY (issuer, subject, tenant_id)
);

CREATE TABLE device_authorizations (
    device_code_hash TEXT PRIMARY KEY,
    user_code TEXT NOT NULL UNIQUE,
    client_name TEXT NOT NULL,
    status TEXT NOT NULL,
    tenant_id TEXT,
    issuer TEXT,
    subject TEXT,
    role TEXT,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    confirmed_at TEXT,
    last_polled_at TEXT
);
