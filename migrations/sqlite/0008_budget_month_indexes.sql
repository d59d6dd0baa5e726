-- A month's settlements are found through the day indexes (a month is a range of day keys), so the
-- two month indexes are dropped: every settlement wrote seven B-trees, now five.

DROP INDEX IF EXISTS budget_settlements_by_tenant_month;
DROP INDEX IF EXISTS budget_settlements_by_month;
