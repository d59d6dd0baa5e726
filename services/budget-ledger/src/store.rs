//! The ledger's tables, read and written with bound parameters on SQLite or PostgreSQL.
//!
//! Sums are wrapped in `CAST(... AS BIGINT)`: PostgreSQL's `SUM(bigint)` is `numeric`, which the
//! engine-neutral driver does not decode, and a cast keeps both engines on BIGINT.

use std::collections::{BTreeMap, HashSet};

use brainstorm_common::store::{Database, statement_chunks};
use brainstorm_common::time::{format_timestamp, parse_timestamp};
use brainstorm_proto::budget::{
    AgentBudget, AgentBudgetExhausted, AlertConfig, AlertRecord, CounterTotal, ModelStats, SettledRequest, Settlement, TenantLimits,
    UsageGroup,
};
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::counters::{Scope, ScopeKind};
use crate::period::Period;

/// Result of a store operation.
pub type StoreResult<T> = Result<T, sqlx::Error>;

/// Exact-match filters on a tenant's settlements; `None` matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettlementFilters {
    pub model: Option<String>,
    pub key_id: Option<String>,
    pub agent_id: Option<String>,
    pub outcome: Option<String>,
}

/// What a usage summary groups by; each maps to a fixed SQL expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageGrouping {
    Model,
    Provider,
    Key,
    Agent,
    Day,
}

impl UsageGrouping {
    /// Reads `model`, `provider`, `key`, `agent` or `day`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "model" => Some(UsageGrouping::Model),
            "provider" => Some(UsageGrouping::Provider),
            "key" => Some(UsageGrouping::Key),
            "agent" => Some(UsageGrouping::Agent),
            "day" => Some(UsageGrouping::Day),
            _ => None,
        }
    }
}

/// One agent's ledger figures over a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentStats {
    pub agent_id: String,
    pub total_spend_nanos: i64,
    pub requests: i64,
    pub succeeded: i64,
    pub total_latency_ms: i64,
    pub spent_today_nanos: i64,
    pub active_conversations: i64,
}

/// What a settlement insert reads back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Returning {
    /// Only how many rows were taken.
    Nothing,
    /// The request id of each row taken.
    RequestIds,
}

/// The ledger's store.
#[derive(Debug, Clone)]
pub struct BudgetStore {
    database: Database,
}

impl BudgetStore {
    pub fn new(database: Database) -> Self {
        BudgetStore { database }
    }

    /// Writes a settlement unless its request id is already recorded; true when written.
    pub async fn insert_settlement(&self, settlement: &Settlement, recorded_at: &str) -> StoreResult<bool> {
        Ok(self.insert_settlements(&[settlement], recorded_at).await?.first().copied().unwrap_or(false))
    }

    /// Writes several settlements in one transaction (each unless its request id is already
    /// recorded); true for each one written.
    pub async fn insert_settlements(&self, settlements: &[&Settlement], recorded_at: &str) -> StoreResult<Vec<bool>> {
        // A batch costs the same few statements whatever its size (on SQLite every statement is a
        // round trip to the connection's thread): the rows in multi-row inserts, then each day's
        // total moved once by what was new.
        let periods: Vec<(DateTime<Utc>, String, String)> = settlements
            .iter()
            .map(|settlement| {
                let occurred = parse_timestamp(&settlement.occurred_at).unwrap_or_else(Utc::now);
                (occurred, Period::Daily.key_at(occurred), Period::Monthly.key_at(occurred))
            })
            .collect();
        // Nearly every batch is all new: its inserts then return no rows (on SQLite each returned
        // row is a hand-off between the connection's thread and the runtime). A batch with a
        // redelivered or repeated request id is rolled back and written again, asking which rows
        // the inserts took.
        if let Some(written) = self.try_insert_settlements(settlements, &periods, recorded_at, Returning::Nothing).await? {
            return Ok(written);
        }
        Ok(self.try_insert_settlements(settlements, &periods, recorded_at, Returning::RequestIds).await?.unwrap_or_default())
    }

    /// One attempt at a batch; `None` when `returning` is `Nothing` and not every row was new
    /// (nothing is committed then).
    async fn try_insert_settlements(
        &self,
        settlements: &[&Settlement],
        periods: &[(DateTime<Utc>, String, String)],
        recorded_at: &str,
        returning: Returning,
    ) -> StoreResult<Option<Vec<bool>>> {
        let mut transaction = self.database.begin_writer().await?;
        let placeholders = self.database.placeholders();
        let mut inserted: HashSet<String> = HashSet::new();
        for (chunk, chunk_periods) in statement_chunks(settlements).zip(statement_chunks(periods)) {
            let sql = format!(
                "{} INTO budget_settlements (request_id, tenant_id, plan, key_id, agent_id, conversation_id, model, provider, \
                 input_tokens, output_tokens, cost_nanos, outcome, latency_ms, day_key, month_key, occurred_at, recorded_at) \
                 VALUES {} ON CONFLICT (request_id) DO NOTHING{}",
                placeholders.batch_insert(),
                placeholders.values(chunk.len(), 17, 1),
                match returning {
                    Returning::Nothing => "",
                    Returning::RequestIds => " RETURNING request_id",
                }
            );
            let mut insert = sqlx::query(&sql);
            for (settlement, (occurred, day_key, month_key)) in chunk.iter().zip(chunk_periods) {
                insert = insert
                    .bind(&settlement.request_id)
                    .bind(&settlement.tenant_id)
                    .bind(&settlement.plan)
                    .bind(settlement.key_id.clone())
                    .bind(settlement.agent_id.clone())
                    .bind(settlement.conversation_id.clone())
                    .bind(&settlement.model)
                    .bind(&settlement.provider)
                    .bind(settlement.input_tokens)
                    .bind(settlement.output_tokens)
                    .bind(settlement.cost_nanos)
                    .bind(&settlement.outcome)
                    .bind(i64::try_from(settlement.latency_ms).unwrap_or(i64::MAX))
                    .bind(day_key.as_str())
                    .bind(month_key.as_str())
                    .bind(brainstorm_common::time::format_timestamp(*occurred))
                    .bind(recorded_at);
            }
            match returning {
                Returning::Nothing => {
                    if insert.execute(&mut *transaction).await?.rows_affected() != chunk.len() as u64 {
                        // Dropping the transaction rolls it back.
                        return Ok(None);
                    }
                }
                Returning::RequestIds => {
                    for row in insert.fetch_all(&mut *transaction).await? {
                        inserted.insert(row.try_get("request_id")?);
                    }
                }
            }
        }
        // Written: the first of the batch's settlements with a request id the insert took.
        let written: Vec<bool> = match returning {
            Returning::Nothing => vec![true; settlements.len()],
            Returning::RequestIds => settlements.iter().map(|settlement| inserted.remove(&settlement.request_id)).collect(),
        };
        // The days' totals move in the same transaction as the settlements they count.
        let mut days: BTreeMap<(&str, &str), (&str, i64, i64)> = BTreeMap::new();
        for ((settlement, (_, day_key, month_key)), _) in settlements.iter().zip(periods).zip(&written).filter(|(_, new)| **new) {
            let day = days.entry((settlement.tenant_id.as_str(), day_key.as_str())).or_insert((month_key.as_str(), 0, 0));
            day.1 = day.1.saturating_add(settlement.cost_nanos);
            day.2 += 1;
        }
        let days: Vec<_> = days.into_iter().collect();
        for chunk in statement_chunks(&days) {
            let sql = format!(
                "{} INTO budget_daily_spend (tenant_id, day_key, month_key, cost_nanos, requests) VALUES {} \
                 ON CONFLICT (tenant_id, day_key) DO UPDATE SET cost_nanos = budget_daily_spend.cost_nanos + excluded.cost_nanos, \
                 requests = budget_daily_spend.requests + excluded.requests",
                placeholders.batch_insert(),
                placeholders.values(chunk.len(), 5, 1)
            );
            let mut upsert = sqlx::query(&sql);
            for ((tenant_id, day_key), (month_key, cost_nanos, requests)) in chunk {
                upsert = upsert.bind(*tenant_id).bind(*day_key).bind(*month_key).bind(*cost_nanos).bind(*requests);
            }
            upsert.execute(&mut *transaction).await?;
        }
        transaction.commit().await?;
        Ok(Some(written))
    }

    /// Records that an agent's budget stopped or downgraded a request; true when new.
    pub async fn insert_agent_exhaustion(&self, event: &AgentBudgetExhausted) -> StoreResult<bool> {
        let result = sqlx::query(
            "INSERT INTO budget_agent_exhaustions (event_id, tenant_id, agent_id, action, request_id, occurred_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (event_id) DO NOTHING",
        )
        .bind(&event.event_id)
        .bind(&event.tenant_id)
        .bind(&event.agent_id)
        .bind(&event.action)
        .bind(event.request_id.clone())
        .bind(&event.occurred_at)
        .execute(self.database.pool())
        .await?;
        Ok(result.rows_affected() == 1)
    }

    pub async fn tenant_limits(&self, tenant_id: &str) -> StoreResult<Option<TenantLimits>> {
        let row = sqlx::query(
            "SELECT tenant_id, daily_limit_nanos, monthly_limit_nanos, updated_at FROM budget_tenant_limits WHERE tenant_id = $1",
        )
        .bind(tenant_id)
        .fetch_optional(self.database.pool())
        .await?;
        row.map(|row| {
            Ok(TenantLimits {
                tenant_id: row.try_get("tenant_id")?,
                daily_limit_nanos: row.try_get("daily_limit_nanos")?,
                monthly_limit_nanos: row.try_get("monthly_limit_nanos")?,
                updated_at: Some(row.try_get("updated_at")?),
            })
        })
        .transpose()
    }

    pub async fn set_tenant_limits(&self, limits: &TenantLimits, now: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO budget_tenant_limits (tenant_id, daily_limit_nanos, monthly_limit_nanos, updated_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant_id) DO UPDATE SET daily_limit_nanos = excluded.daily_limit_nanos, \
             monthly_limit_nanos = excluded.monthly_limit_nanos, updated_at = excluded.updated_at",
        )
        .bind(&limits.tenant_id)
        .bind(limits.daily_limit_nanos)
        .bind(limits.monthly_limit_nanos)
        .bind(now)
        .execute(self.database.pool())
        .await?;
        Ok(())
    }

    pub async fn agent_budget(&self, tenant_id: &str, agent_id: &str) -> StoreResult<Option<AgentBudget>> {
        let row = sqlx::query(
            "SELECT tenant_id, agent_id, per_day_nanos, exhaustion_action, created_at, updated_at FROM budget_agent_budgets \
             WHERE tenant_id = $1 AND agent_id = $2",
        )
        .bind(tenant_id)
        .bind(agent_id)
        .fetch_optional(self.database.pool())
        .await?;
        row.as_ref().map(agent_budget_from_row).transpose()
    }

    pub async fn agent_budgets(&self, tenant_id: &str) -> StoreResult<Vec<AgentBudget>> {
        let rows = sqlx::query(
            "SELECT tenant_id, agent_id, per_day_nanos, exhaustion_action, created_at, updated_at FROM budget_agent_budgets \
             WHERE tenant_id = $1 ORDER BY agent_id",
        )
        .bind(tenant_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(agent_budget_from_row).collect()
    }

    /// Creates or replaces an agent's budget (keeping its creation time).
    pub async fn put_agent_budget(&self, budget: &AgentBudget) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO budget_agent_budgets (tenant_id, agent_id, per_day_nanos, exhaustion_action, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant_id, agent_id) DO UPDATE SET per_day_nanos = excluded.per_day_nanos, \
             exhaustion_action = excluded.exhaustion_action, updated_at = excluded.updated_at",
        )
        .bind(&budget.tenant_id)
        .bind(&budget.agent_id)
        .bind(budget.per_day_nanos)
        .bind(&budget.exhaustion_action)
        .bind(&budget.created_at)
        .bind(&budget.updated_at)
        .execute(self.database.pool())
        .await?;
        Ok(())
    }

    /// A tenant's per-agent limits as stored: the map's JSON text, its version and when it was written.
    pub async fn agent_limits(&self, tenant_id: &str) -> StoreResult<Option<(String, i64, String)>> {
        let row = sqlx::query("SELECT limits, version, updated_at FROM budget_agent_limits WHERE tenant_id = $1")
            .bind(tenant_id)
            .fetch_optional(self.database.pool())
            .await?;
        row.map(|row| Ok((row.try_get("limits")?, row.try_get("version")?, row.try_get("updated_at")?))).transpose()
    }

    /// Writes a tenant's per-agent limits as version `expected + 1` if the stored version is still
    /// `expected` (0: none stored); false when another write came first.
    pub async fn write_agent_limits(&self, tenant_id: &str, limits: &str, expected: i64, now: &str) -> StoreResult<bool> {
        let result = if expected == 0 {
            sqlx::query(
                "INSERT INTO budget_agent_limits (tenant_id, limits, version, updated_at) VALUES ($1, $2, 1, $3) \
                 ON CONFLICT (tenant_id) DO NOTHING",
            )
            .bind(tenant_id)
            .bind(limits)
            .bind(now)
            .execute(self.database.pool())
            .await?
        } else {
            sqlx::query(
                "UPDATE budget_agent_limits SET limits = $1, version = version + 1, updated_at = $2 WHERE tenant_id = $3 AND version = $4",
            )
            .bind(limits)
            .bind(now)
            .bind(tenant_id)
            .bind(expected)
            .execute(self.database.pool())
            .await?
        };
        Ok(result.rows_affected() == 1)
    }

    /// A tenant's spend in one period (`2026-11-22` or `2026-11`).
    pub async fn tenant_spend(&self, tenant_id: &str, period: Period, period_key: &str) -> StoreResult<i64> {
        // From the per-day totals: one row for a day, at most 31 for a month.
        let sql = match period {
            Period::Daily => {
                "SELECT CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) FROM budget_daily_spend WHERE tenant_id = $1 AND day_key = $2"
            }
            Period::Monthly => {
                "SELECT CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) FROM budget_daily_spend WHERE tenant_id = $1 AND month_key = $2"
            }
        };
        sqlx::query_scalar(sql).bind(tenant_id).bind(period_key).fetch_one(self.database.pool()).await
    }

    /// An API key's spend in the period containing `now`. Found through the tenant's time index: a
    /// period is a range of `occurred_at` (written by `format_timestamp`, so text order is time order).
    pub async fn key_spend(&self, tenant_id: &str, key_id: &str, period: Period, now: DateTime<Utc>) -> StoreResult<i64> {
        sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) FROM budget_settlements \
             WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3 AND key_id = $4",
        )
        .bind(tenant_id)
        .bind(format_timestamp(period.start_at(now)))
        .bind(format_timestamp(period.end_after(now)))
        .bind(key_id)
        .fetch_one(self.database.pool())
        .await
    }

    /// Spend per day from `first_day` to `last_day` (inclusive), only days with settlements, oldest first.
    pub async fn daily_spend(&self, tenant_id: &str, first_day: &str, last_day: &str) -> StoreResult<Vec<(String, i64)>> {
        let rows = sqlx::query(
            "SELECT day_key, cost_nanos AS spent FROM budget_daily_spend \
             WHERE tenant_id = $1 AND day_key >= $2 AND day_key <= $3 ORDER BY day_key",
        )
        .bind(tenant_id)
        .bind(first_day)
        .bind(last_day)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(|row| Ok((row.try_get("day_key")?, row.try_get("spent")?))).collect()
    }

    /// Per-agent figures from the start of `first_day` (a day key) on; `today` selects today's spend
    /// and conversations. The days are found through the tenant's time index (`occurred_at` starts
    /// with its day key, so every settlement of `first_day` or later sorts at or after it).
    pub async fn agent_stats(&self, tenant_id: &str, first_day: &str, today: &str) -> StoreResult<Vec<AgentStats>> {
        let rows = sqlx::query(
            "SELECT agent_id, CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS total_spend, COUNT(*) AS requests, \
             CAST(COALESCE(SUM(CASE WHEN outcome = $3 THEN 1 ELSE 0 END), 0) AS BIGINT) AS succeeded, \
             CAST(COALESCE(SUM(latency_ms), 0) AS BIGINT) AS total_latency, \
             CAST(COALESCE(SUM(CASE WHEN day_key = $4 THEN cost_nanos ELSE 0 END), 0) AS BIGINT) AS spent_today, \
             COUNT(DISTINCT CASE WHEN day_key = $4 THEN conversation_id END) AS active_conversations \
             FROM budget_settlements WHERE tenant_id = $1 AND occurred_at >= $2 AND agent_id IS NOT NULL \
             GROUP BY agent_id ORDER BY agent_id",
        )
        .bind(tenant_id)
        .bind(first_day)
        .bind("succeeded")
        .bind(today)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AgentStats {
                    agent_id: row.try_get("agent_id")?,
                    total_spend_nanos: row.try_get("total_spend")?,
                    requests: row.try_get("requests")?,
                    succeeded: row.try_get("succeeded")?,
                    total_latency_ms: row.try_get("total_latency")?,
                    spent_today_nanos: row.try_get("spent_today")?,
                    active_conversations: row.try_get("active_conversations")?,
                })
            })
            .collect()
    }

    /// `(agent id, action, count)` of budget exhaustions since `since` (an RFC 3339 instant).
    pub async fn agent_exhaustion_counts(&self, tenant_id: &str, since: &str) -> StoreResult<Vec<(String, String, i64)>> {
        let rows = sqlx::query(
            "SELECT agent_id, action, COUNT(*) AS occurrences FROM budget_agent_exhaustions \
             WHERE tenant_id = $1 AND occurred_at >= $2 GROUP BY agent_id, action",
        )
        .bind(tenant_id)
        .bind(since)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(|row| Ok((row.try_get("agent_id")?, row.try_get("action")?, row.try_get("occurrences")?))).collect()
    }

    pub async fn alert_config(&self, tenant_id: &str) -> StoreResult<Option<AlertConfig>> {
        let row =
            sqlx::query("SELECT tenant_id, thresholds, webhook_url, enabled, updated_at FROM budget_alert_configs WHERE tenant_id = $1")
                .bind(tenant_id)
                .fetch_optional(self.database.pool())
                .await?;
        row.map(|row| {
            let thresholds: String = row.try_get("thresholds")?;
            Ok(AlertConfig {
                tenant_id: row.try_get("tenant_id")?,
                thresholds: serde_json::from_str(&thresholds).unwrap_or_default(),
                webhook_url: row.try_get("webhook_url")?,
                enabled: row.try_get::<i64, _>("enabled")? != 0,
                updated_at: Some(row.try_get("updated_at")?),
            })
        })
        .transpose()
    }

    pub async fn put_alert_config(&self, config: &AlertConfig, now: &str) -> StoreResult<()> {
        let thresholds = serde_json::to_string(&config.thresholds).unwrap_or_else(|_| "[]".to_string());
        sqlx::query(
            "INSERT INTO budget_alert_configs (tenant_id, thresholds, webhook_url, enabled, updated_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (tenant_id) DO UPDATE SET thresholds = excluded.thresholds, webhook_url = excluded.webhook_url, \
             enabled = excluded.enabled, updated_at = excluded.updated_at",
        )
        .bind(&config.tenant_id)
        .bind(thresholds)
        .bind(config.webhook_url.clone())
        .bind(i64::from(config.enabled))
        .bind(now)
        .execute(self.database.pool())
        .await?;
        Ok(())
    }

    /// Records a threshold crossing and its alert in one transaction, unless this threshold already
    /// fired in this period; true when recorded (the caller then delivers it).
    pub async fn record_crossing(&self, alert: &AlertRecord, ratio_basis_points: i64) -> StoreResult<bool> {
        let mut transaction = self.database.begin().await?;
        let crossed = sqlx::query(
            "INSERT INTO budget_alert_crossings (tenant_id, scope, period_key, threshold, crossed_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (tenant_id, scope, period_key, threshold) DO NOTHING",
        )
        .bind(&alert.tenant_id)
        .bind(&alert.scope)
        .bind(&alert.period_key)
        .bind(i64::from(alert.threshold))
        .bind(&alert.timestamp)
        .execute(&mut *transaction)
        .await?;
        if crossed.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO budget_alerts (id, tenant_id, scope, period_key, threshold, ratio_basis_points, projected_nanos, limit_nanos, \
             delivery_status, delivery_attempts, delivery_error, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(&alert.id)
        .bind(&alert.tenant_id)
        .bind(&alert.scope)
        .bind(&alert.period_key)
        .bind(i64::from(alert.threshold))
        .bind(ratio_basis_points)
        .bind(alert.projected_nanos)
        .bind(alert.limit_nanos)
        .bind(&alert.delivery_status)
        .bind(i64::from(alert.delivery_attempts))
        .bind(alert.delivery_error.clone())
        .bind(&alert.timestamp)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(true)
    }

    pub async fn update_alert_delivery(&self, alert_id: &str, status: &str, attempts: u32, error: Option<&str>) -> StoreResult<()> {
        sqlx::query("UPDATE budget_alerts SET delivery_status = $1, delivery_attempts = $2, delivery_error = $3 WHERE id = $4")
            .bind(status)
            .bind(i64::from(attempts))
            .bind(error.map(str::to_string))
            .bind(alert_id)
            .execute(self.database.pool())
            .await?;
        Ok(())
    }

    /// A tenant's alerts, newest first.
    pub async fn alerts(&self, tenant_id: &str, limit: u32) -> StoreResult<Vec<AlertRecord>> {
        let rows = sqlx::query(
            "SELECT id, tenant_id, scope, period_key, threshold, ratio_basis_points, projected_nanos, limit_nanos, delivery_status, \
             delivery_attempts, delivery_error, created_at FROM budget_alerts WHERE tenant_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2",
        )
        .bind(tenant_id)
        .bind(i64::from(limit))
        .fetch_all(self.database.pool())
        .await?;
        rows.iter()
            .map(|row| {
                let basis_points: i64 = row.try_get("ratio_basis_points")?;
                Ok(AlertRecord {
                    id: row.try_get("id")?,
                    tenant_id: row.try_get("tenant_id")?,
                    scope: row.try_get("scope")?,
                    period_key: row.try_get("period_key")?,
                    threshold: clamp_u32(row.try_get("threshold")?),
                    // Display only: the ratio is kept exact in basis points.
                    ratio_percent: basis_points as f64 / 100.0,
                    projected_nanos: row.try_get("projected_nanos")?,
                    limit_nanos: row.try_get("limit_nanos")?,
                    timestamp: row.try_get("created_at")?,
                    delivery_status: row.try_get("delivery_status")?,
                    delivery_attempts: clamp_u32(row.try_get("delivery_attempts")?),
                    delivery_error: row.try_get("delivery_error")?,
                })
            })
            .collect()
    }

    /// Requests, tokens and spend grouped by `grouping`, for settlements in `[since, until)`.
    pub async fn usage_summary(&self, tenant_id: &str, grouping: UsageGrouping, since: &str, until: &str) -> StoreResult<Vec<UsageGroup>> {
        let (expression, order) = match grouping {
            UsageGrouping::Model => ("model", "cost DESC, group_key"),
            UsageGrouping::Provider => ("provider", "cost DESC, group_key"),
            UsageGrouping::Key => ("COALESCE(key_id, '')", "cost DESC, group_key"),
            UsageGrouping::Agent => ("COALESCE(agent_id, '')", "cost DESC, group_key"),
            UsageGrouping::Day => ("day_key", "group_key"),
        };
        // Both fragments come from the fixed table above, never from input.
        let sql = format!(
            "SELECT {expression} AS group_key, COUNT(*) AS requests, CAST(COALESCE(SUM(input_tokens), 0) AS BIGINT) AS input_tokens, \
             CAST(COALESCE(SUM(output_tokens), 0) AS BIGINT) AS output_tokens, CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS cost \
             FROM budget_settlements WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3 \
             GROUP BY {expression} ORDER BY {order}"
        );
        let rows = sqlx::query(&sql).bind(tenant_id).bind(since).bind(until).fetch_all(self.database.pool()).await?;
        rows.iter()
            .map(|row| {
                Ok(UsageGroup {
                    key: row.try_get("group_key")?,
                    requests: u64::try_from(row.try_get::<i64, _>("requests")?).unwrap_or(0),
                    input_tokens: row.try_get("input_tokens")?,
                    output_tokens: row.try_get("output_tokens")?,
                    cost_nanos: row.try_get("cost")?,
                })
            })
            .collect()
    }

    /// Up to `limit` of the tenant's settlements in `[since, until)` matching `filters`, newest first
    /// (by time, then request id), starting after `after` (`(occurred_at, request_id)` of the last row
    /// of the previous page). Through the tenant's time index.
    pub async fn settled_requests(
        &self,
        tenant_id: &str,
        since: &str,
        until: &str,
        filters: &SettlementFilters,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> StoreResult<Vec<SettledRequest>> {
        let mut sql = String::from(
            "SELECT request_id, occurred_at, key_id, agent_id, conversation_id, model, provider, outcome, input_tokens, output_tokens, \
             cost_nanos, latency_ms FROM budget_settlements WHERE tenant_id = $1 AND occurred_at >= $2 AND occurred_at < $3",
        );
        let mut values: Vec<&str> = vec![tenant_id, since, until];
        // Column names come from this fixed list, never from input.
        for (column, value) in
            [("model", &filters.model), ("key_id", &filters.key_id), ("agent_id", &filters.agent_id), ("outcome", &filters.outcome)]
        {
            if let Some(value) = value {
                values.push(value);
                sql.push_str(&format!(" AND {column} = ${}", values.len()));
            }
        }
        if let Some((occurred_at, request_id)) = after {
            values.push(occurred_at);
            let at = values.len();
            values.push(request_id);
            sql.push_str(&format!(" AND (occurred_at < ${at} OR (occurred_at = ${at} AND request_id < ${}))", values.len()));
        }
        sql.push_str(&format!(" ORDER BY occurred_at DESC, request_id DESC LIMIT {limit}"));
        let mut query = sqlx::query(&sql);
        for value in values {
            query = query.bind(value);
        }
        let rows = query.fetch_all(self.database.pool()).await?;
        rows.iter()
            .map(|row| {
                Ok(SettledRequest {
                    request_id: row.try_get("request_id")?,
                    occurred_at: row.try_get("occurred_at")?,
                    key_id: row.try_get("key_id")?,
                    agent_id: row.try_get("agent_id")?,
                    conversation_id: row.try_get("conversation_id")?,
                    model: row.try_get("model")?,
                    provider: row.try_get("provider")?,
                    outcome: row.try_get("outcome")?,
                    input_tokens: row.try_get("input_tokens")?,
                    output_tokens: row.try_get("output_tokens")?,
                    cost_nanos: row.try_get("cost_nanos")?,
                    latency_ms: row.try_get("latency_ms")?,
                })
            })
            .collect()
    }

    /// Per-model figures of the tenant's settlements since `since` (through the tenant's time index).
    pub async fn model_stats(&self, tenant_id: &str, since: &str) -> StoreResult<Vec<ModelStats>> {
        let rows = sqlx::query(
            "SELECT model, COUNT(*) AS requests, \
             CAST(COALESCE(SUM(CASE WHEN outcome = $3 THEN 1 ELSE 0 END), 0) AS BIGINT) AS succeeded, \
             CAST(COALESCE(SUM(CASE WHEN outcome = $3 AND output_tokens > 0 THEN 1 ELSE 0 END), 0) AS BIGINT) AS answered, \
             CAST(COALESCE(SUM(CASE WHEN outcome = $3 THEN latency_ms ELSE 0 END), 0) AS BIGINT) AS total_latency, \
             CAST(COALESCE(SUM(CASE WHEN outcome = $3 THEN output_tokens ELSE 0 END), 0) AS BIGINT) AS total_output, \
             COUNT(DISTINCT day_key) AS days \
             FROM budget_settlements WHERE tenant_id = $1 AND occurred_at >= $2 GROUP BY model ORDER BY model",
        )
        .bind(tenant_id)
        .bind(since)
        .bind("succeeded")
        .fetch_all(self.database.pool())
        .await?;
        let count = |row: &AnyRow, column: &str| -> StoreResult<u64> { Ok(u64::try_from(row.try_get::<i64, _>(column)?).unwrap_or(0)) };
        rows.iter()
            .map(|row| {
                Ok(ModelStats {
                    model: row.try_get("model")?,
                    requests: count(row, "requests")?,
                    succeeded: count(row, "succeeded")?,
                    answered: count(row, "answered")?,
                    total_latency_ms: row.try_get("total_latency")?,
                    total_output_tokens: row.try_get("total_output")?,
                    days_active: count(row, "days")?,
                })
            })
            .collect()
    }

    /// Every counter's total for the day `day_key` and the month `month_key`, across tenants.
    pub async fn current_totals(&self, day_key: &str, month_key: &str) -> StoreResult<Vec<CounterTotal>> {
        let (month_first_day, month_last_day) = month_days(month_key);
        let mut totals = Vec::new();
        let total = |kind: ScopeKind, owner: String, period_key: &str, value: i64| CounterTotal {
            kind: kind.as_str().to_string(),
            owner,
            period_key: period_key.to_string(),
            value,
        };
        let rows = sqlx::query(
            "SELECT tenant_id, CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS spent, \
             CAST(COALESCE(SUM(input_tokens + output_tokens), 0) AS BIGINT) AS tokens, COUNT(*) AS requests \
             FROM budget_settlements WHERE day_key = $1 GROUP BY tenant_id",
        )
        .bind(day_key)
        .fetch_all(self.database.pool())
        .await?;
        for row in &rows {
            let tenant_id: String = row.try_get("tenant_id")?;
            totals.push(total(ScopeKind::TenantDaily, tenant_id.clone(), day_key, row.try_get("spent")?));
            totals.push(total(ScopeKind::PlanTokensDaily, tenant_id.clone(), day_key, row.try_get("tokens")?));
            totals.push(total(ScopeKind::PlanRequestsDaily, tenant_id, day_key, row.try_get("requests")?));
        }
        // A tenant's month from its days (kept with every settlement); a key's month from the day
        // index, as a range of day keys.
        let month_rows = sqlx::query(
            "SELECT tenant_id, CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS spent FROM budget_daily_spend \
             WHERE month_key = $1 GROUP BY tenant_id",
        )
        .bind(month_key)
        .fetch_all(self.database.pool())
        .await?;
        for row in &month_rows {
            totals.push(total(ScopeKind::TenantMonthly, row.try_get("tenant_id")?, month_key, row.try_get("spent")?));
        }
        let key_day_rows = sqlx::query(
            "SELECT key_id, CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS spent FROM budget_settlements \
             WHERE day_key = $1 AND key_id IS NOT NULL GROUP BY key_id",
        )
        .bind(day_key)
        .fetch_all(self.database.pool())
        .await?;
        for row in &key_day_rows {
            totals.push(total(ScopeKind::KeyDaily, row.try_get("key_id")?, day_key, row.try_get("spent")?));
        }
        let key_month_rows = sqlx::query(
            "SELECT key_id, CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS spent FROM budget_settlements \
             WHERE day_key >= $1 AND day_key <= $2 AND key_id IS NOT NULL GROUP BY key_id",
        )
        .bind(&month_first_day)
        .bind(&month_last_day)
        .fetch_all(self.database.pool())
        .await?;
        for row in &key_month_rows {
            totals.push(total(ScopeKind::KeyMonthly, row.try_get("key_id")?, month_key, row.try_get("spent")?));
        }
        let agent_rows = sqlx::query(
            "SELECT tenant_id, agent_id, CAST(COALESCE(SUM(cost_nanos), 0) AS BIGINT) AS spent FROM budget_settlements \
             WHERE day_key = $1 AND agent_id IS NOT NULL GROUP BY tenant_id, agent_id",
        )
        .bind(day_key)
        .fetch_all(self.database.pool())
        .await?;
        for row in &agent_rows {
            let owner = Scope::agent_owner(&row.try_get::<String, _>("tenant_id")?, &row.try_get::<String, _>("agent_id")?);
            totals.push(total(ScopeKind::AgentDaily, owner, day_key, row.try_get("spent")?));
        }
        Ok(totals)
    }
}

fn agent_budget_from_row(row: &AnyRow) -> StoreResult<AgentBudget> {
    Ok(AgentBudget {
        tenant_id: row.try_get("tenant_id")?,
        agent_id: row.try_get("agent_id")?,
        per_day_nanos: row.try_get("per_day_nanos")?,
        exhaustion_action: row.try_get("exhaustion_action")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// The first and last day keys a month key's days can have (`2026-11` gives `2026-11-01` and
/// `2026-11-31`: day keys compare as text, and no day is later than the 31st).
fn month_days(month_key: &str) -> (String, String) {
    (format!("{month_key}-01"), format!("{month_key}-31"))
}

fn clamp_u32(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}
