-- OAuth (PKCE) apps a tenant registered, and the authorization codes issued for them: each code
-- stored by its digest with the PKCE challenge, the scopes granted and the approving key's
-- permissions, single use, ten minutes.

CREATE TABLE oauth_apps (
    client_id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    name TEXT NOT NULL,
    callback_urls TEXT NOT NULL,
    scopes TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX oauth_apps_by_tenant ON oauth_apps (tenant_id);

CREATE TABLE oauth_codes (
    code_hash TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    redirect_uri TEXT NOT NULL,
    code_challenge TEXT NOT NULL,
    scopes TEXT NOT NULL,
    permissions TEXT NOT NULL,
    authorized_by TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    redeemed_at TEXT
);
