-- Evaluation datasets: named per tenant, with ordered items (input and metadata as JSON text; an
-- item imported from the audit records names its source request, imported once per dataset).

CREATE TABLE eval_datasets (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    name TEXT NOT NULL,
    description TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE eval_dataset_items (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    dataset_id TEXT NOT NULL,
    input TEXT NOT NULL,
    expected_output TEXT NOT NULL,
    metadata TEXT NOT NULL,
    source_request_id TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX eval_dataset_items_dataset ON eval_dataset_items (dataset_id, created_at, id);
