//! The catalog's tables, on SQLite or PostgreSQL.

use std::collections::BTreeMap;

use brainstorm_common::store::Database;
use brainstorm_proto::catalog::{Preset, ProviderKey};
use brainstorm_providers::vault::SealedSecret;
use sqlx::Row;
use sqlx::any::AnyRow;

pub type StoreResult<T> = Result<T, sqlx::Error>;

/// A stored key with its sealed secret.
pub struct StoredKey {
    pub key: ProviderKey,
    pub sealed: SealedSecret,
}

#[derive(Debug, Clone)]
pub struct CatalogStore {
    database: Database,
}

const KEY_COLUMNS: &str =
    "id, tenant_id, provider, name, masked_key, ciphertext, nonce, wrapped_key, key_nonce, status, created_at, deactivated_at";

impl CatalogStore {
    pub fn new(database: Database) -> Self {
        CatalogStore { database }
    }

    /// Inserts an active key, deactivating the provider's previous active key in the same transaction.
    pub async fn insert_rotating(&self, stored: &StoredKey, now: &str) -> StoreResult<()> {
        let key = &stored.key;
        let mut transaction = self.database.begin().await?;
        sqlx::query("UPDATE provider_keys SET status = $1, deactivated_at = $2 WHERE tenant_id = $3 AND provider = $4 AND status = $5")
            .bind("inactive")
            .bind(now)
            .bind(&key.tenant_id)
            .bind(&key.provider)
            .bind("active")
            .execute(&mut *transaction)
            .await?;
        sqlx::query(&format!("INSERT INTO provider_keys ({KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"))
            .bind(&key.id)
            .bind(&key.tenant_id)
            .bind(&key.provider)
            .bind(&key.name)
            .bind(&key.masked_key)
            .bind(&stored.sealed.ciphertext)
            .bind(&stored.sealed.nonce)
            .bind(&stored.sealed.wrapped_key)
            .bind(&stored.sealed.key_nonce)
            .bind(&key.status)
            .bind(&key.created_at)
            .bind(key.deactivated_at.clone())
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await
    }

    pub async fn keys(&self, tenant_id: &str) -> StoreResult<Vec<StoredKey>> {
        let rows = sqlx::query(&format!("SELECT {KEY_COLUMNS} FROM provider_keys WHERE tenant_id = $1 ORDER BY created_at, id"))
            .bind(tenant_id)
            .fetch_all(self.database.pool())
            .await?;
        rows.iter().map(stored_key_from_row).collect()
    }

    /// Deactivates the key with this id, or the active key of this provider; returns it if found.
    pub async fn deactivate(&self, tenant_id: &str, provider_or_key_id: &str, now: &str) -> StoreResult<Option<ProviderKey>> {
        let row = sqlx::query(&format!(
            "SELECT {KEY_COLUMNS} FROM provider_keys WHERE tenant_id = $1 AND (id = $2 OR (provider = $2 AND status = $3)) ORDER BY created_at DESC"
        ))
        .bind(tenant_id)
        .bind(provider_or_key_id)
        .bind("active")
        .fetch_optional(self.database.pool())
        .await?;
        let Some(stored) = row.as_ref().map(stored_key_from_row).transpose()? else { return Ok(None) };
        let mut key = stored.key;
        if key.status == "active" {
            sqlx::query("UPDATE provider_keys SET status = $1, deactivated_at = $2 WHERE id = $3 AND status = $4")
                .bind("inactive")
                .bind(now)
                .bind(&key.id)
                .bind("active")
                .execute(self.database.pool())
                .await?;
            key.status = "inactive".to_string();
            key.deactivated_at = Some(now.to_string());
        }
        Ok(Some(key))
    }

    pub async fn aliases(&self, tenant_id: &str) -> StoreResult<BTreeMap<String, String>> {
        let rows = sqlx::query("SELECT alias, target FROM model_aliases WHERE tenant_id = $1")
            .bind(tenant_id)
            .fetch_all(self.database.pool())
            .await?;
        rows.iter().map(|row| Ok((row.try_get("alias")?, row.try_get("target")?))).collect()
    }

    /// Replaces the alias map atomically.
    pub async fn replace_aliases(&self, tenant_id: &str, aliases: &BTreeMap<String, String>) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query("DELETE FROM model_aliases WHERE tenant_id = $1").bind(tenant_id).execute(&mut *transaction).await?;
        for (alias, target) in aliases {
            sqlx::query("INSERT INTO model_aliases (tenant_id, alias, target) VALUES ($1, $2, $3)")
                .bind(tenant_id)
                .bind(alias)
                .bind(target)
                .execute(&mut *transaction)
                .await?;
        }
        transaction.commit().await
    }

    pub async fn presets(&self, tenant_id: &str) -> StoreResult<Vec<Preset>> {
        let rows = sqlx::query(
            "SELECT tenant_id, slug, name, models, strategy, options, created_at, updated_at FROM routing_presets WHERE tenant_id = $1 ORDER BY slug",
        )
        .bind(tenant_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(preset_from_row).collect()
    }

    pub async fn preset(&self, tenant_id: &str, slug: &str) -> StoreResult<Option<Preset>> {
        let row = sqlx::query(
            "SELECT tenant_id, slug, name, models, strategy, options, created_at, updated_at FROM routing_presets WHERE tenant_id = $1 AND slug = $2",
        )
        .bind(tenant_id)
        .bind(slug)
        .fetch_optional(self.database.pool())
        .await?;
        row.as_ref().map(preset_from_row).transpose()
    }

    pub async fn insert_preset(&self, preset: &Preset) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO routing_presets (tenant_id, slug, name, models, strategy, options, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&preset.tenant_id)
        .bind(&preset.slug)
        .bind(&preset.name)
        .bind(serde_json::to_string(&preset.models).unwrap_or_else(|_| "[]".to_string()))
        .bind(&preset.strategy)
        .bind(&preset.options_json)
        .bind(&preset.created_at)
        .bind(&preset.updated_at)
        .execute(self.database.pool())
        .await?;
        Ok(())
    }

    pub async fn update_preset(&self, preset: &Preset) -> StoreResult<bool> {
        let result = sqlx::query("UPDATE routing_presets SET name = $1, models = $2, strategy = $3, options = $4, updated_at = $5 WHERE tenant_id = $6 AND slug = $7")
            .bind(&preset.name)
            .bind(serde_json::to_string(&preset.models).unwrap_or_else(|_| "[]".to_string()))
            .bind(&preset.strategy)
            .bind(&preset.options_json)
            .bind(&preset.updated_at)
            .bind(&preset.tenant_id)
            .bind(&preset.slug)
            .execute(self.database.pool())
            .await?;
        Ok(result.rows_affected() == 1)
    }

    pub async fn delete_preset(&self, tenant_id: &str, slug: &str) -> StoreResult<bool> {
        let result = sqlx::query("DELETE FROM routing_presets WHERE tenant_id = $1 AND slug = $2")
            .bind(tenant_id)
            .bind(slug)
            .execute(self.database.pool())
            .await?;
        Ok(result.rows_affected() == 1)
    }
}

fn stored_key_from_row(row: &AnyRow) -> StoreResult<StoredKey> {
    Ok(StoredKey {
        key: ProviderKey {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            provider: row.try_get("provider")?,
            name: row.try_get("name")?,
            masked_key: row.try_get("masked_key")?,
            status: row.try_get("status")?,
            created_at: row.try_get("created_at")?,
            deactivated_at: row.try_get("deactivated_at")?,
        },
        sealed: SealedSecret {
            ciphertext: row.try_get("ciphertext")?,
            nonce: row.try_get("nonce")?,
            wrapped_key: row.try_get("wrapped_key")?,
            key_nonce: row.try_get("key_nonce")?,
        },
    })
}

fn preset_from_row(row: &AnyRow) -> StoreResult<Preset> {
    Ok(Preset {
        tenant_id: row.try_get("tenant_id")?,
        slug: row.try_get("slug")?,
        name: row.try_get("name")?,
        models: serde_json::from_str(&row.try_get::<String, _>("models")?).unwrap_or_default(),
        strategy: row.try_get("strategy")?,
        options_json: row.try_get("options")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}
