-- Each tenant's spend per day, kept beside the settlements in the same transaction as each new
-- settlement: alert evaluation, status and forecasts read a tenant's day and month from here instead
-- of summing every settlement of the period (which grew with traffic).

CREATE TABLE budget_daily_spend (
    tenant_id TEXT NOT NULL,
    day_key TEXT NOT NULL,
    month_key TEXT NOT NULL,
    cost_nanos BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, day_key)
);

CREATE INDEX budget_daily_spend_by_month ON budget_daily_spend (tenant_id, month_key);

INSERT INTO budget_daily_spend (tenant_id, day_key, month_key, cost_nanos, requests)
SELECT tenant_id, day_key, MIN(month_key), SUM(cost_nanos), COUNT(*) FROM budget_settlements GROUP BY tenant_id, day_key;
