-- Prompts and their evaluations: a tenant's prompt templates (the version serving each environment,
-- 0 for none), every version (default variables as JSON text), the A/B test of a prompt (the share
-- of renders given version A in millionths, and each variant's exposures), and evaluation runs with
-- their cases (scores in millionths, inputs as JSON text).

CREATE TABLE prompts (
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL,
    latest_version BIGINT NOT NULL,
    dev_version BIGINT NOT NULL,
    staging_version BIGINT NOT NULL,
    prod_version BIGINT NOT NULL,
    archived BIGINT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

CREATE TABLE prompt_versions (
    tenant_id TEXT NOT NULL,
    prompt_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    template TEXT NOT NULL,
    variables TEXT NOT NULL,
    change_note TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, prompt_id, version)
);

CREATE TABLE prompt_ab_tests (
    tenant_id TEXT NOT NULL,
    prompt_id TEXT NOT NULL,
    active BIGINT NOT NULL,
    version_a BIGINT NOT NULL,
    version_b BIGINT NOT NULL,
    split_ratio_micros BIGINT NOT NULL,
    exposures_a BIGINT NOT NULL,
    exposures_b BIGINT NOT NULL,
    started_at TEXT NOT NULL,
    stopped_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, prompt_id)
);

CREATE TABLE prompt_eval_runs (
    run_id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    prompt_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    scorer TEXT NOT NULL,
    model TEXT NOT NULL,
    created_at TEXT NOT NULL,
    test_case_count BIGINT NOT NULL,
    pass_count BIGINT NOT NULL,
    fail_count BIGINT NOT NULL,
    avg_score_micros BIGINT NOT NULL
);
CREATE INDEX prompt_eval_runs_prompt ON prompt_eval_runs (tenant_id, prompt_id, created_at);

CREATE TABLE prompt_eval_results (
    run_id TEXT NOT NULL,
    position BIGINT NOT NULL,
    input TEXT NOT NULL,
    rendered TEXT NOT NULL,
    expected TEXT NOT NULL,
    actual TEXT NOT NULL,
    score_micros BIGINT NOT NULL,
    pass BIGINT NOT NULL,
    scorer TEXT NOT NULL,
    error TEXT NOT NULL,
    PRIMARY KEY (run_id, position)
);
