-- Identity: tenant plans and graduation. A tenant records when it last moved to plan `standard` and
-- which address it verified; a pending email verification holds only a digest of the mailed code.
-- Timestamps are RFC 3339 UTC text with milliseconds (text order is time order).

ALTER TABLE tenants ADD COLUMN graduated_at TEXT;
ALTER TABLE tenants ADD COLUMN email_verified_at TEXT;
ALTER TABLE tenants ADD COLUMN verified_email TEXT;

-- At most one pending code per tenant: starting again replaces the row.
-- code_hash: SHA-256 hex of the code bound to the tenant and the address; attempts counts confirmations tried.
CREATE TABLE email_verifications (
    tenant_id TEXT PRIMARY KEY REFERENCES tenants (id),
    email TEXT NOT NULL,
    code_hash TEXT NOT NULL,
    attempts BIGINT NOT NULL,
    expires_at TEXT NOT NULL,
    created_at TEXT NOT NULL
);
