-- `/auth/provision`: the tenant an identity provider's user made for itself at its first sign-in,
-- one per identity (the primary key is what makes a repeated or concurrent provision find the first
-- one instead of making a second tenant).

CREATE TABLE idp_provisions (
    issuer TEXT NOT NULL,
    subject TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (issuer, subject)
);
