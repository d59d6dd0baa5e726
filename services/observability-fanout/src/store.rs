//! The fan-out tables, on SQLite or PostgreSQL.

use brainstorm_common::store::Database;
use brainstorm_proto::observability::{DeliveryStats, Destination};
use brainstorm_providers::vault::SealedSecret;
use sqlx::Row;
use sqlx::any::AnyRow;

pub type StoreResult<T> = Result<T, sqlx::Error>;

/// A destination row: what is shown, and its sealed secret members (empty fields when none).
#[derive(Debug, Clone)]
pub struct StoredDestination {
    pub destination: Destination,
    pub sealed: SealedSecret,
}

#[derive(Debug, Clone)]
pub struct FanoutStore {
    database: Database,
}

const COLUMNS: &str = "id, tenant_id, kind, name, type, config, secret_names, ciphertext, nonce, wrapped_key, key_nonce, event_types, \
     batch_max_size, batch_flush_interval_ms, filter_rules, enabled, created_at, updated_at, sent, failed, dropped, last_delivery_at";

fn unsigned(row: &AnyRow, column: &str) -> StoreResult<u64> {
    Ok(u64::try_from(row.try_get::<i64, _>(column)?).unwrap_or_default())
}

fn decode_list(text: &str) -> StoreResult<Vec<String>> {
    serde_json::from_str(text).map_err(|error| sqlx::Error::Decode(Box::new(error)))
}

fn from_row(row: &AnyRow) -> StoreResult<StoredDestination> {
    Ok(StoredDestination {
        destination: Destination {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            kind: row.try_get("kind")?,
            name: row.try_get("name")?,
            r#type: row.try_get("type")?,
            config_json: row.try_get("config")?,
            event_types: decode_list(&row.try_get::<String, _>("event_types")?)?,
            batch_max_size: u32::try_from(unsigned(row, "batch_max_size")?).unwrap_or(u32::MAX),
            batch_flush_interval_ms: u32::try_from(unsigned(row, "batch_flush_interval_ms")?).unwrap_or(u32::MAX),
            filter_rules_json: row.try_get("filter_rules")?,
            enabled: row.try_get::<i64, _>("enabled")? != 0,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            sent: unsigned(row, "sent")?,
            failed: unsigned(row, "failed")?,
            dropped: unsigned(row, "dropped")?,
            last_delivery_at: row.try_get("last_delivery_at")?,
            secrets_set: decode_list(&row.try_get::<String, _>("secret_names")?)?,
        },
        sealed: SealedSecret {
            ciphertext: row.try_get("ciphertext")?,
            nonce: row.try_get("nonce")?,
            wrapped_key: row.try_get("wrapped_key")?,
            key_nonce: row.try_get("key_nonce")?,
        },
    })
}

impl FanoutStore {
    pub fn new(database: Database) -> FanoutStore {
        FanoutStore { database }
    }

    /// Inserts a destination, or replaces it (by id) with `replace`.
    pub async fn put(&self, stored: &StoredDestination, replace: bool) -> StoreResult<()> {
        let destination = &stored.destination;
        let mut transaction = self.database.begin().await?;
        if replace {
            sqlx::query("DELETE FROM obs_destinations WHERE id = $1 AND tenant_id = $2")
                .bind(&destination.id)
                .bind(&destination.tenant_id)
                .execute(&mut *transaction)
                .await?;
        }
        sqlx::query(&format!(
            "INSERT INTO obs_destinations ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)"
        ))
        .bind(&destination.id)
        .bind(&destination.tenant_id)
        .bind(&destination.kind)
        .bind(&destination.name)
        .bind(&destination.r#type)
        .bind(&destination.config_json)
        .bind(serde_json::to_string(&destination.secrets_set).unwrap_or_else(|_| "[]".to_string()))
        .bind(&stored.sealed.ciphertext)
        .bind(&stored.sealed.nonce)
        .bind(&stored.sealed.wrapped_key)
        .bind(&stored.sealed.key_nonce)
        .bind(serde_json::to_string(&destination.event_types).unwrap_or_else(|_| "[]".to_string()))
        .bind(i64::from(destination.batch_max_size))
        .bind(i64::from(destination.batch_flush_interval_ms))
        .bind(&destination.filter_rules_json)
        .bind(i64::from(destination.enabled))
        .bind(&destination.created_at)
        .bind(&destination.updated_at)
        .bind(i64::try_from(destination.sent).unwrap_or(i64::MAX))
        .bind(i64::try_from(destination.failed).unwrap_or(i64::MAX))
        .bind(i64::try_from(destination.dropped).unwrap_or(i64::MAX))
        .bind(&destination.last_delivery_at)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await
    }

    /// A tenant's destinations of `kind` (every kind when empty), oldest first.
    pub async fn list(&self, tenant_id: &str, kind: &str) -> StoreResult<Vec<StoredDestination>> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM obs_destinations WHERE tenant_id = $1 AND ($2 = '' OR kind = $2) ORDER BY created_at, id"
        ))
        .bind(tenant_id)
        .bind(kind)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(from_row).collect()
    }

    pub async fn get(&self, tenant_id: &str, kind: &str, id: &str) -> StoreResult<Option<StoredDestination>> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM obs_destinations WHERE tenant_id = $1 AND kind = $2 AND id = $3"))
            .bind(tenant_id)
            .bind(kind)
            .bind(id)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(from_row).transpose()
    }

    pub async fn delete(&self, tenant_id: &str, id: &str) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query("DELETE FROM obs_delivery_hours WHERE destination_id = $1").bind(id).execute(&mut *transaction).await?;
        sqlx::query("DELETE FROM obs_destinations WHERE tenant_id = $1 AND id = $2")
            .bind(tenant_id)
            .bind(id)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await
    }

    /// The tenant's fan-out switch (on until set off).
    pub async fn enabled(&self, tenant_id: &str) -> StoreResult<bool> {
        let row =
            sqlx::query("SELECT enabled FROM obs_config WHERE tenant_id = $1").bind(tenant_id).fetch_optional(self.database.pool()).await?;
        Ok(row.map(|row| row.try_get::<i64, _>("enabled")).transpose()?.is_none_or(|enabled| enabled != 0))
    }

    pub async fn set_enabled(&self, tenant_id: &str, enabled: bool, now: &str) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query("DELETE FROM obs_config WHERE tenant_id = $1").bind(tenant_id).execute(&mut *transaction).await?;
        sqlx::query("INSERT INTO obs_config (tenant_id, enabled, updated_at) VALUES ($1, $2, $3)")
            .bind(tenant_id)
            .bind(i64::from(enabled))
            .bind(now)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await
    }

    /// Counts a delivery's outcome on the destination and in its hour.
    pub async fn record(&self, id: &str, sent: u64, failed: u64, dropped: u64, now: &str) -> StoreResult<()> {
        let as_i64 = |count: u64| i64::try_from(count).unwrap_or(i64::MAX);
        let hour = now.get(..13).unwrap_or(now);
        let mut transaction = self.database.begin().await?;
        sqlx::query(
            "UPDATE obs_destinations SET sent = sent + $1, failed = failed + $2, dropped = dropped + $3, \
             last_delivery_at = CASE WHEN $1 > 0 THEN $4 ELSE last_delivery_at END WHERE id = $5",
        )
        .bind(as_i64(sent))
        .bind(as_i64(failed))
        .bind(as_i64(dropped))
        .bind(now)
        .bind(id)
        .execute(&mut *transaction)
        .await?;
        sqlx::query(
            "INSERT INTO obs_delivery_hours (destination_id, hour, sent, failed, dropped) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (destination_id, hour) DO UPDATE SET sent = obs_delivery_hours.sent + excluded.sent, \
             failed = obs_delivery_hours.failed + excluded.failed, dropped = obs_delivery_hours.dropped + excluded.dropped",
        )
        .bind(id)
        .bind(hour)
        .bind(as_i64(sent))
        .bind(as_i64(failed))
        .bind(as_i64(dropped))
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await
    }

    /// The counts of the hours from `since_hour` (`YYYY-MM-DDTHH`) on.
    pub async fn stats_since(&self, id: &str, since_hour: &str) -> StoreResult<DeliveryStats> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(sent), 0) AS BIGINT) AS sent, CAST(COALESCE(SUM(failed), 0) AS BIGINT) AS failed, \
             CAST(COALESCE(SUM(dropped), 0) AS BIGINT) AS dropped FROM obs_delivery_hours WHERE destination_id = $1 AND hour >= $2",
        )
        .bind(id)
        .bind(since_hour)
        .fetch_one(self.database.pool())
        .await?;
        Ok(DeliveryStats {
            sent: unsigned(&row, "sent")?,
            failed: unsigned(&row, "failed")?,
            dropped: unsigned(&row, "dropped")?,
            last_delivery_at: String::new(),
        })
    }
}
