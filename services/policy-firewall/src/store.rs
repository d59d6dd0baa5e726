//! The policy firewall's tables, read and written with bound parameters on SQLite or PostgreSQL.
//!
//! Kill-switch changes bump the tenant row's `version` in the same transaction, so every snapshot can
//! be ordered. Configurations are stored as the JSON of their validated domain types.

use brainstorm_common::store::{Database, statement_chunks};
use brainstorm_proto::policy::{AgentRisk, Approval, Interception, KillSwitchHistoryEntry, ScopedSwitch, Verdict};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use crate::approvals::{APPROVED, PENDING};

/// Result of a store operation.
pub type StoreResult<T> = Result<T, sqlx::Error>;

/// The tenant switch row.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KillSwitchRow {
    pub active: bool,
    pub activated_at: Option<String>,
    pub activated_by: Option<String>,
    pub reason: Option<String>,
    pub deactivated_at: Option<String>,
    pub version: i64,
}

/// A registered external guardrail provider, its key sealed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProviderRecord {
    pub tenant_id: String,
    pub provider_id: String,
    pub name: String,
    pub endpoint: String,
    pub template: String,
    pub result_mapping_json: Option<String>,
    pub timeout_ms: i64,
    pub sealed_key: Option<SealedKey>,
    pub api_key_mask: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// The four parts of a sealed API key (see `brainstorm_providers::vault`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedKey {
    pub ciphertext: String,
    pub nonce: String,
    pub wrapped_key: String,
    pub key_nonce: String,
}

/// A stored JSON document and when it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDocument {
    pub json: String,
    pub updated_at: String,
}

/// A stored ruleset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRuleset {
    pub version: i64,
    pub rules_json: String,
    pub updated_at: String,
    pub updated_by: String,
}

/// The policy firewall's store.
#[derive(Debug, Clone)]
pub struct PolicyStore {
    database: Database,
}

/// `SELECT <every approval column> FROM policy_approvals <rest>`, as one literal.
macro_rules! select_approvals {
    ($rest:literal) => {
        concat!(
            "SELECT id, tenant_id, tool_name, surface, agent_id, owner_id, argument_keys_json, argument_hash, rule_id, status, scope, ",
            "review_note, reviewed_by, created_at, reviewed_at, expires_at, consumed_at, consumed_by_request_id, request_id, attempts ",
            "FROM policy_approvals ",
            $rest
        )
    };
}

impl PolicyStore {
    pub fn new(database: Database) -> Self {
        PolicyStore { database }
    }

    /// The database (tests read raw columns to check what is stored).
    pub fn database(&self) -> &Database {
        &self.database
    }

    // ------------------------------------------------------------ kill switches

    pub async fn kill_switch(&self, tenant_id: &str) -> StoreResult<Option<KillSwitchRow>> {
        let row = sqlx::query(
            "SELECT active, activated_at, activated_by, reason, deactivated_at, version FROM policy_kill_switches WHERE tenant_id = $1",
        )
        .bind(tenant_id)
        .fetch_optional(self.database.pool())
        .await?;
        row.map(|row| {
            Ok(KillSwitchRow {
                active: row.try_get::<i64, _>("active")? != 0,
                activated_at: row.try_get("activated_at")?,
                activated_by: row.try_get("activated_by")?,
                reason: row.try_get("reason")?,
                deactivated_at: row.try_get("deactivated_at")?,
                version: row.try_get("version")?,
            })
        })
        .transpose()
    }

    /// Activates the tenant switch and appends to its history; false when it was already active.
    pub async fn activate_kill_switch(&self, tenant_id: &str, reason: &str, activated_by: &str, now: &str) -> StoreResult<bool> {
        let mut transaction = self.database.begin().await?;
        let changed = sqlx::query(
            "INSERT INTO policy_kill_switches (tenant_id, active, activated_at, activated_by, reason, deactivated_at, version, updated_at) \
             VALUES ($1, 1, $2, $3, $4, NULL, 1, $2) \
             ON CONFLICT (tenant_id) DO UPDATE SET active = 1, activated_at = excluded.activated_at, activated_by = excluded.activated_by, \
             reason = excluded.reason, deactivated_at = NULL, version = policy_kill_switches.version + 1, updated_at = excluded.updated_at \
             WHERE policy_kill_switches.active = 0",
        )
        .bind(tenant_id)
        .bind(now)
        .bind(activated_by)
        .bind(reason)
        .execute(&mut *transaction)
        .await?;
        if changed.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO policy_kill_switch_history (id, tenant_id, activated_at, deactivated_at, activated_by, deactivated_by, reason) \
             VALUES ($1, $2, $3, NULL, $4, NULL, $5)",
        )
        .bind(uuid::Uuid::now_v7().to_string())
        .bind(tenant_id)
        .bind(now)
        .bind(activated_by)
        .bind(reason)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(true)
    }

    /// Deactivates the tenant switch and closes its open history entry; false when it was inactive.
    pub async fn deactivate_kill_switch(&self, tenant_id: &str, deactivated_by: &str, now: &str) -> StoreResult<bool> {
        let mut transaction = self.database.begin().await?;
        let changed = sqlx::query(
            "UPDATE policy_kill_switches SET active = 0, deactivated_at = $2, version = version + 1, updated_at = $2 \
             WHERE tenant_id = $1 AND active = 1",
        )
        .bind(tenant_id)
        .bind(now)
        .execute(&mut *transaction)
        .await?;
        if changed.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query(
            "UPDATE policy_kill_switch_history SET deactivated_at = $2, deactivated_by = $3 WHERE tenant_id = $1 AND deactivated_at IS NULL",
        )
        .bind(tenant_id)
        .bind(now)
        .bind(deactivated_by)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(true)
    }

    /// The last `limit` activations, newest first.
    pub async fn kill_switch_history(&self, tenant_id: &str, limit: i64) -> StoreResult<Vec<KillSwitchHistoryEntry>> {
        let rows = sqlx::query(
            "SELECT activated_at, deactivated_at, activated_by, reason FROM policy_kill_switch_history WHERE tenant_id = $1 \
             ORDER BY activated_at DESC, id DESC LIMIT $2",
        )
        .bind(tenant_id)
        .bind(limit)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(KillSwitchHistoryEntry {
                    activated_at: row.try_get("activated_at")?,
                    deactivated_at: row.try_get("deactivated_at")?,
                    activated_by: row.try_get("activated_by")?,
                    reason: row.try_get("reason")?,
                })
            })
            .collect()
    }

    /// Activates (or refreshes) a scoped switch.
    pub async fn activate_scope(&self, tenant_id: &str, scope: &ScopedSwitch, now: &str) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query(
            "INSERT INTO policy_kill_switch_scopes (tenant_id, scope_type, scope_id, reason, activated_by, activated_at, active, \
             deactivated_at, deactivated_by) VALUES ($1, $2, $3, $4, $5, $6, 1, NULL, NULL) \
             ON CONFLICT (tenant_id, scope_type, scope_id) DO UPDATE SET reason = excluded.reason, activated_by = excluded.activated_by, \
             activated_at = excluded.activated_at, active = 1, deactivated_at = NULL, deactivated_by = NULL",
        )
        .bind(tenant_id)
        .bind(&scope.r#type)
        .bind(&scope.id)
        .bind(&scope.reason)
        .bind(&scope.activated_by)
        .bind(&scope.activated_at)
        .execute(&mut *transaction)
        .await?;
        bump_version(&mut transaction, tenant_id, now).await?;
        transaction.commit().await?;
        Ok(())
    }

    /// Deactivates an active scoped switch; None when absent or already off.
    pub async fn deactivate_scope(
        &self,
        tenant_id: &str,
        scope_type: &str,
        scope_id: &str,
        deactivated_by: &str,
        now: &str,
    ) -> StoreResult<Option<ScopedSwitch>> {
        let mut transaction = self.database.begin().await?;
        let changed = sqlx::query(
            "UPDATE policy_kill_switch_scopes SET active = 0, deactivated_at = $4, deactivated_by = $5 \
             WHERE tenant_id = $1 AND scope_type = $2 AND scope_id = $3 AND active = 1",
        )
        .bind(tenant_id)
        .bind(scope_type)
        .bind(scope_id)
        .bind(now)
        .bind(deactivated_by)
        .execute(&mut *transaction)
        .await?;
        if changed.rows_affected() != 1 {
            return Ok(None);
        }
        bump_version(&mut transaction, tenant_id, now).await?;
        let row = sqlx::query(
            "SELECT scope_type, scope_id, reason, activated_by, activated_at, active, deactivated_at FROM policy_kill_switch_scopes \
             WHERE tenant_id = $1 AND scope_type = $2 AND scope_id = $3",
        )
        .bind(tenant_id)
        .bind(scope_type)
        .bind(scope_id)
        .fetch_one(&mut *transaction)
        .await?;
        let scope = scope_from_row(&row)?;
        transaction.commit().await?;
        Ok(Some(scope))
    }

    /// Active scoped switches, oldest first.
    pub async fn active_scopes(&self, tenant_id: &str) -> StoreResult<Vec<ScopedSwitch>> {
        let rows = sqlx::query(
            "SELECT scope_type, scope_id, reason, activated_by, activated_at, active, deactivated_at FROM policy_kill_switch_scopes \
             WHERE tenant_id = $1 AND active = 1 ORDER BY activated_at, scope_type, scope_id",
        )
        .bind(tenant_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(scope_from_row).collect()
    }

    // ------------------------------------------------------------ configurations

    pub async fn guardrail_config(&self, tenant_id: &str) -> StoreResult<Option<StoredDocument>> {
        self.document("SELECT config_json, updated_at FROM policy_guardrail_configs WHERE tenant_id = $1", tenant_id).await
    }

    pub async fn put_guardrail_config(&self, tenant_id: &str, json: &str, now: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO policy_guardrail_configs (tenant_id, config_json, updated_at) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant_id) DO UPDATE SET config_json = excluded.config_json, updated_at = excluded.updated_at",
        )
        .bind(tenant_id)
        .bind(json)
        .bind(now)
        .execute(self.database.pool())
        .await?;
        Ok(())
    }

    pub async fn firewall_config(&self, tenant_id: &str) -> StoreResult<Option<StoredDocument>> {
        self.document("SELECT config_json, updated_at FROM policy_firewall_configs WHERE tenant_id = $1", tenant_id).await
    }

    pub async fn put_firewall_config(&self, tenant_id: &str, json: &str, now: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO policy_firewall_configs (tenant_id, config_json, updated_at) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant_id) DO UPDATE SET config_json = excluded.config_json, updated_at = excluded.updated_at",
        )
        .bind(tenant_id)
        .bind(json)
        .bind(now)
        .execute(self.database.pool())
        .await?;
        Ok(())
    }

    async fn document(&self, sql: &'static str, tenant_id: &str) -> StoreResult<Option<StoredDocument>> {
        let row = sqlx::query(sql).bind(tenant_id).fetch_optional(self.database.pool()).await?;
        row.map(|row| Ok(StoredDocument { json: row.try_get("config_json")?, updated_at: row.try_get("updated_at")? })).transpose()
    }

    // ------------------------------------------------------------ external guardrail providers

    /// Creates or replaces a provider (keeping its creation time).
    pub async fn upsert_guardrail_provider(&self, record: &ProviderRecord) -> StoreResult<()> {
        let sealed = record.sealed_key.as_ref();
        sqlx::query(
            "INSERT INTO policy_guardrail_providers (tenant_id, provider_id, name, endpoint, template, result_mapping_json, timeout_ms, \
             api_key_ciphertext, api_key_nonce, api_key_wrapped_key, api_key_key_nonce, api_key_mask, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
             ON CONFLICT (tenant_id, provider_id) DO UPDATE SET name = excluded.name, endpoint = excluded.endpoint, \
             template = excluded.template, result_mapping_json = excluded.result_mapping_json, timeout_ms = excluded.timeout_ms, \
             api_key_ciphertext = excluded.api_key_ciphertext, api_key_nonce = excluded.api_key_nonce, \
             api_key_wrapped_key = excluded.api_key_wrapped_key, api_key_key_nonce = excluded.api_key_key_nonce, \
             api_key_mask = excluded.api_key_mask, updated_at = excluded.updated_at",
        )
        .bind(&record.tenant_id)
        .bind(&record.provider_id)
        .bind(&record.name)
        .bind(&record.endpoint)
        .bind(&record.template)
        .bind(record.result_mapping_json.clone())
        .bind(record.timeout_ms)
        .bind(sealed.map(|sealed| sealed.ciphertext.clone()))
        .bind(sealed.map(|sealed| sealed.nonce.clone()))
        .bind(sealed.map(|sealed| sealed.wrapped_key.clone()))
        .bind(sealed.map(|sealed| sealed.key_nonce.clone()))
        .bind(record.api_key_mask.clone())
        .bind(&record.created_at)
        .bind(&record.updated_at)
        .execute(self.database.pool())
        .await?;
        Ok(())
    }

    /// A tenant's providers, by id.
    pub async fn guardrail_providers(&self, tenant_id: &str) -> StoreResult<Vec<ProviderRecord>> {
        let rows = sqlx::query(
            "SELECT tenant_id, provider_id, name, endpoint, template, result_mapping_json, timeout_ms, api_key_ciphertext, api_key_nonce, \
             api_key_wrapped_key, api_key_key_nonce, api_key_mask, created_at, updated_at FROM policy_guardrail_providers \
             WHERE tenant_id = $1 ORDER BY provider_id",
        )
        .bind(tenant_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(provider_from_row).collect()
    }

    /// Removes a provider; false when it did not exist.
    pub async fn delete_guardrail_provider(&self, tenant_id: &str, provider_id: &str) -> StoreResult<bool> {
        let result = sqlx::query("DELETE FROM policy_guardrail_providers WHERE tenant_id = $1 AND provider_id = $2")
            .bind(tenant_id)
            .bind(provider_id)
            .execute(self.database.pool())
            .await?;
        Ok(result.rows_affected() == 1)
    }

    // ------------------------------------------------------------ XDR risk scores

    /// Sets (or replaces) an agent's risk score.
    pub async fn put_agent_risk(&self, risk: &AgentRisk) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO policy_agent_risks (tenant_id, agent_id, risk_micros, source, set_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (tenant_id, agent_id) DO UPDATE SET risk_micros = excluded.risk_micros, source = excluded.source, \
             set_at = excluded.set_at, expires_at = excluded.expires_at",
        )
        .bind(&risk.tenant_id)
        .bind(&risk.agent_id)
        .bind(risk_micros(risk.risk_score))
        .bind(&risk.source)
        .bind(&risk.set_at)
        .bind(&risk.expires_at)
        .execute(self.database.writer())
        .await?;
        Ok(())
    }

    /// Clears an agent's risk score; false when it had none in force at `now`.
    pub async fn clear_agent_risk(&self, tenant_id: &str, agent_id: &str, now: &str) -> StoreResult<bool> {
        let cleared = sqlx::query("DELETE FROM policy_agent_risks WHERE tenant_id = $1 AND agent_id = $2 RETURNING expires_at")
            .bind(tenant_id)
            .bind(agent_id)
            .fetch_optional(self.database.writer())
            .await?;
        Ok(cleared.map(|row| row.try_get::<String, _>("expires_at")).transpose()?.is_some_and(|expires_at| expires_at.as_str() > now))
    }

    /// The tenant's risk scores still in force at `now`.
    pub async fn agent_risks(&self, tenant_id: &str, now: &str) -> StoreResult<Vec<AgentRisk>> {
        let rows = sqlx::query(
            "SELECT agent_id, risk_micros, source, set_at, expires_at FROM policy_agent_risks \
             WHERE tenant_id = $1 AND expires_at > $2 ORDER BY agent_id",
        )
        .bind(tenant_id)
        .bind(now)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AgentRisk {
                    tenant_id: tenant_id.to_string(),
                    agent_id: row.try_get("agent_id")?,
                    risk_score: row.try_get::<i64, _>("risk_micros")? as f64 / 1_000_000.0,
                    source: row.try_get("source")?,
                    set_at: row.try_get("set_at")?,
                    expires_at: row.try_get("expires_at")?,
                })
            })
            .collect()
    }

    // ------------------------------------------------------------ interceptions

    pub async fn insert_interception(&self, interception: &Interception) -> StoreResult<()> {
        self.insert_interceptions(std::slice::from_ref(interception)).await
    }

    /// Stores interceptions in multi-row inserts, one transaction (an id already stored is skipped).
    pub async fn insert_interceptions(&self, interceptions: &[Interception]) -> StoreResult<()> {
        let placeholders = self.database.placeholders();
        let mut transaction = self.database.begin_writer().await?;
        for chunk in statement_chunks(interceptions) {
            let sql = format!(
                "{} INTO policy_interceptions (id, tenant_id, severity, actor_id, actor_type, resource, action, verdicts_json, \
                 request_id, created_at) VALUES {} ON CONFLICT (id) DO NOTHING",
                placeholders.batch_insert(),
                placeholders.values(chunk.len(), 10, 1)
            );
            let mut insert = sqlx::query(&sql);
            for interception in chunk {
                insert = insert
                    .bind(&interception.id)
                    .bind(&interception.tenant_id)
                    .bind(&interception.severity)
                    .bind(&interception.actor_id)
                    .bind(&interception.actor_type)
                    .bind(&interception.resource)
                    .bind(&interception.action)
                    .bind(verdicts_json(&interception.verdicts))
                    .bind(interception.request_id.clone())
                    .bind(&interception.created_at);
            }
            insert.execute(&mut *transaction).await?;
        }
        transaction.commit().await
    }

    /// A page of interceptions, newest first, and the total. The page carries the total it was read
    /// with (one statement, one snapshot): counted apart, a batch committed between the two reads
    /// made an empty page with a total of seven.
    pub async fn interceptions(&self, tenant_id: &str, limit: i64, offset: i64) -> StoreResult<(Vec<Interception>, i64)> {
        let rows = sqlx::query(
            "SELECT id, tenant_id, severity, actor_id, actor_type, resource, action, verdicts_json, request_id, created_at, \
             COUNT(*) OVER () AS total \
             FROM policy_interceptions WHERE tenant_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3",
        )
        .bind(tenant_id)
        .bind(limit)
        .bind(offset)
        .fetch_all(self.database.pool())
        .await?;
        let total: i64 = match rows.first() {
            Some(row) => row.try_get("total")?,
            // An empty first page is an empty log; past the end, the total is counted on its own.
            None if offset == 0 => 0,
            None => {
                sqlx::query_scalar("SELECT COUNT(*) FROM policy_interceptions WHERE tenant_id = $1")
                    .bind(tenant_id)
                    .fetch_one(self.database.pool())
                    .await?
            }
        };
        let interceptions = rows
            .iter()
            .map(|row| {
                let verdicts: String = row.try_get("verdicts_json")?;
                Ok(Interception {
                    id: row.try_get("id")?,
                    tenant_id: row.try_get("tenant_id")?,
                    severity: row.try_get("severity")?,
                    actor_id: row.try_get("actor_id")?,
                    actor_type: row.try_get("actor_type")?,
                    resource: row.try_get("resource")?,
                    action: row.try_get("action")?,
                    verdicts: verdicts_from_json(&verdicts),
                    request_id: row.try_get("request_id")?,
                    created_at: row.try_get("created_at")?,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        Ok((interceptions, total))
    }

    // ------------------------------------------------------------ rulesets

    pub async fn ruleset(&self, tenant_id: &str) -> StoreResult<Option<StoredRuleset>> {
        let row = sqlx::query("SELECT version, rules_json, updated_at, updated_by FROM policy_rulesets WHERE tenant_id = $1")
            .bind(tenant_id)
            .fetch_optional(self.database.pool())
            .await?;
        row.map(|row| {
            Ok(StoredRuleset {
                version: row.try_get("version")?,
                rules_json: row.try_get("rules_json")?,
                updated_at: row.try_get("updated_at")?,
                updated_by: row.try_get("updated_by")?,
            })
        })
        .transpose()
    }

    /// Replaces the rules; returns the new version (1 for the first ruleset, then one more each time).
    pub async fn put_ruleset(&self, tenant_id: &str, rules_json: &str, updated_by: &str, now: &str) -> StoreResult<i64> {
        sqlx::query_scalar(
            "INSERT INTO policy_rulesets (tenant_id, version, rules_json, updated_at, updated_by) VALUES ($1, 1, $2, $3, $4) \
             ON CONFLICT (tenant_id) DO UPDATE SET version = policy_rulesets.version + 1, rules_json = excluded.rules_json, \
             updated_at = excluded.updated_at, updated_by = excluded.updated_by RETURNING version",
        )
        .bind(tenant_id)
        .bind(rules_json)
        .bind(now)
        .bind(updated_by)
        .fetch_one(self.database.pool())
        .await
    }

    // ------------------------------------------------------------ approvals

    pub async fn approval(&self, tenant_id: &str, id: &str) -> StoreResult<Option<Approval>> {
        let row = sqlx::query(select_approvals!("WHERE tenant_id = $1 AND id = $2"))
            .bind(tenant_id)
            .bind(id)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(approval_from_row).transpose()
    }

    /// The pending approval of this tool and argument hash, if any.
    pub async fn pending_approval(&self, tenant_id: &str, tool_name: &str, argument_hash: &str) -> StoreResult<Option<Approval>> {
        let row = sqlx::query(select_approvals!("WHERE tenant_id = $1 AND tool_name = $2 AND argument_hash = $3 AND status = $4"))
            .bind(tenant_id)
            .bind(tool_name)
            .bind(argument_hash)
            .bind(PENDING)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(approval_from_row).transpose()
    }

    /// Queues a pending approval unless one exists for the same tool and hash; true when inserted.
    pub async fn insert_pending_approval(&self, approval: &Approval) -> StoreResult<bool> {
        let keys = serde_json::to_string(&approval.argument_keys).unwrap_or_else(|_| "[]".to_string());
        let result = sqlx::query(
            "INSERT INTO policy_approvals (id, tenant_id, tool_name, surface, agent_id, owner_id, argument_keys_json, argument_hash, rule_id, \
             status, scope, review_note, reviewed_by, created_at, reviewed_at, expires_at, consumed_at, consumed_by_request_id, request_id, \
             attempts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, NULL, NULL, $11, NULL, NULL, NULL, NULL, $12, 1) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&approval.id)
        .bind(&approval.tenant_id)
        .bind(&approval.tool_name)
        .bind(&approval.surface)
        .bind(approval.agent_id.clone())
        .bind(approval.owner_id.clone())
        .bind(keys)
        .bind(&approval.argument_hash)
        .bind(approval.rule_id.clone())
        .bind(PENDING)
        .bind(&approval.created_at)
        .bind(&approval.request_id)
        .execute(self.database.pool())
        .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Counts one more request waiting on a pending approval.
    pub async fn count_attempt(&self, id: &str) -> StoreResult<()> {
        sqlx::query("UPDATE policy_approvals SET attempts = attempts + 1 WHERE id = $1 AND status = $2")
            .bind(id)
            .bind(PENDING)
            .execute(self.database.pool())
            .await?;
        Ok(())
    }

    /// Approved, unconsumed, unexpired allowances this call could use: exact ones first, oldest first.
    pub async fn usable_allowances(&self, tenant_id: &str, tool_name: &str, argument_hash: &str, now: &str) -> StoreResult<Vec<String>> {
        sqlx::query_scalar(
            "SELECT id FROM policy_approvals WHERE tenant_id = $1 AND tool_name = $2 AND status = $3 AND consumed_at IS NULL \
             AND expires_at > $4 AND (scope = $5 OR (scope = $6 AND argument_hash = $7)) \
             ORDER BY CASE WHEN scope = $6 THEN 0 ELSE 1 END, reviewed_at, id LIMIT 5",
        )
        .bind(tenant_id)
        .bind(tool_name)
        .bind(APPROVED)
        .bind(now)
        .bind("tool")
        .bind("exact")
        .bind(argument_hash)
        .fetch_all(self.database.pool())
        .await
    }

    /// Consumes an allowance for a request; false when another request consumed it first or it lapsed.
    pub async fn consume_allowance(&self, id: &str, request_id: &str, now: &str) -> StoreResult<bool> {
        let result = sqlx::query(
            "UPDATE policy_approvals SET consumed_at = $2, consumed_by_request_id = $3 \
             WHERE id = $1 AND status = $4 AND consumed_at IS NULL AND expires_at > $2",
        )
        .bind(id)
        .bind(now)
        .bind(request_id)
        .bind(APPROVED)
        .execute(self.database.pool())
        .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Pending approvals, oldest first.
    pub async fn pending_approvals(&self, tenant_id: &str) -> StoreResult<Vec<Approval>> {
        let rows = sqlx::query(select_approvals!("WHERE tenant_id = $1 AND status = $2 ORDER BY created_at, id"))
            .bind(tenant_id)
            .bind(PENDING)
            .fetch_all(self.database.pool())
            .await?;
        rows.iter().map(approval_from_row).collect()
    }

    /// Decides a pending approval; false when it is not pending (any more).
    #[allow(clippy::too_many_arguments)]
    pub async fn review_approval(
        &self,
        tenant_id: &str,
        id: &str,
        status: &str,
        scope: Option<&str>,
        review_note: Option<&str>,
        reviewed_by: &str,
        now: &str,
        expires_at: Option<&str>,
    ) -> StoreResult<bool> {
        let result = sqlx::query(
            "UPDATE policy_approvals SET status = $3, scope = $4, review_note = $5, reviewed_by = $6, reviewed_at = $7, expires_at = $8 \
             WHERE tenant_id = $1 AND id = $2 AND status = $9",
        )
        .bind(tenant_id)
        .bind(id)
        .bind(status)
        .bind(scope.map(str::to_string))
        .bind(review_note.map(str::to_string))
        .bind(reviewed_by)
        .bind(now)
        .bind(expires_at.map(str::to_string))
        .bind(PENDING)
        .execute(self.database.pool())
        .await?;
        Ok(result.rows_affected() == 1)
    }
}

/// Makes sure the tenant row exists and bumps its version (scoped changes are kill-switch changes).
async fn bump_version(transaction: &mut Transaction<'_, Any>, tenant_id: &str, now: &str) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO policy_kill_switches (tenant_id, active, activated_at, activated_by, reason, deactivated_at, version, updated_at) \
         VALUES ($1, 0, NULL, NULL, NULL, NULL, 1, $2) \
         ON CONFLICT (tenant_id) DO UPDATE SET version = policy_kill_switches.version + 1, updated_at = excluded.updated_at",
    )
    .bind(tenant_id)
    .bind(now)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

fn scope_from_row(row: &AnyRow) -> StoreResult<ScopedSwitch> {
    Ok(ScopedSwitch {
        r#type: row.try_get("scope_type")?,
        id: row.try_get("scope_id")?,
        reason: row.try_get("reason")?,
        activated_by: row.try_get("activated_by")?,
        activated_at: row.try_get("activated_at")?,
        active: row.try_get::<i64, _>("active")? != 0,
        deactivated_at: row.try_get("deactivated_at")?,
    })
}

fn provider_from_row(row: &AnyRow) -> StoreResult<ProviderRecord> {
    let ciphertext: Option<String> = row.try_get("api_key_ciphertext")?;
    let nonce: Option<String> = row.try_get("api_key_nonce")?;
    let wrapped_key: Option<String> = row.try_get("api_key_wrapped_key")?;
    let key_nonce: Option<String> = row.try_get("api_key_key_nonce")?;
    let sealed_key = match (ciphertext, nonce, wrapped_key, key_nonce) {
        (Some(ciphertext), Some(nonce), Some(wrapped_key), Some(key_nonce)) => {
            Some(SealedKey { ciphertext, nonce, wrapped_key, key_nonce })
        }
        _ => None,
    };
    Ok(ProviderRecord {
        tenant_id: row.try_get("tenant_id")?,
        provider_id: row.try_get("provider_id")?,
        name: row.try_get("name")?,
        endpoint: row.try_get("endpoint")?,
        template: row.try_get("template")?,
        result_mapping_json: row.try_get("result_mapping_json")?,
        timeout_ms: row.try_get("timeout_ms")?,
        sealed_key,
        api_key_mask: row.try_get("api_key_mask")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn approval_from_row(row: &AnyRow) -> StoreResult<Approval> {
    let keys: String = row.try_get("argument_keys_json")?;
    let tool_name: String = row.try_get("tool_name")?;
    Ok(Approval {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        high_risk: crate::approvals::is_high_risk_tool(&tool_name),
        tool_name,
        surface: row.try_get("surface")?,
        agent_id: row.try_get("agent_id")?,
        owner_id: row.try_get("owner_id")?,
        argument_keys: serde_json::from_str(&keys).unwrap_or_default(),
        argument_hash: row.try_get("argument_hash")?,
        rule_id: row.try_get("rule_id")?,
        status: row.try_get("status")?,
        scope: row.try_get("scope")?,
        review_note: row.try_get("review_note")?,
        reviewed_by: row.try_get("reviewed_by")?,
        created_at: row.try_get("created_at")?,
        reviewed_at: row.try_get("reviewed_at")?,
        expires_at: row.try_get("expires_at")?,
        consumed_at: row.try_get("consumed_at")?,
        consumed_by_request_id: row.try_get("consumed_by_request_id")?,
        request_id: row.try_get("request_id")?,
        attempts: u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(u32::MAX),
    })
}

/// One verdict as stored, fields in the order `json!` wrote them (sorted): serialized from borrowed
/// text instead of through a `Value` tree (nine verdicts per interception, eight strings each).
#[derive(serde::Serialize)]
struct StoredVerdict<'a> {
    action: &'a str,
    reason: &'a str,
    step: &'a str,
    tool: &'a str,
}

/// The verdicts as the `verdicts_json` column holds them.
fn verdicts_json(verdicts: &[Verdict]) -> String {
    let stored: Vec<StoredVerdict<'_>> = verdicts
        .iter()
        .map(|verdict| StoredVerdict { action: &verdict.action, reason: &verdict.reason, step: &verdict.step, tool: &verdict.tool })
        .collect();
    serde_json::to_string(&stored).unwrap_or_else(|_| "[]".to_string())
}

fn verdicts_from_json(text: &str) -> Vec<Verdict> {
    let parsed: Vec<serde_json::Value> = serde_json::from_str(text).unwrap_or_default();
    let field = |value: &serde_json::Value, name: &str| value.get(name).and_then(serde_json::Value::as_str).unwrap_or_default().to_string();
    parsed
        .iter()
        .map(|value| Verdict {
            step: field(value, "step"),
            tool: field(value, "tool"),
            action: field(value, "action"),
            reason: field(value, "reason"),
        })
        .collect()
}

/// A score of 0 to 1 in millionths (stored as an integer: both engines compare and return it exactly).
fn risk_micros(score: f64) -> i64 {
    (score.clamp(0.0, 1.0) * 1_000_000.0).round() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_stored_as_the_json_tree_wrote_them_and_read_back() {
        let verdicts = vec![
            Verdict { step: "mask_patterns".into(), tool: "lookup".into(), action: "mask".into(), reason: "masked \"ticket\"\n".into() },
            Verdict { step: "allowlist".into(), tool: "lookup".into(), action: "allow".into(), reason: String::new() },
        ];
        let tree: Vec<serde_json::Value> = verdicts
            .iter()
            .map(|verdict| serde_json::json!({"step": verdict.step, "tool": verdict.tool, "action": verdict.action, "reason": verdict.reason}))
            .collect();
        let text = verdicts_json(&verdicts);
        assert_eq!(text, serde_json::Value::Array(tree).to_string());
        assert_eq!(verdicts_from_json(&text), verdicts);
        assert_eq!(verdicts_json(&[]), "[]");
    }
}
