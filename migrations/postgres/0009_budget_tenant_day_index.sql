-- A tenant's days are found through its time index: a settlement's `occurred_at` is written as
-- `YYYY-MM-DDTHH:MM:SS.sssZ` and its `day_key` is that date, so a range of days is a range of
-- `occurred_at`. The tenant's day index duplicated the time index; every settlement wrote five
-- B-trees, now four.

DROP INDEX IF EXISTS budget_settlements_by_tenant_day;
